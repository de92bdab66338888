#!/usr/bin/env python3
"""Time every applicable solver of one primitive problem on a CUDA GPU, next to PyTorch.

    python scripts/compare_solvers.py softmax 65536x1024 fp16

For choosing between solvers by measurement (what find does, printed): CUDA events around
back-to-back calls on PyTorch tensors used in place, median of blocks.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("primitive", choices=["softmax", "layernorm"])
    parser.add_argument("shape")
    parser.add_argument("dtype", choices=["fp32", "fp16", "bf16"])
    args = parser.parse_args()
    import torch

    import kdbkit
    from bench_primitives import timed  # this folder is on sys.path when run as a script
    from kdbkit.runtime.primitives import load_all
    from kdbkit.runtime.solver import REGISTRY

    load_all()

    dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    shape = tuple(int(s) for s in args.shape.split("x"))
    x = torch.randn(shape, device="cuda", dtype=dt)
    y = torch.empty_like(x)

    with kdbkit.Handle() as h:
        prim = "softmax" if args.primitive == "softmax" else "layernorm"
        for solver in REGISTRY.for_primitive(prim):
            try:
                if prim == "softmax":
                    ms = timed(lambda: kdbkit.softmax_forward(h, x, y=y, solver=solver.name), iters=20, blocks=7)
                else:
                    ms = timed(lambda: kdbkit.layernorm_forward(h, x, solver=solver.name), iters=20, blocks=7)
            except kdbkit.KdbError as e:
                print(f"{solver.name:16s} n/a ({e.problem})")
                continue
            print(f"{solver.name:16s} {ms:.4f} ms  {2 * x.numel() * x.element_size() / ms / 1e6:.0f} GB/s")
        ref = (lambda: torch.softmax(x, -1)) if prim == "softmax" else (lambda: torch.nn.functional.layer_norm(x, shape[-1:]))
        ms = timed(ref, iters=20, blocks=7)
        print(f"{'torch':16s} {ms:.4f} ms  {2 * x.numel() * x.element_size() / ms / 1e6:.0f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
