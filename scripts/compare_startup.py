#!/usr/bin/env python3
"""Startup of this tree against another one (an earlier commit), process by process, on one GPU.

A machine drifts within a session (the bare module load moved 10% over a few minutes on the
H100 machine), so two benchmark runs one after the other compare the drift as much as the
code. This script interleaves: each round runs, for each mode, one fresh child of each tree
(``scripts/bench_startup.py --child MODE`` of that tree, timing the handle and each program),
alternating which tree goes first. Each tree gets its own system bundle (built by its own
builder, with its own keys) and its own filled user cache.

Usage (needs a CUDA GPU; the earlier tree is a plain copy, e.g. ``git archive <commit> kdb runtime
packager kernels scripts | tar -x -C .old``):

    python scripts/compare_startup.py --old .old [--runs 15] [--out docs]
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
MODES = ("system", "user")
FIELDS = ("handle_ms", "first_ms", "later_ms")

# Builds the sample kernels' system bundle for the first CUDA device, with each tree's own API.
BUILD = {
    "new": ("from kdbkit.packager.device_build import build_bundle\n"
            "from kdbkit.runtime.backends.registry import discover_devices\n"
            "from kdbkit.runtime.samples import SAMPLES\n"
            "d = next(x for x in discover_devices() if x.backend == sys.argv[2])\n"
            "build_bundle(d.target, [(s.kernel_file, s.options) for s in SAMPLES], sys.argv[1])\n"),
    "old": ("from packager.device_build import build_device_bundle\n"
            "from runtime.backends.registry import discover_devices, open_backend\n"
            "from runtime.samples import SAMPLES\n"
            "d = next(x for x in discover_devices() if x.backend == sys.argv[2])\n"
            "build_device_bundle(open_backend(d), [(s.kernel_file, s.options) for s in SAMPLES], sys.argv[1])\n"),
}


BACKEND = "cuda"


def _env(tree: str, root: Path, work: Path, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KDB_")}
    env.update(KDB_BACKEND=BACKEND, CUDA_CACHE_DISABLE="1", KDB_CUSTOM_CACHE_DIR=str(work / "user-cache"),
               KDB_SYSTEM_DB_PATH=str(work / ("system" if mode == "system" else "no-system")))
    if tree == "old":  # the earlier layout imports top-level packages from its own folder
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return env


def child(tree: str, root: Path, work: Path, mode: str) -> dict:
    proc = subprocess.run([sys.executable, str(root / "scripts" / "bench_startup.py"), "--child", mode],
                          env=_env(tree, root, work, mode), capture_output=True, text=True, cwd=root)
    if proc.returncode:
        raise SystemExit(f"{tree} {mode} child failed:\n{proc.stderr}")
    out = json.loads(proc.stdout)
    rows = out["rows"]
    if {r["source"] for r in rows} != {mode}:
        raise SystemExit(f"{tree} {mode}: programs came from {sorted({r['source'] for r in rows})}")
    return {"handle_ms": out["handle_ms"], "first_ms": rows[0]["resolve_ms"],
            "later_ms": statistics.median(r["resolve_ms"] for r in rows[1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="the earlier tree (kdb, runtime, scripts, ...)")
    ap.add_argument("--runs", type=int, default=15, help="rounds; each runs one child per tree and mode")
    ap.add_argument("--out", type=Path, default=ROOT / "docs")
    ap.add_argument("--backend", default="cuda", help="cuda (the measurement), or opencl to try the script on a CPU")
    args = ap.parse_args()
    global BACKEND
    BACKEND = args.backend
    trees = {"old": args.old.resolve(), "new": ROOT}
    work = {t: Path(tempfile.mkdtemp(prefix=f"kdbkit-compare-{t}-")) for t in trees}
    for tree, root in trees.items():
        for sub in ("system", "no-system"):
            (work[tree] / sub).mkdir()
        env = _env(tree, root, work[tree], "user")
        subprocess.run([sys.executable, "-c", "import sys\n" + BUILD[tree], str(work[tree] / "system"), BACKEND],
                       env=env, check=True, cwd=root)
        # Fill the user cache: one pass that compiles (its sources are "jit"), as each tree does it.
        subprocess.run([sys.executable, str(root / "scripts" / "bench_startup.py"), "--child", "jit"], env=env,
                       check=True, capture_output=True, cwd=root)
    raw = {t: {m: [] for m in MODES} for t in trees}
    for i in range(args.runs):
        order = ("old", "new") if i % 2 == 0 else ("new", "old")
        for mode in MODES:
            for tree in order:
                raw[tree][mode].append(child(tree, trees[tree], work[tree], mode))
    result = {"runs": args.runs, "command": f"python scripts/compare_startup.py --old {args.old} --runs {args.runs}",
              "medians_ms": {}, "new_over_old": {}}
    for mode in MODES:
        for field in FIELDS:
            old = [r[field] for r in raw["old"][mode]]
            new = [r[field] for r in raw["new"][mode]]
            result["medians_ms"][f"{mode}.{field}"] = {"old": statistics.median(old), "new": statistics.median(new)}
            # Paired: each round's two children ran back to back, so their ratio cancels drift.
            result["new_over_old"][f"{mode}.{field}"] = statistics.median(n / o for n, o in zip(new, old))
    result["raw"] = raw
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compare_startup.json").write_text(json.dumps(result, indent=1))
    print(f"{'':22} {'old ms':>8} {'new ms':>8} {'new/old (paired median)':>24}")
    for key, med in result["medians_ms"].items():
        print(f"{key:22} {med['old']:8.3f} {med['new']:8.3f} {result['new_over_old'][key]:24.3f}")


if __name__ == "__main__":
    main()
