"""The dispatcher: a solver added from outside kdbkit's tree, the caches it alone keeps, and the
solvers' declared solutions, on the chain device (PoCL in CI)."""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.primitives.catalogue import catalogue_problems
from kdbkit.runtime.primitives.softmax import SoftmaxProblem
from kdbkit.runtime.reference import softmax as softmax_ref
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.tensor import DataType

TOY_ID = 9001  # no shipped solver's: ids are never reused

# A solver as a library outside kdbkit would write one: it reuses kdbkit's softmax.c and its
# block kernel, with a launch of its own (three groups striding over the rows), and declares
# its solution; the dispatcher resolves its program and calls its factory.
TOY_MODULE = '''
import numpy as np

from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, REGISTRY, Solution, Solver, not_applicable

ALGORITHMS = ("fast", "accurate", "log")


class ToySoftmax(Solver):
    id = TOY_ID
    name = "ToySoftmax"
    primitive = "softmax"

    def is_applicable(self, problem, device):
        if problem.direction != "fwd" or problem.dtype.label != "fp32":
            return not_applicable("it computes fp32 forward passes only")
        return APPLIES

    def solution(self, problem, device):
        n, c, h, w = problem.shape

        def invoker_factory(programs, context):
            (softmax,) = programs
            tail = [*(np.int32(v) for v in (n, c, h, w, problem.mode == "channel")),
                    *(np.int32(s) for s in problem.x_strides), *(np.int32(s) for s in problem.y_strides),
                    np.int32(ALGORITHMS.index(problem.algorithm)), np.float32(problem.alpha),
                    np.float32(problem.beta)]
            run = context.backend.launcher(softmax.function("softmax_fwd_block"), (3, 1, 1), (256, 1, 1),
                                           [None, None, *tail])
            return lambda x, y: run(x, y)

        return Solution([ProgramRequest("softmax.c", problem.dtype.options)], invoker_factory)


def install(before=None):
    return REGISTRY.register(ToySoftmax(), before=before)
'''.replace("TOY_ID", str(TOY_ID))


