"""The per-tier counts: merged exactly across processes' records, torn lines skipped, percentiles
from the histogram."""

from __future__ import annotations

import pytest

from kdbkit.runtime import tier_stats
from kdbkit.runtime.program import Step


@pytest.fixture
def process(monkeypatch):
    fresh = tier_stats.ProcessStats()
    monkeypatch.setattr(tier_stats, "PROCESS", fresh)
    return fresh


def test_saves_append_and_loads_sum_them_skipping_a_torn_line(process, tmp_path):
    process.note_steps([Step("memory", 0.001, "miss"), Step("system sm_90.kdb", 0.2, "miss"),
                        Step("user", 0.3, "hit"), Step("load", 0.1, "loaded")])
    tier_stats.save(tmp_path)
    with open(tmp_path / tier_stats.FILE_NAME, "a") as f:
        f.write('{"t": 1, "tiers": {"user": {"counts": {"hits": ')  # a save cut short by a full disk
        f.write("\n")
    process.note_steps([Step("user", 0.5, "hit"), Step("remote", 2.0, "refused"), Step("jit", 900.0, "compiled")])
    process.note("user", "puts")
    tier_stats.save(tmp_path)
    tiers, since = tier_stats.load(tmp_path)
    assert since is not None
    assert {n: t.as_dict()["hits"] for n, t in tiers.items()} == {"system": 0, "user": 2, "remote": 0, "jit": 0}
    assert tiers["system"].counts["misses"] == 1 and tiers["remote"].counts["refusals"] == 1
    assert tiers["jit"].counts["compiles"] == 1 and tiers["user"].counts["puts"] == 1
    assert "memory" not in tiers and "load" not in tiers
    assert tier_stats.save(tmp_path) is None and len(tier_stats.load(tmp_path)[0]) == 4  # nothing new: no line


def test_percentiles_are_bucket_bounds_within_a_fifth(process):
    for ms in [0.1] * 90 + [10.0] * 9 + [1000.0]:
        process.note("remote", "hits", ms)
    row = process.snapshot()["remote"]
    assert 0.1 <= row["p50_ms"] < 0.1 * 1.19 and 0.1 <= row["p90_ms"] < 0.1 * 1.19
    assert 10.0 <= row["p99_ms"] < 10.0 * 1.19
    assert tier_stats.percentile({}, 0.5) is None


def test_a_folder_that_is_no_cache_gets_nothing_and_a_full_file_is_folded(process, tmp_path, monkeypatch):
    process.note("user", "hits", 0.2)
    tier_stats.save(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()
    monkeypatch.setattr(tier_stats, "MAX_FILE_BYTES", 1)
    for _ in range(3):
        process.note("user", "hits", 0.2)
        tier_stats.save(tmp_path)
    lines = (tmp_path / tier_stats.FILE_NAME).read_text().splitlines()
    assert len(lines) == 1 and tier_stats.load(tmp_path)[0]["user"].counts["hits"] == 3
    assert (tmp_path / tier_stats.FILE_NAME).stat().st_mode & 0o077 == 0
