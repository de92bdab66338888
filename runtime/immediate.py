"""Immediate mode: pick a solver for a problem without timing anything, and cache its invoker.

The choice is a pure function of the problem, the device and the registry, and returns a
trace with one accepted or rejected (reason) line per solver; when nothing applies the error
prints that trace. The heuristic is the registry's order: each primitive registers its
specialised solvers (packed, vectorised) before its general ones. (The find-db, when it holds
a ranking for the problem, will come first: issue 8's find step.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kdbkit.runtime.errors import NoSolverError
from kdbkit.runtime.problem import Problem
from kdbkit.runtime.solver import REGISTRY, Invoker, Solver

if TYPE_CHECKING:
    from kdbkit.runtime.handle import Handle


@dataclass(frozen=True)
class Choice:
    """The solver picked for a problem, how (``heuristic`` or ``asked``), and every solver's verdict."""

    solver: Solver
    how: str
    trace: tuple[str, ...]


def choose(problem: Problem, device, solver: int | str | None = None) -> Choice:
    """The solver for ``problem`` on ``device``: the one asked for, else the first that applies.

    Raises:
        NoSolverError: the solver asked for does not exist, is for another primitive or does
            not apply; or none applies (the message lists each solver's reason).
    """
    candidates = REGISTRY.for_primitive(problem.primitive)
    if solver is not None:
        chosen = REGISTRY.find(solver)
        if chosen is None or chosen.primitive != problem.primitive:
            names = ", ".join(f"{s.id} {s.name}" for s in candidates)
            raise NoSolverError(f"no {problem.primitive} solver {solver!r}", f"choose one of: {names}")
        verdict = chosen.is_applicable(problem, device)
        if not verdict:
            raise NoSolverError(f"solver {chosen.name} does not apply to {problem}: {verdict.reason}",
                                "choose another solver, or none to let kdbkit pick")
        return Choice(chosen, "asked", (f"{chosen.name}: asked for, applies",))
    trace = []
    for candidate in candidates:
        verdict = candidate.is_applicable(problem, device)
        trace.append(f"{candidate.name}: " + ("applies" if verdict else f"rejected, {verdict.reason}"))
        if verdict:
            return Choice(candidate, "heuristic", tuple(trace))
    raise NoSolverError(f"no solver applies to {problem}: " + "; ".join(trace),
                        "change the layout or type to one a solver supports (packed tensors always work)")


def invoker(handle: "Handle", problem: Problem, chosen: Solver) -> Invoker:
    """The invoker of ``chosen`` for ``problem``, built once per (config string, solver id) and handle."""
    key = (problem.config(), chosen.id)
    cached = handle.invokers.get(key)
    if cached is None:
        cached = handle.invokers[key] = chosen.invoker(handle, problem)
    return cached
