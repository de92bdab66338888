"""The main job: the runtime on the local device, from an empty cache, in fresh processes.

Pass 1 runs in a new process with an empty user cache, so every sample is compiled (JIT)
and stored; pass 2 runs in another new process and finds them in the user cache. Each pass
resolves the sample kernels, runs them on random data and checks them against NumPy.
``python -m runtime.demo --child`` is one pass; it prints its results as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path


def child(device_index: int | None) -> int:
    from kdbkit.runtime.backends.registry import default_device, discover_devices
    from kdbkit.runtime.handle import Handle
    from kdbkit.runtime.samples import run_samples

    t0 = time.perf_counter()
    device = default_device() if device_index is None else discover_devices()[device_index]
    handle = Handle(device)
    init_ms = (time.perf_counter() - t0) * 1e3
    results = run_samples(handle)
    json.dump({"device": device.name, "target": str(device.target), "backend": device.backend,
               "init_ms": init_ms, "results": [asdict(r) for r in results]}, sys.stdout)
    return 0


def run_pass(cache_dir: Path, device_index: int | None) -> dict:
    """One pass in a fresh Python process; returns its parsed results."""
    # PoCL and the CUDA driver keep caches of their own; turn them off so that "jit" shows
    # what a compile really costs on a machine that has never run these kernels.
    env = dict(os.environ, KDB_CUSTOM_CACHE_DIR=str(cache_dir), POCL_KERNEL_CACHE="0", CUDA_CACHE_DISABLE="1")
    cmd = [sys.executable, "-m", "kdbkit.runtime.demo", "--child"]
    if device_index is not None:
        cmd += ["--device", str(device_index)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"demo pass failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    if proc.stderr.strip():
        sys.stderr.write(proc.stderr)
    return json.loads(proc.stdout)


def main_job(cache_dir: Path | None = None, device_index: int | None = None, passes: int = 2) -> list[dict]:
    """Run ``passes`` fresh-process passes sharing one cache folder (a new empty one by default)."""
    if cache_dir is None:
        cache_dir = Path(tempfile.mkdtemp(prefix="kdbkit-demo-cache-"))
    return [run_pass(cache_dir, device_index) for _ in range(passes)]


if __name__ == "__main__":
    args = sys.argv[1:]
    device = int(args[args.index("--device") + 1]) if "--device" in args else None
    sys.exit(child(device))
