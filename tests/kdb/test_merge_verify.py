import pytest

from kdbkit.kdb import BundleWriteError, Target, TargetMismatchError, merge_bundles, open_bundle, verify_bundle, write_bundle

from .conftest import fake_binary


def _write(path, target, entries, compiler="nvrtc 13.0"):
    return write_bundle(path, Target.parse(target), entries, compiler=compiler, binary_format="cubin")


def test_merge_dedups_and_reports_conflicts(tmp_path):
    a = _write(tmp_path / "a.kdb", "sm_90_132", [("k.o", "-a", fake_binary(1)), ("k.o", "-b", fake_binary(2))])
    b = _write(tmp_path / "b.kdb", "sm_90_132", [("k.o", "-a", fake_binary(1)), ("k.o", "-b", fake_binary(3)),
                                                  ("k.o", "-c", fake_binary(4))])
    report = merge_bundles(tmp_path / "out.kdb", [a, b])
    assert (report.entries, report.duplicates, report.conflicts) == (3, 1, [("k.o", "-b")])
    out = open_bundle(tmp_path / "out.kdb")
    assert out.get("k.o", "-b") == fake_binary(2)  # the first input wins
    assert out.metadata.target == Target.parse("sm_90_132")


def test_merge_refuses_other_arch_and_compiler(tmp_path):
    a = _write(tmp_path / "a.kdb", "sm_90_132", [("k.o", "-a", b"1" * 50)])
    b = _write(tmp_path / "b.kdb", "sm_80_108", [("k.o", "-a", b"1" * 50)])
    c = _write(tmp_path / "c.kdb", "sm_90_132", [("k.o", "-a", b"1" * 50)], compiler="nvrtc 12.8")
    with pytest.raises(TargetMismatchError, match="different targets"):
        merge_bundles(tmp_path / "o.kdb", [a, b], allow_mixed_cu=True)
    with pytest.raises(TargetMismatchError, match="different compilers"):
        merge_bundles(tmp_path / "o.kdb", [a, c])
    assert not (tmp_path / "o.kdb").exists()


def test_merge_across_cu_counts_only_when_told(tmp_path):
    a = _write(tmp_path / "gfx90a_110.kdb", "gfx90a_110", [("k.o", "-a", b"1" * 50)])
    b = _write(tmp_path / "gfx90a_104.kdb", "gfx90a_104", [("k.o", "-a", b"1" * 50)])
    with pytest.raises(TargetMismatchError, match="allow-mixed-cu"):
        merge_bundles(tmp_path / "gfx90a.kdb", [a, b])
    report = merge_bundles(tmp_path / "gfx90a.kdb", [a, b], allow_mixed_cu=True)
    assert report.entries == 1 and report.duplicates == 1
    assert open_bundle(tmp_path / "gfx90a.kdb").metadata.target == Target.parse("gfx90a")


def test_verify_a_good_bundle(bundle_path, entries):
    report = verify_bundle(bundle_path)
    assert report.ok and report.entries_checked == len(entries)


def test_verify_catches_a_name_that_contradicts_the_metadata(tmp_path, entries):
    p = _write(tmp_path / "sm_80_108.kdb", "sm_90_132", entries)
    report = verify_bundle(p)
    assert not report.ok and "file name says sm_80" in report.problems[0]


@pytest.mark.parametrize("name, target, says", [
    ("sm_90.kdb", "sm_90_132", "file name says sm_90 (arch-wide) but the metadata says sm_90 with 132 CUs"),
    ("sm_90_77.kdb", "sm_90", "file name says sm_90 with 77 CUs but the metadata says sm_90 (arch-wide)"),
])
def test_verify_says_arch_wide_not_none_cus(tmp_path, entries, name, target, says):
    report = verify_bundle(_write(tmp_path / name, target, entries))
    assert not report.ok and report.problems == [f"{tmp_path / name}: {says}"]


def test_merge_into_a_folder_is_refused_naming_the_folder_not_a_temporary_file(tmp_path):
    a = _write(tmp_path / "a.kdb", "sm_90_132", [("k.o", "-a", b"1" * 50)])
    (tmp_path / "out").mkdir()
    with pytest.raises(BundleWriteError) as info:
        merge_bundles(tmp_path / "out", [a])
    assert info.value.problem == f"{tmp_path / 'out'} is a folder" and str(tmp_path / "out" / "sm_90_132.kdb") in \
        info.value.remedy


@pytest.mark.parametrize("where", ["missing/o.kdb", "a.kdb/o.kdb"])  # no such folder; a file where a folder should be
def test_a_write_that_fails_names_the_output_not_its_temporary_file(tmp_path, where):
    a = _write(tmp_path / "a.kdb", "sm_90_132", [("k.o", "-a", b"1" * 50)])
    with pytest.raises(OSError) as info:
        merge_bundles(tmp_path / where, [a])
    assert info.value.filename == str(tmp_path / where) and ".tmp" not in str(info.value)


def test_verify_catches_a_missing_unique_index(bundle_path):
    import sqlite3

    conn = sqlite3.connect(bundle_path)
    conn.execute("DROP INDEX idx_kern_db")
    conn.commit()
    conn.close()
    report = verify_bundle(bundle_path)
    assert any("no unique index" in p for p in report.problems)
