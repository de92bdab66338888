"""The CLI on damaged files: ``kdb doctor`` and ``kdb db verify`` refuse installed bundles and
user caches whose entries are not bound to their keys (rows swapped with SQL) instead of saying
"no problems found"; the cache commands survive a cache with impossible metadata."""

import json
import sqlite3

from kdbkit.kdb import Target, write_bundle
from tests.kdb.test_key_binding import swap_rows
from tests.runtime.chain_fixtures import isolated  # noqa: F401

A = ("add.cl", "-DKDB_ADD=4")
B = ("add.cl", "-DKDB_ADD=5")


def _write(path):
    return write_bundle(path, Target("cuda", "sm_90"), [(*A, b"four" * 50), (*B, b"five" * 50)],
                        compiler="nvrtc 13.0", binary_format="cubin", dictionary=False)


def _entry_rows(out):
    return [r for r in json.loads(out) if r["section"] == "bundle entries"]


def test_doctor_checks_the_entries_of_installed_bundles(kdb, isolated):
    bundle = _write(isolated / "system" / "sm_90.kdb")
    code, out, _ = kdb("doctor", "--json")
    assert [r["ok"] for r in _entry_rows(out)] == [True]
    swap_rows(bundle, A, B)
    code, out, _ = kdb("doctor", "--json")
    bad = [r for r in _entry_rows(out) if not r["ok"]]
    assert code == 1 and {A[1] in r["value"] or B[1] in r["value"] for r in bad} == {True} and len(bad) == 2
    code, out, _ = kdb("doctor")
    assert code == 1 and "no problems found" not in out


def test_doctor_checks_the_entries_of_the_user_cache(kdb, isolated):
    (isolated / "cache").mkdir()
    cache = _write(isolated / "cache" / "sm_90.ukdb")
    swap_rows(cache, A, B)
    code, out, _ = kdb("doctor", "--json")
    assert code == 1 and any(not r["ok"] and r["item"] == str(cache) for r in _entry_rows(out))


def test_db_verify_names_the_swapped_rows(kdb, isolated):
    bundle = _write(isolated / "sm_90.kdb")
    swap_rows(bundle, A, B)
    code, out, err = kdb("db", "verify", bundle)
    assert code != 0 and A[1] in out + err and B[1] in out + err and "row " in out + err


def test_cache_commands_survive_a_cache_with_format_version_minus_1(kdb, isolated, monkeypatch):
    """Once a KeyError (a migration from version -1) out of resolve, cache clear and cache prune."""
    from tests.runtime.chain_fixtures import pick_device

    monkeypatch.setenv("KDB_BACKEND", pick_device().backend)
    code, _, _ = kdb("resolve", "activation.c")
    (cache,) = (isolated / "cache").glob("*.ukdb")
    with sqlite3.connect(cache) as conn:
        conn.execute("UPDATE kdb_meta SET value = '-1' WHERE key = 'format_version'")
    conn.close()
    for command in (["cache", "ls"], ["cache", "prune"], ["resolve", "activation.c"], ["cache", "clear", "--yes"],
                    ["db", "verify", cache]):
        code, out, err = kdb(*command)
        assert "internal error" not in err, (command, err)  # the CLI's name for an exception kdbkit did not raise
        assert code == 0 or "error:" in err or "problem" in out + err, (command, code, out, err)
