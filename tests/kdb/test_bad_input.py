"""Every kind of damaged or foreign file gives a clear error naming the file, never wrong bytes."""

import sqlite3

import pytest

from kdbkit.kdb import (
    BundleNotFoundError,
    CorruptBundleError,
    CorruptEntryError,
    NotABundleError,
    UnsupportedFormatError,
    open_bundle,
    verify_bundle,
)


def test_missing_file(tmp_path):
    with pytest.raises(BundleNotFoundError, match="no such bundle file"):
        open_bundle(tmp_path / "nope.kdb")
    assert "no such bundle" in verify_bundle(tmp_path / "nope.kdb").problems[0]


def test_not_sqlite(tmp_path):
    p = tmp_path / "x.kdb"
    p.write_text("hello, I am a text file\n" * 100)
    with pytest.raises(NotABundleError, match=str(p)):
        open_bundle(p)
    assert not verify_bundle(p).ok


def test_empty_file(tmp_path):
    p = tmp_path / "x.kdb"
    p.write_bytes(b"")
    with pytest.raises(NotABundleError, match="no tables yet"):  # an EmptyBundleError: maybe being created
        open_bundle(p)


def test_sqlite_without_kern_db(tmp_path):
    p = tmp_path / "x.kdb"
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE other (a)")
    conn.commit()
    conn.close()
    with pytest.raises(NotABundleError, match="without a kern_db table"):
        open_bundle(p)


@pytest.mark.parametrize("keep", [50, 0.5])
def test_truncated_file(bundle_path, keep):
    data = bundle_path.read_bytes()
    n = keep if isinstance(keep, int) else int(len(data) * keep)
    bundle_path.write_bytes(data[:n])
    report = verify_bundle(bundle_path)
    assert not report.ok
    assert str(bundle_path) in " ".join(report.problems)


def _flip_blob(path, name, args):
    conn = sqlite3.connect(path)
    blob = conn.execute("SELECT kernel_blob FROM kern_db WHERE kernel_name=? AND kernel_args=?", (name, args)).fetchone()[0]
    flipped = bytearray(blob)
    flipped[len(flipped) // 2] ^= 0xFF
    conn.execute("UPDATE kern_db SET kernel_blob=? WHERE kernel_name=? AND kernel_args=?", (bytes(flipped), name, args))
    conn.commit()
    conn.close()


def test_flipped_blob_is_reported_with_file_and_key(bundle_path, entries):
    name, args, _ = entries[3]
    _flip_blob(bundle_path, name, args)
    with pytest.raises(CorruptEntryError) as info:
        open_bundle(bundle_path).get(name, args)
    assert str(bundle_path) in str(info.value) and name in str(info.value) and args in str(info.value)
    report = verify_bundle(bundle_path)
    assert len(report.problems) == 1 and report.entries_checked == len(entries)
    # the other entries still read
    assert open_bundle(bundle_path).get(*entries[4][:2]) == entries[4][2]


def test_garbage_zstd_frame(bundle_path, entries):
    name, args, _ = entries[0]
    conn = sqlite3.connect(bundle_path)
    conn.execute("UPDATE kern_db SET kernel_blob=?, uncompressed_size=? WHERE kernel_name=? AND kernel_args=?",
                 (b"\x28\xb5\x2f\xfd garbage garbage", 5000, name, args))
    conn.commit()
    conn.close()
    with pytest.raises(CorruptEntryError, match="does not decode|frame claims 103 bytes"):
        open_bundle(bundle_path).get(name, args)


def test_wrong_hash_column(bundle_path, entries):
    name, args, _ = entries[0]
    conn = sqlite3.connect(bundle_path)
    conn.execute("UPDATE kern_db SET kernel_hash='00' WHERE kernel_name=? AND kernel_args=?", (name, args))
    conn.commit()
    conn.close()
    with pytest.raises(CorruptEntryError, match="does not match kernel_hash"):
        open_bundle(bundle_path).get(name, args)


def test_newer_format_version(bundle_path):
    conn = sqlite3.connect(bundle_path)
    conn.execute("UPDATE kdb_meta SET value='99' WHERE key='format_version'")
    conn.commit()
    conn.close()
    with pytest.raises(UnsupportedFormatError, match="version 99 is newer.*upgrade kdbkit"):
        open_bundle(bundle_path)
    assert not verify_bundle(bundle_path).ok


@pytest.mark.parametrize("key,value,match", [
    ("format_version", "one", "not a number"),
    ("codec", "lzma", "unknown codec"),
    ("arch", "vax", "no valid target"),
    ("format_version", "-1", "not a number"),  # once a KeyError: a migration from version -1
    ("format_version", -1, "not a number"),
    ("format_version", "9" * 5000, "not a number"),  # once Python's ValueError (digit limit)
    ("format_version", b"\x01", "not a number"),
    ("format_version", 1.5, "not a number"),
    ("sources", 5, "not a kernel-source manifest"),  # once a TypeError from json.loads
    ("sources", b"\xff\xfe{", "not a kernel-source manifest"),
    ("sources", "[" * 100000, "not a kernel-source manifest"),  # once a RecursionError
    ("codec", b"zstd", "unknown codec"),
    ("cu", "9" * 5000, "no valid target"),
    ("cu", 1e300, "no valid target"),
    ("arch", 7, "no valid target"),
])
def test_bad_metadata(bundle_path, key, value, match):
    conn = sqlite3.connect(bundle_path)
    conn.execute("INSERT OR REPLACE INTO kdb_meta(key, value) VALUES (?, ?)", (key, value))
    conn.commit()
    conn.close()
    with pytest.raises(CorruptBundleError, match=match):
        open_bundle(bundle_path)


@pytest.mark.parametrize("key,value", [("format_version", "-1"), ("sources", 5), ("cu", "9" * 5000)])
def test_bad_metadata_in_a_user_cache_is_moved_aside_with_one_warning(tmp_path, key, value):
    """A user cache with bad metadata is damaged: set aside and a new one started, never a crash."""
    from kdbkit.runtime.program_key import ProgramKey
    from kdbkit.runtime.user_cache import UserCache

    from kdbkit.kdb import Target

    target = Target.parse("sm_90")
    cache = UserCache(tmp_path, target, compiler="nvrtc 13.0", binary_format="cubin")
    assert cache.put(ProgramKey("a.cl", "-DN=1", ""), b"binary" * 30)
    cache.close()
    with sqlite3.connect(cache.path) as conn:
        conn.execute("INSERT OR REPLACE INTO kdb_meta(key, value) VALUES (?, ?)", (key, value))
    conn.close()
    again = UserCache(tmp_path, target, compiler="nvrtc 13.0", binary_format="cubin")
    assert again.get(ProgramKey("a.cl", "-DN=1", "")) is None and again.usable
    again.close()
    assert len(list(tmp_path.glob("*.corrupt-*"))) == 1  # moved aside (with a warning), nothing deleted


def test_a_table_name_that_is_not_text_is_not_a_bundle(bundle_path):
    """A damaged schema row whose name reads back as a blob once raised TypeError (sorting names)."""
    from kdbkit.kdb import Bundle, KdbError, Target

    conn = sqlite3.connect(bundle_path)
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET name = CAST(name AS BLOB), tbl_name = CAST(tbl_name AS BLOB) "
                 "WHERE name = 'kern_db'")
    conn.commit()
    conn.close()
    for attempt in (lambda: open_bundle(bundle_path),
                    lambda: Bundle.create(bundle_path, Target.parse("sm_90"), compiler="c", binary_format="cubin",
                                          exist_ok=True)):
        with pytest.raises(KdbError):
            attempt()
