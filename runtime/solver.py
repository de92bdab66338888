"""Solvers: the ways to compute a primitive, each with a stable id, and the registry that holds them.

A solver answers :meth:`Solver.is_applicable` with an :class:`Applicability` that carries the
reason when it does not apply (users see every reason when nothing applies, never a bare "no
solver found"), states its workspace, lists the :class:`ProgramRequest` s it needs (exactly
what bundles store) and builds an invoker: a callable that launches the solver's kernels for
one problem on a handle. Ids are stable and never reused: a find-db written by one release
names solvers by id, and a later release must either know the id or skip the record.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from kdbkit.runtime import env
from kdbkit.runtime.backends.base import DeviceInfo
from kdbkit.runtime.env import EnvVar
from kdbkit.runtime.program_key import ProgramRequest

if TYPE_CHECKING:
    from kdbkit.runtime.handle import Handle
    from kdbkit.runtime.problem import Problem

Invoker = Callable[..., None]


@dataclass(frozen=True)
class Applicability:
    """Whether a solver applies to a problem, and if not, why (one clause, for users)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


APPLIES = Applicability(True)


def not_applicable(reason: str) -> Applicability:
    return Applicability(False, reason)


class Solver(ABC):
    """One way to compute a primitive. Subclasses set ``id``, ``name`` and ``primitive``."""

    id: int
    name: str
    primitive: str
    backends: tuple[str, ...] | None = None  # the backends its kernels build for; None: every one (the dialect)

    @abstractmethod
    def is_applicable(self, problem: "Problem", device: DeviceInfo) -> Applicability:
        """Whether this solver computes ``problem`` on ``device``; the reason when it does not."""

    def suits(self, problem: "Problem", device: DeviceInfo) -> Applicability:
        """Whether immediate mode should pick this solver where it applies: a solver known to be
        slow on some problems it computes says why, and the heuristic passes over it to the next
        (find still times it; with nothing else applying, immediate mode takes it anyway)."""
        return APPLIES

    def builds_for(self, target) -> bool:
        """Whether this solver's kernels compile for ``target`` (a :class:`kdbkit.kdb.Target`):
        an offline build leaves out the programs of a solver that can never run there (the
        tensor-core kernels below sm_80, say). Default: every target of its backends."""
        return True

    def workspace(self, problem: "Problem") -> int:
        """Device bytes of scratch memory the invoker needs besides the problem's tensors."""
        return 0

    @abstractmethod
    def programs(self, problem: "Problem") -> list[ProgramRequest]:
        """The kernel programs the invoker launches (what a bundle must hold for it)."""

    @abstractmethod
    def invoker(self, handle: "Handle", problem: "Problem") -> Invoker:
        """A callable that runs ``problem`` given its tensors (device buffers) as keywords."""

    @functools.cached_property  # asked on every first call of a problem: made once per solver
    def switch(self) -> EnvVar:
        """``KDB_DEBUG_<NAME>`` (``ActivPacked`` -> ``KDB_DEBUG_ACTIV_PACKED``): 0 excludes this solver."""
        return EnvVar(f"KDB_DEBUG_{_snake_upper(self.name)}", "bool", True,
                      f"Set to 0 to exclude the {self.primitive} solver {self.name} ({self.id}). Default: enabled.")

    def __repr__(self) -> str:
        return f"<solver {self.id} {self.name}>"


def _snake_upper(name: str) -> str:
    """``ActivPacked2D`` -> ``ACTIV_PACKED2_D``: an underscore before each capital that follows a
    lower-case letter or a digit (by hand: a regex would be compiled on a first call)."""
    return "".join("_" + c if i and c.isupper() and (name[i - 1].islower() or name[i - 1].isdigit()) else c
                   for i, c in enumerate(name)).upper()


class SolverRegistry:
    """Every solver, by id and by name; a primitive's solvers in registration order."""

    def __init__(self) -> None:
        self._by_id: dict[int, Solver] = {}
        self._by_name: dict[str, Solver] = {}

    def register(self, solver: Solver) -> Solver:
        """Add ``solver``; an id or a name already taken is a bug in kdbkit and raises."""
        for key, table in ((solver.id, self._by_id), (solver.name, self._by_name)):
            if key in table:
                raise ValueError(f"solver {solver.name} ({solver.id}): {key!r} is already {table[key]!r}")
        self._by_id[solver.id] = solver
        self._by_name[solver.name] = solver
        return solver

    def find(self, key: int | str) -> Solver | None:
        """The solver with this id (``3`` or ``"3"``) or name, or ``None``."""
        if isinstance(key, str) and key.strip().isdigit():
            key = int(key)
        return self._by_id.get(key) if isinstance(key, int) else self._by_name.get(key)

    def for_primitive(self, primitive: str) -> list[Solver]:
        return [s for s in self._by_id.values() if s.primitive == primitive]

    def __iter__(self) -> Iterator[Solver]:
        return iter(sorted(self._by_id.values(), key=lambda s: s.id))


