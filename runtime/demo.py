"""The main job's runs: a small network's forward in a fresh process, timed to its first result.

``kdb demo`` (runtime/cli/demo_command.py) builds a bundle for the local device, installs it,
and runs :func:`child` twice, each in a new Python process: first with an empty cache and no
bundle (every program compiled: JIT), then with the installed bundle and JIT forbidden.
``python -m kdbkit.runtime.demo --child [--device N]`` is one run; it prints its results as
JSON, or one line of JSON naming the error (``{"error": ...}``) and exits 1.

The network is ResNet-18 (kdbkit.runtime.models) at 32 x 32, batch 1, fp32: every primitive of
an image network (convolutions, batch norms, activations, pooling, additions, the final matrix
multiply), small enough for a CPU. Its result is checked against a float64 NumPy forward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kdbkit.kdb.errors import KdbError
from kdbkit.runtime import env

NETWORK = "resnet18"
SIZES = dict(batch=1, image=32, dtype="fp32", layout="NCHW")
TOLERANCE = 1e-4


class DemoError(KdbError):
    """A run of the main job failed; the message is the child's own one-line error."""


def demo_network():
    """The main job's network (parameters drawn from seed 0)."""
    from kdbkit.runtime import models

    return models.build(NETWORK, **SIZES)


def child(device_index: int | None) -> int:
    """One run in this process; prints JSON results, or ``{"error": ...}`` and returns 1.

    Timed: making the handle (it opens the installed bundle, if any) and the first forward to
    its result on the host. Not timed: opening the device and putting the parameters on it.
    """
    try:
        import numpy as np

        from kdbkit.runtime.backends.registry import open_backend, pick_device
        from kdbkit.runtime.handle import Handle

        device = pick_device(device_index)
        backend = open_backend(device)
        net = demo_network()
        x = np.random.default_rng(0).standard_normal(net.input_shape)
        try:
            t0 = time.perf_counter()
            handle = Handle(backend=backend)
            handle_ms = (time.perf_counter() - t0) * 1e3
            with handle:
                net.to_device(handle)
                staged = net.input_tensor(handle, x)
                backend.synchronize()
                t0 = time.perf_counter()
                y = net.download(handle, net.forward(handle, staged))
                forward_ms = (time.perf_counter() - t0) * 1e3
                staged.buffer.free()
                resolved = handle.resolved_by_source
                bundle = next((str(c.path) for c in handle.system_trace if c.status == "accepted"), None)
                net.release()
        finally:
            backend.close()
        want = net.reference_forward(x)
        error = float(np.linalg.norm(y - want) / np.linalg.norm(want)) if np.all(np.isfinite(y)) else float("inf")
        json.dump({"device": device.name, "target": str(device.target), "backend": device.backend,
                   "handle_ms": handle_ms, "forward_ms": forward_ms, "first_ms": handle_ms + forward_ms,
                   "resolved": resolved, "bundle": bundle, "rel_error": error, "ok": error < TOLERANCE}, sys.stdout)
        return 0
    except KdbError as exc:
        json.dump({"error": str(exc).splitlines()[0]}, sys.stdout)
        return 1
    except Exception as exc:  # a bug: still one line, with how to see more
        json.dump({"error": f"internal error in the demo run ({type(exc).__name__}: {exc}); rerun with "
                            "KDB_CLI_TRACEBACK=1 and report the traceback"}, sys.stdout)
        if env.get_bool("KDB_CLI_TRACEBACK"):
            raise
        return 1


# PoCL and the CUDA driver keep caches of their own: off, so that the build and the JIT run show
# what compiling costs on a machine that has never built these kernels, unless the caller set
# them (the caller's setting stays).
DRIVER_CACHES_OFF = {"POCL_KERNEL_CACHE": "0", "CUDA_CACHE_DISABLE": "1"}


def run_child(device_index: int | None, **variables: str) -> dict:
    """One run in a fresh Python process with ``variables`` set; returns its parsed results.

    Raises:
        DemoError: the run failed; the message is its one-line error.
    """
    child_env = {**DRIVER_CACHES_OFF, **os.environ, **variables}
    cmd = [sys.executable, "-m", "kdbkit.runtime.demo", "--child"]
    if device_index is not None:
        cmd += ["--device", str(device_index)]
    proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True)
    if proc.stderr.strip():
        sys.stderr.write(proc.stderr)  # the run's own warnings (kdbkit's one-line log records)
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise DemoError(f"the demo run exited with status {proc.returncode} and printed no result",
                        "rerun with KDB_CLI_TRACEBACK=1 to see why") from None
    if "error" in result:
        raise DemoError(result["error"])
    return result


def jit_run(device_index: int | None, folder: Path) -> dict:
    """The run with an empty user cache and find-db and no bundle on the search path."""
    return run_child(device_index, KDB_CUSTOM_CACHE_DIR=str(folder / "cache-jit"),
                     KDB_USER_DB_PATH=str(folder / "userdb-jit"), KDB_SYSTEM_DB_PATH=str(folder / "no-bundles"))


def bundle_run(device_index: int | None, folder: Path, db_dir: Path) -> dict:
    """The run with the installed bundle, an empty user cache, and JIT forbidden."""
    return run_child(device_index, KDB_CUSTOM_CACHE_DIR=str(folder / "cache-bundle"),
                     KDB_USER_DB_PATH=str(folder / "userdb-bundle"), KDB_SYSTEM_DB_PATH=str(db_dir),
                     KDB_DISABLE_JIT="1")


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(child(int(args[args.index("--device") + 1]) if "--device" in args else None))
