"""Solver gates read the typed arch (``Target.arch_facts``), never parse arch strings: every
solver's ``is_applicable`` and ``builds_for`` answer, without raising, for every arch the table
knows (with and without a CU count, with CUDA's ``a``/``f`` suffixes and AMD's target features)
and for well-spelled archs it does not know; an arch added through the table's registration
function reaches the gates with no edit to kdbkit's files."""

from __future__ import annotations

import pytest

from kdbkit.kdb.arch import ArchFacts, known_archs, register_arch, unregister_arch
from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.base import DeviceInfo
from kdbkit.runtime.primitives import load_all
from kdbkit.runtime.primitives.batchnorm import BatchNormProblem
from kdbkit.runtime.primitives.catalogue import catalogue_problems
from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.tensor import DataType

UNKNOWN_BUT_WELL_SPELLED = ("sm_130", "sm_130a", "sm_10", "gfx1250", "gfx000", "gfx1250:xnack-", "ocl-3f9a1c2b7d10")


def every_spelling() -> list[str]:
    """Each row's arch, its suffixed spellings, AMD archs with target features, and archs with no row."""
    spellings = []
    for row in known_archs():
        spellings += [row.name, *(row.name + s for s in row.suffixes)]
        if row.name.startswith("gfx"):
            spellings += [f"{row.name}:xnack-", f"{row.name}:sramecc+:xnack-"]
    return spellings + list(UNKNOWN_BUT_WELL_SPELLED)


def device(text: str) -> DeviceInfo:
    target = Target.parse(text)
    return DeviceInfo(target.backend, 0, f"a {target.arch} device", target, 16 << 30)


@pytest.fixture(scope="module")
def problems() -> list:
    load_all()
    return catalogue_problems()


@pytest.mark.parametrize("arch", every_spelling())
@pytest.mark.parametrize("cu", ["", "_132"])
def test_every_gate_answers_for_every_arch(arch, cu, problems):
    dev = device(arch + cu)
    assert Target.parse(str(dev.target)) == dev.target
    for problem in problems:
        for solver in REGISTRY.for_primitive(problem.primitive):
            verdict = solver.is_applicable(problem, dev)
            assert verdict.ok or verdict.reason, solver
            assert solver.builds_for(dev.target) in (True, False), solver


def test_the_persistent_batch_norm_takes_an_arch_specific_target():
    """sm_90a_132 is a legal target; the gate read ``int("90a")`` and raised ValueError."""
    load_all()
    solver = REGISTRY.find("BatchNormPersistent")
    shape, strides = (8, 64, 16, 16), (64 * 256, 256, 16, 1)
    problem = BatchNormProblem("train", "spatial", DataType.FP32, shape, strides, strides)
    assert solver.is_applicable(problem, device("sm_90a_132"))
    assert solver.is_applicable(problem, device("sm_90_132"))
    assert "sm_70 or later" in solver.is_applicable(problem, device("gfx942_304")).reason


@pytest.mark.parametrize("arch, applies", [("sm_90", True), ("sm_90a", True), ("sm_80", False), ("sm_100a", False),
                                           ("sm_120f", False), ("gfx942", False)])
def test_wgmma_applies_where_the_table_says_the_arch_has_it(arch, applies):
    load_all()
    solver, problem = REGISTRY.find("GemmWgmma"), _wgmma_problem()
    assert bool(solver.is_applicable(problem, device(arch + "_132"))) is applies
    assert solver.builds_for(Target.parse(arch)) is applies


def _wgmma_problem() -> GemmProblem:
    return GemmProblem(DataType.FP16, 256, 256, 256, lda=256, ldb=256, ldc=256)


def test_an_arch_added_through_the_table_reaches_the_solver_gates():
    """How to add an arch: one row. A made-up sm_130 with wgmma parses as a target, names its
    bundle, and the wgmma GEMM's gate and ``builds_for`` take it, as they refuse it without the row."""
    load_all()
    solver, problem = REGISTRY.find("GemmWgmma"), _wgmma_problem()
    assert "wgmma" in solver.is_applicable(problem, device("sm_130_200")).reason  # by rule: no wgmma
    register_arch(ArchFacts("sm_130", 32, 256 * 1024, frozenset({"mma.sync", "wgmma"}), ("a",), "Next"))
    try:
        target = Target.parse("sm_130a_200")
        assert (target.backend, target.arch, target.cu) == ("cuda", "sm_130a", 200)
        assert target.bundle_name() == "sm_130a_200.kdb"
        facts = target.arch_facts
        assert facts.known and facts.has("wgmma") and facts.at_least("sm_90") and facts.family == "Next"
        assert solver.builds_for(Target.parse("sm_130"))
        assert solver.is_applicable(problem, device("sm_130_200"))
        assert REGISTRY.find("GemmTensorCore").is_applicable(problem, device("sm_130a_200"))
    finally:
        unregister_arch("sm_130")
    assert not Target.parse("sm_130").arch_facts.known
    assert not solver.builds_for(Target.parse("sm_130"))
