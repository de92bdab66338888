"""Run one problem the way MIOpenDriver does: random inputs, the solver, a timing, a verification.

The problem runs once through :func:`kdbkit.runtime.primitives.invoke.invoke` (the path every
primitive call takes, so KDB_CHECK_NUMERICS and KDB_ENABLE_LOGGING_CMD apply), its outputs are
read back, then, with ``-t 1``, the chosen solver's invoker is timed between device events over
``-i`` launches (after the outputs were read, so a beta that reads them does not disturb the
check), and the outputs are compared with the NumPy reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Callable

import numpy as np

from kdbkit.runtime.driver import lines
from kdbkit.runtime.driver.spec import DriverSpec
from kdbkit.runtime.driver.tensors import HostTensors, check_fits
from kdbkit.runtime.driver.verify import max_error
from kdbkit.runtime.find import find_solutions
from kdbkit.runtime.immediate import invoker
from kdbkit.runtime.primitives.invoke import invoke
from kdbkit.runtime.problem import Problem

if TYPE_CHECKING:
    from kdbkit.runtime.handle import Handle


@dataclass
class Outcome:
    """What one problem's run printed, for callers that want the figures."""

    problem: Problem
    solver: str
    how: str
    time_ms: float | None = None
    error: float | None = None
    tolerance: float | None = None
    ok: bool = True


def run_problem(handle: "Handle", spec: DriverSpec, problem: Problem, o: SimpleNamespace,
                emit: Callable[[str], None]) -> Outcome:
    """Run, time and verify ``problem`` as the resolved options ``o`` ask; print with ``emit``."""
    emit(lines.problem(problem))
    check_fits(problem.tensors(), handle.device.name, handle.device.memory_bytes)
    host = HostTensors(problem.tensors(), np.random.default_rng(o.seed))
    spec.prepare(problem, host)
    outputs, unused = spec.outputs(problem), spec.unused(problem)
    backend = handle.backend
    buffers = {name: backend.to_device(flat) for name, flat in host.flat.items()}
    try:
        asked, how = _solver(handle, problem, o.solver, emit)
        descs = host.descs
        group = lambda names: {n: (buffers[n], descs[n]) for n in names}
        choice = invoke(handle, problem, asked, group(n for n in descs if n not in outputs and n not in unused),
                        group(outputs), group(unused) or None)
        outcome = Outcome(problem, choice.solver.name, how or choice.how)
        emit(lines.solver(choice.solver.name, choice.solver.id, outcome.how))
        results = {n: backend.to_host(buffers[n], np.empty_like(host.flat[n])) for n in outputs}
        exact = {n: backend.to_host(buffers[n], np.empty_like(host.flat[n])) for n in spec.exact(problem, host)}
        if o.time:
            run = invoker(handle, problem, choice.solver)
            outcome.time_ms = backend.time_ms(lambda: run(**buffers), repeat=o.iterations)
            emit(lines.elapsed(spec.timing_title(problem), outcome.time_ms))
            for line in spec.stats(problem, outcome.time_ms):
                emit(line)
        if o.verify:
            _verify(spec, problem, host, results, o, outcome, emit, exact)
        return outcome
    finally:
        for buffer in buffers.values():
            buffer.free()


def _solver(handle: "Handle", problem: Problem, solver: str | None, emit) -> tuple[int | str | None, str | None]:
    """(the solver to ask invoke for, how it was chosen) from ``-S``; None, None for immediate mode."""
    if solver is None or solver.strip() == "0":
        return None, None
    if solver.strip() == "-1":
        found = find_solutions(handle, problem)
        emit(lines.find(found))
        return found[0].solver_id, "find"
    return solver.strip(), "asked"


def _verify(spec: DriverSpec, problem: Problem, host: HostTensors, results: dict[str, np.ndarray],
            o: SimpleNamespace, outcome: Outcome, emit, exact: dict[str, np.ndarray]) -> None:
    expected = spec.reference(problem, host)
    tolerance = o.tolerance if o.tolerance is not None else spec.tolerance(problem)
    error, overwritten = 0.0, []
    for name, flat in results.items():
        error = max(error, max_error(host.values_of(name, flat), expected[name]))
        changed = host.gaps_changed(name, flat)
        if changed:
            overwritten.append(f"{changed} elements of {name} between its strides")
    for name, wanted in spec.exact(problem, host).items():
        got = exact[name].view(wanted.dtype).reshape(wanted.shape)
        wrong = int(np.count_nonzero(got != wanted))
        if wrong:
            overwritten.append(f"{wrong} of {wanted.size} {name} unlike the reference's")
    outcome.error, outcome.tolerance = error, tolerance
    outcome.ok = error <= tolerance and not overwritten
    emit(lines.verdict(spec.title(problem), error, tolerance, overwritten))
