"""A compile lock held by a stalled holder is waited on with progress in the log and a bound,
after which the waiter compiles the program itself; lock files and their folder are private."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kdbkit.kdb import Target
from kdbkit.runtime.lease import FileLease
from kdbkit.runtime.program_key import ProgramRequest, program_key
from tests.runtime.chain_fixtures import child_env

CHILD = Path(__file__).with_name("stall_child.py")
ROOT = Path(__file__).resolve().parents[2]
BOUND = 3


def _child(tmp_path, mode, salt, **extra):
    env = child_env(tmp_path, KDB_COMPILE_LOCK_WAIT=str(BOUND), KDB_LOG_LEVEL="7", **extra)
    return subprocess.Popen([sys.executable, str(CHILD), mode, salt], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)


def _waited(err: str, holder: str) -> None:
    warnings = [line for line in err.splitlines() if "compile lock of activation.c" in line and "warning" in line]
    assert any("waiting for the compile lock" in w and ".lock" in w for w in warnings), err
    assert any("gave up waiting" in w and "compiling it here as well" in w for w in warnings), err
    assert any("trace" in line and f"held by {holder}" in line for line in err.splitlines()), err


@pytest.mark.slow  # waits out the bound
def test_a_stalled_holder_process_is_waited_on_for_the_bound_then_the_waiter_compiles(isolated, chain_device):
    holder = _child(isolated, "hold", "stalled-process")
    try:
        assert holder.stdout.readline().strip() == "compiling"  # it holds the program's locks now
        waiter = _child(isolated, "wait", "stalled-process")
        out, err = waiter.communicate(timeout=300)
        assert waiter.returncode == 0, err
        done = json.loads(out)
        assert done["source"] == "jit" and BOUND <= done["seconds"] < BOUND + 60, done
        _waited(err, f"process {holder.pid} on ")
    finally:
        holder.kill()
        holder.communicate()


@pytest.mark.slow  # waits out the bound
def test_a_stalled_thread_is_waited_on_for_the_bound_then_the_waiter_compiles(isolated, chain_device):
    child = _child(isolated, "threads", "stalled-thread")
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    done = json.loads(out.splitlines()[-1])
    assert done["source"] == "jit" and BOUND <= done["seconds"] < 2 * BOUND + 60, done
    _waited(err, "thread 'stalled' of this process")


def test_lock_files_are_private_whatever_the_umask(tmp_path):
    key = program_key(ProgramRequest("softmax.c", ("-DX=1",)), target=Target.parse("sm_90"), compiler="nvrtc 13.0",
                      source_digest="0" * 64)
    folder = tmp_path / "locks"
    old = os.umask(0)
    try:
        with FileLease(folder).hold(key):
            (lock,) = folder.glob("*.lock")
            assert stat.S_IMODE(lock.stat().st_mode) == 0o600
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        folder.chmod(0o755)  # made by an older kdbkit, or by hand
        lock.chmod(0o666)
        with FileLease(folder).hold(key):
            assert stat.S_IMODE(lock.stat().st_mode) == 0o600
            assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    finally:
        os.umask(old)


def test_idle_lock_files_are_removed_once_the_folder_holds_too_many_but_held_and_recent_ones_stay(tmp_path):
    import time

    from kdbkit.runtime import lease

    folder = tmp_path / "locks"
    folder.mkdir()
    old = time.time() - 2 * lease.IDLE_LOCK_S
    for i in range(lease.MAX_LOCK_FILES + 50):
        path = folder / f"{i:040x}.lock"
        path.touch()
        os.utime(path, (old, old))
    recent = folder / ("r" * 40 + ".lock")
    recent.touch()
    held = folder / f"{0:040x}.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(held)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        key = program_key(ProgramRequest("softmax.c", ("-DX=1",)), target=Target.parse("sm_90"),
                          compiler="nvrtc 13.0", source_digest="0" * 64)
        with FileLease(folder).hold(key):
            pass
        left = {p.name for p in folder.glob("*.lock")}
        assert left == {held.name, recent.name, f"{key.digest[:40]}.lock"}
    finally:
        holder.kill()
