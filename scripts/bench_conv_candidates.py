#!/usr/bin/env python3
"""MobileNet-V2's depthwise layers and fp32 1 x 1 layers at batch 32: each candidate solver
next to PyTorch (cuDNN, benchmark mode, TF32 off) on the same tensors, forward, both layouts:
the data behind immediate mode's choices there (bench_conv.py times only the solver chosen).
Depthwise: ConvDepthwise, and ConvGroupedTensorCore for 16-bit types; fp32 1 x 1:
ConvImplicitGemm and ConvIm2colGemm. Each pair timed in alternating blocks
(bench_primitives.timed_pair). Writes ``--out`` (JSON) and prints a row per candidate; a
``*`` marks immediate mode's choice.

    python scripts/bench_conv_candidates.py --out /tmp/c.json --label new   # on the GPU machine
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_conv import Parser, _count  # noqa: E402  (a bad option: one line)
from bench_primitives import timed_pair  # noqa: E402
from conv_problems import mobilenet_v2  # noqa: E402

TYPES = ("fp16", "fp32")


def candidates(layer, label: str) -> list[str]:
    """The solvers timed for ``layer`` of type ``label`` (none: the layer is not measured)."""
    if layer.groups > 1:
        return ["ConvDepthwise", *(["ConvGroupedTensorCore"] if label != "fp32" else [])]
    if label == "fp32" and layer.filter == (1, 1):
        return ["ConvImplicitGemm", "ConvIm2colGemm"]
    return []


def parse_args(argv=None):
    parser = Parser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", required=True, help="the JSON file written")
    parser.add_argument("--label", default="", help="a name for the tree measured, kept in each row")
    parser.add_argument("--types", default="fp16,fp32", help="comma-separated, of fp16, fp32")
    parser.add_argument("--iters", type=_count(1), default=10)
    parser.add_argument("--blocks", type=_count(1), default=5)
    args = parser.parse_args(argv)
    args.types = args.types.split(",")
    if any(t not in TYPES for t in args.types):
        parser.error(f"argument --types: {args.types} is not a list of {', '.join(TYPES)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        sys.exit("PyTorch is not installed: run this on the GPU machine")
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    import kdbkit
    from kdbkit.runtime.immediate import choose
    from kdbkit.runtime.primitives.convolution import ConvProblem
    from kdbkit.runtime.tensor import DataType

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    dtypes = {"fp16": torch.float16, "fp32": torch.float32}
    rows = []
    with kdbkit.Handle() as h:
        for label in args.types:
            for layout in ("NCHW", "NHWC"):
                fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
                for layer in mobilenet_v2():
                    solvers = candidates(layer, label)
                    if not solvers:
                        continue
                    dt = dtypes[label]
                    x = torch.randn(layer.n, layer.c, layer.h, layer.w, device="cuda", dtype=dt).to(memory_format=fmt)
                    w = (torch.randn(layer.k, layer.c // layer.groups, *layer.filter, device="cuda", dtype=dt) / 3
                         ).to(memory_format=fmt)
                    geometry = {"pad": layer.pad, "stride": layer.stride, "groups": layer.groups}
                    ref = torch.nn.functional.conv2d(x, w, None, layer.stride, layer.pad, 1, layer.groups)
                    problem = ConvProblem("F", DataType.parse(label), layout, (layer.n, layer.c, layer.h, layer.w),
                                          layer.k, layer.filter, layer.pad, layer.stride, groups=layer.groups)
                    chosen = choose(h, problem).solver.name
                    for solver in solvers:
                        y = torch.empty_like(ref)
                        try:
                            kdbkit.convolution_forward(h, x, w, y=y, solver=solver, **geometry)
                        except Exception as e:  # a candidate that does not apply: said, and the others go on
                            print(f"{label} {layout} {layer.name} {solver}: {type(e).__name__}: {e}", flush=True)
                            continue
                        err = float((y.double() - ref.double()).norm() / ref.double().norm())

                        def ours(solver=solver, y=y):
                            kdbkit.convolution_forward(h, x, w, y=y, solver=solver, **geometry)

                        def theirs():
                            torch.nn.functional.conv2d(x, w, None, layer.stride, layer.pad, 1, layer.groups)

                        t_ours, t_torch, _ = timed_pair(ours, theirs, iters=args.iters, blocks=args.blocks)
                        rows.append({"tree": args.label, "type": label, "layout": layout, "layer": layer.name,
                                     "count": layer.count, "solver": solver, "chosen": chosen, "kdbkit_ms": t_ours,
                                     "torch_ms": t_torch, "ratio": t_torch / t_ours, "err": err})
                        print(f"{args.label} {label} {layout} {layer.name:26s} {solver:24s}"
                              f"{'*' if solver == chosen else ' '} {t_ours:.4f} ms torch {t_torch:.4f} "
                              f"x{t_torch / t_ours:.2f} err {err:.1e}", flush=True)
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
