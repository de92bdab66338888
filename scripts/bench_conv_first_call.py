#!/usr/bin/env python3
"""The first call of every ResNet-50 convolution layer (batch 32, each direction) in a fresh
process, once another process has run find: kdbkit takes the find-db's ranking and times
nothing; PyTorch's cuDNN in benchmark mode searches again for each new layer in every process.

Three kinds of process, one after the other, sharing kdbkit's user folders (a temporary
find-db and program cache):
  1. find: ``find_solutions`` for every layer and direction (what ``kdb tune`` or a first run
     records), its time per layer;
  2. kdbkit: a fresh process's first call of each layer, then a second call; the solver
     chosen, how (``find-db``), and how many timings the call made (0: no search);
  3. torch: a fresh process's first and second call of each layer with
     ``torch.backends.cudnn.benchmark = True``.
Each process initialises CUDA and runs a small unrelated convolution first, so the times are
a layer's own. Writes ``<out>/bench_conv_first_call.json`` and ``.md``.

    python scripts/bench_conv_first_call.py --out docs      # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_conv import BATCH, resnet50

DTYPES = {"fp16": "float16", "fp32": "float32", "bf16": "bfloat16"}


def _layers(directions: str) -> list[dict]:
    unique = {}
    for name, c, h, w, k, f, pad, stride, groups, _ in resnet50():
        unique.setdefault((c, h, w, k, f, pad, stride, groups), name)
    return [{"layer": name, "c": c, "h": h, "w": w, "k": k, "f": f, "pad": pad, "stride": stride, "groups": groups,
             "direction": d} for (c, h, w, k, f, pad, stride, groups), name in unique.items() for d in directions]


def _tensors(torch, layer: dict, dtype, layout: str):
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    x = torch.randn(BATCH, layer["c"], layer["h"], layer["w"], device="cuda", dtype=dtype).to(memory_format=fmt)
    w = torch.randn(layer["k"], layer["c"] // layer["groups"], layer["f"], layer["f"], device="cuda",
                    dtype=dtype).to(memory_format=fmt)
    # dy from the output size, not from a convolution: that would run cuDNN's search before the timing
    side = [(s + 2 * layer["pad"] - layer["f"]) // layer["stride"] + 1 for s in (layer["h"], layer["w"])]
    dy = torch.randn(BATCH, layer["k"], *side, device="cuda", dtype=dtype).to(memory_format=fmt)
    return x, w, dy


def _elapsed_ms(torch, call) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def _problem(layer: dict, label: str, layout: str):
    from kdbkit.runtime.primitives.convolution import ConvProblem
    from kdbkit.runtime.tensor import DataType

    return ConvProblem(layer["direction"], DataType.parse(label), layout, (BATCH, layer["c"], layer["h"], layer["w"]),
                       layer["k"], (layer["f"],) * 2, (layer["pad"],) * 2, (layer["stride"],) * 2,
                       groups=layer["groups"])


def child(role: str, layers: list[dict], label: str, layout: str) -> list[dict]:
    import torch

    dtype = getattr(torch, DTYPES[label])
    warm = torch.randn(2, 8, 9, 9, device="cuda", dtype=dtype)  # CUDA, cuDNN and kdbkit initialised first
    results = []
    if role == "torch":
        torch.backends.cudnn.benchmark = True
        torch.nn.functional.conv2d(warm, torch.randn(8, 8, 3, 3, device="cuda", dtype=dtype), None, 1, 1)
        for layer in layers:
            x, w, dy = _tensors(torch, layer, dtype, layout)
            g = (layer["stride"], layer["pad"], 1, layer["groups"])
            call = {"F": lambda: torch.nn.functional.conv2d(x, w, None, *g),
                    "B": lambda: torch.nn.grad.conv2d_input(x.shape, w, dy, *g),
                    "W": lambda: torch.nn.grad.conv2d_weight(x, w.shape, dy, *g)}[layer["direction"]]
            results.append({"first_ms": _elapsed_ms(torch, call), "second_ms": _elapsed_ms(torch, call)})
        return results

    import kdbkit
    from kdbkit.runtime.find import find_solutions
    from kdbkit.runtime.immediate import choose

    with kdbkit.Handle() as h:
        timings = []
        real = type(h.backend).time_ms
        type(h.backend).time_ms = lambda self, *a, **k: timings.append(1) or real(self, *a, **k)
        kdbkit.convolution_forward(h, warm, torch.randn(8, 8, 3, 3, device="cuda", dtype=dtype), pad=1)
        for layer in layers:
            problem = _problem(layer, label, layout)
            if role == "find":
                start = time.perf_counter()
                ranked = find_solutions(h, problem)
                results.append({"find_ms": (time.perf_counter() - start) * 1e3, "best": ranked[0].solver,
                                "ranked": [(s.solver, s.time_ms) for s in ranked]})
                continue
            x, w, dy = _tensors(torch, layer, dtype, layout)
            geometry = {"pad": layer["pad"], "stride": layer["stride"], "groups": layer["groups"]}
            dx, dw = torch.empty_like(x), torch.empty_like(w)
            call = {"F": lambda: kdbkit.convolution_forward(h, x, w, **geometry),
                    "B": lambda: kdbkit.convolution_backward_data(h, dy, w, x.shape, dx=dx, **geometry),
                    "W": lambda: kdbkit.convolution_backward_weights(h, dy, x, w.shape, dw=dw, **geometry)
                    }[layer["direction"]]
            before = len(timings)
            first = _elapsed_ms(torch, call)
            choice = choose(h, problem)
            results.append({"first_ms": first, "timed": len(timings) - before, "how": choice.how,
                            "solver": choice.solver.name, "second_ms": _elapsed_ms(torch, call)})
    return results


def run_child(role: str, args, env: dict) -> list[dict]:
    out = subprocess.run([sys.executable, __file__, "--child", role, "--type", args.type, "--layout", args.layout,
                          "--directions", args.directions], capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"the {role} process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default="docs")
    parser.add_argument("--type", default="fp16", choices=list(DTYPES))
    parser.add_argument("--layout", default="NHWC", choices=["NCHW", "NHWC"])
    parser.add_argument("--directions", default="FBW")
    parser.add_argument("--child", choices=["find", "kdbkit", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    layers = _layers(args.directions)
    if args.child:
        print(json.dumps(child(args.child, layers, args.type, args.layout)))
        return 0
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "KDB_USER_DB_PATH": f"{folder}/db", "KDB_CUSTOM_CACHE_DIR": f"{folder}/cache"}
        found = run_child("find", args, env)
        ours = run_child("kdbkit", args, env)
        theirs = run_child("torch", args, env)
    rows = []
    for layer, f, o, t in zip(layers, found, ours, theirs):
        rows.append({**layer, "find_ms": f["find_ms"], "find_best": f["best"], "kdbkit_first_ms": o["first_ms"],
                     "kdbkit_timed": o["timed"], "kdbkit_how": o["how"], "kdbkit_solver": o["solver"],
                     "kdbkit_second_ms": o["second_ms"], "torch_first_ms": t["first_ms"],
                     "torch_second_ms": t["second_ms"]})
        r = rows[-1]
        print(f"{r['layer']:36s} {r['direction']} find {r['find_ms']:8.1f} ms | kdbkit first {r['kdbkit_first_ms']:7.2f} "
              f"ms ({r['kdbkit_how']}, {r['kdbkit_timed']} timed) second {r['kdbkit_second_ms']:6.3f} | torch first "
              f"{r['torch_first_ms']:8.2f} ms second {r['torch_second_ms']:6.3f}", flush=True)
    import torch

    summary = {key: sum(r[key] for r in rows) for key in
               ("find_ms", "kdbkit_first_ms", "kdbkit_second_ms", "torch_first_ms", "torch_second_ms")}
    summary["kdbkit_timed"] = sum(r["kdbkit_timed"] for r in rows)
    summary["kdbkit_from_find_db"] = sum(r["kdbkit_how"] == "find-db" for r in rows)
    summary["layers"] = len(rows)
    result = {"device": torch.cuda.get_device_name(), "batch": BATCH, "type": args.type, "layout": args.layout,
              "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "summary": summary, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_conv_first_call.json").write_text(json.dumps(result, indent=1))
    lines = [f"# First call of each ResNet-50 convolution layer in a fresh process, {result['device']}", "",
             f"Written by `python scripts/bench_conv_first_call.py` (batch {BATCH}, {args.type}, {args.layout}; "
             f"cuDNN {result['cudnn']} with `benchmark=True`). A first process ran find for every layer; a fresh "
             "process's first call then used the find-db (how) and made the timings counted (timed); PyTorch's "
             "fresh process searched each new layer. Times include synchronisation.", "",
             f"Sums over {len(rows)} layer-directions: find (once, first process) {summary['find_ms']:.0f} ms; "
             f"kdbkit first calls {summary['kdbkit_first_ms']:.1f} ms with {summary['kdbkit_timed']} timings, "
             f"{summary['kdbkit_from_find_db']} of {len(rows)} from the find-db; PyTorch first calls "
             f"{summary['torch_first_ms']:.1f} ms; second calls: kdbkit {summary['kdbkit_second_ms']:.1f} ms, "
             f"PyTorch {summary['torch_second_ms']:.1f} ms.", "",
             "| layer | dir | find ms (process 1) | kdbkit first ms | how | timed | solver | kdbkit second ms | "
             "torch first ms | torch second ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['layer']} | {r['direction']} | {r['find_ms']:.1f} | {r['kdbkit_first_ms']:.2f} | "
                     f"{r['kdbkit_how']} | {r['kdbkit_timed']} | {r['kdbkit_solver']} | {r['kdbkit_second_ms']:.3f} | "
                     f"{r['torch_first_ms']:.2f} | {r['torch_second_ms']:.3f} |")
    (out / "bench_conv_first_call.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
