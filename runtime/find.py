"""Find: time every applicable solver of a problem, rank them, and keep the ranking in the find-db.

``find_solutions`` first asks the find-db: a ranking recorded by an earlier process (or shipped
beside the bundles) is returned as it is, so a second process with the same problem compiles
nothing and times nothing; with a cluster tier, so is one another node found and shared
(``kdbkit.runtime.shared_rankings``). Otherwise each applicable solver's invoker is built (its
programs resolved through the lookup chain, as any launch) and timed on scratch tensors of the
problem's shapes, and the ranking is written to the user find-db and shared with the cluster.

Filtering follows MIOpen's switches with the ``KDB_`` prefix: ``KDB_DEBUG_FIND_ONLY_SOLVER``
(an id or a name) restricts find to one solver, and each solver's ``KDB_DEBUG_<NAME>=0``
excludes it. Both narrow what find records, which a warning says; a narrowed ranking is kept
in the user find-db only, never shared with the cluster (a debugging switch on one node must
not choose for every other).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from kdbkit.kdb.find_db import FindRecord
from kdbkit.runtime import env
from kdbkit.runtime.errors import HandleClosedError, NoSolverError, ProblemError
from kdbkit.runtime.logging_setup import get_logger, warn_once
from kdbkit.runtime.problem import Problem, parse_config
from kdbkit.runtime.solver import REGISTRY, Solver, enabled

if TYPE_CHECKING:
    from kdbkit.runtime.handle import Handle

_log = get_logger(__name__)
SORT_KEYS = ("time", "workspace")


@dataclass(frozen=True)
class Solution:
    """A solver's result for a problem: its time, its workspace, and where the figure came from."""

    problem: Problem
    solver_id: int
    solver: str
    time_ms: float
    workspace: int
    source: str  # "timed", "user" (the user find-db), "cluster" (shared by another node) or a system find-db's path


def find_solutions(handle: "Handle", problem: Problem | str, *, sort_by: str = "time", repeat: int = 3,
                   fresh: bool = False) -> list[Solution]:
    """Every applicable solver of ``problem``, best first.

    Args:
        problem: a problem, or its config string (as the find-db and the log lines
            name it).
        sort_by: ``time`` (fastest first) or ``workspace`` (smallest first, then fastest).
        repeat: launches per timing (after one warm-up launch).
        fresh: time again even when the find-db has a ranking.

    Raises:
        NoSolverError: no solver applies, or ``KDB_DEBUG_FIND_ONLY_SOLVER`` names an unknown
            solver or one that does not apply.
        ProblemError: ``problem`` is neither a problem nor a config string that parses.
        HandleClosedError: the handle is closed.
    """
    problem = _as_problem(problem)
    if handle.closed:
        raise HandleClosedError()
    if sort_by not in SORT_KEYS:
        raise ProblemError(f"sort_by={sort_by!r} is not a way to rank solutions", f"use one of {', '.join(SORT_KEYS)}")
    if not fresh:
        recorded = recorded_solutions(handle, problem)
        if recorded:
            return _sorted(recorded, sort_by)
    solvers, narrowed = _candidates(problem, handle.device)
    scratch = _scratch(handle, problem)
    try:
        timed = [_time(handle, problem, s, scratch, repeat) for s in solvers]
    finally:
        for buffer in scratch.values():
            buffer.free()
    ranked = _sorted(timed, "time")
    records = [FindRecord(s.solver_id, s.solver, rank, s.time_ms, s.workspace) for rank, s in enumerate(ranked)]
    handle.dispatcher.record(problem, records, share=not narrowed)  # immediate mode reads it next time
    return _sorted(timed, sort_by)


def _as_problem(problem: Any) -> Problem:
    """A problem, or the one its config string names."""
    if isinstance(problem, Problem):
        return problem
    if isinstance(problem, str):
        return parse_config(problem)
    raise ProblemError(f"find_solutions takes a problem or its config string, not {type(problem).__name__} "
                       f"{problem!r}", "pass a problem (kdbkit.parse_config(...) makes one) or its config string")


def recorded_solutions(handle: "Handle", problem: Problem) -> list[Solution]:
    """The find-db's ranking for ``problem``, without the solvers that no longer exist or apply."""
    return list(iter_recorded_solutions(handle, problem))


def iter_recorded_solutions(handle: "Handle", problem: Problem) -> Iterator[Solution]:
    """:func:`recorded_solutions` one at a time, best first (the dispatcher's ranking)."""
    for record, solver, where in handle.dispatcher.ranked(problem):
        yield Solution(problem, solver.id, solver.name, record.time_ms, record.workspace, where)


