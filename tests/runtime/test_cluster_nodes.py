"""Several "nodes" (processes with user caches of their own) share one real redis-server: each
program is compiled once across all of them, a Redis crash mid-run costs only speed, and a lease
holder that dies holds nobody back beyond its lease."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from kdbkit.runtime.redis_tier import PREFIX
from tests.prerequisites import require_redis_server
from tests.runtime.chain_fixtures import child_env
from tests.runtime.redis_server import RedisServer

pytest.importorskip("redis", reason="no redis client: pip install 'kdbkit[cluster]'")
ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "tests" / "runtime" / "cluster_node.py"


@pytest.fixture
def server(tmp_path):
    running = RedisServer(require_redis_server(), tmp_path / "redis")
    yield running
    running.stop()


def _start_nodes(tmp_path, url: str, seeds, count: int, pause: float, **extra: str):
    procs = []
    for seed in seeds:
        env = child_env(tmp_path, KDB_REMOTE_CACHE=url, **extra)
        env["KDB_CUSTOM_CACHE_DIR"] = str(tmp_path / f"node{seed}" / "cache")
        env["KDB_USER_DB_PATH"] = str(tmp_path / f"node{seed}" / "userdb")
        env.setdefault("KDB_REMOTE_TIMEOUT_MS", "5000")  # eight processes on two cores: slow is not down
        env.setdefault("KDB_COMPILE_LOCK_WAIT", "600")  # nor is a long wait for a lease: compile once
        procs.append(subprocess.Popen([sys.executable, str(NODE), str(seed), str(count), str(pause)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT))
    return procs


def _finish(procs):
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        assert "Traceback" not in err, err
        outs.append((json.loads(out), err))
    return outs


@pytest.mark.slow
def test_eight_nodes_compile_each_program_once_between_them(tmp_path, server):
    outs = _finish(_start_nodes(tmp_path, server.url, seeds=range(8), count=8, pause=0.0))
    results = [r for out, _ in outs for r in out]
    assert all(r["ok"] for r in results)
    compiled = Counter(r["program"] for r in results if r["how"] == "compiled")
    asked = {r["program"] for r in results}
    assert len(asked) >= 10  # a real mix: most of the twelve programs, each asked for by several nodes
    assert compiled == Counter(asked), "each distinct program compiled exactly once across the nodes"
    assert {r["how"] for r in results} - {"compiled", "built by another process", "remote"} == set()
    assert len(server.client().keys(PREFIX + "*")) == len(asked)


@pytest.mark.slow
def test_a_redis_crash_mid_run_costs_only_speed_and_the_tier_comes_back(tmp_path, server):
    procs = _start_nodes(tmp_path, server.url, seeds=range(3), count=12, pause=0.4, KDB_REMOTE_BACKOFF="1",
                         KDB_REMOTE_TIMEOUT_MS="200")
    client = server.client()
    deadline = time.monotonic() + 120
    while len(client.keys(PREFIX + "*")) < 3:  # the nodes are under way and publishing
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.05)
    server.kill()
    time.sleep(1.5)  # the nodes meet the outage
    restarted = server.restart()
    try:
        outs = _finish(procs)
        warned = []
        for out, err in outs:
            assert len(out) == 12 and all(r["ok"] for r in out)
            warned.append(sum("not answering" in line for line in err.splitlines()))
        # at most one warning a node (a node that asked nothing during the outage reconnects unaware)
        assert max(warned) == 1 and min(warned) >= 0, warned
        # after the back-off the nodes use the new, empty server again: what they compile lands there
        assert restarted.client().keys(PREFIX + "*")
    finally:
        restarted.stop()


def test_a_lease_holder_that_dies_holds_the_others_back_no_longer_than_its_lease(tmp_path, server, isolated,
                                                                                 make_handle, monkeypatch):
    from kdbkit.runtime.samples import SAMPLES

    relu = SAMPLES[0]
    monkeypatch.setenv("KDB_REMOTE_CACHE", server.url)
    monkeypatch.setenv("KDB_REMOTE_LEASE_TTL", "2")
    monkeypatch.setenv("KDB_REMOTE_TIMEOUT_MS", "5000")
    monkeypatch.setenv("KDB_COMPILE_LOCK_WAIT", "120")  # the lease's expiry, not the wait's bound, must free it
    holder_code = (
        "import sys, time\n"
        "from kdbkit.runtime.backends.registry import default_device\n"
        "from kdbkit.runtime.handle import Handle\n"
        "from kdbkit.runtime.program_key import ProgramRequest\n"
        "h = Handle(default_device())\n"
        "tier = next(t for t in h.sources if t.name == 'remote')\n"
        f"key = tier.context.key(ProgramRequest({relu.kernel_file!r}, {list(relu.options)!r}))\n"
        "with tier.lease().hold(key):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n")
    env = child_env(tmp_path, KDB_REMOTE_CACHE=server.url, KDB_REMOTE_LEASE_TTL="2")
    holder = subprocess.Popen([sys.executable, "-c", holder_code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        handle = make_handle()
        found = {}
        waiter = threading.Thread(target=lambda: found.update(p=handle.program(relu.kernel_file, relu.options)))
        t0 = time.monotonic()
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive(), "the waiter waits while the holder lives"
        holder.kill()  # mid-"compile": it never publishes nor releases
        waiter.join(timeout=60)
        assert not waiter.is_alive()
        assert found["p"].source == "jit" and found["p"].steps[-2].outcome == "compiled"
        assert time.monotonic() - t0 < 60  # freed by the lease's expiry (2 s), far before the wait's bound
    finally:
        holder.kill()
        holder.wait()
