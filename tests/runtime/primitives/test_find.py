"""Find, the find-db and immediate mode, on the chain device (PoCL in CI)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from kdbkit.kdb.find_db import FindDb, FindRecord
from kdbkit.runtime.errors import NoSolverError, ProblemError
from kdbkit.runtime.find import find_solutions, recorded_solutions, run_solution
from kdbkit.runtime.immediate import choose
from kdbkit.runtime.primitives.activation import ActivationMode, ActivationProblem
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc

PACKED = ActivationProblem("fwd", ActivationMode.GELU_ERF, DataType.FP32, (64, 33), (33, 1), (33, 1))
STRIDED = ActivationProblem("fwd", ActivationMode.RELU, DataType.FP32, (4, 5), (8, 1), (5, 1))


def _user_file(isolated, handle):
    return isolated / "userdb" / handle.find_db.user_path.name


def test_find_times_every_applicable_solver_and_records_the_ranking(handle, isolated):
    solutions = find_solutions(handle, PACKED)
    assert [s.solver for s in solutions] and {s.solver for s in solutions} == {"ActivPacked", "ActivStrided"}
    assert all(s.source == "timed" and s.time_ms > 0 and s.workspace == 0 for s in solutions)
    assert solutions == sorted(solutions, key=lambda s: s.time_ms)
    rows = sqlite3.connect(_user_file(isolated, handle)).execute(
        "SELECT solver, rank FROM find_db WHERE config = ? ORDER BY rank", (PACKED.config(),)).fetchall()
    assert rows == [(s.solver, i) for i, s in enumerate(solutions)]
    # Immediate mode now follows the ranking, and says so.
    choice = choose(handle, PACKED)
    assert choice.how == "find-db" and choice.solver.name == solutions[0].solver


def test_a_recorded_ranking_is_returned_without_compiling_or_timing(make_handle, isolated, monkeypatch):
    first = find_solutions(make_handle(), PACKED)
    handle = make_handle()
    monkeypatch.setattr(type(handle.backend), "time_ms", lambda *a, **k: pytest.fail("timed again"))
    monkeypatch.setattr(type(handle), "program", lambda *a, **k: pytest.fail("compiled again"))
    again = find_solutions(handle, PACKED)
    assert [(s.solver, s.time_ms) for s in again] == [(s.solver, s.time_ms) for s in first]
    assert {s.source for s in again} == {"user"}


def test_a_second_process_compiles_nothing_and_times_nothing(handle, isolated):
    find_solutions(handle, PACKED)
    child = """
import json, kdbkit
from kdbkit.runtime.find import find_solutions
from kdbkit.runtime.problem import parse_config
calls = {"program": 0, "time": 0}
with kdbkit.Handle() as h:
    real_program, real_time = type(h).program, type(h.backend).time_ms
    def program(self, *a, **k):
        calls["program"] += 1
        return real_program(self, *a, **k)
    def time_ms(self, *a, **k):
        calls["time"] += 1
        return real_time(self, *a, **k)
    type(h).program, type(h.backend).time_ms = program, time_ms
    found = find_solutions(h, parse_config(CONFIG))
    print(json.dumps({"calls": calls, "sources": sorted({s.source for s in found})}))
