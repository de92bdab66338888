"""Immediate mode: pick a solver for a problem without timing anything.

In order: the solver the caller asked for; else the find-db's best for the problem's config
string (a solver it names that no longer exists or applies is skipped with a log line); else
the heuristic, the registry's order, in which each primitive registers its specialised solvers
(packed, vectorised) before its general ones, passing over a solver that applies but says it
does not suit the problem (slow there) unless nothing else applies. The choice carries how it was made and a trace
with one accepted or rejected (reason) line per solver; when nothing applies the error prints
that trace.

The functions here are pure (problem, device, find-db ranking in; choice out); the handle's
:class:`~kdbkit.runtime.dispatcher.Dispatcher` calls them and keeps their answers.
:func:`choose` and :func:`invoker` are the dispatcher's, by handle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator

from kdbkit.runtime.errors import NoSolverError
from kdbkit.runtime.logging_setup import get_logger
from kdbkit.runtime.problem import Problem
from kdbkit.runtime.solver import REGISTRY, Invoker, Solver, enabled

if TYPE_CHECKING:
    from kdbkit.kdb.find_db import FindRecord
    from kdbkit.runtime.backends.base import DeviceInfo
    from kdbkit.runtime.handle import Handle

_log = get_logger(__name__)


@dataclass(frozen=True)
class Choice:
    """The solver picked for a problem, how (``asked``, ``find-db`` or ``heuristic``), and every solver's verdict."""

    solver: Solver
    how: str
    trace: tuple[str, ...]


def choose(handle: "Handle", problem: Problem, solver: int | str | None = None) -> Choice:
    """The solver for ``problem`` on ``handle`` (:meth:`Dispatcher.choose`): the one asked for,
    else the find-db's best, else the first that applies.

    Raises:
        NoSolverError: the solver asked for does not exist, is for another primitive or does
            not apply; or none applies (the message lists each solver's reason).
    """
    return handle.dispatcher.choose(problem, solver)


def invoker(handle: "Handle", problem: Problem, chosen: Solver) -> Invoker:
    """The invoker of ``chosen`` for ``problem`` on ``handle`` (:meth:`Dispatcher.invoker`)."""
    return handle.dispatcher.invoker(problem, chosen)


def asked(problem: Problem, device: "DeviceInfo", solver: int | str) -> Choice:
    """The solver the caller named (an id or a name), if it is ``problem``'s and applies.

    Raises:
        NoSolverError: it does not exist, is for another primitive, or does not apply.
    """
    chosen = REGISTRY.find(solver)
    if chosen is None or chosen.primitive != problem.primitive:
        names = ", ".join(f"{s.id} {s.name}" for s in REGISTRY.for_primitive(problem.primitive))
        raise NoSolverError(f"no {problem.primitive} solver {solver!r}", f"choose one of: {names}")
    verdict = chosen.is_applicable(problem, device)
    if not verdict:
        raise NoSolverError(f"solver {chosen.name} does not apply to {problem}: {verdict.reason}",
                            "choose another solver, or none to let kdbkit pick")
    return Choice(chosen, "asked", (f"{chosen.name}: asked for, applies",))


def heuristic(problem: Problem, device: "DeviceInfo",
              ranked: Iterable[tuple["FindRecord", Solver, str]]) -> Choice:
    """The best of the find-db's ``ranked`` solvers that is enabled, else the heuristic's.

    Raises:
        NoSolverError: none applies (the message lists each solver's reason).
    """
    for _, best, where in ranked:
        if enabled(best):
            return Choice(best, "find-db", (f"{best.name}: ranked first by the find-db ({where})",))
    trace, passed_over = [], None
    for candidate in REGISTRY.for_primitive(problem.primitive):
        if not enabled(candidate):
            trace.append(f"{candidate.name}: disabled by {candidate.switch.name}=0")
            continue
        verdict = candidate.is_applicable(problem, device)
        if not verdict:
            trace.append(f"{candidate.name}: rejected, {verdict.reason}")
            continue
        fit = candidate.suits(problem, device)
        if fit:
            trace.append(f"{candidate.name}: applies")
            return Choice(candidate, "heuristic", tuple(trace))
        trace.append(f"{candidate.name}: applies, passed over: {fit.reason}")
        passed_over = passed_over or candidate
    if passed_over is not None:  # slow, but the only one that computes it
        return Choice(passed_over, "heuristic", tuple(trace))
    raise NoSolverError(f"no solver applies to {problem}: " + "; ".join(trace),
                        "change the layout or type to one a solver supports (packed tensors always work), or "
                        "re-enable the solvers switched off")


def ranked(found: "tuple[list[FindRecord], str] | None", problem: Problem,
           device: "DeviceInfo") -> Iterator[tuple["FindRecord", Solver, str]]:
    """A find-db's ranking for ``problem`` (``found``: its records and where they came from,
    ``user``, ``cluster`` or a system find-db's path, or None), best first, as (record, solver, where). A
    solver this kdbkit lacks or that no longer applies is skipped with a log line; the rest are
    asked nothing until reached (immediate mode stops at the first). Here rather than in
    ``find``, so that a first call never imports the tuner."""
    if found is None:
        return
    records, where = found
    for record in records:
        solver = REGISTRY.find(record.solver_id)
        reason = None
        if solver is None or solver.primitive != problem.primitive:
            reason = "no such solver in this kdbkit"
        elif not (verdict := solver.is_applicable(problem, device)):
            reason = f"it no longer applies: {verdict.reason}"
        if reason:
            _log.info("find-db %s: skipping solver %s (%d) for %s: %s", where, record.solver, record.solver_id,
                      problem.config(), reason)
            continue
        yield record, solver, where
