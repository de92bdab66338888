"""A user cache that is damaged or claims another format is repaired once, by the first process
that finds it (moved aside, named in one warning, a new one started), and `kdb cache clear` and
`kdb cache prune` handle every such file without a traceback."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.chain_fixtures import child_env

CHILD = """
import json
from kdbkit.runtime.handle import Handle
from kdbkit.runtime.samples import run_samples
h = Handle()
print(json.dumps([r.source for r in run_samples(h, seed=1) if r.ok]))
h.close()
"""


def _process(tmp_path: Path) -> tuple[list[str], str]:
    (tmp_path / "system").mkdir(exist_ok=True)
    env = {**child_env(tmp_path), "KDB_USER_DB_PATH": str(tmp_path / "userdb")}
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def _filled_cache(tmp_path: Path) -> Path:
    sources, _ = _process(tmp_path)
    assert sources and set(sources) == {"jit"}
    return next((tmp_path / "cache").glob("*.ukdb"))


def _set_format(ukdb: Path, version: str) -> None:
    with sqlite3.connect(ukdb) as conn:
        conn.execute("UPDATE kdb_meta SET value = ? WHERE key = 'format_version'", (version,))
    conn.close()


def _damage(ukdb: Path, how: str) -> None:
    if how == "truncated by one byte":
        os.truncate(ukdb, ukdb.stat().st_size - 1)
    elif how == "cut in half":
        os.truncate(ukdb, ukdb.stat().st_size // 2)
    elif how == "cut to its first page":
        os.truncate(ukdb, 4096)
    else:
        _set_format(ukdb, how.split()[-1])


@pytest.mark.parametrize("how", ["truncated by one byte", "cut in half", "cut to its first page",
                                 "format_version 99", "format_version -1"])
def test_a_damaged_cache_is_repaired_by_the_next_process(tmp_path, how):
    ukdb = _filled_cache(tmp_path)
    _damage(ukdb, how)
    sources, err = _process(tmp_path)
    assert "jit" in sources and "unusable" not in err, err
    aside = list(ukdb.parent.glob(f"{ukdb.name}.corrupt-*"))
    if how != "truncated by one byte":  # one byte off the end may only cost the last entry, which is rebuilt
        assert len(aside) == 1  # kept for inspection
        warnings = [line for line in err.splitlines() if "kdbkit warning" in line and "ukdb" in line]
        assert len(warnings) == 1 and aside[0].name in warnings[0] and "kdb cache clear" in warnings[0], err
    sources, err = _process(tmp_path)
    assert set(sources) == {"user"} and "ukdb" not in err, err  # stored again, read again, no warning


@pytest.mark.parametrize("version", ["99", "-1", "ten"])
def test_clear_removes_a_cache_of_a_newer_or_unreadable_format(tmp_path, monkeypatch, kdb, version):
    ukdb = _filled_cache(tmp_path)
    _set_format(ukdb, version)
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(ukdb.parent))
    code, out, err = kdb("cache", "ls")
    assert code == 0 and "Traceback" not in err
    code, out, err = kdb("cache", "clear", "--yes", "--json")
    assert code == 0 and "Traceback" not in err
    assert str(ukdb) in json.loads(out)["removed_files"] and not ukdb.exists()
    assert set(_process(tmp_path)[0]) == {"jit"}


@pytest.mark.parametrize("damage", ["format_version 99", "format_version -1", "cut to its first page"])
def test_prune_removes_damaged_files_and_old_moved_aside_ones(tmp_path, monkeypatch, kdb, damage):
    ukdb = _filled_cache(tmp_path)
    _damage(ukdb, damage)
    old = ukdb.with_name(f"{ukdb.name}.corrupt-20200101-000000-1")
    new = ukdb.with_name(f"{ukdb.name}.corrupt-29990101-000000-1")
    for p in (old, new):
        p.write_bytes(b"moved aside")
    os.utime(old, (0, 0))
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(ukdb.parent))
    code, out, err = kdb("cache", "prune", "--json")
    assert code == 0 and "Traceback" not in err
    removed = json.loads(out)["removed_files"]
    assert str(ukdb) in removed and str(old) in removed and str(new) not in removed
    assert not ukdb.exists() and not old.exists() and new.exists()


@pytest.mark.parametrize("damage", ["not sqlite", "schema 2"])
def test_clear_removes_a_damaged_or_newer_user_find_db_and_keeps_a_good_one(tmp_path, monkeypatch, kdb, damage):
    from kdbkit.kdb.find_db import FindDb, FindRecord

    folder = tmp_path / "userdb"
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KDB_USER_DB_PATH", str(folder))
    good = FindDb("gfx942_304", [], folder, producer="test", warn=lambda *a: None)
    assert good.store("cfg", [FindRecord(1, "s", 0, 1.0, 0)])
    good.close()
    bad = folder / "sm_90_132.ufdb"
    if damage == "not sqlite":
        bad.write_bytes(b"SQLite format 3\0" + b"\xff" * 100)
    else:
        db = FindDb("sm_90_132", [], folder, producer="test", warn=lambda *a: None)
        assert db.store("cfg", [FindRecord(1, "s", 0, 1.0, 0)])
        db.close()
        with sqlite3.connect(bad) as conn:
            conn.execute("UPDATE find_meta SET value = '2' WHERE key = 'schema'")
        conn.close()
    code, out, err = kdb("cache", "clear", "--yes", "--json")
    assert code == 0 and "Traceback" not in err
    assert str(bad) in json.loads(out)["removed_files"] and not bad.exists()
    assert (folder / "gfx942_304.ufdb").exists()


def test_a_user_find_db_damaged_under_a_reader_is_moved_aside_once(tmp_path):
    from kdbkit.kdb.find_db import FindDb, FindRecord

    warnings = []

    def find_db():
        return FindDb("sm_90_132", [], tmp_path, producer="test", warn=lambda key, message: warnings.append(message))

    db = find_db()
    for i in range(2000):  # rankings over many pages, past the metadata's
        assert db.store(f"config-{i:05}-" + "x" * 40, [FindRecord(1, "s", 0, 1.0, 0)])
    db.close()
    path = tmp_path / "sm_90_132.ufdb"
    db = find_db()
    assert db.load("config-00000-" + "x" * 40)  # open, as a long-running process holds it
    os.truncate(path, path.stat().st_size // 2)  # damaged under it
    assert db.load("config-01999-" + "x" * 40) is None  # a miss, not a crash
    aside = list(tmp_path.glob("sm_90_132.ufdb.corrupt-*"))
    assert len(aside) == 1 and len(warnings) == 1 and aside[0].name in warnings[0]
    assert db.store("new", [FindRecord(2, "t", 0, 1.0, 0)])  # a new file, in this process
    db.close()
    again = find_db()  # and in the next
    assert again.load("new")[0][0].solver_id == 2
    again.close()
