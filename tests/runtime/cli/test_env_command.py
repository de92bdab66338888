"""``kdb env``: every variable once, with one meaning, and a warning for a setting that names nothing."""

from __future__ import annotations

import json
import os

import pytest


@pytest.fixture(autouse=True)
def no_kdb_settings(monkeypatch):
    for name in [n for n in os.environ if n.startswith("KDB_")]:
        monkeypatch.delenv(name)


def test_every_variable_is_listed_once(kdb):
    code, out, _ = kdb("env", "--json")
    names = [v["name"] for v in json.loads(out)["variables"]]
    assert code == 0 and sorted(n for n in set(names) if names.count(n) > 1) == []
    assert "KDB_DEBUG_CONV_FFT" not in names
    meaning = {v["name"]: v["meaning"] for v in json.loads(out)["variables"]}
    assert "ConvImplicitGemm (" in meaning["KDB_DEBUG_CONV_IMPLICIT_GEMM"]  # the solver's own switch, which is read


@pytest.mark.parametrize("value, hint", [("999", ""), ("SoftmaxLane", "did you mean SoftmaxLanes? ")])
def test_find_only_solver_naming_no_solver_is_warned(kdb, monkeypatch, value, hint):
    monkeypatch.setenv("KDB_DEBUG_FIND_ONLY_SOLVER", value)
    code, out, err = kdb("env", "--set")
    warning = f"warning: KDB_DEBUG_FIND_ONLY_SOLVER={value!r}: no solver has that id or name, so find refuses every "
    assert code == 0 and warning in err and f"problem; {hint}give a solver id (" in err
    assert err.count("KDB_DEBUG_FIND_ONLY_SOLVER") == 1
    code, out, _ = kdb("env", "--json")
    assert warning.removeprefix("warning: ") in json.loads(out)["warnings"][0]


@pytest.mark.parametrize("value", ["14", "SoftmaxLanes"])
def test_find_only_solver_naming_a_solver_is_quiet(kdb, monkeypatch, value):
    monkeypatch.setenv("KDB_DEBUG_FIND_ONLY_SOLVER", value)
    code, _, err = kdb("env", "--set")
    assert code == 0 and not err
