"""A user cache kept under its size: least recently used entries go first, the one just stored stays."""

from __future__ import annotations

import os

from kdbkit.kdb import Bundle, Target
from kdbkit.runtime.cache_eviction import LOW_WATER, Evictor, used_bytes

TARGET = Target("opencl", "ocl-0123456789ab")
BLOB = 20_000  # bytes per entry: random, so compression keeps them this size


def _cache(tmp_path, entries: int) -> Bundle:
    bundle = Bundle.create(tmp_path / "ocl-0123456789ab.ukdb", TARGET, compiler="test 1", binary_format="ocl-binary",
                           wal=True)
    bundle.put_many([("k.c", f"-DN={i}", os.urandom(BLOB)) for i in range(entries)])
    return bundle


def _keys(bundle: Bundle) -> set[str]:
    return {e.kernel_args for e in bundle.entries()}


def test_a_store_over_the_limit_evicts_the_least_recently_used_first(tmp_path):
    bundle = _cache(tmp_path, 40)
    evictor = Evictor(bundle.path, max_bytes=30 * BLOB)
    for i in range(20, 40):  # the later half read: the earlier half goes first
        evictor.used("k.c", f"-DN={i}")
    bundle.put("k.c", "-DN=new", os.urandom(BLOB))
    evicted = evictor.stored("k.c", "-DN=new")
    left = _keys(bundle)
    assert evicted and "-DN=new" in left
    assert {f"-DN={i}" for i in range(20, 40)} <= left  # the recently used all stayed
    assert not {f"-DN={i}" for i in range(evicted)} & left  # the oldest went
    assert used_bytes(evictor._connection()) <= 30 * BLOB * LOW_WATER + 8192


def test_the_entry_just_stored_stays_even_when_it_alone_is_over_the_limit(tmp_path):
    bundle = _cache(tmp_path, 3)
    evictor = Evictor(bundle.path, max_bytes=BLOB // 2)
    bundle.put("k.c", "-DN=big", os.urandom(BLOB))
    evictor.stored("k.c", "-DN=big")
    assert _keys(bundle) == {"-DN=big"}


def test_no_limit_evicts_nothing_but_notes_uses(tmp_path):
    bundle = _cache(tmp_path, 10)
    evictor = Evictor(bundle.path, max_bytes=0)
    evictor.used("k.c", "-DN=3")
    assert evictor.stored("k.c", "-DN=4") == 0 and len(_keys(bundle)) == 10
    uses = dict(((n, a), t) for n, a, t in evictor._connection().execute("SELECT * FROM kdb_use"))
    assert set(uses) == {("k.c", "-DN=3"), ("k.c", "-DN=4")}


def test_a_reader_keeps_reading_while_another_connection_evicts(tmp_path):
    bundle = _cache(tmp_path, 20)
    reader = Bundle.open(bundle.path, writable=True, wal=True)
    before = reader.get("k.c", "-DN=0")
    Evictor(bundle.path, max_bytes=5 * BLOB).stored("k.c", "-DN=19")
    assert before is not None and reader.get("k.c", "-DN=0") is None  # gone for the next read only
    assert reader.get("k.c", "-DN=19") is not None


def test_the_runtime_keeps_its_cache_under_kdb_cache_maxsize(make_handle, isolated, monkeypatch):
    from kdbkit.kdb import open_bundle
    from kdbkit.runtime.samples import SAMPLES

    monkeypatch.setenv("KDB_CACHE_MAXSIZE", "1")  # every store evicts all but itself
    first = make_handle()
    for sample in SAMPLES[:3]:
        assert first.program(sample.kernel_file, sample.options).source == "jit"
    (path,) = (isolated / "cache").glob("*.ukdb")
    with open_bundle(path) as bundle:
        assert bundle.count() == 1
    again = make_handle()
    assert again.program(SAMPLES[2].kernel_file, SAMPLES[2].options).source == "user"
    assert again.program(SAMPLES[0].kernel_file, SAMPLES[0].options).source == "jit"  # evicted: compiled again
