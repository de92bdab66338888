"""Solvers: the ways to compute a primitive, each with a stable id, and the registry that holds them.

A solver answers :meth:`Solver.is_applicable` with an :class:`Applicability` that carries the
reason when it does not apply (users see every reason when nothing applies, never a bare "no
solver found"), states its workspace, and declares its :class:`Solution` for a problem, as
MIOpen's ``GetSolution`` does: the :class:`ProgramRequest` s it needs (exactly what bundles
store) and an invoker factory that receives those programs loaded and a :class:`Context` (the
backend, the device; never the handle) and returns the invoker, a callable that launches the
solver's kernels for that problem. The dispatcher (``kdbkit.runtime.dispatcher``) resolves the
programs and keeps the invoker: a solver never looks a program up itself. Ids are stable and
never reused: a find-db written by one release names solvers by id, and a later release must
either know the id or skip the record.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from kdbkit.runtime import env
from kdbkit.runtime.backends.base import Backend, Buffer, DeviceInfo
from kdbkit.runtime.env import EnvVar
from kdbkit.runtime.program_key import ProgramRequest

if TYPE_CHECKING:
    from kdbkit.runtime.problem import Problem
    from kdbkit.runtime.program import Program

Invoker = Callable[..., None]


class Context:
    """What an invoker factory may use besides its programs: the backend it launches on, the
    device, its workspace (:meth:`alloc`), and the invokers of other problems (the GEMM inside a
    convolution) or of other solvers (a fallback). Made by the dispatcher for one solution;
    never the handle.

    Attributes:
        backend: the :class:`~kdbkit.runtime.backends.base.Backend` the invoker launches on.
        device: its :class:`~kdbkit.runtime.backends.base.DeviceInfo` (``device.target.cu``...).
        owned: the buffers :meth:`alloc` gave, freed with the invoker (``Dispatcher.close``, or
            as soon as find has timed it).
    """

    __slots__ = ("backend", "device", "owned", "_dispatcher", "_resolver")

    def __init__(self, backend: Backend, device: DeviceInfo, dispatcher: Any, resolver: Any):
        self.backend, self.device = backend, device
        self.owned: list[Buffer] = []
        self._dispatcher, self._resolver = dispatcher, resolver

    def alloc(self, nbytes: int) -> Buffer:
        """``nbytes`` of device memory for the invoker's workspace (in its factory or on a later
        call), owned by the invoker: the dispatcher frees it when it drops the invoker."""
        buffer = self.backend.alloc(nbytes)
        self.owned.append(buffer)
        return buffer

    def to_device(self, array) -> Buffer:
        """A copy of ``array`` in device memory the invoker owns, as :meth:`alloc`."""
        buffer = self.backend.to_device(array)
        self.owned.append(buffer)
        return buffer

    def invoker(self, problem: "Problem", solver: "Solver | int | str | None" = None) -> Invoker:
        """The invoker of ``problem`` with ``solver`` (immediate mode's choice if None), made now
        and its programs resolved as this solution's were (from the bundle only, on the
        prefetch worker). Raises as :meth:`Dispatcher.invoker`."""
        return self._dispatcher.invoker(problem, solver, resolver=self._resolver)

    def caller_invoker(self, problem: "Problem", solver: "Solver | int | str | None" = None) -> Invoker:
        """As :meth:`invoker`, through the caller's full lookup chain: for an invoker made
        during a later call (:func:`fallback_invoker`), on the caller's thread."""
        return self._dispatcher.invoker(problem, solver)


InvokerFactory = Callable[[list["Program"], Context], Invoker]