REGISTRY = SolverRegistry()


def enabled(solver: Solver) -> bool:
    """False when the solver's ``KDB_DEBUG_<NAME>`` switch is 0."""
    return env.get_bool(solver.switch)


def switches() -> list[EnvVar]:
    """Every solver's switch (every primitive loaded), for ``kdb env``."""
    from kdbkit.runtime.primitives import load_all

    load_all()
    return [s.switch for s in REGISTRY]


def register(cls: type[Solver]) -> type[Solver]:
    """Class decorator: put one instance of the solver in :data:`REGISTRY`."""
    REGISTRY.register(cls())
    return cls


def _grid_1d(n: int, block: int, max_groups: int) -> tuple[int, int, int]:
    """Enough groups of ``block`` to cover ``n`` elements, capped (the kernels loop over the rest)."""
    return (max(1, min(max_groups, -(-n // block))), 1, 1)


def launch_1d(handle: "Handle", kernel: Any, n: int, args: list, block: int = 256, max_groups: int = 4096) -> None:
    """Launch a grid-stride kernel over ``n`` elements: enough groups to cover them, capped."""
    handle.backend.launch(kernel, _grid_1d(n, block, max_groups), (block, 1, 1), args)


def launcher_1d(handle: "Handle", kernel: Any, n: int, args: list, block: int = 256, max_groups: int = 4096,
                groups_per_unit: int | None = None):
    """:func:`launch_1d` made once (``None`` where a buffer comes at run time): the returned
    function takes those buffers in order (Backend.launcher). ``groups_per_unit``: at most
    this many groups share a multiprocessor (:func:`residency_cap`)."""
    shared = residency_cap(handle, kernel, block, groups_per_unit) if groups_per_unit else 0
    return handle.backend.launcher(kernel, _grid_1d(n, block, max_groups), (block, 1, 1), args, shared_bytes=shared)


def residency_cap(handle: "Handle", kernel: Any, block: int, groups: int) -> int:
    """Dynamic shared memory (bytes, unused by the kernel) with which at most ``groups`` groups
    of ``block`` threads share a multiprocessor: some streaming kernels run faster a little
    below full occupancy. 0 where the kernel already fits no more, or where the backend has no
    occupancy calculator to ask (only CUDA's is)."""
    if "occupancy" not in handle.backend.capabilities:
        return 0
    resident = handle.backend.resident_groups
    if resident(kernel, block, 0) <= groups:
        return 0
    low, high = 0, 48 * 1024  # at most 48 KiB: no opt-in needed, and few groups fit past it
    if resident(kernel, block, high) > groups:
        return 0
    while high - low > 256:  # the smallest multiple of 256 bytes that caps it
        middle = (low + high) // 2 // 256 * 256
        if resident(kernel, block, middle) <= groups:
            high = middle
        else:
            low = middle
    return high


def fallback_invoker(handle: "Handle", problem: Any, solver_name: str) -> Callable[..., None]:
    """The invoker of another registered solver for the same problem, built on its first call:
    where a fast kernel cannot take a call (a tensor at an offset not 16-byte aligned). Found
    in the registry by name, so the fast solver's module need not import (and so register
    before it) the one it falls back on."""
    made: list = []

    def run(*args: Any, **kwargs: Any) -> None:
        if not made:
            made.append(REGISTRY.find(solver_name).invoker(handle, problem))
        made[0](*args, **kwargs)

    return run


def aligned16(*buffers) -> bool:
    """Every buffer starts 16-byte aligned, so a kernel may access it as 16-byte vectors
    (OpenCL buffers carry no address and are always aligned far beyond that)."""
    return all(int(getattr(b, "ptr", 0)) % 16 == 0 for b in buffers)


def fast_when_aligned(fast: Callable, general: Callable) -> Callable:
    """An invoker of three buffers (a, b, c): ``fast``, whose kernel accesses 16 bytes at a
    time, when all three are 16-byte aligned; else ``general`` (a view at an odd offset)."""

    def run(a, b, c):
        if aligned16(a, b, c):
            fast(a, b, c)
        else:
            general(a, b, c)

    return run


def vector_elements(dtype) -> int:
    """Elements of ``dtype`` per 16-byte vector (kernels' KDB_VEC)."""
    return 16 // dtype.itemsize


def padded_ints(values, fill: int, dims: int) -> list:
    """``values`` as ``dims`` int32 launch arguments, ``fill`` in front: a shape of fewer
    dimensions as a kernel's fixed 5-D one (sizes padded with 1, strides with 0)."""
    import numpy as np

    return [np.int32(v) for v in (fill,) * (dims - len(values)) + tuple(values)]
