#!/usr/bin/env python3
"""Each convolution solver that applies, layer by layer, next to PyTorch (cuDNN in benchmark
mode, TF32 off) on the same tensors in the same run: the data behind immediate mode's choices
(bench_conv.py times only the solver chosen), such as the implicit GEMM against Winograd and
im2col in fp32, or ConvDepthwise against the grouped tensor-core kernel. The models' layers at
batch 32, the types, layouts and directions asked for; each row says which solver immediate
mode picks (``*``) and the error against PyTorch (the output poisoned first). Writes
``<out>/bench_conv_solvers.json`` and prints a row per solver.

    python scripts/bench_conv_solvers.py --out /tmp/bs --directions FB               # on the GPU machine
    python scripts/bench_conv_solvers.py --models mobilenet_v2 --types fp16,fp32 --directions F --only-grouped
    python scripts/bench_conv_solvers.py --models problems --only '3>,7x7/2' --types fp16 --directions F

``--models problems`` is bench_conv.py's benchmark set, each problem at its own batch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import conv_problems  # noqa: E402
from bench_conv import LAYOUTS, Parser, _count, picked  # noqa: E402  (a bad option: one line)
from bench_primitives import timed_pair  # noqa: E402

MODELS = {**conv_problems.MODELS, "problems": conv_problems.problem_set}
TYPES = ("fp32", "fp16", "bf16")


def _choices(text: str, allowed, what: str, parser) -> list[str]:
    chosen = [v for v in text.split(",") if v]
    wrong = [v for v in chosen if v not in allowed]
    if not chosen or wrong:
        parser.error(f"argument --{what}: {text!r} is not a list of {', '.join(allowed)}")
    return chosen


def parse_args(argv=None):
    parser = Parser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default="docs", help="the folder bench_conv_solvers.json is written to")
    parser.add_argument("--models", default="resnet50", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--types", default="fp32", help=f"comma-separated, of {', '.join(TYPES)}")
    parser.add_argument("--layouts", default="NCHW,NHWC")
    parser.add_argument("--directions", default="FBW", help="any of F, B, W")
    parser.add_argument("--solvers", default="", help="comma-separated solver names (default: every one that applies)")
    parser.add_argument("--iters", type=_count(1), default=5)
    parser.add_argument("--blocks", type=_count(1), default=3)
    parser.add_argument("--only-3x3", action="store_true", help="only the 3 x 3 layers at stride 1")
    parser.add_argument("--only-grouped", action="store_true", help="only the grouped (and depthwise) layers")
    parser.add_argument("--only", default="", help="only the layers whose '<model> <layer>' contains one of "
                        "these comma-separated texts")
    args = parser.parse_args(argv)
    args.models = _choices(args.models, MODELS, "models", parser)
    args.types = _choices(args.types, TYPES, "types", parser)
    args.layouts = _choices(args.layouts, LAYOUTS, "layouts", parser)
    if not args.directions or set(args.directions) - set("FBW"):
        parser.error(f"argument --directions: {args.directions!r} is not made of F, B and W")
    args.solvers = [s for s in args.solvers.split(",") if s]
    return args


def layers(args) -> list[tuple[str, object]]:
    """(model, layer) for every layer the options keep."""
    kept = []
    for model in args.models:
        for layer in MODELS[model]():
            if args.only_3x3 and (layer.filter != (3, 3) or layer.stride != (1, 1)):
                continue
            if args.only_grouped and layer.groups == 1:
                continue
            if not picked(args.only, f"{model} {layer.name}"):
                continue
            kept.append((model, layer))
    return kept


def candidates(problem, device, asked: list[str]) -> list[str]:
    """The solvers timed for ``problem``: those asked for (or every convolution solver) that apply."""
    from kdbkit.runtime.solver import REGISTRY

    pool = [REGISTRY.find(name) for name in asked] if asked else REGISTRY.for_primitive("conv")
    return [s.name for s in pool if s is not None and s.is_applicable(problem, device)]


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
    from kdbkit.runtime.tensor import DataType

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch_types = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    conv2d, grad = torch.nn.functional.conv2d, torch.nn.grad
    rows = []
    with kdbkit.Handle() as h:
        for type_label in args.types:
            dt = torch_types[type_label]
            for layout in args.layouts:
                fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
                for model, layer in layers(args):
                    (fy, fx), pad, stride, dil, g = layer.filter, layer.pad, layer.stride, layer.dilation, layer.groups
                    x = torch.randn(layer.n, layer.c, layer.h, layer.w, device="cuda", dtype=dt).to(memory_format=fmt)
                    w = (torch.randn(layer.k, layer.c // g, fy, fx, device="cuda", dtype=dt)
                         / (layer.c // g * fy * fx) ** 0.5).to(memory_format=fmt)
                    y = conv2d(x, w, None, stride, pad, dil, g)
                    dy, dx, dw = torch.randn_like(y), torch.empty_like(x), torch.empty_like(w)
                    geometry = {"pad": pad, "stride": stride, "dilation": dil, "groups": g}
                    for direction in args.directions:
                        problem = layer.problem(direction, DataType.parse(type_label), layout)
                        chosen = choose(h, problem).solver.name
                        theirs = {"F": lambda: conv2d(x, w, None, stride, pad, dil, g),
                                  "B": lambda: grad.conv2d_input(x.shape, w, dy, stride, pad, dil, g),
                                  "W": lambda: grad.conv2d_weight(x, w.shape, dy, stride, pad, dil, g)}[direction]
                        reference = theirs().double()
                        got = {"F": y, "B": dx, "W": dw}[direction]
                        for solver in candidates(problem, h.device, args.solvers):
                            ours = {"F": lambda s=solver: kdbkit.convolution_forward(h, x, w, y=y, solver=s, **geometry),
                                    "B": lambda s=solver: kdbkit.convolution_backward_data(h, dy, w, x.shape, dx=dx,
                                                                                           solver=s, **geometry),
                                    "W": lambda s=solver: kdbkit.convolution_backward_weights(h, dy, x, w.shape, dw=dw,
                                                                                              solver=s, **geometry),
                                    }[direction]
                            got.fill_(float("nan"))  # poisoned: an element left unwritten shows in the error
                            try:
                                ours()
                            except Exception as e:  # one that fails here is said, and the others go on
                                print(f"{type_label} {layout} {direction} {model} {layer.name} {solver}: "
                                      f"{type(e).__name__}: {e}", flush=True)
                                continue
                            torch.cuda.synchronize()
                            error = float((got.double() - reference).norm() / reference.norm())
                            t_ours, t_torch, _ = timed_pair(ours, theirs, iters=args.iters, blocks=args.blocks)
                            row = {"model": model, "type": type_label, "layout": layout, "direction": direction,
                                   "layer": layer.name, "count": layer.count, "solver": solver,
                                   "chosen": solver == chosen, "kdbkit_ms": t_ours, "torch_ms": t_torch,
                                   "rel_error": error, "kdbkit_tflops": problem.flops / t_ours / 1e9}
                            rows.append(row)
                            print(f"{type_label} {layout} {direction} {model} {layer.name:32s} {solver:26s}"
                                  f"{'*' if row['chosen'] else ' '} {t_ours:7.3f} ms torch {t_torch:7.3f} "
                                  f"x{t_torch / t_ours:5.2f} err {error:.1e}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_conv_solvers.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "batch": conv_problems.BATCH, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
