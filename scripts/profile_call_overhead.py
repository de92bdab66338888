"""Where a primitive call's host time goes: cProfile over many calls of tiny problems on CUDA
tensors from PyTorch (the kernels take a few µs, so the host is all there is to see).

Run on the GPU machine: ``python scripts/profile_call_overhead.py [--calls 300] [--top 40]``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    import torch

    import kdbkit

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    x = torch.randn(4, 8, 8, 8, device="cuda")
    y, p = torch.empty_like(x), torch.rand(8, device="cuda") + 0.5
    m, v, pooled = torch.empty(8, device="cuda"), torch.empty(8, device="cuda"), torch.empty(4, 8, 4, 4, device="cuda")
    with kdbkit.Handle() as h:
        calls = {"relu": lambda: kdbkit.activation_forward(h, x, "relu", y=y),
                 "batch norm (inference)": lambda: kdbkit.batchnorm_inference(h, x, p, p, p, p, y=y),
                 "batch norm (training)": lambda: kdbkit.batchnorm_training(h, x, p, p, y=y, saved_mean=m,
                                                                            saved_invstd=v),
                 "max pool 3x3/2": lambda: kdbkit.pooling_forward(h, x, window=3, stride=2, pad=1,
                                                                  save_indices=False, y=pooled)}
        for name, call in calls.items():
            for _ in range(20):
                call()
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(args.calls):
                call()
            torch.cuda.synchronize()
            print(f"{name}: {(time.perf_counter() - started) / args.calls * 1e6:.1f} us per call", flush=True)
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(args.calls):
                call()
            profile.disable()
            torch.cuda.synchronize()
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
