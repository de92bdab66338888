"""KDB_CHECK_NUMERICS on primitive calls, and the solver registry's stable ids."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import NumericsError
from kdbkit.runtime.primitives import load_all
from kdbkit.runtime.solver import REGISTRY, SolverRegistry

# Solver ids that kdbkit has shipped: a find-db names solvers by id, so a shipped id keeps its
# solver for good (a retired solver leaves its id unused). A new solver takes a free id and
# need not be added here: each primitive lists its solvers in one place (its SOLVERS).
SHIPPED = {1: "ActivPacked", 2: "ActivStrided", 3: "SoftmaxThread", 4: "SoftmaxBlock", 5: "OpTensorPacked",
           6: "OpTensorStrided", 7: "LayerNormBlock", 8: "PoolDirect", 9: "BatchNormBlock",
           10: "GemmTiled", 11: "GemmTensorCore", 12: "SoftmaxRows",
           13: "BatchNormSplit", 14: "SoftmaxLanes", 15: "LayerNormLanes", 16: "GemmWgmma", 17: "PoolBand", 18: "PoolStrip",
           19: "BatchNormPersistent", 20: "ConvDirect", 21: "ConvIm2colGemm",
           22: "ConvImplicitGemmTensorCore", 23: "ConvWrwImplicitGemmTensorCore",
           24: "ConvDepthwise", 25: "ConvImplicitGemmMfma",
           26: "ConvBias", 27: "ConvWinogradF2x3", 28: "ConvImplicitGemm",
           29: "GemmBlocked"}


def test_a_shipped_id_keeps_its_solver():
    load_all()
    moved = {i: (name, REGISTRY.find(i).name) for i, name in SHIPPED.items()
             if REGISTRY.find(i) is not None and REGISTRY.find(i).name != name}
    assert moved == {}
    assert all(REGISTRY.find(name) is None or REGISTRY.find(name).id == i for i, name in SHIPPED.items())


def _solver_lists() -> dict[str, tuple]:
    """Every primitive module's ``SOLVERS`` (each primitive's one list, in priority order)."""
    load_all()
    return {name: module.SOLVERS for name, module in list(sys.modules.items())
            if name.startswith("kdbkit.runtime.primitives.") and isinstance(getattr(module, "SOLVERS", None), tuple)}


def test_each_primitive_registers_its_one_list_of_solvers_in_its_order():
    lists = _solver_lists()
    listed = [cls for solvers in lists.values() for cls in solvers]
    assert sorted(s.id for s in REGISTRY) == sorted(cls.id for cls in listed)  # all registered, each once
    for module, solvers in lists.items():
        primitive = solvers[0].primitive
        assert {cls.primitive for cls in solvers} == {primitive}, module
        assert [type(s) for s in REGISTRY.for_primitive(primitive)] == list(solvers), module


def test_an_id_or_name_cannot_be_taken_twice():
    registry = SolverRegistry()
    first = REGISTRY.find(1)
    registry.register(first)
    with pytest.raises(ValueError, match="already"):
        registry.register(first)


def test_clean_tensors_pass_silently(handle, monkeypatch, caplog):
    monkeypatch.setenv("KDB_CHECK_NUMERICS", "0x06")  # warn + throw
    with caplog.at_level("WARNING", logger="kdbkit"):
        kdbkit.activation_forward(handle, np.linspace(-1, 1, 50, dtype=np.float32), "tanh", alpha=1, beta=1)
    assert "check numerics" not in caplog.text


def test_inform_and_stats_report_every_tensor(handle, monkeypatch, caplog):
    monkeypatch.setenv("KDB_CHECK_NUMERICS", str(0x01 | 0x10))
    with caplog.at_level("WARNING", logger="kdbkit"):
        kdbkit.activation_forward(handle, np.array([-1, 2, 3], np.float32), "relu")
    assert ": x (input) ok" in caplog.text and ": y (output) ok" in caplog.text
    assert "y (output) mean 1.66667, absmean 1.66667, min 0, max 3" in caplog.text


@pytest.mark.parametrize("values, words", [([np.nan, 1.0], "NaN"), ([np.inf, 1.0], "inf"), ([0.0, 0.0], "all zeros")])
def test_warn_reports_abnormal_inputs(handle, monkeypatch, caplog, values, words):
    monkeypatch.setenv("KDB_CHECK_NUMERICS", "2")
    with caplog.at_level("WARNING", logger="kdbkit"):
        kdbkit.activation_forward(handle, np.array(values, np.float32), "abs")
    assert f"x (input) {words}" in caplog.text


def test_throw_raises_naming_the_tensor(handle, monkeypatch):
    monkeypatch.setenv("KDB_CHECK_NUMERICS", "4")
    x = np.array([1.0, -2.0], np.float32)
    with pytest.raises(NumericsError, match=r"dy \(input\)|input dy has NaN"):
        kdbkit.activation_backward(handle, x, x, np.array([np.nan, 1.0], np.float32), "relu")
    with pytest.raises(NumericsError, match="output y has all zeros"):
        kdbkit.activation_forward(handle, np.array([-1.0, -2.0], np.float32), "relu")


def test_abort_ends_the_process(handle, tmp_path):
    child = ("import numpy as np, kdbkit\n"
             "with kdbkit.Handle() as h:\n"
             "    kdbkit.activation_forward(h, np.array([float('nan')], np.float32), 'relu')\n")
    env = {**os.environ, "KDB_CHECK_NUMERICS": "8", "KDB_BACKEND": handle.device.backend}
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "aborting" in proc.stderr
