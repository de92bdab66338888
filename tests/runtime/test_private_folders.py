"""Only the user writes what the user runs: cache folders are made private whatever the umask,
and a folder or file another user could have written is refused with one warning, never loaded.

The second user is uid 65534 (``nobody``): the tests that act as that user run as root, as the
suite does in CI, and skip elsewhere. Tests of a folder this process may not read or write run
their process without capabilities (``setpriv``) when they run as root, so that mode bits apply.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kdbkit.runtime.samples import SAMPLES, run_samples
from tests.runtime.chain_fixtures import child_env

RELU = SAMPLES[0]
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as a second user (uid 65534) needs root")

# A process of its own: makes a handle, resolves every sample program (and runs them), prints
# where each came from and the mode of every file in the cache folder while the cache is open.
CHILD = """
import json, os, stat, sys
from pathlib import Path
from kdbkit.runtime.handle import Handle
from kdbkit.runtime.samples import run_samples
h = Handle()
sources = [r.source for r in run_samples(h, seed=1) if r.ok]
folder = Path(os.environ["KDB_CUSTOM_CACHE_DIR"])
modes = {}
for root, dirs, files in os.walk(folder):
    for name in dirs + files:
        p = Path(root) / name
        modes[str(p.relative_to(folder))] = stat.S_IMODE(os.lstat(p).st_mode)
h.close()
print(json.dumps({"sources": sources, "modes": modes}))
"""


def _child(env: dict, *, modes_apply: bool = False, umask: int | None = None) -> tuple[dict, str]:
    """Run CHILD; with ``modes_apply``, as a process that file modes bind (root without capabilities)."""
    kwargs = {"preexec_fn": (lambda: os.umask(umask))} if umask is not None else {}
    cmd = [sys.executable, "-c", CHILD]
    if modes_apply and os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv (util-linux): mode bits cannot be made to apply")
        cmd = [setpriv, "--bounding-set=-all", "--inh-caps=-all", *cmd]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def _lines_naming(err: str, path: Path) -> list[str]:
    return [line for line in err.splitlines() if str(path) in line]


@pytest.fixture
def open_tmp():
    """A folder every user may enter (pytest's own are root's only), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="kdbkit-private-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _env(tmp_path: Path, cache: Path) -> dict:
    (tmp_path / "system").mkdir(exist_ok=True)
    return {**child_env(tmp_path), "KDB_CUSTOM_CACHE_DIR": str(cache), "KDB_USER_DB_PATH": str(tmp_path / "userdb")}


@as_root
@pytest.mark.parametrize("how", ["owned by nobody", "writable by all"])
def test_a_binary_planted_by_another_user_is_never_loaded(make_handle, isolated, open_tmp, monkeypatch, capfd,
                                                          fresh_log, how):
    clean = make_handle()
    assert clean.program(RELU.kernel_file, RELU.options).source == "jit"
    genuine = clean.user_cache_path
    clean.close()  # the WAL is folded into the file
    offered = open_tmp / "offered.ukdb"
    shutil.copyfile(genuine, offered)
    os.chmod(offered, 0o644)
    folder = open_tmp / "cache"
    folder.mkdir()
    if how == "owned by nobody":
        os.chown(folder, NOBODY, NOBODY)
        os.chmod(folder, 0o700)
    else:
        os.chmod(folder, 0o777)
    # nobody writes, under the very key this process will ask for, a binary it would load
    subprocess.run(["cp", str(offered), str(folder / genuine.name)], user=NOBODY, group=NOBODY, extra_groups=[],
                   check=True)
    monkeypatch.setenv("KDB_CUSTOM_CACHE_DIR", str(folder))
    capfd.readouterr()
    handle = make_handle()
    assert handle.program(RELU.kernel_file, RELU.options).source == "jit"
    assert all(r.ok and r.source in ("jit", "memory") for r in run_samples(handle, seed=3))
    err = capfd.readouterr().err
    assert len(_lines_naming(err, folder)) == 1 and "Traceback" not in err, err
    assert os.listdir(folder) == [genuine.name]  # nothing of root's written where nobody can write


