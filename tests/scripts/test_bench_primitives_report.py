"""scripts/bench_primitives.py's report on the CPU (no GPU): a memory-bound row is shown beside
the share of copy bandwidth a copy of the same bytes reached in the same run."""

from __future__ import annotations

from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_a_memory_bound_row_names_its_share_of_a_same_size_copy(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import bench_primitives as bp

    runs = [(0.0154, 0.0096, [0.62, 0.63], 0.1, 6553600, 0)]  # the global average pool's bytes and times
    row = bp.summary_row("global avg pool 7x7 channels-last", "fp16", runs, 4264.0, 1400.0)
    assert 0.09 < row["kdbkit_copy_share"] < 0.11 and 0.29 < row["kdbkit_same_size_share"] < 0.31
    result = {"device": "a GPU", "copy_gbs": 4264.0, "host_us_per_call": {}, "iters": 20, "blocks": 7,
              "placements": 1, "graph_calls": 0, "commit": "abc1234", "torch": "2.x", "kdbkit": "0.x",
              "rows": [row]}
    bp.write_report(result, tmp_path)
    text = (tmp_path / "bench_primitives.md").read_text()
    assert "10% of copy (30% of a same-size copy's 1400 GB/s)" in text