@pytest.fixture
def toy(tmp_path):
    """The toy solver's module, written to a folder of its own and imported from there; its
    ``install(before=None)`` registers the solver (undone after the test)."""
    path = tmp_path / "toy_softmax_solver.py"
    path.write_text(textwrap.dedent(TOY_MODULE))
    spec = importlib.util.spec_from_file_location("toy_softmax_solver", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not any(Path(module.__file__).is_relative_to(root) for root in _kdbkit_folders())
    yield module
    if REGISTRY.find(TOY_ID) is not None:
        REGISTRY.unregister(TOY_ID)
    sys.modules.pop("toy_softmax_solver", None)


def _kdbkit_folders() -> list[Path]:
    """The folders of kdbkit's import packages (installed, or a checkout's)."""
    return [Path(importlib.import_module(name).__file__).resolve().parent
            for name in ("kdbkit", "kdbkit.kdb", "kdbkit.runtime", "kdbkit.packager")]


def _problem(shape=(5, 3, 4, 7)) -> SoftmaxProblem:
    n, c, h, w = shape
    strides = (c * h * w, h * w, w, 1)
    return SoftmaxProblem("fwd", "accurate", "instance", DataType.FP32, shape, strides, strides)


def test_a_solver_from_outside_kdbkit_is_asked_for_chosen_first_and_found(toy, make_handle):
    x = np.random.default_rng(5).standard_normal((5, 3, 4, 7)).astype(np.float32)
    want = softmax_ref.forward(x, "accurate", "instance")
    toy.install()
    handle = make_handle()
    # Asked for by id: immediate mode takes it and the dispatcher makes its invoker.
    np.testing.assert_allclose(kdbkit.softmax_forward(handle, x, mode="instance", solver=TOY_ID), want, rtol=1e-5, atol=1e-6)
    assert (_problem().config(), TOY_ID) in handle.dispatcher.invokers
    # Registered last, the heuristic still picks a shipped solver.
    assert handle.dispatcher.choose(_problem()).solver.id != TOY_ID

    # Placed first in softmax's priority order: the heuristic picks it.
    REGISTRY.unregister(TOY_ID)
    toy.install(before=REGISTRY.for_primitive("softmax")[0])
    assert REGISTRY.for_primitive("softmax")[0].id == TOY_ID
    handle = make_handle()
    choice = handle.dispatcher.choose(_problem())
    assert choice.how == "heuristic" and choice.solver.id == TOY_ID and choice.trace == ("ToySoftmax: applies",)
    np.testing.assert_allclose(kdbkit.softmax_forward(handle, x, mode="instance"), want, rtol=1e-5, atol=1e-6)

    # Find times it with the shipped solvers and ranks it.
    solutions = kdbkit.find_solutions(handle, _problem(), fresh=True)
    assert TOY_ID in {s.solver_id for s in solutions} and len(solutions) > 1
    toy_solution = next(s for s in solutions if s.solver_id == TOY_ID)
    assert toy_solution.solver == "ToySoftmax" and toy_solution.time_ms > 0
    y = kdbkit.DeviceTensor.empty(handle.backend, kdbkit.TensorDesc(DataType.FP32, x.shape, _problem().y_strides))
    kdbkit.run_solution(handle, toy_solution, x=handle.backend.to_device(x), y=y)
    np.testing.assert_allclose(y.to_host(handle.backend), want, rtol=1e-5, atol=1e-6)


def test_the_registry_refuses_a_reused_id_and_an_unknown_anchor(toy):
    toy.install()
    with pytest.raises(ValueError, match="already"):
        toy.install()
    REGISTRY.unregister(TOY_ID)
    with pytest.raises(ValueError, match="no softmax solver to go before"):
        toy.install(before="GemmTiled")
    assert REGISTRY.find(TOY_ID) is None


def test_every_solver_s_programs_are_its_solution_s():
    """The builder and the catalogue read ``programs``; the dispatcher resolves the solution's."""
    checked = 0
    for problem in catalogue_problems():
        for solver in REGISTRY.for_primitive(problem.primitive):
            solution = solver.solution(problem, None)
            assert list(solution.programs) == solver.programs(problem), (solver.name, problem.config())
            assert callable(solution.invoker_factory)
            checked += 1
    assert checked >= len(list(REGISTRY))


def test_find_forgets_the_choice_it_ranked_anew(make_handle):
    handle = make_handle()
    problem = _problem()
    before = handle.dispatcher.choose(problem)
    assert handle.dispatcher.choices[problem.config()] is before
    solutions = kdbkit.find_solutions(handle, problem, fresh=True)
    assert problem.config() not in handle.dispatcher.choices
    after = handle.dispatcher.choose(problem)
    assert after.how == "find-db" and after.solver.id == solutions[0].solver_id


# Assignments to a handle's attributes (``handle.x = ``, ``handle.x[k] = ``) or calls that change
# one in place (``handle.x.pop(``...), in any module: the dispatcher's caches are the only ones.
_WRITES_INTO_HANDLE = re.compile(
    r"\bhandle\.\w+(\[[^]\n]*\])?\s*(=|\+=|-=|\|=)(?!=)|\bhandle\.\w+\.(pop|clear|update|setdefault|append)\(|"
    r"\bsetattr\(handle\b")


def test_no_module_writes_into_a_handle():
    offenders, scanned = [], 0
    for root in _kdbkit_folders():
        for path in sorted(root.rglob("*.py")):
            scanned += 1
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if _WRITES_INTO_HANDLE.search(line.split("#")[0]):
                    offenders.append(f"{path}:{number}: {line.strip()}")
    assert offenders == [] and scanned > 50
    assert _WRITES_INTO_HANDLE.search("handle.choices[config] = choice")  # the pattern catches what it must
    assert _WRITES_INTO_HANDLE.search("handle.choices.pop(config, None)")
    assert not _WRITES_INTO_HANDLE.search("if handle.device == other:")
