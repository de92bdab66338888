"""A broken user cache or system bundle never stops the runtime: it warns once, keeps results in memory,
repairs what it can."""

from __future__ import annotations

import os
import sqlite3
import subprocess

import pytest

from kdbkit.kdb import Bundle, open_bundle
from kdbkit.runtime.samples import SAMPLES, run_samples

RELU = SAMPLES[0]


@pytest.fixture
def fresh_warnings(fresh_log):
    return fresh_log


def _ukdb(handle):
    return handle.user_cache_path


def test_cache_folder_that_cannot_be_created(make_handle, isolated, monkeypatch, capfd, fresh_warnings):
    blocker = isolated / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(blocker / "cache"))
    handle = make_handle()
    results = run_samples(handle, seed=4)
    assert all(r.ok and r.source == "jit" for r in results)
    assert handle.program(RELU.kernel_file, RELU.options).source == "memory"
    err = capfd.readouterr().err
    assert err.count("is unusable") == 1 and str(blocker) in err and "KDB_CUSTOM_CACHE_DIR" in err


def test_cache_under_proc_is_unwritable_even_for_root(make_handle, monkeypatch, capfd, fresh_warnings):
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", "/proc/kdbkit-cache")
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "jit"
    assert "kdbkit-cache" in capfd.readouterr().err


def test_read_only_cache_file_is_still_read(make_handle, isolated, monkeypatch, capfd, fresh_warnings):
    make_handle().program(RELU.kernel_file, RELU.options)
    # Turn the file into one SQLite cannot write: a read-only database via the immutable route is
    # not available to root, so simulate the failure the way SQLite reports it.
    from kdbkit.runtime import user_cache

    real_open = user_cache.Bundle.open

    def refuse(path, *, writable=False, **k):  # as SQLite refuses a read-only file or folder
        if writable:
            raise user_cache.KdbError("attempt to write a readonly database")
        return real_open(path, **k)

    monkeypatch.setattr(user_cache.Bundle, "open", refuse)
    handle = make_handle()
    assert handle.program(RELU.kernel_file, RELU.options).source == "user"
    assert handle.program("reduce_sum.c", ["-DBLOCK=256"]).source == "jit"
    assert "Cannot write the user kernel cache" in capfd.readouterr().err
    monkeypatch.setattr(user_cache.Bundle, "open", real_open)


def test_full_database_keeps_results_in_memory(make_handle, isolated, monkeypatch, capfd, fresh_warnings):
    from kdbkit.runtime import user_cache

    real_create = user_cache.Bundle.create

    def tiny(*a, **k):  # SQLite's own "database or disk is full", from a page limit
        b = real_create(*a, **k)
        pages = b._conn.execute("PRAGMA page_count").fetchone()[0]
        b._conn.execute(f"PRAGMA max_page_count = {pages}")
        return b

    monkeypatch.setattr(user_cache.Bundle, "create", tiny)
    handle = make_handle()
    results = run_samples(handle, seed=5)
    assert all(r.ok and r.source == "jit" for r in results)
    err = capfd.readouterr().err
    assert err.count("Cannot write the user kernel cache") == 1 and "full" in err


