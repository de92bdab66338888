import sqlite3
import threading

import pytest

from kdbkit.kdb import Bundle, KdbError, ReadOnlyBundleError, Target, open_bundle, write_bundle
from kdbkit.kdb.schema import FORMAT_VERSION

from .conftest import fake_binary


def test_written_bundle_reads_back_every_entry(bundle_path, entries):
    with open_bundle(bundle_path) as b:
        assert b.count() == len(entries)
        for name, args, data in entries:
            assert b.get(name, args) == data
        assert b.get("missing.cl.o", "-mcpu=sm_90") is None


def test_metadata_is_recorded(bundle_path, target):
    md = open_bundle(bundle_path).metadata
    assert md.format_version == FORMAT_VERSION
    assert md.target == target
    assert (md.compiler, md.binary_format, md.codec, md.hash) == ("nvrtc 13.0", "cubin", "zstd", "xxh3_128")
    assert md.producer.startswith("kdbkit") and md.created


def test_schema_matches_miopen(bundle_path):
    conn = sqlite3.connect(bundle_path)
    cols = [r[1] for r in conn.execute("PRAGMA table_info(kern_db)")]
    assert cols == ["id", "kernel_name", "kernel_args", "kernel_blob", "kernel_hash", "uncompressed_size"]
    plan = " ".join(r[3] for r in conn.execute(
        "EXPLAIN QUERY PLAN SELECT kernel_blob FROM kern_db WHERE kernel_name = ? AND kernel_args = ?", ("a", "b")))
    assert "USING INDEX" in plan  # lookups never scan


def test_system_bundles_open_read_only(bundle_path):
    b = open_bundle(bundle_path)
    assert not b.writable
    with pytest.raises(ReadOnlyBundleError, match="read-only"):
        b.put("x.o", "", b"1")


def test_put_many_is_one_transaction_and_replaces(tmp_path, target):
    with Bundle.create(tmp_path / "u.ukdb", target, compiler="c 1", binary_format="cubin", wal=True) as b:
        assert b.put_many([("a.o", "-x", b"1" * 100), ("b.o", "-y", b"2" * 100)]) == 2
        b.put("a.o", "-x", b"3" * 100)
        assert b.get("a.o", "-x") == b"3" * 100 and b.count() == 2
        assert b.delete("a.o", "-x") and not b.delete("a.o", "-x")
    assert sqlite3.connect(tmp_path / "u.ukdb").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_failed_batch_leaves_nothing(tmp_path, target):
    with Bundle.create(tmp_path / "u.ukdb", target, compiler="c 1", binary_format="cubin") as b:
        def bad():
            yield ("a.o", "", b"1")
            raise RuntimeError("builder died")
        with pytest.raises(RuntimeError):
            b.put_many(bad())
        assert b.count() == 0


def test_entries_and_stats(bundle_path, entries):
    b = open_bundle(bundle_path)
    infos = list(b.entries())
    assert len(infos) == len(entries)
    assert sum(i.raw_size for i in infos) == sum(len(e[2]) for e in entries)
    s = b.stats()
    assert s.entries == len(entries) and s.raw_bytes == sum(len(e[2]) for e in entries)
    assert s.stored_bytes < s.raw_bytes and s.ratio > 1.5
    assert sorted(b.items()) == sorted(entries)


def test_first_entry_is_the_row_stored_first_checked_under_its_key(tmp_path, target):
    with Bundle.create(tmp_path / "u.ukdb", target, compiler="c 1", binary_format="cubin") as b:
        assert b.first_entry() is None
        b.put_many([("z.o", "-x", b"1" * 100), ("a.o", "-y", b"2" * 100)])  # stored first, though not first by name
        assert b.first_entry() == ("z.o", "-x", b"1" * 100)
    conn = sqlite3.connect(tmp_path / "u.ukdb")
    conn.execute("UPDATE kern_db SET kernel_args = '-w' WHERE kernel_name = 'z.o'")  # bytes of another key now
    conn.commit()
    with pytest.raises(KdbError, match=r"z.o \[-w\] is corrupt"):
        open_bundle(tmp_path / "u.ukdb").first_entry()


def test_dictionary_is_trained_when_it_pays(tmp_path, target):
    many = [(f"k{i}.o", f"-DI={i}", fake_binary(i)) for i in range(300)]
    with_dict = write_bundle(tmp_path / "a.kdb", target, many, compiler="c", binary_format="cubin")
    without = write_bundle(tmp_path / "b.kdb", target, many, compiler="c", binary_format="cubin", dictionary=False)
    a, b = open_bundle(with_dict), open_bundle(without)
    assert a.metadata.dictionary_size > 0 and b.metadata.dictionary_size == 0
    assert a.stats().stored_bytes + a.stats().dictionary_bytes < b.stats().stored_bytes
    assert a.get("k7.o", "-DI=7") == many[7][2]


