"""Stress: many processes and threads on one user cache, with `kdb cache clear` running and
writers killed mid-write; every result checked against the key it was asked for.

CI runs the small size; ``KDB_STRESS=large`` runs the size the reliability figures quote
(16 processes x 4 threads; docs/reliability.md). Each program adds its key's constant, so a
binary served under another key is a wrong result, counted.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from kdbkit.kdb import verify_bundle
from tests.prerequisites import require_nvrtc
from tests.runtime.chain_fixtures import child_env

pytestmark = pytest.mark.slow  # many processes and builds: CI runs them, `-m "not slow"` does not
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LARGE = os.environ.get("KDB_STRESS") == "large"
PROCESSES, THREADS, ROUNDS = (16, 4, 3) if LARGE else (4, 2, 2)
KILLS = 20 if LARGE else 4

STRESS_ADD = """\
/* stress_add.c: y = x + KDB_ADD; the stress tests' program, one binary per constant. */
#include "kdb_compat.h"

KDB_KERNEL void add_const(const KDB_GLOBAL float* x, KDB_GLOBAL float* y, int n)
{
    for (int i = KDB_GLOBAL_ID_X; i < n; i += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X)
        y[i] = x[i] + (float)(KDB_ADD);
}
"""


@pytest.fixture
def stress_env(isolated, chain_device):
    kernels = isolated / "stress kernels"
    kernels.mkdir()
    (kernels / "stress_add.c").write_text(STRESS_ADD)
    return child_env(isolated, KDB_KERNEL_PATH=str(kernels))


def _report(line: str) -> None:
    """A figure for docs/reliability.md (shown with pytest -s)."""
    print(f"\n[stress {'large' if LARGE else 'CI'}] {line}")


def _start(env, keys, threads=THREADS, rounds=ROUNDS):
    return subprocess.Popen([sys.executable, str(HERE / "stress_child.py"), str(threads), str(rounds), *keys],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _collect(procs) -> tuple[Counter, list[str]]:
    """Every process's resolutions counted by (key, how), and every problem any of them met."""
    found: Counter = Counter()
    problems = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        if p.returncode != 0 or "Traceback" in err or "locked" in err:
            problems.append(f"exit {p.returncode}: {err[-2000:]}")
            continue
        result = json.loads(out)
        problems += result["errors"] + [f"wrong result: {w}" for w in result["wrong"]]
        for key, how, n in result["found"]:
            found[(key, how)] += n
    return found, problems


def _cache_files(isolated) -> list[Path]:
    return sorted((isolated / "cache").rglob("*.ukdb"))


def _kdb(env, *args, **kw):
    return subprocess.run([sys.executable, "-m", "kdbkit.runtime.cli.app", *args], env=env, capture_output=True,
                          text=True, cwd=ROOT, **kw)


def test_processes_and_threads_share_one_cache_and_compile_each_program_once(isolated, stress_env):
    shared = [str(k) for k in range(1, 5)]
    procs = [_start(stress_env, shared + [f"{100 + 10 * i + j}" for j in range(2)]) for i in range(PROCESSES)]
    found, problems = _collect(procs)
    assert not problems, problems[:5]
    compiled = Counter(key for (key, how), n in found.items() if how == "compiled" for _ in range(n))
    keys = {key for key, _ in found}
    assert keys == set(shared) | {f"{100 + 10 * i + j}" for i in range(PROCESSES) for j in range(2)}
    assert all(compiled[k] == 1 for k in keys), {k: compiled[k] for k in keys if compiled[k] != 1}
    for path in _cache_files(isolated):
        assert verify_bundle(path).ok, verify_bundle(path)
    _report(f"{PROCESSES} processes x {THREADS} threads x {ROUNDS} rounds: {sum(found.values())} resolutions "
            f"checked, {len(keys)} programs each compiled once, 0 errors, 0 wrong results")