@as_root
def test_a_system_bundle_folder_others_may_write_is_skipped(make_handle, isolated, open_tmp, monkeypatch, capfd,
                                                            fresh_log):
    folder = open_tmp / "system-db"
    folder.mkdir()
    os.chmod(folder, 0o777)
    monkeypatch.setenv("KDB_SYSTEM_DB_PATH", str(folder))
    from kdbkit.runtime import paths

    assert folder not in [d.path for d in paths.system_db_dirs()]
    err = capfd.readouterr().err
    assert len(_lines_naming(err, folder)) == 1 and "chmod 700" in err


def test_umask_000_still_makes_the_cache_private(tmp_path):
    cache = tmp_path / "made" / "by" / "kdbkit"
    env = _env(tmp_path, cache)
    env.pop("POCL_CACHE_DIR", None)  # PoCL's cache goes into kdbkit's folder too
    env["HOME"] = str(tmp_path)
    result, _ = _child(env, umask=0)
    assert result["sources"] and set(result["sources"]) <= {"jit"}
    for level in (tmp_path / "made", tmp_path / "made" / "by", cache):
        assert stat.S_IMODE(level.stat().st_mode) == 0o700, level
    modes = {name: mode for name, mode in result["modes"].items() if not name.startswith(("locks", "pocl/"))}
    ukdb = next(n for n in modes if n.endswith(".ukdb"))
    assert {ukdb, ukdb + "-wal", ukdb + "-shm"} <= set(modes)
    assert modes.get("pocl", 0o700) == 0o700  # PoCL's folder, on the PoCL device only
    files = {n: m for n, m in modes.items() if n != "pocl"}
    assert set(files.values()) == {0o600}, files


@pytest.mark.parametrize("mode", [0o000, 0o600])
def test_a_cache_folder_that_cannot_be_searched_is_one_warning(tmp_path, mode):
    folder = tmp_path / "cache"
    folder.mkdir()
    os.chmod(folder, mode)  # as after `sudo -u` without -H, or a chmod gone wrong
    try:
        result, err = _child(_env(tmp_path, folder), modes_apply=True)
    finally:
        os.chmod(folder, 0o700)
    assert result["sources"] and set(result["sources"]) <= {"jit"}
    assert len(_lines_naming(err, folder)) == 1 and "chmod 700" in err, err


def test_a_read_only_prebuilt_wal_cache_serves_hits_and_stores_nothing(tmp_path):
    folder = tmp_path / "image-cache"
    env = _env(tmp_path, folder)
    built, _ = _child(env)  # the image's builder
    assert set(built["sources"]) == {"jit"}
    ukdb = next(folder.glob("*.ukdb"))
    conn = sqlite3.connect(ukdb)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with conn:  # one program the image lacks: compiled, kept in memory, stored nowhere
        conn.execute("DELETE FROM kern_db WHERE kernel_name LIKE 'matmul%'")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()  # the last connection: SQLite removes the -wal and -shm, as an image ships the file
    assert not os.path.exists(f"{ukdb}-shm")  # without it SQLite cannot read the file read-only by itself
    before = sorted(os.listdir(folder))
    os.chmod(folder, 0o555)
    try:
        result, err = _child(env, modes_apply=True)
    finally:
        os.chmod(folder, 0o700)
    assert sorted(result["sources"]) == ["jit", "user", "user"], err
    assert sorted(os.listdir(folder)) == before
    assert len(_lines_naming(err, folder)) == 1 and "Cannot write" in err, err


@as_root
def test_a_user_find_db_another_user_could_write_is_ignored(make_handle, isolated, open_tmp, monkeypatch, capfd,
                                                           fresh_log):
    folder = open_tmp / "userdb"
    folder.mkdir()
    os.chown(folder, NOBODY, NOBODY)  # a planted find-db would choose which solvers this process runs
    monkeypatch.setenv("KDB_USER_DB_PATH", str(folder))
    handle = make_handle()
    assert handle.dispatcher.find_db.user_path is None
    err = capfd.readouterr().err
    assert len(_lines_naming(err, folder)) == 1 and "chown" in err, err
