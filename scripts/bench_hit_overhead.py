#!/usr/bin/env python3
"""The Python a system hit adds around its parts, with no GPU: this tree against an earlier one.

A stand-in backend whose ``load`` costs nothing isolates what the lookup chain itself costs
per program (request, key, bundle read and decode, steps, memory tier). Each tree runs in its
own fresh processes on the embedded default device (PoCL), 40 programs × 30 rounds each;
medians per hit and per handle are printed. Where a GPU machine is at hand,
``scripts/compare_startup.py`` measures the whole hit instead.

Usage: python scripts/bench_hit_overhead.py --old .old [--processes 3]
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

ROOT = Path(__file__).resolve().parents[1]

CHILD = r'''
import os, sys, tempfile, time, statistics, json
work = tempfile.mkdtemp()
os.environ["KDB_SYSTEM_DB_PATH"] = work
os.environ["KDB_CUSTOM_CACHE_DIR"] = os.path.join(work, "cache")
new = sys.argv[1] == "new"
if new:
    from kdbkit.runtime.backends.registry import default_device, open_backend
    from kdbkit.packager.device_build import build_bundle
    from kdbkit.runtime.handle import Handle
else:
    from runtime.backends.registry import default_device, open_backend
    from packager.device_build import build_device_bundle
    from runtime.handle import Handle
device = default_device()
backend = open_backend(device)
programs = [("activation.c", (f"-DSALT={i}",)) for i in range(40)]
if new:
    build_bundle(device.target, programs, work)
    from kdbkit.runtime import kernel_sources
else:
    build_device_bundle(backend, programs, work)
    from runtime import kernel_sources
kernel_sources._files.clear()  # both handles digest from cold, whatever their builder left warm


class Module:
    def function(self, name):
        return name


backend.load = lambda binary: Module()  # the stand-in: loading costs nothing
t0 = time.perf_counter()
handle = Handle(backend=backend)
handle_ms = (time.perf_counter() - t0) * 1e3
memory = handle.chain.memory._programs if new else handle._memory
hits = []
for _ in range(30):
    memory.clear()
    for kernel_file, options in programs:
        t = time.perf_counter()
        assert handle.program(kernel_file, options).source == "system"
        hits.append((time.perf_counter() - t) * 1e6)
print(json.dumps({"handle_ms": handle_ms, "hit_us": statistics.median(hits)}))
'''


def run(tree: str, root: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    if tree == "old":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, tree], env=env, capture_output=True, text=True,
                          cwd=tempfile.gettempdir())
    if proc.returncode:
        raise SystemExit(f"{tree}: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="the earlier tree (kdb, runtime, packager, kernels)")
    ap.add_argument("--processes", type=int, default=3, help="fresh processes per tree, alternating")
    args = ap.parse_args()
    results: dict = {"old": [], "new": []}
    for _ in range(args.processes):
        for tree in ("old", "new"):
            results[tree].append(run(tree, args.old.resolve() if tree == "old" else ROOT))
    for tree, runs in results.items():
        print(f"{tree}: per hit {statistics.median(r['hit_us'] for r in runs):.1f} us, "
              f"handle {statistics.median(r['handle_ms'] for r in runs):.2f} ms")


if __name__ == "__main__":
    main()
