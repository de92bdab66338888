#!/usr/bin/env python3
"""The tensor-core GEMM's fast kernels side by side on a CUDA GPU, next to torch.matmul.

For each square size and type: every fast kernel of gemm_tc.cu (128 x 128 tiles; 128 x 256
tiles with 4 or 6 buffers), launched directly on PyTorch's tensors, checked against
torch.matmul (relative error) and timed with CUDA events (median of blocks of back-to-back
launches). Tells which kernel the GemmTensorCore solver should take. Writes
``<out>/gemm_tiles.json`` and ``.md``.

    python scripts/compare_gemm_tiles.py --out docs        # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bench_primitives import timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default="docs")
    parser.add_argument("--sizes", default="4096,8192")
    args = parser.parse_args()
    import torch

    import kdbkit
    from kdbkit.runtime.primitives.gemm import GemmProblem  # noqa: F401  (registers the solvers)
    from kdbkit.runtime.primitives.gemm.solvers.tensor_core import BLOCK_TILE, FAST

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    rows = []
    with kdbkit.Handle() as h:
        be = h.backend
        for label, dt, opt in (("fp16", torch.float16, "-DKDB_TYPE_FP16"), ("bf16", torch.bfloat16, "-DKDB_TYPE_BF16")):
            prog = h.program("gemm_tc.cu", (opt,))
            for size in (int(s) for s in args.sizes.split(",")):
                a = torch.randn(size, size, device="cuda", dtype=dt)
                b = torch.randn(size, size, device="cuda", dtype=dt)
                c = torch.empty(size, size, device="cuda", dtype=dt)
                ref = torch.matmul(a.float(), b.float())
                flops = 2 * size**3
                t_torch = timed(lambda: torch.matmul(a, b, out=c), iters=10, blocks=5)
                bufs = [be.wrap(t.data_ptr(), t.numel() * 2) for t in (a, b, c)]
                ints = [np.int32(v) for v in (size, size, size, size, size, size)]
                tail = [*ints, np.int64(0), np.int64(0), np.int64(0), np.float32(1.0), np.float32(0.0)]
                for name, (tile_n, threads, shared, tile_k) in FAST.items():
                    if size % tile_n or size % tile_k:
                        continue
                    kernel = prog.function(name)
                    grid = (size // tile_n, size // BLOCK_TILE, 1)
                    run = be.launcher(kernel, grid, (threads, 1, 1), [None, None, None, *tail], shared)
                    c.fill_(float("nan"))
                    run(*bufs)
                    torch.cuda.synchronize()
                    err = float((c.float() - ref).norm() / ref.norm())
                    ms = timed(lambda: run(*bufs), iters=10, blocks=5)
                    row = {"type": label, "size": size, "kernel": name, "ms": ms, "tflops": flops / ms / 1e9,
                           "torch_ms": t_torch, "torch_tflops": flops / t_torch / 1e9, "rel_error": err,
                           "vs_torch": t_torch / ms}
                    rows.append(row)
                    print(f"{label} {size:5d} {name:22s} {ms:8.4f} ms {row['tflops']:6.0f} TFLOP/s  "
                          f"torch {row['torch_tflops']:4.0f}  x{row['vs_torch']:.2f}  err {err:.1e}", flush=True)
        device = h.device.name
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gemm_tiles.json").write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows},
                                                    indent=1))
    lines = [f"# The tensor-core GEMM's fast kernels on {device}", "",
             "Written by `python scripts/compare_gemm_tiles.py` (CUDA events, median of 5 blocks of 10 launches; "
             "error relative to torch.matmul in fp32).", "",
             "| type | size | kernel | ms | TFLOP/s | torch TFLOP/s | torch / kernel | rel. error |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['type']} | {r['size']} | {r['kernel']} | {r['ms']:.4f} | {r['tflops']:.0f} | "
              f"{r['torch_tflops']:.0f} | {r['vs_torch']:.2f} | {r['rel_error']:.1e} |" for r in rows]
    (out / "gemm_tiles.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
