"""Many processes and threads share one user cache: no corruption, no "database is locked", one compile per key."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kdbkit.kdb import open_bundle, verify_bundle
from tests.runtime.chain_fixtures import child_env

ROOT = Path(__file__).resolve().parents[2]
N = 8


def _race(tmp_path, salts_per_proc):
    env = child_env(tmp_path)
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "runtime" / "race_child.py"), *salts],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for salts in salts_per_proc]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        assert "locked" not in err and "Traceback" not in err, err
        outs.append(json.loads(out))
    return outs


def _ukdb(tmp_path):
    files = list((tmp_path / "cache").glob("*.ukdb"))
    assert len(files) == 1
    return files[0]


@pytest.mark.slow
def test_processes_racing_on_one_key_compile_it_once(isolated, chain_device):
    outs = _race(isolated, [["same"]] * N)
    found = [o[0] for o in outs]
    assert found.count("compiled") == 1, found  # the others waited on the lock and read the result
    assert set(found) - {"compiled"} <= {"built by another process", "user"}
    path = _ukdb(isolated)
    assert open_bundle(path).count() == 1 and verify_bundle(path).ok


@pytest.mark.slow
def test_processes_on_different_keys_all_land(isolated, chain_device):
    outs = _race(isolated, [[f"p{i}a", f"p{i}b", "shared"] for i in range(N)])
    flat = [s for o in outs for s in o]
    assert len(flat) == 3 * N
    assert [o[2] for o in outs].count("compiled") == 1  # the shared key was compiled once
    path = _ukdb(isolated)
    assert open_bundle(path).count() == 2 * N + 1 and verify_bundle(path).ok


def test_threads_racing_on_one_key_compile_it_once(make_handle, chain_backend, monkeypatch):
    from kdbkit.runtime import lease
    from kdbkit.runtime.compilers import compiler_for

    compiles = []
    compiler_class = type(compiler_for(chain_backend.device.target))
    real = compiler_class.compile

    def counting(self, *a, **k):
        compiles.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(compiler_class, "compile", counting)
    handles = [make_handle() for _ in range(N)]
    sources, errors = [], []

    def work(h):
        try:
            sources.append(h.program("activation.c", ["-DSALT=threads"]).source)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(h,)) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(compiles) == 1
    # The JIT tier serves every thread that got there while the compile ran (one of them by
    # compiling); a thread started late on a loaded machine finds the user cache filled instead.
    assert len(sources) == N and set(sources) <= {"jit", "user"} and "jit" in sources
    assert len(lease._thread_locks) == 0  # per-key thread locks are gone once nobody waits for them