def run_solution(handle: "Handle", solution: Solution, **tensors: Any) -> None:
    """Run one solution's invoker on device buffers (or device tensors) named as the problem names them.

    Raises:
        HandleClosedError: the handle is closed. NoSolverError: the solution's solver is gone.
    """
    if handle.closed:
        raise HandleClosedError()
    solver = REGISTRY.find(solution.solver_id)
    if solver is None:
        raise NoSolverError(f"solution names solver {solution.solver_id}, which this kdbkit lacks",
                            "run find_solutions again")
    buffers = {name: getattr(t, "buffer", t) for name, t in tensors.items()}
    handle.dispatcher.invoker(solution.problem, solver)(**buffers)


def _candidates(problem: Problem, device) -> tuple[list[Solver], bool]:
    """The solvers find times for ``problem``, and whether a switch narrowed them."""
    solvers = REGISTRY.for_primitive(problem.primitive)
    only = env.get_str("KDB_DEBUG_FIND_ONLY_SOLVER")
    if only:
        chosen = REGISTRY.find(only)
        if chosen is None or chosen.primitive != problem.primitive:
            names = ", ".join(f"{s.id} {s.name}" for s in solvers)
            raise NoSolverError(f"KDB_DEBUG_FIND_ONLY_SOLVER={only!r} names no {problem.primitive} solver",
                                f"unset it, or name one of: {names}")
        verdict = chosen.is_applicable(problem, device)
        if not verdict:
            raise NoSolverError(f"KDB_DEBUG_FIND_ONLY_SOLVER={only}: {chosen.name} does not apply to {problem}: "
                                f"{verdict.reason}", "unset it, or choose a solver that applies")
        _warn_narrowed(f"KDB_DEBUG_FIND_ONLY_SOLVER={only}")
        return [chosen], True
    disabled = [s for s in solvers if not enabled(s)]
    if disabled:
        _warn_narrowed(", ".join(f"{s.switch.name}=0" for s in disabled))
    trace, applicable = [], []
    for solver in solvers:
        if solver in disabled:
            trace.append(f"{solver.name}: disabled by {solver.switch.name}")
            continue
        verdict = solver.is_applicable(problem, device)
        trace.append(f"{solver.name}: " + ("applies" if verdict else f"rejected, {verdict.reason}"))
        if verdict:
            applicable.append(solver)
    if not applicable:
        raise NoSolverError(f"no solver applies to {problem}: " + "; ".join(trace),
                            "change the layout or type, or re-enable the solvers switched off")
    return applicable, bool(disabled)


def _warn_narrowed(what: str) -> None:
    warn_once(f"find-narrowed:{what}", f"{what}: find times only the solvers left, and the find-db records that "
              "narrowed ranking; unset it and run find again for the full one", logger=_log)


def _scratch(handle: "Handle", problem: Problem) -> dict[str, Any]:
    """Device tensors of the problem's shapes, filled with small random values (inputs) or zeros."""
    rng = np.random.default_rng(0)
    buffers = {}
    for name, desc in problem.tensors().items():
        host = (rng.standard_normal(desc.span) * 0.5).astype(np.float32)
        if desc.dtype.label == "fp16":
            host = host.astype(np.float16)
        elif desc.dtype.label == "bf16":
            host = (host.view(np.uint32) >> 16).astype(np.uint16)
        buffers[name] = handle.backend.to_device(host)
    return buffers


def _time(handle: "Handle", problem: Problem, solver: Solver, scratch: dict[str, Any], repeat: int) -> Solution:
    # Each candidate's own invoker, its workspace freed once timed: kept, every solver's staging
    # of every problem found would stay allocated (a set of hundreds ran a GPU out of memory).
    with handle.dispatcher.scratch_invoker(problem, solver) as run:
        run(**scratch)  # warm-up: first-launch costs are not the solver's
        ms = handle.backend.time_ms(lambda: run(**scratch), repeat=repeat)
    _log.info("find %s: %s %.4f ms", problem.config(), solver.name, ms)
    return Solution(problem, solver.id, solver.name, ms, solver.workspace(problem), "timed")


def _sorted(solutions: list[Solution], sort_by: str) -> list[Solution]:
    if sort_by == "workspace":
        return sorted(solutions, key=lambda s: (s.workspace, s.time_ms, s.solver_id))
    return sorted(solutions, key=lambda s: (s.time_ms, s.solver_id))
