"""Files written by MIOpen (bzip2, md5, no kdb_meta) read, verify and merge."""

from kdbkit.kdb import Bundle, Target, merge_bundles, open_bundle, verify_bundle
from kdbkit.kdb.schema import FORMAT_VERSION

from .conftest import write_miopen_file


def test_reads_a_miopen_file(tmp_path, entries):
    p = write_miopen_file(tmp_path / "gfx906_60.kdb", entries)
    b = open_bundle(p)
    md = b.metadata
    assert md.written_by_miopen and (md.codec, md.hash) == ("bzip2", "md5")
    assert md.target == Target.parse("gfx906_60")
    for name, args, data in entries:
        assert b.get(name, args) == data


def test_verifies_a_miopen_file(tmp_path, entries):
    report = verify_bundle(write_miopen_file(tmp_path / "gfx906_60.kdb", entries))
    assert report.ok, report.problems
    assert report.entries_checked == len(entries) and report.format_version == 0


def test_opening_for_write_migrates_and_keeps_bzip2(tmp_path, entries):
    p = write_miopen_file(tmp_path / "gfx906_60.kdb", entries)
    with Bundle.open(p, writable=True) as b:
        assert b.metadata.format_version == FORMAT_VERSION and b.metadata.codec == "bzip2" and b.keyed
        b.put("new.o", "-mcpu=gfx906", b"abc" * 100)
    b = open_bundle(p)
    assert b.get("new.o", "-mcpu=gfx906") == b"abc" * 100
    assert b.get(*entries[0][:2]) == entries[0][2]


def test_merge_converts_miopen_to_zstd(tmp_path, entries):
    p = write_miopen_file(tmp_path / "gfx906_60.kdb", entries)
    report = merge_bundles(tmp_path / "out.kdb", [p])
    out = open_bundle(tmp_path / "out.kdb")
    assert report.entries == len(entries) and out.metadata.codec == "zstd"
    assert out.get(*entries[1][:2]) == entries[1][2]
