#!/usr/bin/env python3
"""PoolStrip's occupancy side by side on a CUDA GPU: the benchmark's max pooling (3x3, stride 2,
pad 1, 32 x 64 x 112 x 112) in fp16, bf16 and fp32 under several (threads per group, groups per
multiprocessor) launch bounds (pool_strip.c's POOL_STRIP_THREADS and POOL_STRIP_GROUPS_PER_MP).
Unbounded, the kernel takes about 110 registers a thread, so two groups of 256 threads fit a
multiprocessor; bounds that ask for more groups cap the registers. Timed like bench_primitives
(CUDA events, median of blocks) with the copy bandwidth of the same run. Tells which bounds
pool_strip.c and runtime/primitives/pooling/solvers/strip.py should take.

    python scripts/compare_pool_strip.py            # on the GPU machine
"""

from __future__ import annotations

import functools
import sys

from bench_primitives import copy_bandwidth, timed, with_options

VARIANTS = ((256, 2), (128, 4), (64, 8), (128, 5), (64, 10), (128, 6), (256, 3))


def main() -> int:
    import kdbkit
    import torch
    from kdbkit.runtime.primitives.pooling.solvers import strip

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    copy = copy_bandwidth(20, 5)
    print(f"device-to-device copy: {copy:.0f} GB/s", flush=True)
    program, threads = strip.program, strip.THREADS
    try:
        for block, groups in VARIANTS:
            extra = (f"-DPOOL_STRIP_THREADS={block}", f"-DPOOL_STRIP_GROUPS_PER_MP={groups}")
            strip.program = functools.partial(with_options, program, extra)
            strip.THREADS = block
            with kdbkit.Handle() as h:
                for dt, label in ((torch.float16, "fp16"), (torch.bfloat16, "bf16"), (torch.float32, "fp32")):
                    x = torch.randn(32, 64, 112, 112, device="cuda", dtype=dt)
                    y = torch.empty(32, 64, 56, 56, device="cuda", dtype=dt)
                    ref = torch.nn.functional.max_pool2d(x, 3, 2, 1)
                    call = functools.partial(kdbkit.pooling_forward, h, x, window=3, stride=2, pad=1,
                                             save_indices=False, y=y, solver="PoolStrip")
                    call()
                    assert torch.equal(y, ref), f"bounds ({block}, {groups}) {label}: wrong result"
                    ms = timed(call, iters=50, blocks=7)
                    nbytes = (x.numel() + y.numel()) * x.element_size()
                    print(f"bounds ({block:>3}, {groups:>2}) {label}: {ms * 1000:7.2f} µs "
                          f"{nbytes / ms / 1e6 / copy:4.0%} of copy", flush=True)
    finally:
        strip.program, strip.THREADS = program, threads
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
