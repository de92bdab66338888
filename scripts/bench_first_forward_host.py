#!/usr/bin/env python3
"""The host work kdbkit adds to a network's first forward, with no GPU.

A GPU machine measures a network's whole time to first result (``bench_network.py``); once
the programs come from a bundle, most of it is Python run for the first time: the handle,
each new problem's solver choice and invoker, the programs' bundle reads. This measures that
part alone, on any machine: the networks at small sizes on the embedded default device
(PoCL), with a stand-in ``load`` and launch that cost nothing, so that neither PoCL's
binary loads nor its kernels count.

The parent builds a bundle for the device and tunes a system find-db for the networks'
problems (as the GPU run ships them), then starts fresh processes that each make a handle
and run two forwards, timing the handle, the first forward and the second, and noting the
time Python's full collections (generation 2) took inside the handle and first forward: one
such pause, 10-20 ms here, falls in or out of that window with the process's allocation
history, so the report says where it did. Each variant keeps
its per-user folders across its processes, as one user's processes do. Two set-ups of
the per-user folders alternate: ``custom`` (``KDB_CUSTOM_CACHE_DIR`` and ``KDB_USER_DB_PATH``
set) and ``default`` (neither: the folders come from platformdirs, under a scratch ``HOME``),
which is what a user who sets nothing gets; the latter also with ``KDB_DISABLE_PREFETCH=1``.
``--pythonpath DIR`` runs the same processes
with another kdbkit first on ``sys.path`` (a checkout of an older commit mapped as
``kdbkit``), alternating, to compare two versions on one machine.

Usage: python scripts/bench_first_forward_host.py [--runs 7] [--networks bert_base,resnet50]
       [--pythonpath OTHER] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_network import KDB_CALL  # the kdb command line, run with this interpreter

ROOT = Path(__file__).resolve().parents[1]

CHILD = r'''
import json, os, sys, time
t_start = time.perf_counter()
sys.path.insert(1, os.environ["BENCH_SCRIPTS"])
import numpy as np
import bench_network, kdbkit
from kdbkit.runtime.backends.registry import default_device, open_backend
from kdbkit.runtime.backends.base import Kernel, Module
from kdbkit.runtime.handle import Handle

net = bench_network._network(sys.argv[1])
x = np.random.default_rng(1).standard_normal(net.input_shape).astype(np.float32)
backend = open_backend(default_device())


class StandInKernel(Kernel):
    def __init__(self, name):
        self.name = name


class StandInModule(Module):
    def function(self, name):
        return StandInKernel(name)


backend.load = lambda binary: StandInModule()  # the bundle is read and checked; loading costs nothing
backend.launch = lambda *args, **kwargs: None
backend.launcher = lambda *args, **kwargs: (lambda *buffers: None)
backend.synchronize()
time.sleep(0.2)  # a device open takes this long and more: work started beside it has had its chance
import gc
collections = []  # Python's own pauses: (generation, ms), within the timed parts


def note_collection(phase, info, started=[0.0]):
    if phase == "start":
        started[0] = time.perf_counter()
    elif timing:
        collections.append((info["generation"], (time.perf_counter() - started[0]) * 1e3))


gc.callbacks.append(note_collection)
timing = True
t0 = time.perf_counter()
handle = Handle(backend=backend)
handle_ms = (time.perf_counter() - t0) * 1e3
timing = False
net.to_device(handle)
staged = net.input_tensor(handle, x)
times = []
for _ in range(2):
    timing = not times
    t0 = time.perf_counter()
    net.forward(handle, staged)
    times.append((time.perf_counter() - t0) * 1e3)
timing = False
resolved = handle.resolved_by_source
handle.close()
print(json.dumps({"handle_ms": handle_ms, "first_forward_ms": times[0], "second_forward_ms": times[1],
                  "first_ms": handle_ms + times[0], "resolved": resolved,
                  "full_collections_ms": sum(ms for generation, ms in collections if generation == 2)}))
'''


def _kdb(*args: str, env: dict) -> None:
    proc = subprocess.run([sys.executable, "-c", KDB_CALL, *args], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"kdb {' '.join(args)}: {proc.stderr.strip()}")


def prepare(work: Path, networks: list[str]) -> Path:
    """A bundle and a tuned system find-db for the networks' problems on the default device."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    env.update(BENCH_NETWORK_SMALL="1", KDB_CUSTOM_CACHE_DIR=str(work / "prep-cache"),
               KDB_USER_DB_PATH=str(work / "prep-db"))
    catalogue = work / "catalogue.txt"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_network.py"), "--small", "--networks",
                    ",".join(networks), "--write-catalogue", str(catalogue)], env=env, check=True,
                   capture_output=True)
    system = work / "system"
    from kdbkit.runtime.backends.registry import default_device

    target = str(default_device().target)
    _kdb("tune", "-c", str(catalogue), "-o", str(system), env=env)
    (fdb,) = system.glob("*.fdb")
    _kdb("build", "--target", target, "-c", str(catalogue), "-c", str(fdb), "-o", str(system), env=env)
    return system


