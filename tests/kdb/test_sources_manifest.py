"""The kernel-source manifest in kdb_meta: written, read, merged, and refused when damaged."""

from __future__ import annotations

import sqlite3

import pytest

from kdbkit.kdb import CorruptBundleError, Target, merge_bundles, open_bundle, write_bundle

TARGET = Target("cuda", "sm_90", (), 132)


def _bundle(path, entries=(("a", "-DX", b"a" * 64),), sources=None):
    return write_bundle(path, TARGET, list(entries), compiler="nvrtc 13.0", binary_format="cubin", sources=sources)


def test_the_manifest_reads_back_as_written(tmp_path):
    path = _bundle(tmp_path / "sm_90_132.kdb", sources={"b.c": "2" * 64, "a.c": "1" * 64})
    with open_bundle(path) as bundle:
        assert bundle.metadata.source_digests == {"a.c": "1" * 64, "b.c": "2" * 64}
    assert open_bundle(_bundle(tmp_path / "none.kdb")).metadata.source_digests == {}


def test_merge_joins_manifests_and_drops_a_file_built_from_two_sources(tmp_path):
    one = _bundle(tmp_path / "1.kdb", sources={"a.c": "1" * 64, "b.c": "2" * 64})
    two = _bundle(tmp_path / "2.kdb", [("c", "-DY", b"c" * 64)], sources={"b.c": "3" * 64, "c.c": "4" * 64})
    merge_bundles(tmp_path / "out.kdb", [one, two])
    assert open_bundle(tmp_path / "out.kdb").metadata.source_digests == {"a.c": "1" * 64, "c.c": "4" * 64}
    merge_bundles(tmp_path / "partial.kdb", [one, _bundle(tmp_path / "3.kdb", [("d", "", b"d" * 64)])])
    assert open_bundle(tmp_path / "partial.kdb").metadata.source_digests == {}  # it would not cover every entry


@pytest.mark.parametrize("value", ["{not json", "[1, 2]", '{"a.c": 3}'])
def test_a_damaged_manifest_is_a_corrupt_bundle(tmp_path, value):
    path = _bundle(tmp_path / "sm_90_132.kdb", sources={"a.c": "1" * 64})
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE kdb_meta SET value = ? WHERE key = 'sources'", (value,))
    with pytest.raises(CorruptBundleError, match="kdb_meta.sources is not a kernel-source manifest"):
        open_bundle(path)
