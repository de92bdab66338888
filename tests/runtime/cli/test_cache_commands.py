"""``kdb cache ...``: what it refuses before it deletes anything."""

from __future__ import annotations

import json

import pytest

from kdbkit.runtime import paths
from kdbkit.runtime.cache_admin import prune_cache
from kdbkit.runtime.user_cache import LOCKS
from tests.runtime.chain_fixtures import isolated  # noqa: F401


@pytest.fixture
def idle_lock(isolated):
    locks = paths.user_cache_dir() / LOCKS
    locks.mkdir(parents=True)
    lock = locks / "idle.lock"
    lock.touch()
    return lock


@pytest.mark.parametrize("days", ["-1", "-0.5", "nan"])
def test_prune_refuses_a_negative_lock_age_and_keeps_the_locks(kdb, idle_lock, days):
    code, out, err = kdb("cache", "prune", "--lock-days", days)
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and "--lock-days" in err
    assert idle_lock.exists()


def test_prune_with_lock_days_0_removes_every_idle_lock(kdb, idle_lock):
    code, out, _ = kdb("cache", "prune", "--lock-days", "0")
    assert code == 0 and "removed 1 file(s)" in out and not idle_lock.exists()


def test_prune_and_clear_report_in_json(kdb, idle_lock):
    code, out, _ = kdb("cache", "prune", "--json")  # a fresh lock is kept
    assert code == 0 and json.loads(out) == {"removed_files": [], "removed_entries": 0, "freed_bytes": 0}
    code, out, _ = kdb("cache", "clear", "--yes", "--json")
    report = json.loads(out)
    assert code == 0 and report["removed_files"] == [str(idle_lock)] and report["entries"] == 0


@pytest.mark.parametrize("age", [-1.0, float("nan")])
def test_prune_cache_refuses_a_negative_lock_age(idle_lock, age):
    with pytest.raises(ValueError, match="0 seconds or more"):
        prune_cache(lock_age_s=age)
    assert idle_lock.exists()
