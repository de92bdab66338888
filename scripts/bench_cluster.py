#!/usr/bin/env python3
"""The cluster tier on a real redis-server: N simulated nodes (processes with user caches of their
own) run the demo network (ResNet-18, kdbkit.runtime.demo) to its first result.

All in one run, on the default device (PoCL on the CPU where there is no GPU):
- ``alone``: one node, empty user cache, empty tier: what one node compiles, and its JIT times;
- ``together``: N nodes started at once on an emptied tier: the compiles summed over the nodes
  (the compile lease makes it one node's work: target at most 1.1x ``alone``'s count and time);
- ``warm tier``: N fresh nodes (empty user caches) one after another on the tier the others
  filled: every program a remote hit (each node alone, as separate machines would be);
- ``local warm``: the same number of fresh processes whose user cache is warm, no tier: the
  target is a warm-tier node's first result at most 1.5x this one's (medians);
- per program, a remote hit's latency (warm tier) beside a user-cache hit's (local warm) and a
  JIT's (alone).
Driver caches (PoCL's kernel cache, CUDA's) are off in every run, as ``kdb demo`` keeps them for
its JIT run: on PoCL a loaded binary is finished by PoCL at its first launch in every mode alike.

Writes ``bench_cluster.json``, ``bench_cluster.png`` and ``bench_cluster.md`` in ``--out``.

Usage: python scripts/bench_cluster.py [--nodes 8] [--out docs] [--redis-server PATH]
       (a node: python scripts/bench_cluster.py --node, with the environment the driver sets)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kdbkit.runtime.demo import DRIVER_CACHES_OFF

TARGET_WARM_RATIO = 1.5
TARGET_COMPILE_RATIO = 1.1


def node() -> None:
    """One node: the demo network to its first result; prints what it timed and how each program was found."""
    import numpy as np

    from kdbkit.runtime.backends.registry import open_backend, pick_device
    from kdbkit.runtime.demo import TOLERANCE, demo_network
    from kdbkit.runtime.handle import Handle

    import kdbkit.runtime.jit as jit

    # The compiler's own CPU time, beside the JIT step's wall time: simulated nodes share this
    # machine's cores (on PoCL their kernels run on them too), which separate machines would not.
    compile_cpu_ms: list[float] = []
    build_once = jit.build_once

    def timed_build_once(key, leases, recheck, compile_fn, store):
        def compile_timed():
            t = time.thread_time()
            try:
                return compile_fn()
            finally:
                compile_cpu_ms.append((time.thread_time() - t) * 1e3)
        return build_once(key, leases, recheck, compile_timed, store)

    jit.build_once = timed_build_once
    # and the write-through of a hit into the user cache, which a warm-tier node pays per program
    from kdbkit.runtime.lookup import LookupChain

    through_ms: list[float] = []
    write_through = LookupChain._write_through

    def timed_write_through(self, source, request, binary):
        t = time.perf_counter()
        write_through(self, source, request, binary)
        through_ms.append((time.perf_counter() - t) * 1e3)

    LookupChain._write_through = timed_write_through
    device = pick_device(None)
    backend = open_backend(device)
    net = demo_network()
    x = np.random.default_rng(0).standard_normal(net.input_shape)
    barrier = os.environ.get("BENCH_CLUSTER_BARRIER")
    if barrier:  # set up (imports, device), then start with the others, as separate machines would
        Path(barrier, f"ready-{os.getpid()}").touch()
        while not Path(barrier, "go").exists():
            time.sleep(0.005)
    t0 = time.perf_counter()
    with Handle(backend=backend) as handle:
        handle_ms = (time.perf_counter() - t0) * 1e3
        net.to_device(handle)
        staged = net.input_tensor(handle, x)
        backend.synchronize()
        t1 = time.perf_counter()
        y = net.download(handle, net.forward(handle, staged))
        first_ms = (time.perf_counter() - t1) * 1e3 + (t1 - t0) * 1e3
        programs = list(handle.chain.memory.values())
        steps = [(s.name, s.outcome, s.ms) for p in programs for s in p.steps]
        staged.buffer.free()
        net.release()
    backend.close()
    want = net.reference_forward(x)
    error = float(np.linalg.norm(y - want) / np.linalg.norm(want))
    compiled = [ms for name, outcome, ms in steps if name == "jit" and outcome == "compiled"]
    json.dump({"device": device.name, "backend": device.backend, "first_ms": first_ms, "handle_ms": handle_ms,
               "programs": len(programs),
               "sources": {src: sum(p.source == src for p in programs) for src in {p.source for p in programs}},
               "compiles": len(compiled), "compile_ms": sum(compiled),
               "hit_ms": {tier: [ms for name, outcome, ms in steps if name == tier and outcome == "hit"]
                          for tier in ("remote", "user")},
               "jit_ms": compiled, "compile_cpu_ms": sum(compile_cpu_ms), "write_through_ms": sum(through_ms),
               "ok": error < TOLERANCE}, sys.stdout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A redis-server on a loopback port in a temporary folder, for the run."""

    def __init__(self, executable: str, folder: Path):
        self.port = _free_port()
        self.process = subprocess.Popen([executable, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                         str(folder), "--save", "", "--appendonly", "no"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{executable} did not start")
                time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def flush(self) -> None:
        import redis

        redis.Redis.from_url(self.url).flushdb()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def _start(work: Path, name: str, url: str | None, barrier: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, **DRIVER_CACHES_OFF, "KDB_CUSTOM_CACHE_DIR": str(work / name / "cache"),
           "KDB_USER_DB_PATH": str(work / name / "userdb"), "KDB_SYSTEM_DB_PATH": str(work / "no-bundles"),
           "KDB_DISABLE_PREFETCH": "1", "POCL_CACHE_DIR": str(work / name / "pocl")}  # PoCL's scratch: per node
    (work / name / "pocl").mkdir(parents=True, exist_ok=True)
    env.pop("KDB_REMOTE_CACHE", None)
    if barrier is not None:
        env["BENCH_CLUSTER_BARRIER"] = str(barrier)
    if url:
        env["KDB_REMOTE_CACHE"] = url
        env["KDB_REMOTE_TIMEOUT_MS"] = "2000"  # N processes on a few cores: slow is not down
    return subprocess.Popen([sys.executable, __file__, "--node"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _results(procs: list[subprocess.Popen]) -> list[dict]:
    results = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"a node failed:\n{err}")
        result = json.loads(out)
        result["warnings"] = [line for line in err.splitlines() if "warning" in line and "Missing system" not in line]
        if not result["ok"]:
            raise SystemExit(f"a node computed a wrong result: {result}")
        results.append(result)
    return results


def _run(*names_urls, work: Path) -> list[dict]:
    return _results([_start(work, name, url) for name, url in names_urls])


def _together(nodes: int, url: str, work: Path) -> list[dict]:
    """N nodes that start their timed run at once: each sets up (Python, the device: what separate
    machines do each on its own CPUs, which simulated nodes would share) and waits at a barrier."""
    barrier = work / "barrier"
    barrier.mkdir()
    procs = [_start(work, f"together{i}", url, barrier) for i in range(nodes)]
    while len(list(barrier.glob("ready-*"))) < nodes:
        if any(p.poll() is not None for p in procs):
            break  # a node failed: _results says why
        time.sleep(0.01)
    (barrier / "go").touch()
    return _results(procs)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure(nodes: int, redis_server: str, work: Path) -> dict:
    (work / "no-bundles").mkdir(parents=True, exist_ok=True)
    redis = Redis(redis_server, work)
    try:
        alone = _run(("alone", redis.url), work=work)[0]
        redis.flush()
        together = _together(nodes, redis.url, work)
        warm_tier = [_run((f"warm{i}", redis.url), work=work)[0] for i in range(nodes)]
        # the alone node's user cache is warm: fresh processes on it, without the tier
        local = [_run(("alone", None), work=work)[0] for _ in range(nodes)]
    finally:
        redis.stop()
    compiles = sum(r["compiles"] for r in together)
    compile_ms = sum(r["compile_ms"] for r in together)
    compile_cpu_ms = sum(r["compile_cpu_ms"] for r in together)
    warm_first = _median([r["first_ms"] for r in warm_tier])
    local_first = _median([r["first_ms"] for r in local])
    return {
        "device": alone["device"], "backend": alone["backend"], "nodes": nodes, "programs": alone["programs"],
        "alone": {"first_ms": alone["first_ms"], "compiles": alone["compiles"], "compile_ms": alone["compile_ms"],
                  "compile_cpu_ms": alone["compile_cpu_ms"],
                  "compile_ms_per_program": sorted(alone["jit_ms"])},
        "together": {"first_ms": [r["first_ms"] for r in together], "compiles": compiles, "compile_ms": compile_ms,
                     "compiles_per_node": [r["compiles"] for r in together],
                     "compile_ms_per_program": sorted(ms for r in together for ms in r["jit_ms"]),
                     "warnings": sorted({w for r in together for w in r["warnings"]}),
                     "compile_ratio": compiles / alone["compiles"] if alone["compiles"] else None,
                     "compile_ms_ratio": compile_ms / alone["compile_ms"] if alone["compile_ms"] else None,
                     "compile_cpu_ms": compile_cpu_ms,
                     "compile_cpu_ratio": compile_cpu_ms / alone["compile_cpu_ms"] if alone["compile_cpu_ms"] else None},
        "warm_tier": {"first_ms": [r["first_ms"] for r in warm_tier], "median_first_ms": warm_first,
                      "handle_ms": [r["handle_ms"] for r in warm_tier],
                      "write_through_ms": [r["write_through_ms"] for r in warm_tier],
                      "remote_hit_ms": [sum(r["hit_ms"]["remote"]) for r in warm_tier],
                      "sources": warm_tier[0]["sources"], "compiles": sum(r["compiles"] for r in warm_tier)},
        "local_warm": {"first_ms": [r["first_ms"] for r in local], "median_first_ms": local_first,
                       "handle_ms": [r["handle_ms"] for r in local],
                       "user_hit_ms": [sum(r["hit_ms"]["user"]) for r in local],
                       "sources": local[0]["sources"]},
        "warm_ratio": warm_first / local_first if warm_first and local_first else None,
        "latency_ms": {"remote hit": _median([ms for r in warm_tier for ms in r["hit_ms"]["remote"]]),
                       "user-cache hit": _median([ms for r in local for ms in r["hit_ms"]["user"]]),
                       "jit": _median(alone["jit_ms"])},
    }


def report(data: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_cluster.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [f"# The cluster tier: {data['nodes']} nodes on {data['device']} ({data['backend']})", "",
             f"Made by `{data['command']}` at {data['commit']}, {data['host']}, {data['date']}.", "",
             "| measure | value | target |", "|---|---|---|",
             f"| programs of the demo network | {data['programs']} | |",
             f"| one node alone: compiles, compile steps' wall time | {data['alone']['compiles']}, "
             f"{data['alone']['compile_ms']:.0f} ms | |",
             f"| {data['nodes']} nodes together, empty tier: compiles | {data['together']['compiles']} "
             f"({data['together']['compile_ratio']:.2f}x one node's) | <= {TARGET_COMPILE_RATIO}x |",
             f"| the same: compilers' CPU time | {data['together']['compile_cpu_ms']:.0f} ms "
             f"({data['together']['compile_cpu_ratio']:.2f}x one node's {data['alone']['compile_cpu_ms']:.0f} ms) "
             f"| <= {TARGET_COMPILE_RATIO}x |",
             f"| the same: compile steps' wall time | {data['together']['compile_ms']:.0f} ms "
             f"({data['together']['compile_ms_ratio']:.2f}x one node's) | |",
             f"| first result, warm tier (median of {data['nodes']} fresh nodes) | "
             f"{data['warm_tier']['median_first_ms']:.1f} ms | |",
             f"| first result, warm local cache (median of {data['nodes']}) | "
             f"{data['local_warm']['median_first_ms']:.1f} ms | |",
             f"| warm tier / warm local cache | {data['warm_ratio']:.2f}x | <= {TARGET_WARM_RATIO}x |",
             f"| first result, one node alone (all JIT) | {data['alone']['first_ms']:.0f} ms | |"]
    lines += ["", "Median latency of one program's lookup:", ""]
    lines += [f"- {k}: {v:.3f} ms" for k, v in data["latency_ms"].items() if v is not None]
    (out / "bench_cluster.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    labels = ["alone (JIT)", "together (lease)", "warm tier", "warm local"]
    values = [data["alone"]["first_ms"], _median(data["together"]["first_ms"]),
              data["warm_tier"]["median_first_ms"], data["local_warm"]["median_first_ms"]]
    a.bar(labels, values)
    a.set_yscale("log")
    a.set_ylabel("first result of the demo network (ms, median)")
    a.tick_params(axis="x", rotation=20)
    b.bar(["one node", f"{data['nodes']} nodes"], [data["alone"]["compile_ms"], data["together"]["compile_ms"]])
    b.set_ylabel("compile time summed over nodes (ms)")
    fig.suptitle(f"cluster tier, {data['device']}")
    fig.tight_layout()
    fig.savefig(out / "bench_cluster.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("docs"))
    parser.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the nodes' caches here (default: a temp dir)")
    args = parser.parse_args()
    if args.node:
        node()
        return
    with tempfile.TemporaryDirectory(prefix="kdb-cluster-") as tmp:
        data = measure(args.nodes, args.redis_server, args.workdir or Path(tmp))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip() or "?"
    data.update(command="python " + " ".join(["scripts/bench_cluster.py", *sys.argv[1:]]), commit=commit,
                host=f"{platform.node()} ({os.cpu_count()} CPUs)", date=time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                       time.gmtime()))
    report(data, args.out)
    print((args.out / "bench_cluster.md").read_text())


if __name__ == "__main__":
    main()
