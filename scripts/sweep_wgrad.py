#!/usr/bin/env python3
"""Times ConvTmaBwdWeights's plans (tile width, orientation, slices) on ResNet-50's backward
weights layers (batch 32, channels-last, fp16) as CUDA graph replays (GPU time, no host time),
beside the plan tma_wgrad.plan picks, so that its cost model can be checked against the card.
Writes ``<out>/sweep_wgrad.json`` and prints, per layer, the model's plan, its time, and the
fastest plan seen.

    python scripts/sweep_wgrad.py --out /tmp/sw      # on the GPU machine
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from bench_conv import resnet50
from bench_primitives import graphed

CALLS = 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--layout", default="NHWC")
    args = parser.parse_args()
    import torch

    import kdbkit
    from kdbkit.runtime.primitives.convolution import ConvProblem
    from kdbkit.runtime.primitives.convolution.solvers import tma_wgrad
    from kdbkit.runtime.tensor import DataType

    model_plan = tma_wgrad.plan
    forced: list = []

    def plan(problem, tile_n, units):  # the sweep's plan where one is forced, else the model's
        return forced[0] if forced else model_plan(problem, tile_n, units)

    tma_wgrad.plan = plan
    rows, seen = [], set()
    fmt = torch.channels_last if args.layout == "NHWC" else torch.contiguous_format
    with kdbkit.Handle() as h:
        units = h.device.target.cu or 132
        for name, c, hh, ww, k, f, pad, stride, _, _ in resnet50():
            if (c, hh, k, f, stride) in seen:
                continue
            seen.add((c, hh, k, f, stride))
            problem = ConvProblem("W", DataType.FP16, args.layout, (32, c, hh, ww), k, (f, f), (pad, pad),
                                  (stride, stride))
            x = torch.randn(32, c, hh, ww, device="cuda", dtype=torch.float16).to(memory_format=fmt)
            dy = torch.randn(*problem.y_shape, device="cuda", dtype=torch.float16).to(memory_format=fmt)
            dw = torch.empty(*problem.w_shape, device="cuda", dtype=torch.float16).to(memory_format=fmt)
            chosen = {n: model_plan(problem, n, units) for n in tma_wgrad.STAGES}
            best_n = min(chosen, key=lambda n: chosen[n].cost)
            times = []
            for tile_n in tma_wgrad.STAGES:
                solver = f"ConvTmaBwdWeights128x{tile_n}"
                base = model_plan(problem, tile_n, units)
                for swap in (False, True):
                    m, n = (base.m, base.n) if swap == base.swap else (base.n, base.m)
                    tiles = -(-m // 128) * -(-n // tile_n)
                    top = min(base.steps, -(-4 * units // tiles))
                    for slices in sorted({s for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 33, 44, 66, 132, 264)
                                          if s <= top} | {base.slices if swap == base.swap else 1,
                                                          max(1, units // tiles)} - {0}):
                        if slices > top:
                            continue
                        p = dataclasses.replace(base, swap=swap, m=m, n=n, slices=slices)
                        forced[:] = [p]
                        h.dispatcher._invokers.clear()
                        h.dispatcher.plans.clear()
                        call = lambda: kdbkit.convolution_backward_weights(h, dy, x, dw.shape, pad=pad,  # noqa: E731
                                                                           stride=stride, dw=dw, solver=solver)
                        call()
                        torch.cuda.synchronize()
                        replay = graphed(call, CALLS, h)
                        replay()
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        samples = []
                        for _ in range(5):
                            start.record()
                            replay()
                            end.record()
                            end.synchronize()
                            samples.append(start.elapsed_time(end) * 1000 / CALLS)
                        us = sorted(samples)[2]
                        times.append({"tile_n": tile_n, "swap": swap, "slices": slices, "us": us})
            forced.clear()
            model = chosen[best_n]
            mine = next((t["us"] for t in times if (t["tile_n"], t["swap"], t["slices"]) ==
                         (best_n, model.swap, model.slices)), None)
            best = min(times, key=lambda t: t["us"])
            tflops = problem.flops / best["us"] / 1e6
            print(f"{name:34s} model {best_n}/{int(model.swap)}/{model.slices} {mine:7.1f} us | best "
                  f"{best['tile_n']}/{int(best['swap'])}/{best['slices']} {best['us']:7.1f} us ({tflops:.0f} TFLOP/s)",
                  flush=True)
            rows.append({"layer": name, "flops": problem.flops, "model": [best_n, model.swap, model.slices],
                         "model_us": mine, "times": times})
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "sweep_wgrad.json").write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                                                 "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
