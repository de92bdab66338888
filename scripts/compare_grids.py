#!/usr/bin/env python3
"""Grid sizes for the 1-D grid-stride kernels (activations, tensor ops, batch-norm inference)
side by side on a CUDA GPU: the grid that covers every element once (each thread one step)
against persistent grids of k groups per multiprocessor, where each thread loops and no
partial last wave idles most of the GPU. Timed like bench_primitives (CUDA events, median of
blocks), with the copy bandwidth and PyTorch's time in the same run. Tells which grid
runtime/solver.py's 1-D launches should take.

    python scripts/compare_grids.py            # on the GPU machine
"""

from __future__ import annotations

import sys

from bench_primitives import copy_bandwidth, timed

PER_UNIT = (None, 2, 4, 8, 16, 32)  # None: the current grid


def main() -> int:
    import torch

    import kdbkit
    from kdbkit.runtime import solver

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    F = torch.nn.functional
    copy = copy_bandwidth(20, 5)
    print(f"device-to-device copy: {copy:.0f} GB/s", flush=True)
    original = solver._grid_1d
    cases = []
    for dt, label in ((torch.float16, "fp16"), (torch.float32, "fp32")):
        n = 1 << 26
        x, a2 = torch.randn(n, device="cuda", dtype=dt), torch.randn(n, device="cuda", dtype=dt)
        y = torch.empty_like(x)
        img = torch.randn(32, 64, 112, 112, device="cuda", dtype=dt)
        out = torch.empty_like(img)
        p = torch.rand(64, device="cuda") + 0.5
        pt = p.to(dt)
        item = x.element_size()
        cases += [
            (f"relu {label}", lambda h, x=x, y=y: kdbkit.activation_forward(h, x, "relu", y=y),
             lambda x=x, y=y: torch.relu(x, out=y) if False else torch.relu(x), 2 * n * item),
            (f"gelu {label}", lambda h, x=x, y=y: kdbkit.activation_forward(h, x, "gelu", y=y),
             lambda x=x: F.gelu(x), 2 * n * item),
            (f"add {label}", lambda h, x=x, a2=a2, y=y: kdbkit.op_tensor(h, "add", x, a2, c=y),
             lambda x=x, a2=a2, y=y: torch.add(x, a2, out=y), 3 * n * item),
            (f"bn infer {label}", lambda h, img=img, out=out: kdbkit.batchnorm_inference(h, img, p, p, p, p, y=out),
             lambda img=img, pt=pt: F.batch_norm(img, pt, pt, pt, pt, training=False), 2 * img.numel() * item),
        ]
    for name, _, theirs, nbytes in cases:
        ms = timed(theirs, iters=20, blocks=7)
        print(f"torch      {name:14s} {ms:.4f} ms {nbytes / ms / 1e6 / copy:4.0%}", flush=True)
    for per_unit in PER_UNIT:
        with kdbkit.Handle() as h:
            units = h.device.target.cu or 132

            def grid(n, block, max_groups, per_unit=per_unit, units=units):
                groups = original(n, block, max_groups)
                return groups if per_unit is None else (min(groups[0], per_unit * units), 1, 1)

            solver._grid_1d = grid
            for name, ours, _, nbytes in cases:
                ms = timed(lambda: ours(h), iters=20, blocks=7)
                print(f"{'cover' if per_unit is None else f'{per_unit}/unit':10s} {name:14s} {ms:.4f} ms "
                      f"{nbytes / ms / 1e6 / copy:4.0%}", flush=True)
            solver._grid_1d = original
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
