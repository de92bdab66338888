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
memory = handle.chain.memory
cold = os.environ.get("HIT_OVERHEAD_COLD") == "1"
if cold:  # as a fresh process meets its first programs: three, once each, the read timed apart
    from kdbkit.kdb import open_bundle
    with open_bundle(next(os.path.join(work, n) for n in os.listdir(work) if n.endswith(".kdb"))) as bundle:
        loose = os.path.join(work, "loose.bin")
        with open(loose, "wb") as f:
            f.write(next(bundle.items())[2])  # a program's binary as a loose file, as a bare load reads it
    t = time.perf_counter()
    with open(loose, "rb") as f:
        f.read()
    read_us = (time.perf_counter() - t) * 1e6
    out = {"handle_ms": handle_ms, "read_us": read_us, "k": []}
    for kernel_file, options in programs[:3]:
        t = time.perf_counter()
        program = handle.program(kernel_file, options)
        out["k"].append({"us": (time.perf_counter() - t) * 1e6, "steps": {s.name.split()[0]: s.ms * 1e3 for s in program.steps}})
    print(json.dumps(out))
    sys.exit(0)
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


def run(python: str, cold: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    env["HIT_OVERHEAD_COLD"] = "1" if cold else "0"
    proc = subprocess.run([python, "-c", CHILD], env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if proc.returncode:
        raise SystemExit(f"{python}: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=3, help="fresh processes per environment, alternating")
    ap.add_argument("--python", help="another environment's interpreter, measured the same way")
    ap.add_argument("--cold", action="store_true", help="each process resolves three programs once, as a fresh "
                    "process does (the first pays for opening the bundle): per program, medians")
    args = ap.parse_args()
    if args.cold:
        runs = [run(sys.executable, cold=True) for _ in range(args.processes)]
        for i in range(3):
            steps = {k: round(statistics.median(r["k"][i]["steps"][k] for r in runs), 1) for k in runs[0]["k"][i]["steps"]}
            print(f"program {i}: {statistics.median(r['k'][i]['us'] for r in runs):.1f} us (steps, us: {steps})")
        print(f"a file read of the bundle's size class: {statistics.median(r['read_us'] for r in runs):.1f} us")
        return
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
