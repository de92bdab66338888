#!/usr/bin/env python3
"""Each fp32 convolution solver that applies, layer by layer, next to PyTorch (cuDNN, TF32 off)
in the same run: the data behind immediate mode's choice between the implicit GEMM, Winograd
and im2col (bench_conv.py times only the solver chosen). ResNet-50 at batch 32, both layouts,
the directions asked for; each row also says which solver immediate mode picks. Writes
``<out>/bench_conv_solvers.json`` and prints a table.

    python scripts/bench_conv_solvers.py --out /tmp/bs --directions FB   # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_primitives import timed_pair
from conv_problems import BATCH, resnet50

SOLVERS = ("ConvImplicitGemm", "ConvWinogradF2x3", "ConvIm2colGemm")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default="docs")
    parser.add_argument("--directions", default="FBW")
    parser.add_argument("--layouts", default="NCHW,NHWC")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--only-3x3", action="store_true", help="only the 3 x 3 layers at stride 1")
    args = parser.parse_args()
    import torch

    import kdbkit
    from kdbkit.runtime.immediate import choose
    from kdbkit.runtime.solver import REGISTRY
    from kdbkit.runtime.tensor import DataType

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    with kdbkit.Handle() as h:
        for layout in args.layouts.split(","):
            fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
            for layer in resnet50():
                (f, _), pad, stride = layer.filter, layer.pad, layer.stride
                if args.only_3x3 and (layer.filter != (3, 3) or stride != (1, 1)):
                    continue
                x = torch.randn(layer.n, layer.c, layer.h, layer.w, device="cuda").to(memory_format=fmt)
                w = (torch.randn(layer.k, layer.c, *layer.filter, device="cuda") / (layer.c * f * f) ** 0.5
                     ).to(memory_format=fmt)
                y = torch.nn.functional.conv2d(x, w, None, stride, pad)
                dy, dx, dw = torch.randn_like(y), torch.empty_like(x), torch.empty_like(w)
                geometry = {"pad": pad, "stride": stride}
                for direction in args.directions:
                    problem = layer.problem(direction, DataType.FP32, layout)
                    chosen = choose(h, problem).solver.name
                    theirs = {"F": lambda: torch.nn.functional.conv2d(x, w, None, stride, pad),
                              "B": lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, stride, pad),
                              "W": lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, stride, pad)}[direction]
                    reference = theirs().clone()
                    for solver in SOLVERS:
                        if not REGISTRY.find(solver).is_applicable(problem, h.device):
                            continue
                        ours = {"F": lambda s=solver: kdbkit.convolution_forward(h, x, w, y=y, solver=s, **geometry),
                                "B": lambda s=solver: kdbkit.convolution_backward_data(h, dy, w, x.shape, dx=dx,
                                                                                       solver=s, **geometry),
                                "W": lambda s=solver: kdbkit.convolution_backward_weights(h, dy, x, w.shape, dw=dw,
                                                                                          solver=s, **geometry),
                                }[direction]
                        got = {"F": y, "B": dx, "W": dw}[direction]
                        got.fill_(float("nan"))  # poisoned: an element left unwritten shows in the error
                        ours()
                        torch.cuda.synchronize()
                        error = float((got - reference).norm() / reference.norm())
                        t_ours, t_torch, _ = timed_pair(ours, theirs, iters=args.iters, blocks=args.blocks)
                        row = {"layout": layout, "direction": direction, "layer": layer.name, "count": layer.count,
                               "solver": solver, "chosen": solver == chosen, "kdbkit_ms": t_ours, "torch_ms": t_torch,
                               "rel_error": error, "kdbkit_tflops": problem.flops / t_ours / 1e9}
                        rows.append(row)
                        print(f"{layout} {direction} {layer.name:34s} {solver:18s}{'*' if row['chosen'] else ' '} "
                              f"{t_ours:7.3f} ms torch {t_torch:7.3f} x{t_torch / t_ours:5.2f} "
                              f"{row['kdbkit_tflops']:5.1f} TF/s err {error:.1e}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_conv_solvers.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "batch": BATCH, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
