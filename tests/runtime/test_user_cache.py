"""The user cache: opened without a write lock, its metadata checked, and never used again once broken."""

from __future__ import annotations

import sqlite3

import pytest

from kdbkit.kdb import Bundle, Target, open_bundle
from kdbkit.kdb.errors import BundleBusyError, CorruptBundleError
from kdbkit.runtime import user_cache as uc
from kdbkit.runtime.program_key import ProgramRequest, program_key
from kdbkit.runtime.user_cache import UserCache

TARGET = Target("cuda", "sm_90", (), 132)
KEY = program_key(ProgramRequest("k.c", "-DN=1"), target=TARGET, compiler="nvrtc 13.0", source_digest="ab" * 32)
BINARY = b"\x7fELF cubin bytes" * 50


def _cache(folder, compiler="nvrtc 13.0", target=TARGET, binary_format="cubin") -> UserCache:
    return UserCache(folder, target, compiler=compiler, binary_format=binary_format)


@pytest.fixture
def no_retry(monkeypatch):
    """A busy database fails at once instead of after 30 s of back-off."""
    monkeypatch.setattr(uc, "with_backoff", lambda fn, retry_s=0: fn())
    monkeypatch.setattr("kdbkit.kdb.bundle.BUSY_TIMEOUT_S", 0.05)


def test_an_existing_cache_opens_while_another_process_holds_the_write_lock(tmp_path, no_retry, fresh_log, capsys):
    first = _cache(tmp_path)
    assert first.put(KEY, BINARY)
    first.close()
    writer = sqlite3.connect(tmp_path / "sm_90.ukdb", timeout=0)
    writer.execute("BEGIN IMMEDIATE")  # another process in the middle of a store
    try:
        second = _cache(tmp_path)
        assert second.get(KEY) == BINARY  # opening needs no write lock, and readers never wait in WAL
        assert second.is_open and second.usable
    finally:
        writer.rollback()
        writer.close()
    assert capsys.readouterr().err == ""


def test_a_cache_damaged_under_a_reader_is_moved_aside_once_then_left_alone(tmp_path, fresh_log, capsys,
                                                                             monkeypatch):
    cache = _cache(tmp_path)
    assert cache.put(KEY, BINARY)
    calls = []
    real_get, real_put = Bundle.get, Bundle.put

    def failing_get(self, *a):
        calls.append("get")
        raise CorruptBundleError(f"{self.path}: the file is damaged (database disk image is malformed)")

    monkeypatch.setattr(Bundle, "get", failing_get)
    monkeypatch.setattr(Bundle, "put", lambda self, *a: calls.append("put") or real_put(self, *a))
    assert cache.get(KEY) is None and cache.usable
    aside = list(tmp_path.glob("sm_90.ukdb.corrupt-*"))
    assert len(aside) == 1 and open_bundle(aside[0]).stats().entries == 1  # kept for inspection
    assert cache.put(KEY, BINARY) and calls == ["get", "put"]  # a new file, written again
    # Damaged again in the same process: the file is left alone for the rest of it.
    bundle = cache._bundle
    assert cache.get(KEY) is None and not cache.usable
    assert cache.get(KEY) is None and cache.put(KEY, BINARY) is False and cache.get(KEY) is None
    assert calls == ["get", "put", "get"]
    assert bundle._conn is not None and cache._bundle is None
    err = capsys.readouterr().err
    assert err.count("moved it to") == 1 and aside[0].name in err and "kdb cache clear" in err
    assert err.count("is unusable") == 1
    monkeypatch.setattr(Bundle, "get", real_get)


@pytest.mark.parametrize("other, why", [
    (dict(target=Target("cuda", "sm_80")), "holds binaries for sm_80"),
    (dict(binary_format="ocl-binary"), "holds ocl-binary binaries"),
    (dict(codec="bzip2"), "its blobs are bzip2"),
])
def test_a_file_made_for_something_else_is_moved_aside(tmp_path, fresh_log, capsys, other, why):
    path = tmp_path / "sm_90.ukdb"
    made = dict(target=Target("cuda", "sm_90"), compiler="nvrtc 13.0", binary_format="cubin", codec="zstd")
    made.update(other)
    Bundle.create(path, made.pop("target"), **made).close()
    cache = _cache(tmp_path)
    assert cache.put(KEY, BINARY) and cache.get(KEY) == BINARY  # a new file, right for this device
    assert open_bundle(path).metadata.target == Target("cuda", "sm_90")
    (aside,) = tmp_path.glob("sm_90.ukdb.corrupt-*")
    err = capsys.readouterr().err
    assert "was not a cache for this device" in err and why in err and aside.name in err


def test_entries_of_another_compiler_are_kept_apart_not_moved(tmp_path, fresh_log, capsys):
    old = _cache(tmp_path, compiler="nvrtc 12.8")
    old_key = program_key(ProgramRequest("k.c", "-DN=1"), target=TARGET, compiler="nvrtc 12.8", source_digest="ab" * 32)
    assert old.put(old_key, b"old binary" * 20)
    old.close()
    new = _cache(tmp_path, compiler="nvrtc 13.0")
    assert new.get(KEY) is None  # the other compiler's entry is never returned for this key
    assert new.put(KEY, BINARY) and new.get(KEY) == BINARY
    assert open_bundle(tmp_path / "sm_90.ukdb").count() == 2 and not list(tmp_path.glob("*.corrupt-*"))
    assert capsys.readouterr().err == ""


def test_an_empty_file_being_created_by_another_process_is_not_moved_aside(tmp_path, no_retry, monkeypatch):
    path = tmp_path / "sm_90.ukdb"
    sqlite3.connect(path).close()  # SQLite made the file; its creator has not written the tables yet
    cache = _cache(tmp_path)
    assert cache.put(KEY, BINARY) and cache.get(KEY) == BINARY
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_a_foreign_sqlite_file_is_never_turned_into_a_cache(tmp_path, fresh_log, capsys):
    path = tmp_path / "sm_90.ukdb"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (text)")
    conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.commit()
    conn.close()
    cache = _cache(tmp_path)
    assert cache.put(KEY, BINARY)
    (aside,) = tmp_path.glob("sm_90.ukdb.corrupt-*")
    assert sqlite3.connect(aside).execute("SELECT text FROM notes").fetchall() == [("mine",)]


def test_busy_is_retried_then_reported(tmp_path):
    calls = []

    def busy():
        calls.append(1)
        raise BundleBusyError("locked")

    with pytest.raises(BundleBusyError):
        uc.with_backoff(busy, retry_s=0.02)
    assert len(calls) >= 2
