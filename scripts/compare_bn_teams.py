#!/usr/bin/env python3
"""BatchNormPersistent's team plans side by side on a CUDA GPU: the benchmark's training problem
(32 x 64 x 112 x 112) under several costs per round of channels (runtime/primitives/batchnorm/
solvers/persistent.py's ROUND_COST: higher means fewer, longer rounds), timed like
bench_primitives with the copy bandwidth of the same run. Tells which ROUND_COST to keep.

    python scripts/compare_bn_teams.py            # on the GPU machine
"""

from __future__ import annotations

import sys

from bench_primitives import copy_bandwidth, timed

COSTS = (128, 512, 1024, 2048, 4096, 16384)


def main() -> int:
    import kdbkit
    import torch
    from kdbkit.runtime.primitives.batchnorm.solvers import persistent

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    copy = copy_bandwidth(20, 5)
    print(f"device-to-device copy: {copy:.0f} GB/s", flush=True)
    for cost in COSTS:
        persistent.ROUND_COST = cost
        with kdbkit.Handle() as h:
            for dt, label in ((torch.float16, "fp16"), (torch.float32, "fp32")):
                x = torch.randn(32, 64, 112, 112, device="cuda", dtype=dt)
                y, s = torch.empty_like(x), torch.rand(64, device="cuda") + 0.5
                m, v = torch.empty(64, device="cuda"), torch.empty(64, device="cuda")
                vectors = 32 * 112 * 112 * x.element_size() // 16
                kernel = h.program("batchnorm_persistent.cu", ("-DKDB_TYPE_FP16",) if x.element_size() == 2 else ()
                                   ).function("bn_train_persistent")
                plan = persistent.team_plan(vectors, 64, persistent.resident_for(h.backend, kernel, h.device.target.cu))
                ms = timed(lambda: kdbkit.batchnorm_training(h, x, s, s, y=y, saved_mean=m, saved_invstd=v,
                                                             solver="BatchNormPersistent"), iters=20, blocks=7)
                nbytes = 2 * x.numel() * x.element_size()
                print(f"round cost {cost:>10} {label}: plan (members, chunk, teams) {plan}: "
                      f"{ms:.4f} ms {nbytes / ms / 1e6 / copy:4.0%}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