""".replace("CONFIG", repr(PACKED.config()))
    env = {**os.environ, "KDB_BACKEND": handle.device.backend}
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"calls": {"program": 0, "time": 0}, "sources": ["user"]}


def test_records_of_missing_or_inapplicable_solvers_are_skipped_with_a_log_line(handle, caplog):
    handle.find_db.store(STRIDED.config(), [FindRecord(999, "GoneInAnUpgrade", 0, 0.1, 0),
                                            FindRecord(1, "ActivPacked", 1, 0.2, 0),
                                            FindRecord(2, "ActivStrided", 2, 0.3, 0)])
    with caplog.at_level("INFO", logger="kdbkit"):
        kept = recorded_solutions(handle, STRIDED)
    assert [s.solver for s in kept] == ["ActivStrided"]
    text = caplog.text
    assert "skipping solver GoneInAnUpgrade (999)" in text and "no such solver" in text
    assert "skipping solver ActivPacked (1)" in text and "no longer applies: the tensors are not packed" in text
    assert choose(handle, STRIDED).solver.name == "ActivStrided"


def test_find_only_solver(handle, monkeypatch, caplog):
    monkeypatch.setenv("KDB_DEBUG_FIND_ONLY_SOLVER", "ActivStrided")
    with caplog.at_level("WARNING", logger="kdbkit"):
        only = find_solutions(handle, PACKED, fresh=True)
    assert [s.solver for s in only] == ["ActivStrided"]
    assert "narrowed ranking" in caplog.text
    monkeypatch.setenv("KDB_DEBUG_FIND_ONLY_SOLVER", "Nope")
    with pytest.raises(NoSolverError, match="KDB_DEBUG_FIND_ONLY_SOLVER='Nope' names no activ solver"):
        find_solutions(handle, PACKED, fresh=True)
    monkeypatch.setenv("KDB_DEBUG_FIND_ONLY_SOLVER", "1")
    with pytest.raises(NoSolverError, match="ActivPacked does not apply .*not packed"):
        find_solutions(handle, STRIDED, fresh=True)


def test_a_solver_switched_off_is_neither_found_nor_chosen(make_handle, monkeypatch):
    monkeypatch.setenv("KDB_DEBUG_ACTIV_PACKED", "0")
    handle = make_handle()
    assert [s.solver for s in find_solutions(handle, PACKED, fresh=True)] == ["ActivStrided"]
    other = ActivationProblem("fwd", ActivationMode.ABS, DataType.FP32, (9,), (1,), (1,))
    choice = choose(handle, other)
    assert choice.solver.name == "ActivStrided" and choice.trace[0] == "ActivPacked: disabled by KDB_DEBUG_ACTIV_PACKED=0"


def test_a_damaged_user_find_db_is_moved_aside(make_handle, isolated, caplog):
    handle = make_handle()
    path = _user_file(isolated, handle)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a database" * 100)
    with caplog.at_level("WARNING", logger="kdbkit"):
        assert find_solutions(handle, PACKED)
    assert "was not usable" in caplog.text and "moved it to" in caplog.text
    assert list(path.parent.glob("*.corrupt-*"))
    assert recorded_solutions(make_handle(), PACKED)  # the new file holds the ranking


def test_a_system_find_db_serves_and_the_user_record_wins(make_handle, isolated):
    handle = make_handle()
    system = FindDb(handle.find_db.user_path.stem, [], isolated / "system", producer="test", warn=print)
    system.store(PACKED.config(), [FindRecord(2, "ActivStrided", 0, 0.5, 0), FindRecord(1, "ActivPacked", 1, 0.9, 0)])
    system.close()
    (isolated / "system" / system.user_path.name).rename(isolated / "system" / (system.user_path.stem + ".fdb"))
    shipped = recorded_solutions(handle, PACKED)
    assert [s.solver for s in shipped] == ["ActivStrided", "ActivPacked"] and shipped[0].source.endswith(".fdb")
    assert choose(handle, PACKED).how == "find-db"
    handle.find_db.store(PACKED.config(), [FindRecord(1, "ActivPacked", 0, 0.1, 0)])
    assert [(s.solver, s.source) for s in recorded_solutions(handle, PACKED)] == [("ActivPacked", "user")]


def test_a_call_chosen_from_the_find_db_does_not_import_the_tuner(handle):
    """Immediate mode reads the find-db itself: the find module (timing, scratch tensors) stays
    unimported in a process that only runs primitives, a first call's saving."""
    find_solutions(handle, PACKED)  # the ranking the child's choice comes from
    child = """
import json, sys, numpy as np, kdbkit
from kdbkit.runtime.immediate import choose
from kdbkit.runtime.primitives.activation import ActivationMode
from kdbkit.runtime.problem import parse_config
with kdbkit.Handle() as h:
    how = choose(h, parse_config(CONFIG)).how
    kdbkit.activation_forward(h, np.ones((64, 33), np.float32), ActivationMode.GELU_ERF)
    print(json.dumps({"how": how, "find": "kdbkit.runtime.find" in sys.modules}))
""".replace("CONFIG", repr(PACKED.config()))
    env = {**os.environ, "KDB_BACKEND": handle.device.backend}
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"how": "find-db", "find": False}


def test_run_solution_and_sorting(handle):
    by_workspace = find_solutions(handle, PACKED, sort_by="workspace")
    assert by_workspace == sorted(by_workspace, key=lambda s: (s.workspace, s.time_ms))
    with pytest.raises(ProblemError, match="sort_by='speed'"):
        find_solutions(handle, PACKED, sort_by="speed")
    be = handle.backend
    x = np.random.default_rng(1).standard_normal((64, 33)).astype(np.float32)
    xt = DeviceTensor.from_host(be, x)
    yt = DeviceTensor.empty(be, TensorDesc.packed("fp32", x.shape))
    run_solution(handle, by_workspace[-1], x=xt, y=yt)
    from kdbkit.runtime.reference.activation import forward

    np.testing.assert_allclose(yt.to_host(be), forward(x, 10), rtol=1e-5, atol=1e-6)


def test_find_takes_a_config_string_and_refuses_what_is_neither(handle):
    """find_solutions(h, "<config string>") and find_solutions(h, None) raised AttributeError."""
    by_string = find_solutions(handle, PACKED.config())
    assert by_string and all(s.problem == PACKED for s in by_string)
    for wrong in (None, 42, [PACKED]):
        with pytest.raises(ProblemError, match=r"^find_solutions takes a problem or its config string, not "):
            find_solutions(handle, wrong)
    with pytest.raises(ProblemError, match="names no known primitive"):
        find_solutions(handle, "nosuch,type=fp32")
