#!/usr/bin/env python3
"""The Python a system hit adds around its parts, with no GPU.

A stand-in backend whose ``load`` costs nothing isolates what the lookup chain itself costs
per program: request, key, bundle read and decode, steps, memory tier. Each fresh process
builds a bundle of 40 programs for the embedded default device (PoCL), makes a handle and
resolves every program 30 times over (the memory tier emptied between rounds); the medians
per hit and per handle are printed. ``--python`` runs the same in another environment (one
with another kdbkit installed), to compare two versions on one machine. A GPU machine
measures the whole hit: ``scripts/bench_startup.py`` and ``scripts/profile_system_hit.py``.

Usage: python scripts/bench_hit_overhead.py [--processes 3] [--python OTHER_PYTHON]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r'''
import os, sys, tempfile, time, statistics, json
work = tempfile.mkdtemp()
os.environ["KDB_SYSTEM_DB_PATH"] = work
os.environ["KDB_CUSTOM_CACHE_DIR"] = os.path.join(work, "cache")
from kdbkit.runtime.backends.registry import default_device, open_backend
from kdbkit.packager.device_build import build_bundle
from kdbkit.runtime.handle import Handle
from kdbkit.runtime import kernel_sources

device = default_device()
backend = open_backend(device)
programs = [("activation.c", (f"-DSALT={i}",)) for i in range(40)]
build_bundle(device.target, programs, work)
kernel_sources._files.clear()  # the handle digests as a fresh process would


class Module:
    def function(self, name):
        return name


backend.load = lambda binary: Module()  # the stand-in: loading costs nothing
t0 = time.perf_counter()
handle = Handle(backend=backend)
handle_ms = (time.perf_counter() - t0) * 1e3
memory = handle.chain.memory._programs
hits, parts = [], {}
for _ in range(30):
    memory.clear()
    for kernel_file, options in programs:
        t = time.perf_counter()
        program = handle.program(kernel_file, options)
        hits.append((time.perf_counter() - t) * 1e6)
        assert program.source == "system", program.source
        for step in program.steps:
            parts.setdefault(step.name.split()[0], []).append(step.ms * 1e3)
print(json.dumps({"handle_ms": handle_ms, "hit_us": statistics.median(hits),
                  "steps_us": {k: statistics.median(v) for k, v in parts.items()}}))
'''


def run(python: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    proc = subprocess.run([python, "-c", CHILD], env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if proc.returncode:
        raise SystemExit(f"{python}: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=3, help="fresh processes per environment, alternating")
    ap.add_argument("--python", help="another environment's interpreter, measured the same way")
    args = ap.parse_args()
    pythons = {"this": sys.executable, **({"other": args.python} if args.python else {})}
    results: dict = {name: [] for name in pythons}
    for _ in range(args.processes):
        for name, python in pythons.items():
            results[name].append(run(python))
    for name, runs in results.items():
        steps = {k: round(statistics.median(r["steps_us"][k] for r in runs), 1) for k in runs[0]["steps_us"]}
        print(f"{name}: per hit {statistics.median(r['hit_us'] for r in runs):.1f} us (steps, us: {steps}), "
              f"handle {statistics.median(r['handle_ms'] for r in runs):.2f} ms")


if __name__ == "__main__":
    main()