def run_child(network: str, system: Path, scratch: Path, folders: str, pythonpath: str | None,
              extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KDB_", "XDG_"))}
    env.update(extra or {})
    env.update(BENCH_NETWORK_SMALL="1", BENCH_SCRIPTS=str(ROOT / "scripts"), KDB_SYSTEM_DB_PATH=str(system),
               KDB_DISABLE_JIT="1", POCL_KERNEL_CACHE="0")
    if folders == "custom":
        env.update(KDB_CUSTOM_CACHE_DIR=str(scratch / "cache"), KDB_USER_DB_PATH=str(scratch / "db"))
    else:
        env["HOME"] = str(scratch)  # platformdirs' folders, under a home of its own
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run([sys.executable, "-c", CHILD, network], env=env, capture_output=True, text=True,
                          cwd=tempfile.gettempdir())
    if proc.returncode:
        raise SystemExit(f"{network} ({folders}): {proc.stderr.strip()}")
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    if set(record["resolved"]) != {"system"}:
        raise SystemExit(f"{network}: programs came from {record['resolved']}, not only the bundle")
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7, help="fresh processes per network, set-up and version")
    ap.add_argument("--networks", default="bert_base,resnet50")
    ap.add_argument("--pythonpath", help="another kdbkit, first on sys.path, measured alternately as 'other'")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    networks = [n for n in args.networks.split(",") if n]
    work = Path(tempfile.mkdtemp(prefix="bench-first-forward-"))
    system = prepare(work, networks)
    versions = {"this": None, **({"other": args.pythonpath} if args.pythonpath else {})}
    runs: dict = {}
    for network in networks:
        variants = {f"{network} {folders} {version}": (folders, pythonpath, Path(tempfile.mkdtemp(dir=work)), {})
                    for folders in ("custom", "default") for version, pythonpath in versions.items()}
        variants[f"{network} default this, prefetch off"] = ("default", None, Path(tempfile.mkdtemp(dir=work)),
                                                             {"KDB_DISABLE_PREFETCH": "1"})
        for name, (folders, pythonpath, scratch, extra) in variants.items():
            # Each variant keeps its per-user folders from run to run, as one user's processes
            # do; a first, untimed run writes them (the startup memo among them).
            run_child(network, system, scratch, folders, pythonpath, extra)
        for _ in range(args.runs):  # interleaved, so that drift touches every variant alike
            for name, (folders, pythonpath, scratch, extra) in variants.items():
                runs.setdefault(name, []).append(run_child(network, system, scratch, folders, pythonpath, extra))
    medians = {name: {k: round(statistics.median(r[k] for r in rs), 3)
                      for k in ("handle_ms", "first_forward_ms", "first_ms", "second_forward_ms")}
                   | {"runs_with_a_full_collection": sum(r["full_collections_ms"] > 0 for r in rs),
                      "full_collections_ms": round(sum(r["full_collections_ms"] for r in rs), 1)}
               for name, rs in runs.items()}
    for name, m in medians.items():
        print(f"{name:44} handle {m['handle_ms']:6.2f} ms, first forward {m['first_forward_ms']:6.2f} ms, "
              f"handle + first {m['first_ms']:6.2f} ms, second forward {m['second_forward_ms']:6.2f} ms; "
              f"full collections in {m['runs_with_a_full_collection']} of {args.runs} timed windows "
              f"({m['full_collections_ms']} ms in all)")
    if args.out:
        args.out.write_text(json.dumps({"medians": medians, "runs": runs, "python": sys.version.split()[0]},
                                       indent=1))


if __name__ == "__main__":
    main()
