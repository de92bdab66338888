"""``kdb cache clear`` and ``prune`` while other processes use the cache: nothing corrupts, nothing blocks."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from filelock import FileLock

from kdbkit.kdb import open_bundle, verify_bundle
from kdbkit.runtime.cache_admin import clear_cache
from kdbkit.runtime.samples import SAMPLES
from tests.runtime.chain_fixtures import child_env

ROOT = Path(__file__).resolve().parents[2]


def test_clear_empties_through_sqlite_while_others_read_and_compile(make_handle, isolated):
    handle = make_handle()
    for s in SAMPLES[:2]:
        handle.program(s.kernel_file, s.options)
    path = handle.user_cache_path
    folder = path.parent
    # Another user of the cache: a reader inside a read transaction (its snapshot pins the
    # WAL), and a compile holding its lock.
    reader = sqlite3.connect(path)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM kern_db").fetchone() == (2,)
    held = FileLock(str(folder / "locks" / "held-by-a-compile.lock"))
    held.acquire()
    idle = folder / "locks" / "idle.lock"
    idle.touch()
    aside = folder / f"{path.name}.corrupt-20260101-000000-1"
    aside.write_bytes(b"moved aside earlier")
    try:
        report = clear_cache(folder)
        assert report.entries == 2 and report.busy_locks == 1
        # The live file's journals are SQLite's, in use: deleting them would corrupt the database.
        assert Path(f"{path}-wal").exists() and Path(f"{path}-shm").exists()
        assert reader.execute("SELECT count(*) FROM kern_db").fetchone() == (2,)  # its snapshot still reads
        assert (folder / "locks" / "held-by-a-compile.lock").exists() and not idle.exists() and not aside.exists()
    finally:
        reader.rollback()
        reader.close()
        held.release()
    assert verify_bundle(path).ok and open_bundle(path).count() == 0
    # The handle that had the cache open goes on: what it needs again is compiled and stored.
    again = make_handle()
    assert again.program(SAMPLES[2].kernel_file, SAMPLES[2].options).source == "jit"
    assert make_handle().program(SAMPLES[2].kernel_file, SAMPLES[2].options).source == "user"


def test_clear_while_another_process_writes(isolated, chain_device):
    # A second process stores programs in a loop while `kdb cache clear` runs: no error on
    # either side, and the file verifies afterwards.
    writer = textwrap.dedent("""
        import sys
        from kdbkit.runtime.handle import Handle
        from kdbkit.runtime.backends.registry import default_device
        with Handle(default_device()) as h:
            for i in range(int(sys.argv[1])):
                h.program("activation.c", [f"-DSALT=w{i}"])
        print("done")
    """)
    env = child_env(isolated)
    proc = subprocess.Popen([sys.executable, "-c", writer, "4"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    cleared = 0
    while proc.poll() is None:
        folder = isolated / "cache"
        if folder.is_dir() and list(folder.glob("*.ukdb")):
            cleared += clear_cache(folder).entries >= 0
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and out.strip() == "done", err
    assert "Traceback" not in err and "damaged" not in err and "unusable" not in err, err
    assert cleared and all(verify_bundle(p).ok for p in (isolated / "cache").glob("*.ukdb"))


def test_clear_leaves_a_cache_that_another_process_is_creating(tmp_path):
    # SQLite makes the file before its creator's first transaction commits: not a damaged file.
    folder = tmp_path / "cache"
    folder.mkdir()
    creating = folder / "sm_90.ukdb"
    creator = sqlite3.connect(creating)
    creator.execute("PRAGMA journal_mode = wal")
    creator.execute("BEGIN IMMEDIATE")
    creator.execute("CREATE TABLE kern_db (id INTEGER PRIMARY KEY)")
    try:
        report = clear_cache(folder)
        assert creating.exists() and Path(f"{creating}-wal").exists() and report.removed_files == []
    finally:
        creator.rollback()
        creator.close()


POCL_CHILD = textwrap.dedent("""
    import os, sys
    from kdbkit.runtime.handle import Handle
    with Handle() as h:
        h.program("activation.c", ["-DKDB_DTYPE=float", "-DSALT=" + sys.argv[1]])
    print(os.environ.get("POCL_CACHE_DIR"), os.environ.get("POCL_KERNEL_CACHE"))
""")


def _pocl_child(isolated, salt: str, **extra: str) -> list[str]:
    """A fresh process that compiles one program on PoCL; its POCL_CACHE_DIR and POCL_KERNEL_CACHE."""
    env = {k: v for k, v in child_env(isolated, **extra).items() if k not in ("POCL_CACHE_DIR", "POCL_KERNEL_CACHE")}
    env.update({k: v for k, v in extra.items() if k.startswith("POCL_")})
    proc = subprocess.run([sys.executable, "-c", POCL_CHILD, salt], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_pocl_keeps_its_kernel_cache_in_kdbkits_cache_folder(isolated, chain_device, tmp_path):
    """PoCL's own final compile was most of a first call's time with a bundle: its cache now
    lives in kdbkit's (versioned) cache folder, private, emptied by `kdb cache clear`."""
    if chain_device.backend != "opencl" or "Portable Computing Language" not in chain_device.driver:
        pytest.skip(f"PoCL's cache: the chain device is {chain_device.name}, not PoCL")
    pocl = isolated / "cache" / "pocl"
    salt = str(tmp_path.name)  # a program no PoCL cache holds yet
    assert _pocl_child(isolated, salt) == [str(pocl), "1"]
    assert (pocl.stat().st_mode & 0o777) == 0o700 and any(pocl.rglob("*")), "PoCL cached nothing there"
    proc = subprocess.run([sys.executable, "-c", "from kdbkit.runtime.cli.app import main; main()", "cache",
                           "clear", "--yes"], env=child_env(isolated), cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert pocl.is_dir() and not any(pocl.iterdir())
    # The user's own settings are kept; KDB_DISABLE_CACHE leaves PoCL as it is.
    mine = tmp_path / "my-pocl"
    mine.mkdir()
    assert _pocl_child(isolated, salt, POCL_CACHE_DIR=str(mine)) == [str(mine), "1"]
    assert any(mine.rglob("*")) and not any(pocl.iterdir())
    assert _pocl_child(isolated, salt, POCL_KERNEL_CACHE="0") == ["None", "0"]
    assert _pocl_child(isolated, salt, KDB_DISABLE_CACHE="1", XDG_CACHE_HOME=str(tmp_path / "xdg")) == ["None", "None"]
    assert not any(pocl.iterdir())
