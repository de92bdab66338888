#!/usr/bin/env python3
"""ResNeXt-50 (32x4d) and MobileNet-V2 forward convolutions at batch 32 next to PyTorch (cuDNN,
benchmark mode, TF32 off) in the same run, on a CUDA GPU: every layer, the solver immediate mode
chose, and per model, type and layout the sum of the layers' times weighted by how often each
occurs (bench_conv.py's timing: blocks alternating; ``--graph N``: replays of a CUDA graph of
N calls). Writes ``<out>/bench_conv_grouped.json`` and ``.md``.

    python scripts/bench_conv_grouped.py --out docs --graph 10 --commit <sha>   # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_primitives import git_commit, graphed, timed_pair
from conv_problems import mobilenet_v2 as mobilenet_v2_layers

BATCH = 32


def resnext50() -> list[tuple]:
    """(name, C, H, W, K, filter, pad, stride, groups, occurrences) of torchvision's
    resnext50_32x4d at 224 x 224: ResNet-50 v1.5 with 3 x 3 convolutions of 32 groups, twice as wide."""
    layers = [("conv1 7x7/2", 3, 224, 224, 64, 7, 3, 2, 1, 1)]
    width, size, cin = 128, 56, 64
    for stage, count in enumerate((3, 4, 6, 3)):
        out, stride, s = width * 2, 1 if stage == 0 else 2, f"layer{stage + 1}"
        layers += [(f"{s} 1x1 {cin}>{width}", cin, size, size, width, 1, 0, 1, 1, 1),
                   (f"{s} 3x3/{stride} {width} g32", width, size, size, width, 3, 1, stride, 32, 1),
                   (f"{s} downsample 1x1/{stride} {cin}>{out}", cin, size, size, out, 1, 0, stride, 1, 1)]
        size //= stride
        layers += [(f"{s} 1x1 {width}>{out}", width, size, size, out, 1, 0, 1, 1, count),
                   (f"{s} 1x1 {out}>{width}", out, size, size, width, 1, 0, 1, 1, count - 1),
                   (f"{s} 3x3 {width} g32", width, size, size, width, 3, 1, 1, 32, count - 1)]
        cin, width = out, width * 2
    return layers


def mobilenet_v2() -> list[tuple]:
    """conv_problems.py's MobileNet-V2 (square filters, pads and strides) as resnext50's tuples."""
    return [(c.name, c.c, c.h, c.w, c.k, c.filter[0], c.pad[0], c.stride[0], c.groups, c.count)
            for c in mobilenet_v2_layers()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default="docs")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--types", default="fp16,bf16")
    parser.add_argument("--models", default="resnext50,mobilenet_v2")
    parser.add_argument("--only-grouped", action="store_true", help="only the layers of more than one group")
    parser.add_argument("--graph", type=int, default=0, metavar="N")
    parser.add_argument("--commit", default="")
    args = parser.parse_args()
    import torch

    import kdbkit
    from kdbkit.runtime.immediate import choose
    from kdbkit.runtime.primitives.convolution import ConvProblem
    from kdbkit.runtime.tensor import DataType

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    models = {"resnext50": resnext50, "mobilenet_v2": mobilenet_v2}
    types = {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}
    rows = []
    with kdbkit.Handle() as h:
        for model in args.models.split(","):
            for label in args.types.split(","):
                dt = types[label]
                for layout in ("NCHW", "NHWC"):
                    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
                    for name, c, hh, ww, k, f, pad, stride, groups, count in models[model]():
                        if args.only_grouped and groups == 1:
                            continue
                        x = torch.randn(BATCH, c, hh, ww, device="cuda", dtype=dt).to(memory_format=fmt)
                        w = (torch.randn(k, c // groups, f, f, device="cuda", dtype=dt) / (c // groups * f * f) ** 0.5
                             ).to(memory_format=fmt)
                        y = torch.nn.functional.conv2d(x, w, None, stride, pad, 1, groups)
                        problem = ConvProblem("F", DataType.parse(label), layout, (BATCH, c, hh, ww), k, (f, f),
                                              (pad, pad), (stride, stride), groups=groups)
                        solver = choose(h, problem).solver.name
                        out = kdbkit.convolution_forward(h, x, w, y=y.clone(), pad=pad, stride=stride, groups=groups)
                        err = float((out.double() - y.double()).norm() / y.double().norm())

                        def ours():
                            kdbkit.convolution_forward(h, x, w, y=y, pad=pad, stride=stride, groups=groups)

                        def theirs():
                            torch.nn.functional.conv2d(x, w, None, stride, pad, 1, groups)

                        repeats = 1
                        if args.graph:
                            ours(), theirs()
                            torch.cuda.synchronize()
                            ours, theirs = graphed(ours, args.graph, h), graphed(theirs, args.graph, h)
                            repeats = args.graph
                        t_ours, t_torch, _ = timed_pair(ours, theirs, iters=args.iters, blocks=args.blocks)
                        t_ours, t_torch = t_ours / repeats, t_torch / repeats
                        rows.append({"model": model, "type": label, "layout": layout, "layer": name, "count": count,
                                     "groups": groups, "key": problem.config(), "solver": solver,
                                     "kdbkit_ms": t_ours, "torch_ms": t_torch, "speedup_vs_torch": t_torch / t_ours,
                                     "rel_error_vs_torch": err})
                        print(f"{model} {label} {layout} {name:34s} {solver:28s} kdbkit {t_ours:7.4f} ms torch "
                              f"{t_torch:7.4f} ms x{t_torch / t_ours:5.2f} err {err:.1e}", flush=True)
    summary = {}
    for r in rows:
        for key in (f"{r['model']} {r['type']} {r['layout']}",
                    f"{r['model']} {r['type']} {r['layout']} " + ("grouped" if r["groups"] > 1 else "one group")):
            o, t = summary.get(key, (0.0, 0.0))
            summary[key] = (o + r["kdbkit_ms"] * r["count"], t + r["torch_ms"] * r["count"])
    summary = {key: {"kdbkit_ms": o, "torch_ms": t, "speedup_vs_torch": t / o} for key, (o, t) in summary.items()}
    for key, s in summary.items():
        print(f"sum {key}: kdbkit {s['kdbkit_ms']:.3f} ms, torch {s['torch_ms']:.3f} ms, x{s['speedup_vs_torch']:.3f}")
    result = {"device": torch.cuda.get_device_name(), "batch": BATCH, "iters": args.iters, "blocks": args.blocks,
              "graph_calls": args.graph, "commit": args.commit or git_commit(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "summary": summary, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_conv_grouped.json").write_text(json.dumps(result, indent=1))
    lines = [f"# Grouped and depthwise convolutions against PyTorch (cuDNN) on {result['device']}", "",
             f"Written by `python scripts/bench_conv_grouped.py` at commit {result['commit']} (forward, batch 32; "
             f"cuDNN {result['cudnn']} in benchmark mode, TF32 off; kdbkit's solver from immediate mode; median of "
             f"{args.blocks} blocks of {args.iters} "
             + (f"replays of a CUDA graph of {args.graph} calls" if args.graph else "calls")
             + ", blocks alternating). Sums weight each layer by how often the model runs it.", "",
             "| model, type, layout | kdbkit ms | torch ms | torch / kdbkit |", "|---|---|---|---|"]
    lines += [f"| {k} | {s['kdbkit_ms']:.3f} | {s['torch_ms']:.3f} | {s['speedup_vs_torch']:.3f} |"
              for k, s in summary.items()]
    lines += ["", "| model | type | layout | layer | x | solver | kdbkit ms | torch ms | torch / kdbkit |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['type']} | {r['layout']} | {r['layer']} | {r['count']} | {r['solver']} | "
              f"{r['kdbkit_ms']:.4f} | {r['torch_ms']:.4f} | {r['speedup_vs_torch']:.2f} |" for r in rows]
    (out / "bench_conv_grouped.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