def test_eviction_and_kdb_cache_clear_while_processes_resolve_lose_nothing_but_time(isolated, stress_env):
    stress_env = dict(stress_env, KDB_CACHE_MAXSIZE="64K")  # a few programs' worth: stores evict
    stop = threading.Event()
    clears = []

    def clear_in_a_loop():
        while not stop.is_set():
            done = _kdb(stress_env, "cache", "clear", "--yes")
            clears.append((done.returncode, done.stderr))
            time.sleep(0.2)

    clearer = threading.Thread(target=clear_in_a_loop)
    clearer.start()
    try:
        procs = [_start(stress_env, [str(k) for k in range(1, 7)]) for _ in range(PROCESSES)]
        found, problems = _collect(procs)
    finally:
        stop.set()
        clearer.join()
    assert not problems, problems[:5]
    assert clears and all(code == 0 and "Traceback" not in err for code, err in clears), clears[:3]
    assert sum(found.values()) == PROCESSES * THREADS * ROUNDS * 6
    for path in _cache_files(isolated):
        assert verify_bundle(path).ok, verify_bundle(path)
    compiles = sum(n for (_, how), n in found.items() if how == "compiled")
    _report(f"with eviction (64K) and {len(clears)} `kdb cache clear` runs: {sum(found.values())} resolutions "
            f"checked, {compiles} compiles of 6 programs, 0 errors, 0 wrong results")


def test_jit_writers_killed_mid_write_leave_a_cache_that_serves_right_binaries(isolated, stress_env):
    rng = random.Random(7)
    for i in range(KILLS):
        p = _start(stress_env, [str(200 + 10 * i + j) for j in range(6)], threads=2, rounds=1)
        time.sleep(rng.uniform(0.3, 2.5))
        p.send_signal(signal.SIGKILL)
        p.communicate()
    keys = [str(200 + 10 * i + j) for i in range(KILLS) for j in range(6)]
    found, problems = _collect([_start(stress_env, keys, threads=2, rounds=1)])
    assert not problems, problems[:5]
    assert sum(found.values()) == 2 * len(keys)
    for path in _cache_files(isolated):
        assert verify_bundle(path).ok, verify_bundle(path)
    _report(f"{KILLS} JIT writers SIGKILLed: then {len(keys)} programs resolved right, the cache verifies")


SMALL_CATALOGUE = [
    "bnorm,dir=infer,mode=spatial,type=fp32,shape=2x8x16x16,xs=2048x256x16x1,ys=2048x256x16x1,eps=1e-05,f=0.1,"
    "running=1,saved=1",
    "activ,dir=fwd,mode=relu,type=fp32,shape=2x8x16x16,xs=2048x256x16x1,ys=2048x256x16x1,a=0.0,b=0.0,g=0.0",
    "pool,dir=fwd,mode=max,type=fp32,shape=2x8x16x16,win=3x3,stride=2x2,pad=1x1,xs=2048x256x16x1,ys=512x64x8x1,idx=0",
]


def _temps(folder: Path) -> set[str]:
    """The temporary files of bundle writers in ``folder`` (a bundle being written, its journal)."""
    return {f.name for f in folder.iterdir() if f.name.endswith((".tmp", "-journal"))} if folder.is_dir() else set()


def test_kdb_build_killed_again_and_again_then_finishes_cleanly(isolated, stress_env, tmp_path):
    """Half the kills land while the bundle is being written (its temporary file seen), the
    others at random times; the next build must leave the folder holding its bundle alone."""
    require_nvrtc()  # NVRTC builds for sm_80 on the CPU machine, the quickest real build there is
    out, catalogue, target = tmp_path / "bundles", tmp_path / "small.txt", "sm_80"
    catalogue.write_text("".join(f"{line}\n" for line in SMALL_CATALOGUE))
    rng = random.Random(11)
    while_writing = 0
    for i in range(KILLS):
        p = subprocess.Popen([sys.executable, "-m", "kdbkit.runtime.cli.app", "build", "--target", target,
                              "-c", str(catalogue), "-o", str(out), "-j", "2"], env=stress_env, cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        left_before = _temps(out)  # by killed builds, removed by the next one that writes
        deadline = time.monotonic() + (rng.uniform(0.2, 1.5) if i % 2 else 120)
        while p.poll() is None and time.monotonic() < deadline and not (i % 2 == 0 and _temps(out) - left_before):
            time.sleep(0.002)
        while_writing += bool(_temps(out) - left_before) and p.poll() is None
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)  # the workers too, as an OOM killer or a lost node would
        p.wait()
    assert while_writing, "no kill landed while the bundle was being written"
    done = _kdb(stress_env, "build", "--target", target, "-c", str(catalogue), "-o", str(out), "-j", "2")
    assert done.returncode == 0, done.stderr
    bundle = out / "sm_80.kdb"
    assert verify_bundle(bundle).ok
    assert sorted(p.name for p in out.iterdir()) == [bundle.name, bundle.name + ".provenance.json"], \
        "a killed build's files were left behind (the bundle and its build record are all a build leaves)"
    _report(f"{KILLS} kdb build runs SIGKILLed ({while_writing} while writing): the next build verifies, "
            "nothing left behind")
