#!/usr/bin/env python3
"""Every convolution layer of ResNet-50 (batch 32) and MobileNet-V2 (batch 32), each
direction, next to PyTorch (cuDNN, benchmark mode: its best algorithm) in the same run, on a
CUDA GPU: the solver immediate mode chose (or, with --find, the one find ranked first), each
one's time and TFLOP/s, and per model, direction, type and layout the sum of the layers'
times weighted by how often each occurs.
Both libraries run on the same PyTorch tensors (NCHW and channels-last), timed like
bench_primitives (CUDA events around back-to-back calls, blocks alternating; ``--graph N``:
replays of a CUDA graph of N calls, so that layers shorter than a call's host time time the
GPU, not the host). Writes ``<out>/bench_conv.json``, ``.md`` and ``.png``
(``bench_conv_find.*`` with --find; ``_graph`` before the suffix with --graph).

    python scripts/bench_conv.py --out docs            # on the GPU machine
    python scripts/bench_conv.py --out /tmp/bc --layers 2 --types fp32 --directions F --iters 1 --blocks 1  # a check
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_primitives import git_commit, graphed, timed_pair

BATCH = 32


def resnet50() -> list[tuple]:
    """(name, C, H, W, K, filter, pad, stride, groups, occurrences) of ResNet-50 v1.5 at 224 x 224."""
    layers = [("conv1 7x7/2", 3, 224, 224, 64, 7, 3, 2, 1, 1)]
    width, size, blocks = 64, 56, (3, 4, 6, 3)
    cin = 64
    for stage, count in enumerate(blocks):
        out = width * 4
        stride = 1 if stage == 0 else 2
        s = f"layer{stage + 1}"
        layers += [(f"{s} 1x1 {cin}>{width}", cin, size, size, width, 1, 0, 1, 1, 1),
                   (f"{s} 3x3/{stride} {width}", width, size, size, width, 3, 1, stride, 1, 1),
                   (f"{s} downsample 1x1/{stride} {cin}>{out}", cin, size, size, out, 1, 0, stride, 1, 1)]
        size //= stride
        layers += [(f"{s} 1x1 {width}>{out}", width, size, size, out, 1, 0, 1, 1, count),
                   (f"{s} 1x1 {out}>{width}", out, size, size, width, 1, 0, 1, 1, count - 1),
                   (f"{s} 3x3 {width}", width, size, size, width, 3, 1, 1, 1, count - 1)]
        cin, width = out, width * 2
    return layers


def mobilenet_v2() -> list[tuple]:
    """The same for MobileNet-V2 (width 1.0) at 224 x 224: expansions, depthwise 3 x 3, projections."""
    layers, cin, size = [("conv 3x3/2 3>32", 3, 224, 224, 32, 3, 1, 2, 1, 1)], 32, 112
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)):
        for i in range(n):
            stride, hidden = (s if i == 0 else 1), cin * t
            if t != 1:
                layers.append((f"expand 1x1 {cin}>{hidden} @{size}", cin, size, size, hidden, 1, 0, 1, 1, 1))
            layers.append((f"depthwise 3x3/{stride} {hidden} @{size}", hidden, size, size, hidden, 3, 1, stride,
                           hidden, 1))
            size //= stride
            layers.append((f"project 1x1 {hidden}>{c} @{size}", hidden, size, size, c, 1, 0, 1, 1, 1))
            cin = c
    layers.append(("conv 1x1 320>1280 @7", 320, 7, 7, 1280, 1, 0, 1, 1, 1))
    merged: dict[tuple, list] = {}  # identical layers once, their occurrences summed
    for name, *shape, count in layers:
        key = tuple(shape)
        if key in merged:
            merged[key][-1] += count
        else:
            merged[key] = [name, *shape, count]
    return [tuple(v) for v in merged.values()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default="docs")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--directions", default="FBW")
    parser.add_argument("--types", default="fp16,fp32")
    parser.add_argument("--models", default="resnet50,mobilenet_v2")
    parser.add_argument("--layers", type=int, default=None,
                        help="only each model's first N layers (a check of the script; the report says so)")
    parser.add_argument("--graph", type=int, default=0, metavar="N",
                        help="time replays of a CUDA graph of N calls (0: back-to-back eager calls)")
    parser.add_argument("--commit", default="", help="the commit measured (default: git rev-parse HEAD, if any)")
    parser.add_argument("--find", action="store_true",
                        help="run find for each layer first (as cuDNN's benchmark mode searches), writing "
                             "bench_conv_find.*; default: immediate mode's choice, bench_conv.*")
    args = parser.parse_args()
    import torch

    import kdbkit
    from kdbkit.runtime.find import find_solutions
    from kdbkit.runtime.immediate import choose
    from kdbkit.runtime.primitives.convolution import ConvProblem
    from kdbkit.runtime.tensor import DataType

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # fp32 against fp32, not TF32
    models = {"resnet50": resnet50, "mobilenet_v2": mobilenet_v2}
    types = {"fp16": torch.float16, "fp32": torch.float32, "bf16": torch.bfloat16}
    rows = []
    with kdbkit.Handle() as h:
        for model in args.models.split(","):
            for label in args.types.split(","):
                dt = types[label]
                for layout in ("NCHW", "NHWC"):
                    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
                    for name, c, hh, ww, k, f, pad, stride, groups, count in models[model]()[:args.layers]:
                        x = torch.randn(BATCH, c, hh, ww, device="cuda", dtype=dt).to(memory_format=fmt)
                        w = (torch.randn(k, c // groups, f, f, device="cuda", dtype=dt) / (c // groups * f * f) ** 0.5
                             ).to(memory_format=fmt)
                        geometry = {"pad": pad, "stride": stride, "groups": groups}
                        y = torch.nn.functional.conv2d(x, w, None, stride, pad, 1, groups)
                        dy = torch.randn_like(y)
                        dx, dw = torch.empty_like(x), torch.empty_like(w)
                        calls = {
                            "F": (lambda: kdbkit.convolution_forward(h, x, w, y=y, **geometry),
                                  lambda: torch.nn.functional.conv2d(x, w, None, stride, pad, 1, groups)),
                            "B": (lambda: kdbkit.convolution_backward_data(h, dy, w, x.shape, dx=dx, **geometry),
                                  lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, stride, pad, 1, groups)),
                            "W": (lambda: kdbkit.convolution_backward_weights(h, dy, x, w.shape, dw=dw, **geometry),
                                  lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, stride, pad, 1, groups)),
                        }
                        for direction in args.directions:
                            problem = ConvProblem(direction, DataType.parse(label), layout, (BATCH, c, hh, ww), k,
                                                  (f, f), (pad, pad), (stride, stride), groups=groups)
                            if args.find:
                                find_solutions(h, problem)  # recorded: choose takes the find-db's best
                            solver = choose(h, problem).solver.name
                            ours, theirs = calls[direction]
                            repeats = 1
                            if args.graph:
                                ours(), theirs()  # resolved (compiled, maps encoded; cuDNN's search) before the capture
                                torch.cuda.synchronize()
                                try:
                                    ours, theirs = graphed(ours, args.graph, h), graphed(theirs, args.graph, h)
                                    repeats = args.graph
                                except Exception as e:  # a call that cannot be captured: timed eagerly, and said so
                                    print(f"{name}: no CUDA graph ({type(e).__name__}: {e}); timing eager calls",
                                          flush=True)
                                    ours, theirs = calls[direction]
                            t_ours, t_torch, ratios = timed_pair(ours, theirs, iters=args.iters, blocks=args.blocks)
                            t_ours, t_torch = t_ours / repeats, t_torch / repeats
                            row = {"model": model, "type": label, "layout": layout, "direction": direction,
                                   "layer": name, "count": count, "key": problem.config(), "solver": solver,
                                   "kdbkit_ms": t_ours, "torch_ms": t_torch, "speedup_vs_torch": t_torch / t_ours,
                                   "kdbkit_tflops": problem.flops / t_ours / 1e9,
                                   "torch_tflops": problem.flops / t_torch / 1e9}
                            rows.append(row)
                            print(f"{model} {label} {layout} {direction} {name:36s} {solver:15s} kdbkit "
                                  f"{t_ours:8.3f} ms torch {t_torch:8.3f} ms x{t_torch / t_ours:5.2f} "
                                  f"({row['kdbkit_tflops']:6.1f} vs {row['torch_tflops']:6.1f} TFLOP/s)", flush=True)
    totals = {}
    for r in rows:
        key = f"{r['model']} {r['type']} {r['layout']} {r['direction']}"
        ours, theirs = totals.get(key, (0.0, 0.0))
        totals[key] = (ours + r["kdbkit_ms"] * r["count"], theirs + r["torch_ms"] * r["count"])
    summary = {key: {"kdbkit_ms": o, "torch_ms": t, "speedup_vs_torch": t / o} for key, (o, t) in totals.items()}
    for key, s in summary.items():
        print(f"sum {key}: kdbkit {s['kdbkit_ms']:.2f} ms, torch {s['torch_ms']:.2f} ms, x{s['speedup_vs_torch']:.3f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "batch": BATCH, "iters": args.iters, "blocks": args.blocks,
              "mode": "find" if args.find else "immediate", "layers": args.layers, "graph_calls": args.graph,
              "commit": args.commit or git_commit(),
              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "kdbkit": kdbkit.__version__,
              "summary": summary, "rows": rows}
    stem = ("bench_conv_find" if args.find else "bench_conv") + ("_graph" if args.graph else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    write_report(result, out, stem)
    return 0


def write_report(result: dict, out: Path, stem: str) -> None:
    lines = [f"# Convolution against PyTorch (cuDNN) on {result['device']}", "",
             (f"Written by `python scripts/bench_conv.py`"
              + (f" at commit {result['commit']}" if result.get("commit") else "")
              + f" (batch {result['batch']}; cuDNN {result['cudnn']} in "
              f"benchmark mode, TF32 off; kdbkit's solver from {result['mode']} mode; median of "
              f"{result['blocks']} blocks of {result['iters']} "
              + (f"replays of a CUDA graph of {result['graph_calls']} calls" if result.get("graph_calls") else "calls")
              + ", the libraries' blocks alternating). "
              "Sums weight each layer by how often the model runs it."
              + (f" **Only each model's first {result['layers']} layers.**" if result.get("layers") else "")), "",
             "| model, type, layout, direction | kdbkit ms | torch ms | torch / kdbkit |", "|---|---|---|---|"]
    for key, s in result["summary"].items():
        lines.append(f"| {key} | {s['kdbkit_ms']:.2f} | {s['torch_ms']:.2f} | {s['speedup_vs_torch']:.3f} |")
    lines += ["", "| model | type | layout | dir | layer | x | solver | kdbkit ms | torch ms | torch / kdbkit | "
              "kdbkit TFLOP/s | torch TFLOP/s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['model']} | {r['type']} | {r['layout']} | {r['direction']} | {r['layer']} | {r['count']} | "
                     f"{r['solver']} | {r['kdbkit_ms']:.3f} | {r['torch_ms']:.3f} | {r['speedup_vs_torch']:.2f} | "
                     f"{r['kdbkit_tflops']:.1f} | {r['torch_tflops']:.1f} |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    keys = list(result["summary"])
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(keys) + 1.5))
    values = [result["summary"][k]["speedup_vs_torch"] for k in keys]
    ax.barh(keys, values, color=["tab:green" if v >= 0.5 else "tab:red" for v in values])
    ax.axvline(0.5, color="black", lw=1, ls="--")
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("cuDNN time / kdbkit time, summed over the model's layers (> 1: kdbkit faster)")
    ax.set_title(f"kdbkit convolution ({result['mode']} mode) vs cuDNN, batch {result['batch']}, {result['device']}")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
