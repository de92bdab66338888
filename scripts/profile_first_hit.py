#!/usr/bin/env python3
"""Where a process's first system hit spends the time its later hits do not: function by function.

``bench_startup.py --diagnose`` shows that a fresh process's first system hit costs about 0.25 ms
more than the same lookup once another has run, and that the checked read itself (SQLite, zstd,
xxh3, the load) is not where it goes. This profiles, with cProfile on a wall clock, the first
lookups of fresh processes (``Handle.program`` + ``Module.function``, as bench_startup times
them), each process resolving ``bench_startup.PROGRAMS`` in order, and reports per function the
median own time ("tottime") in the first lookup against the median over the later ones. The
profiler adds its own cost to every call, so read the ranking and the differences, not the sums.

Usage: python scripts/profile_first_hit.py [--runs 9] [--backend cuda] [--out docs/gpu-run/profile_first_hit]
(writes OUT.json and OUT.txt; scripts/run_gpu_checks.sh PART=startup runs it on the GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_startup import PROGRAMS  # noqa: E402  (the same programs, in the same order)

ROOT = Path(__file__).resolve().parents[1]
TOP = 25


def _label(func: tuple) -> str:
    path, line, name = func
    if path == "~":
        return name  # a C function: "<built-in method ...>"
    parts = Path(path).parts
    short = "/".join(parts[parts.index("kdbkit"):]) if "kdbkit" in parts else "/".join(parts[-2:])
    return f"{short}:{line}({name})"


def child(backend_name: str) -> None:
    import cProfile
    import pstats

    import numpy as np

    from kdbkit.runtime.backends.registry import discover_devices, open_backend
    from kdbkit.runtime.handle import Handle

    device = next(d for d in discover_devices() if d.backend == backend_name)
    backend = open_backend(device)
    x = backend.to_device(np.ones(1 << 16, np.float32))  # as bench_startup's child: the device in use
    backend.synchronize()
    handle = Handle(backend=backend)
    lookups = []
    for name, kernel_file, options, entry in PROGRAMS:
        profile = cProfile.Profile(time.perf_counter)
        t0 = time.perf_counter()
        profile.enable()
        program = handle.program(kernel_file, options)
        program.function(entry)
        profile.disable()
        wall_us = (time.perf_counter() - t0) * 1e6
        stats = pstats.Stats(profile).stats  # func -> (calls, primitive calls, tottime, cumtime, callers)
        lookups.append({"kernel": name, "source": program.source, "wall_us": wall_us,
                        "own_us": {_label(f): s[2] * 1e6 for f, s in stats.items()},
                        "calls": {_label(f): s[0] for f, s in stats.items()}})
    del x
    json.dump(lookups, sys.stdout)


def prepare(work: Path, backend_name: str) -> Path:
    from kdbkit.packager.device_build import build_bundle
    from kdbkit.runtime.backends.registry import discover_devices

    device = next(d for d in discover_devices() if d.backend == backend_name)
    system = work / "system"
    system.mkdir()
    build_bundle(device.target, [(kernel_file, options) for _, kernel_file, options, _ in PROGRAMS], system)
    return system


def summarise(runs: list[list[dict]]) -> dict:
    """Per function: the median own time in the first lookup and over the later ones (a function
    a lookup does not call counts 0 there), ranked by what the first adds."""
    names = {n for run in runs for lookup in run for n in lookup["own_us"]}
    rows = []
    for n in names:
        first = statistics.median(run[0]["own_us"].get(n, 0.0) for run in runs)
        later = statistics.median(lookup["own_us"].get(n, 0.0) for run in runs for lookup in run[1:])
        calls = statistics.median(run[0]["calls"].get(n, 0) for run in runs)
        rows.append({"function": n, "first_us": first, "later_us": later, "excess_us": first - later,
                     "first_calls": calls})
    rows.sort(key=lambda r: -r["excess_us"])
    first_wall = statistics.median(run[0]["wall_us"] for run in runs)
    later_wall = statistics.median(lookup["wall_us"] for run in runs for lookup in run[1:])
    return {"processes": len(runs), "first_wall_us": first_wall, "later_wall_us": later_wall,
            "sources": sorted({lookup["source"] for run in runs for lookup in run}), "functions": rows}


def report(summary: dict, command: str) -> str:
    lines = [f"# {command}", f"{summary['processes']} fresh processes; sources {summary['sources']}",
             f"profiled lookup, median: first {summary['first_wall_us']:.0f} us, later "
             f"{summary['later_wall_us']:.0f} us (cProfile's own cost included)", "",
             f"{'first - later (us)':>19} {'first':>8} {'later':>8} {'calls':>6}  function (own time)"]
    for r in summary["functions"][:TOP]:
        lines.append(f"{r['excess_us']:19.1f} {r['first_us']:8.1f} {r['later_us']:8.1f} {r['first_calls']:6.0f}  "
                     f"{r['function']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "gpu-run" / "profile_first_hit")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.backend)
        return
    work = Path(tempfile.mkdtemp(prefix="kdbkit-first-hit-"))
    system = prepare(work, args.backend)
    base = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    base.update(KDB_BACKEND=args.backend, KDB_SYSTEM_DB_PATH=str(system), CUDA_CACHE_DISABLE="1")
    runs = []
    for i in range(args.runs):
        env = dict(base, KDB_CUSTOM_CACHE_DIR=str(work / f"cache{i}"))  # no startup memo: no prefetch
        proc = subprocess.run([sys.executable, __file__, "--child", "--backend", args.backend], env=env,
                              capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(f"child failed:\n{proc.stderr}")
        runs.append(json.loads(proc.stdout))
    summary = summarise(runs)
    command = "python scripts/profile_first_hit.py " + " ".join(sys.argv[1:])
    text = report(summary, command)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, **summary}, indent=1) + "\n")
    args.out.with_suffix(".txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