def test_write_bundle_replaces_atomically_and_leaves_no_temp(tmp_path, target, entries):
    p = write_bundle(tmp_path / "sm_90_132.kdb", target, entries[:3], compiler="c", binary_format="cubin")
    old = open_bundle(p)
    write_bundle(p, target, entries, compiler="c", binary_format="cubin")
    assert open_bundle(p).count() == len(entries)
    assert old.count() == 3  # a reader of the old file keeps its snapshot
    assert sorted(f.name for f in tmp_path.iterdir()) == ["sm_90_132.kdb"]


def test_create_refuses_to_overwrite(bundle_path, target):
    with pytest.raises(KdbError, match="already a bundle"):
        Bundle.create(bundle_path, target, compiler="c", binary_format="cubin")


def test_threads_share_one_bundle(tmp_path, target):
    b = Bundle.create(tmp_path / "t.ukdb", target, compiler="c", binary_format="cubin", wal=True)
    errors = []

    def work(i):
        try:
            for j in range(20):
                b.put(f"k{i}.o", f"-j{j}", fake_binary(i * 100 + j, 500))
                assert b.get(f"k{i}.o", f"-j{j}") == fake_binary(i * 100 + j, 500)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and b.count() == 160


def test_arch_wide_target_round_trips(tmp_path, entries):
    p = write_bundle(tmp_path / "gfx90a.kdb", Target.parse("gfx90a:xnack-"), entries, compiler="clang 19",
                     binary_format="hsaco")
    assert open_bundle(p).metadata.target == Target.parse("gfx90a:xnack-")


def test_shipped_bundles_use_16k_pages_and_no_journal(bundle_path):
    conn = sqlite3.connect(bundle_path)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == 16384
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0


def test_streamed_entries_with_a_dictionary(tmp_path, target):
    many = ((f"k{i}.o", f"-DI={i}", fake_binary(i)) for i in range(300))  # an iterator, not a list
    p = write_bundle(tmp_path / "s.kdb", target, many, compiler="c", binary_format="cubin")
    b = open_bundle(p)
    assert b.count() == 300 and b.metadata.dictionary_size > 0
    assert b.get("k299.o", "-DI=299") == fake_binary(299)


def test_training_sample_is_bounded_random_and_repeatable():
    from kdbkit.kdb.writer import MAX_TRAINING_SAMPLES, training_sample

    blobs = [bytes([i % 3]) * 10 + i.to_bytes(4, "little") for i in range(3 * MAX_TRAINING_SAMPLES)]
    sample = training_sample(blobs)
    assert len(sample) == MAX_TRAINING_SAMPLES and sample == training_sample(blobs)
    assert len({b[0] for b in sample}) == 3  # every family; a stride of 3 would see one


def test_bundles_hashed_with_sha256_still_read(bundle_path, entries):
    """A format-1 bundle (plain sha256 of the data, as kdbkit once wrote) still reads."""
    import hashlib

    conn = sqlite3.connect(bundle_path)
    for name, args, data in entries:
        conn.execute("UPDATE kern_db SET kernel_hash=? WHERE kernel_name=? AND kernel_args=?",
                     (hashlib.sha256(data).hexdigest(), name, args))
    conn.execute("UPDATE kdb_meta SET value='sha256' WHERE key='hash'")
    conn.execute("UPDATE kdb_meta SET value='1' WHERE key='format_version'")
    conn.commit()
    conn.close()
    b = open_bundle(bundle_path)
    assert b.metadata.hash == "sha256" and b.get(*entries[0][:2]) == entries[0][2]


def test_a_reader_sees_entries_written_after_its_last_read(tmp_path, target):
    """A lookup must not leave a read transaction open (a stale WAL snapshot)."""
    path = tmp_path / "u.ukdb"
    writer = Bundle.create(path, target, compiler="c", binary_format="cubin", wal=True)
    writer.put("a.o", "-x", b"1" * 100)
    reader = Bundle.open(path, writable=True, wal=True)
    assert reader.get("a.o", "-x") == b"1" * 100  # one row: fetchone() alone would leave the statement open
    assert reader.get("b.o", "-y") is None
    writer.put("b.o", "-y", b"2" * 100)
    assert reader.get("b.o", "-y") == b"2" * 100
    assert not reader._conn.in_transaction
