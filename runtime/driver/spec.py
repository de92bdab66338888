"""What a primitive's driver module declares: its flags, how they make problems, its reference.

A :class:`DriverSpec` subclass per primitive (one module each, listed in
:mod:`kdbkit.runtime.driver.registry`) says which ``kdb driver`` command runs it, the flags it
adds to the common ones (:data:`COMMON`, :data:`SHAPE`, :data:`FORW`), how resolved flag
values make its problems, which of a problem's tensors it writes, how to prepare inputs that
must be consistent (a backward pass's forward output), and the NumPy reference of its outputs.
Everything else (tensors, solver choice, find, timing, verification, output lines, the
``KDB_ENABLE_LOGGING_CMD`` line) is generic.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, ClassVar

from kdbkit.runtime.tensor import DataType

if TYPE_CHECKING:
    import numpy as np

    from kdbkit.runtime.driver.tensors import HostTensors
    from kdbkit.runtime.problem import Problem

# Largest accepted error per element type (see runtime/driver/verify.py for the measure).
TOLERANCES = {DataType.FP32: 1e-5, DataType.FP16: 2e-3, DataType.BF16: 1.6e-2}


@dataclass(frozen=True)
class Flag:
    """One command-line flag.

    Attributes:
        dest: the name its value has in the resolved options (``o.<dest>``).
        decls: its spellings, short one first (``("-n", "--batchsize")``).
        kind: ``int``, ``float`` or ``str``.
        default: the value when the flag is not given (None: unset).
        help: one sentence; the default is appended.
        choices: the values accepted, if fixed.
        minimum: the smallest value accepted (numbers).
        problem: it describes the problem, so it cannot be combined with ``--config``.
    """

    dest: str
    decls: tuple[str, ...]
    kind: type
    default: Any
    help: str
    choices: tuple | None = None
    minimum: float | None = None
    problem: bool = True


SHAPE = (
    Flag("n", ("-n", "--batchsize"), int, 4, "Batch size N.", minimum=1),
    Flag("c", ("-c", "--in_channels"), int, 8, "Channels C.", minimum=1),
    Flag("h", ("-H", "--in_h"), int, 16, "Height H.", minimum=1),
    Flag("w", ("-W", "--in_w"), int, 16, "Width W.", minimum=1),
)
FORW = Flag("forw", ("-F", "--forw"), int, 0, "Direction: 1 forward, 2 backward, 0 both (MIOpen's numbering; "
            "with --config, the config's own direction unless given).", choices=(0, 1, 2), problem=False)
COMMON = (
    Flag("dtype", ("--dtype",), str, "fp32", "Element type (the activfp16-style commands set it).",
         choices=tuple(t.label for t in DataType)),
    Flag("config", ("--config",), str, None, "A problem config string (as KDB_ENABLE_LOGGING_CMD and the find-db "
         "print it) instead of the shape and problem flags; carries strides.", problem=False),
    Flag("iterations", ("-i", "--iter"), int, 1, "Launches timed with -t 1; the average is printed.", minimum=1,
         problem=False),
    Flag("verify", ("-V", "--verify"), int, 1, "Check the outputs against the NumPy reference: 1 yes, 0 no.",
         choices=(0, 1), problem=False),
    Flag("time", ("-t", "--time"), int, 0, "Time the kernels with device events: 1 yes, 0 no.", choices=(0, 1),
         problem=False),
    Flag("solver", ("-S", "--solution"), str, None, "Solver: unset or 0 for immediate mode (find-db, else the "
         "heuristic), -1 to run find and use its best, or a solver id or name.", problem=False),
    Flag("tolerance", ("--tolerance",), float, None, "Largest error accepted (default per type: fp32 1e-5, "
         "fp16 2e-3, bf16 1.6e-2).", minimum=0, problem=False),
    Flag("seed", ("--seed",), int, 0, "Seed of the random inputs.", problem=False),
    Flag("device", ("--device",), int, None, "Device index from `kdb devices` (default: the first GPU, else "
         "PoCL on the CPU).", minimum=0, problem=False),
)
DIRECTIONS = {0: ("fwd", "bwd"), 1: ("fwd",), 2: ("bwd",)}  # -F value -> directions run


class DriverSpec:
    """A primitive's part of ``kdb driver``; subclass it in one module and list it in the registry.

    Class attributes to set: ``command`` (``softmax``), ``label`` (``Softmax``, for the output
    lines), ``log_label`` (``LogCmdSoftmax``), ``primitive`` (the problem's ``primitive``),
    ``flags`` (its own :class:`Flag` s), ``summary`` (help's first line) and ``example`` (a
    command that runs quickly on a CPU: the help tests run it). Optional: ``aliases``,
    ``shape_flags`` (False when its shape is not N C H W, e.g. gemm's -m -n -k),
    ``directional`` (False: no -F, no forward/backward).
    """

    command: ClassVar[str]
    label: ClassVar[str]
    log_label: ClassVar[str]
    primitive: ClassVar[str]
    summary: ClassVar[str]
    example: ClassVar[str]
    flags: ClassVar[tuple[Flag, ...]] = ()
    aliases: ClassVar[tuple[str, ...]] = ()
    shape_flags: ClassVar[bool] = True
    directional: ClassVar[bool] = True

    # -- what a subclass writes ------------------------------------------------------------

    def problem(self, o: SimpleNamespace, direction: str | None, dtype: DataType) -> "Problem":
        """The problem resolved flags describe (``o.shape`` is (N, C, H, W) with shape flags).

        Raise ProblemError (or ValueError) for a bad value: the CLI turns it into a usage error.
        """
        raise NotImplementedError

    def outputs(self, problem: "Problem") -> tuple[str, ...]:
        """The tensors the problem writes (checked against the reference)."""
        raise NotImplementedError

    def unused(self, problem: "Problem") -> tuple[str, ...]:
        """Tensors the invoker takes that this problem neither reads nor writes."""
        return ()

    def exact(self, problem: "Problem", t: "HostTensors") -> dict[str, "np.ndarray"]:
        """Integer results the kernel writes into tensors outside ``outputs`` (max pooling's
        argmax), by name, as the reference computes them: verified equal, element by element."""
        return {}

    def prepare(self, problem: "Problem", t: "HostTensors") -> None:
        """Make inputs consistent where random ones would not be (every tensor starts random)."""

    def reference(self, problem: "Problem", t: "HostTensors") -> dict[str, "np.ndarray"]:
        """Each output's expected values (float64, the tensor's shape), from ``t``'s initial values."""
        raise NotImplementedError

    # -- defaults a subclass may override ----------------------------------------------------

    def all_flags(self) -> tuple[Flag, ...]:
        return (*(SHAPE if self.shape_flags else ()), *self.flags, *((FORW,) if self.directional else ()), *COMMON)

    def problems(self, o: SimpleNamespace) -> list["Problem"]:
        """The problems flags ask for: one per direction ``-F`` selects."""
        dtype = DataType.parse(o.dtype)
        if not self.directional:
            return [self.problem(o, None, dtype)]
        return [self.problem(o, d, dtype) for d in DIRECTIONS[o.forw]]

    def config_problems(self, problem: "Problem", forw: int | None) -> list["Problem"]:
        """The problems ``--config`` asks for: the config's, or those ``-F`` selects from it.

        Raises:
            ValueError: ``-F`` excludes the config's own direction.
        """
        if not self.directional or forw is None:
            return [problem]
        wanted = DIRECTIONS[forw]
        if problem.direction not in wanted:
            raise ValueError(f"the config is a {problem.direction} problem but -F {forw} asks for "
                             f"{' and '.join(wanted)}; give -F {self.forw_of(problem)} or 0")
        return [problem if d == problem.direction else dataclasses.replace(problem, direction=d) for d in wanted]

    def phase(self, problem: "Problem") -> str:
        """``Forward`` or ``Backward`` (the output lines' first word), or "" for no direction."""
        if not self.directional:
            return ""
        return "Forward" if problem.direction == "fwd" else "Backward"

    def forw_of(self, problem: "Problem") -> int:
        return 1 if problem.direction == "fwd" else 2

    def command_flags(self, problem: "Problem") -> str:
        """Flags that the logged command adds after ``--config``."""
        return f"-F {self.forw_of(problem)}" if self.directional else ""

    def tolerance(self, problem: "Problem") -> float:
        return TOLERANCES[problem.dtype]

    def title(self, problem: "Problem") -> str:
        """``Forward Softmax``: what the verification line names (and the timing line's, unless
        :meth:`timing_title` says otherwise)."""
        return " ".join(filter(None, (self.phase(problem), self.label)))

    def timing_title(self, problem: "Problem") -> str:
        """What the timing line names (MIOpenDriver's conv says ``Forward Conv.`` there)."""
        return self.title(problem)

    def stats(self, problem: "Problem", ms: float) -> list[str]:
        """Lines after the timing (MIOpenDriver's conv prints ``stats:``); none by default."""
        return []
