#!/usr/bin/env python3
"""Does a context's first device operation cost more than later ones? In a fresh process:
open the CUDA backend, then time (optionally) an allocation and a driver memset, then the
first and second kernels launched from two programs of the installed bundle, each with a
synchronise. Prints a JSON line. A probe for the time-to-first-result benchmark's fairness:
PyTorch's "CUDA initialisation" there ends with torch.zeros(1, device="cuda").

Usage: KDB_SYSTEM_DB_PATH=<folder with sm_90.kdb> python scripts/probe_first_launch.py [--memset]
"""
import json
import sys
import time

import numpy as np


def main() -> None:
    from kdbkit.runtime.backends.registry import default_device, open_backend
    from kdbkit.runtime.handle import Handle

    backend = open_backend(default_device())
    backend.synchronize()
    out = {"memset": "--memset" in sys.argv}
    if out["memset"]:
        t0 = time.perf_counter()
        buf = backend.alloc(4)
        drv = backend._drv
        drv.cuMemsetD32(buf.ptr, 0, 1)
        backend.synchronize()
        out["alloc_memset_ms"] = (time.perf_counter() - t0) * 1e3
    handle = Handle(backend=backend)
    x = backend.alloc(4096 * 4)
    i32, f32 = np.int32, np.float32
    kernels = [("tensorop.c", "op_tensor_vec", [x, x, x, i32(0), i32(0), f32(1), f32(1), f32(0)]),
               ("activ.c", "activ_fwd_vec_light", [x, x, i32(0), i32(0), f32(0), f32(0), f32(0)])]
    for i, (file, fn, args) in enumerate(kernels):  # n = 0: each launch does nothing
        t0 = time.perf_counter()
        kernel = handle.program(file, ["-DKDB_TYPE_FP16=1"]).function(fn)
        t1 = time.perf_counter()
        out[f"k{i}_resolve_ms"] = (t1 - t0) * 1e3
        backend.launch(kernel, (1, 1, 1), (32, 1, 1), args)
        backend.synchronize()
        out[f"k{i}_launch_sync_ms"] = (time.perf_counter() - t1) * 1e3
    print(json.dumps(out))


if __name__ == "__main__":
    main()