@dataclass(frozen=True)
class Solution:
    """What a solver needs for one problem (MIOpen's ``ConvSolution``).

    Attributes:
        programs: the programs its invoker launches, in the order the factory receives them
            loaded (what a bundle must hold for the solver).
        invoker_factory: ``(programs, context) -> invoker``: the loaded programs in the order
            of ``programs`` and a :class:`Context`; returns a callable that runs the problem
            given its tensors (device buffers) as keywords.
    """

    programs: Sequence[ProgramRequest]
    invoker_factory: InvokerFactory


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
    """One way to compute a primitive. Subclasses set ``id`` (stable, never reused), ``name`` and
    ``primitive``, and define :meth:`is_applicable` and :meth:`solution`; the primitive's
    ``SOLVERS`` lists them in priority order (a solver from outside kdbkit:
    ``REGISTRY.register(MySolver(), before=...)``)."""

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
    def solution(self, problem: "Problem", device: DeviceInfo | None) -> Solution:
        """The programs this solver launches for ``problem`` and the factory of its invoker.

        ``device`` is the device it will run on, or None where only the programs are asked
        (the offline builder, the catalogue): the programs must not depend on it (a bundle
        serves every device of its target); the factory reads the device from its context.
        """

    def programs(self, problem: "Problem") -> list[ProgramRequest]:
        """The kernel programs the invoker launches (what a bundle must hold for it): the
        solution's. A solver may define this instead and build its solution from it."""
        return list(self.solution(problem, None).programs)

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
    """Every solver, by id and by name; each primitive's solvers in priority order (the order
    immediate mode's heuristic tries them): the order they were registered in, unless a solver
    is registered ``before`` another."""

    def __init__(self) -> None:
        self._by_id: dict[int, Solver] = {}
        self._by_name: dict[str, Solver] = {}
        self._order: dict[str, list[Solver]] = {}  # primitive -> its solvers, in priority order

    def register(self, solver: Solver, *, before: "Solver | int | str | None" = None) -> Solver:
        """Add ``solver``, last in its primitive's priority order, or just before the solver
        ``before`` names (an instance, an id or a name).

        Raises:
            ValueError: the id or the name is taken (ids are never reused: a find-db names
                solvers by id), or ``before`` names no solver of the same primitive.
        """
        for key, table in ((solver.id, self._by_id), (solver.name, self._by_name)):
            if key in table:
                raise ValueError(f"solver {solver.name} ({solver.id}): {key!r} is already {table[key]!r}")
        order = self._order.setdefault(solver.primitive, [])
        at = len(order)
        if before is not None:
            anchor = before if isinstance(before, Solver) else self.find(before)
            if anchor is None or anchor not in order:
                raise ValueError(f"solver {solver.name}: {before!r} is no {solver.primitive} solver to go before")
            at = order.index(anchor)
        self._by_id[solver.id] = solver
        self._by_name[solver.name] = solver
        order.insert(at, solver)
        return solver

    def register_all(self, solvers: "Iterable[type[Solver]]") -> None:
        """Register one instance of each class, in the order given: a primitive's solvers in
        priority order (its ``solvers`` package's ``SOLVERS``)."""
        for cls in solvers:
            self.register(cls())

    def unregister(self, key: int | str) -> Solver:
        """Remove the solver with this id or name (a plug-in's, or a test's) and return it.

        Raises:
            KeyError: no such solver.
        """
        solver = self.find(key)
        if solver is None:
            raise KeyError(key)
        del self._by_id[solver.id], self._by_name[solver.name]
        self._order[solver.primitive].remove(solver)
        return solver

    def find(self, key: int | str) -> Solver | None:
        """The solver with this id (``3`` or ``"3"``) or name, or ``None``."""
        if isinstance(key, str) and key.strip().isdigit():
            key = int(key)
        return self._by_id.get(key) if isinstance(key, int) else self._by_name.get(key)

    def for_primitive(self, primitive: str) -> list[Solver]:
        """``primitive``'s solvers in priority order."""
        return list(self._order.get(primitive, ()))

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
    """Class decorator: put one instance of the solver in :data:`REGISTRY`, last in its
    primitive's order (kdbkit's own solvers are listed in each primitive's ``SOLVERS``)."""
    REGISTRY.register(cls())
    return cls


def _grid_1d(n: int, block: int, max_groups: int) -> tuple[int, int, int]:
    """Enough groups of ``block`` to cover ``n`` elements, capped (the kernels loop over the rest)."""
    return (max(1, min(max_groups, -(-n // block))), 1, 1)


def launch_1d(context: Context, kernel: Any, n: int, args: list, block: int = 256, max_groups: int = 4096) -> None:
    """Launch a grid-stride kernel over ``n`` elements: enough groups to cover them, capped."""
    context.backend.launch(kernel, _grid_1d(n, block, max_groups), (block, 1, 1), args)


def launcher_1d(context: Context, kernel: Any, n: int, args: list, block: int = 256, max_groups: int = 4096,
                groups_per_unit: int | None = None):
    """:func:`launch_1d` made once (``None`` where a buffer comes at run time): the returned
    function takes those buffers in order (Backend.launcher). ``groups_per_unit``: at most
    this many groups share a multiprocessor (:func:`residency_cap`)."""
    shared = residency_cap(context, kernel, block, groups_per_unit) if groups_per_unit else 0
    return context.backend.launcher(kernel, _grid_1d(n, block, max_groups), (block, 1, 1), args, shared_bytes=shared)


def residency_cap(context: Context, kernel: Any, block: int, groups: int) -> int:
    """Dynamic shared memory (bytes, unused by the kernel) with which at most ``groups`` groups
    of ``block`` threads share a multiprocessor: some streaming kernels run faster a little
    below full occupancy. 0 where the kernel already fits no more, or where the backend has no
    occupancy calculator to ask (only CUDA's is)."""
    if "occupancy" not in context.backend.capabilities:
        return 0
    resident = context.backend.resident_groups
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


def fallback_invoker(context: Context, problem: Any, solver_name: str) -> Callable[..., None]:
    """The invoker of another registered solver for the same problem, made by the dispatcher
    (its solution resolved through the caller's chain) on its first call: where a fast kernel
    cannot take a call (a tensor at an offset not 16-byte aligned). Named, so the fast
    solver's module need not import (and so register before it) the one it falls back on."""
    made: list = []

    def run(*args: Any, **kwargs: Any) -> None:
        if not made:
            made.append(context.caller_invoker(problem, solver_name))
        made[0](*args, **kwargs)

    return run


def aligned16(*buffers) -> bool:
    """Every buffer starts 16-byte aligned, so a kernel may access it as 16-byte vectors
    (OpenCL buffers carry no address and are always aligned far beyond that)."""
    for b in buffers:  # a loop, not all() over a generator: this runs on every launch of those invokers
        if int(getattr(b, "ptr", 0)) % 16:
            return False
    return True


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
