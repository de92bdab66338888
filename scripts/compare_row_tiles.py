#!/usr/bin/env python3
"""The row kernels' tile choices side by side on a CUDA GPU: softmax and layer norm forward
(rows of 1024, the benchmark's problem) under several (vectors per thread, lanes per row)
policies, timed like bench_primitives (CUDA events, median of blocks), with PyTorch's times on
the same tensors first. Tells which policy runtime/primitives/lanes.py's lanes_tile should follow.

    python scripts/compare_row_tiles.py            # on the GPU machine
"""

from __future__ import annotations

import sys

from bench_primitives import copy_bandwidth, timed

POLICIES = {
    "current": None,
    "2 per thread": lambda v: (4, min(256, 1 << max(0, (-(-v // 2) - 1).bit_length()))),
    "4 per thread": lambda v: (4, min(256, 1 << max(0, (-(-v // 4) - 1).bit_length()))),
    "8 per thread": lambda v: (8, min(256, 1 << max(0, (-(-v // 8) - 1).bit_length()))),
    "a warp a row": lambda v: (8 if v > 128 else 4, 32),
}


def main() -> int:
    import torch

    import kdbkit
    from kdbkit.runtime.primitives import lanes
    from kdbkit.runtime.primitives.layernorm.solvers import lanes as ln_lanes
    from kdbkit.runtime.primitives.softmax.solvers import lanes as sm_lanes

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    copy = copy_bandwidth(20, 5)
    rows, cols = 1 << 16, 1024
    for dt, label in ((torch.float16, "fp16"), (torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        x = torch.randn(rows, cols, device="cuda", dtype=dt)
        w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
        nbytes = 2 * x.numel() * x.element_size()
        sm = timed(lambda: torch.softmax(x, -1), iters=20, blocks=5)
        ln = timed(lambda: torch.nn.functional.layer_norm(x, (cols,), w, b), iters=20, blocks=5)
        print(f"{'torch':14s} {label}: softmax {sm:.4f} ms {nbytes / sm / 1e6 / copy:4.0%}  "
              f"layer norm {ln:.4f} ms {nbytes / ln / 1e6 / copy:4.0%}", flush=True)
    original = lanes.lanes_tile
    for name, policy in POLICIES.items():
        for module in (lanes, sm_lanes, ln_lanes):
            module.lanes_tile = policy or original
        with kdbkit.Handle() as h:
            for dt, label in ((torch.float16, "fp16"), (torch.bfloat16, "bf16"), (torch.float32, "fp32")):
                x = torch.randn(rows, cols, device="cuda", dtype=dt)
                y = torch.empty_like(x)
                w, b = torch.randn(cols, device="cuda", dtype=dt), torch.randn(cols, device="cuda", dtype=dt)
                m, r = torch.empty(rows, device="cuda"), torch.empty(rows, device="cuda")
                nbytes = 2 * x.numel() * x.element_size()
                sm = timed(lambda: kdbkit.softmax_forward(h, x, y=y, solver="SoftmaxLanes"), iters=20, blocks=5)
                ln = timed(lambda: kdbkit.layernorm_forward(h, x, w, b, y=y, mean=m, rstd=r, solver="LayerNormLanes"),
                           iters=20, blocks=5)
                tile = (policy or original)(cols * x.element_size() // 16)
                print(f"{name:14s} {label} tile {tile}: softmax {sm:.4f} ms {nbytes / sm / 1e6 / copy:4.0%}  "
                      f"layer norm {ln:.4f} ms {nbytes / ln / 1e6 / copy:4.0%}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
