"""The main job: the runtime on the local device, from an empty cache, in fresh processes.

Pass 1 runs in a new process with an empty user cache, so every sample is compiled (JIT)
and stored; pass 2 runs in another new process and finds them in the user cache. Each pass
resolves the sample kernels, runs them on random data and checks them against NumPy.
``python -m kdbkit.runtime.demo --child`` is one pass; it prints its results as JSON, or
one line of JSON naming the error (``{"error": ...}``) and exits 1.

The cache folder is ``--cache-dir`` if given, else ``KDB_CUSTOM_CACHE_DIR`` if set (both are
kept), else a new temporary folder, removed at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from kdbkit.kdb.errors import KdbError
from kdbkit.runtime import env


class DemoError(KdbError):
    """A pass of the main job failed; the message is the child's own one-line error."""


def child(device_index: int | None) -> int:
    """One pass in this process; prints JSON results, or ``{"error": ...}`` and returns 1."""
    try:
        from kdbkit.runtime.backends.registry import pick_device
        from kdbkit.runtime.handle import Handle
        from kdbkit.runtime.samples import run_samples

        t0 = time.perf_counter()
        device = pick_device(device_index)
        with Handle(device) as handle:
            init_ms = (time.perf_counter() - t0) * 1e3
            results = run_samples(handle)
        json.dump({"device": device.name, "target": str(device.target), "backend": device.backend,
                   "init_ms": init_ms, "results": [asdict(r) for r in results]}, sys.stdout)
        return 0
    except KdbError as exc:
        json.dump({"error": str(exc).splitlines()[0]}, sys.stdout)
        return 1
    except Exception as exc:  # a bug: still one line, with how to see more
        json.dump({"error": f"internal error in the demo pass ({type(exc).__name__}: {exc}); rerun with "
                            "KDB_CLI_TRACEBACK=1 and report the traceback"}, sys.stdout)
        if env.get_bool("KDB_CLI_TRACEBACK"):
            raise
        return 1


def run_pass(cache_dir: Path, device_index: int | None) -> dict:
    """One pass in a fresh Python process; returns its parsed results.

    Raises:
        DemoError: the pass failed; the message is its one-line error.
    """
    # PoCL and the CUDA driver keep caches of their own; turn them off so that "jit" shows
    # what a compile really costs on a machine that has never run these kernels.
    child_env = dict(os.environ, KDB_CUSTOM_CACHE_DIR=str(cache_dir), POCL_KERNEL_CACHE="0", CUDA_CACHE_DISABLE="1")
    cmd = [sys.executable, "-m", "kdbkit.runtime.demo", "--child"]
    if device_index is not None:
        cmd += ["--device", str(device_index)]
    proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True)
    if proc.stderr.strip():
        sys.stderr.write(proc.stderr)  # the pass's own warnings (kdbkit's one-line log records)
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise DemoError(f"the demo pass exited with status {proc.returncode} and printed no result",
                        "rerun with KDB_CLI_TRACEBACK=1 to see why") from None
    if "error" in result:
        raise DemoError(result["error"])
    return result


def main_job(cache_dir: Path | None = None, device_index: int | None = None, passes: int = 2) -> list[dict]:
    """Run ``passes`` fresh-process passes sharing one cache folder.

    Args:
        cache_dir: the cache folder; else ``KDB_CUSTOM_CACHE_DIR``, else a temporary folder
            that is removed afterwards.
        device_index: a device from ``kdb devices``; the default device if None.
        passes: how many fresh processes to run, one after the other.
    """
    from kdbkit.runtime.backends.registry import pick_device

    pick_device(device_index)  # fail before any pass when there is none (only the base install, say)
    with ExitStack() as stack:
        folder = cache_dir or env.get_path("KDB_CUSTOM_CACHE_DIR")
        if folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kdbkit-demo-cache-")))
        return [run_pass(folder, device_index) for _ in range(passes)]


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(child(int(args[args.index("--device") + 1]) if "--device" in args else None))