def test_full_disk_on_a_real_tiny_filesystem(make_handle, isolated, monkeypatch, capfd, fresh_warnings):
    mnt = isolated / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the page-limit test covers SQLite's full error")
    try:
        (mnt / "filler").write_bytes(b"\0" * 40 * 1024)
        monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(mnt / "cache"))
        results = run_samples(make_handle(), seed=6)
        assert all(r.ok and r.source == "jit" for r in results)
        assert "kdbkit" in capfd.readouterr().err
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_garbage_ukdb_is_moved_aside_and_replaced(make_handle, isolated, capfd, fresh_warnings):
    handle = make_handle()
    path = _ukdb(handle)
    handle.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not SQLite" * 300)
    h2 = make_handle()
    assert h2.program(RELU.kernel_file, RELU.options).source == "jit"
    assert open_bundle(path).count() == 1
    aside = list(path.parent.glob(path.name + ".corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not SQLite")
    assert "moved it to" in capfd.readouterr().err
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "user"


def test_corrupt_entry_is_removed_and_rebuilt(make_handle, isolated, capfd, fresh_warnings):
    h = make_handle()
    h.program(RELU.kernel_file, RELU.options)
    path = _ukdb(h)
    h.close()
    conn = sqlite3.connect(path)
    blob = bytearray(conn.execute("SELECT kernel_blob FROM kern_db").fetchone()[0])
    blob[len(blob) // 2] ^= 0x55
    conn.execute("UPDATE kern_db SET kernel_blob = ?", (bytes(blob),))
    conn.commit()
    conn.close()
    h2 = make_handle()
    results = run_samples(h2, samples=SAMPLES[:1], seed=7)
    assert results[0].source == "jit" and results[0].ok
    assert "corrupt" in capfd.readouterr().err
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "user"


def test_entry_that_decodes_but_does_not_load_is_replaced(make_handle, isolated, chain_backend):
    h = make_handle()
    h.program(RELU.kernel_file, RELU.options)
    path = _ukdb(h)
    h.close()
    with Bundle.open(path, writable=True) as b:  # valid hash, wrong bytes: a binary for another device
        (name, args, _), = list(b.items())
        b.put(name, args, b"\x7fELF not an OpenCL binary for this device" * 10)
    program = make_handle().program(RELU.kernel_file, RELU.options)
    assert program.source == "jit" and any(s.outcome == "unloadable" for s in program.steps)
    assert make_handle().program(RELU.kernel_file, RELU.options).source == "user"


def test_busy_database_is_retried_with_backoff():
    from kdbkit.kdb import BundleBusyError
    from kdbkit.runtime.user_cache import with_backoff

    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise BundleBusyError("database is locked")
        return "done"

    assert with_backoff(flaky) == "done" and len(calls) == 3

    def always_busy():
        raise BundleBusyError("database is locked")

    with pytest.raises(BundleBusyError):
        with_backoff(always_busy, retry_s=0.05)


def test_a_system_bundle_damaged_anywhere_never_stops_the_runtime(make_handle, isolated, chain_backend, capfd,
                                                                  fresh_warnings):
    from kdbkit.packager.device_build import build_bundle

    requests = [(s.kernel_file, s.options) for s in SAMPLES]
    make_handle().programs(requests)  # the user cache now holds every program: the safe fallback
    (isolated / "built").mkdir()
    good = build_bundle(chain_backend.device.target, requests, isolated / "built").read_bytes()
    page = 16384
    assert len(good) >= 4 * page
    installed = isolated / "system" / chain_backend.device.target.bundle_name()
    outcomes = set()
    for start in range(page, len(good), page):  # page 0 is the header: SQLite refuses that file at open
        bad = bytearray(good)
        bad[start:start + page] = bytes(b ^ 0xA5 for b in bad[start:start + page])
        installed.write_bytes(bytes(bad))
        handle = make_handle()
        results = run_samples(handle, seed=start)
        assert all(r.ok for r in results), start
        assert {r.source for r in results} <= {"system", "user"}
        outcomes.update(step[2] for r in results for step in r.steps)
    assert "damaged" in outcomes or "corrupt" in outcomes  # some damage was met at lookup, and survived
    assert "the file is damaged" in capfd.readouterr().err


def _unloadable_dictionary() -> bytes:
    """A trained zstd dictionary whose entropy tables are damaged: zstd refuses to load it."""
    import random

    from kdbkit.kdb.codec import train_dictionary

    rng = random.Random(0)
    samples = [b"\x7fELF" + bytes([i % 7]) * 30 + b"".join(rng.choice([b"mov", b"add", b"ld.global"]) for _ in range(60))
               for i in range(96)]
    dictionary = bytearray(train_dictionary(samples, dict_size=1024, level=3))
    dictionary[8:40] = b"\xff" * 32
    return bytes(dictionary)


def test_a_system_bundle_whose_dictionary_does_not_load_only_warns(make_handle, isolated, chain_backend, capfd,
                                                                   fresh_warnings):
    """Once a ZstdError from the handle's warm-up: now a damaged bundle, a warning, and the next tier."""
    from kdbkit.packager.device_build import build_bundle

    (isolated / "built").mkdir()
    built = build_bundle(chain_backend.device.target, [(RELU.kernel_file, RELU.options)], isolated / "built")
    installed = isolated / "system" / chain_backend.device.target.bundle_name()
    installed.write_bytes(built.read_bytes())
    with sqlite3.connect(installed) as conn:
        conn.execute("INSERT OR REPLACE INTO kdb_meta(key, value) VALUES ('zstd_dict', ?)", (_unloadable_dictionary(),))
    conn.close()
    handle = make_handle()  # warms the bundle up: the dictionary fails to load here first
    program = handle.program(RELU.kernel_file, RELU.options)
    assert program.source in ("user", "jit")
    assert "could not create decompression dict" in capfd.readouterr().err
