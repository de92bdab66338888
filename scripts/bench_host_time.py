#!/usr/bin/env python3
"""kdbkit's own host time per launch in a network's later forward, on any device.

A later forward of a small network is host-bound: each primitive call costs the host more than
its kernel costs the device. This benchmark separates kdbkit's share (the repeat plan, the
invoker, the fused calls' runners) from the backend's launch: in one process it times later
forwards as they are (``issue``: every launch issued, not waited for), then in another with the
backend's launches made no-ops before the first forward (``kdbkit``: what is left is kdbkit's
own Python). Both are medians over ``--forwards`` forwards. The networks keep all their layers
at small sizes (BERT-base's 12 layers of hidden 64; ResNet-50 at 32 x 32), so the device's work
stays small and the calls are the same as at full size.

Usage:
  python scripts/bench_host_time.py [--networks bert_base,resnet50] [--forwards 30] [--out docs]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

NETWORKS = {"bert_base": (dict(batch=2, seq=16, hidden=64, heads=4, intermediate=128, layers=12), "NCHW"),
            "resnet50": (dict(batch=2, image=32), "NHWC")}


def child(name: str, stub: bool, forwards: int) -> dict:
    """One process: the network's later forwards, timed, with the launches real or no-ops."""
    import numpy as np

    from kdbkit.runtime import models
    from kdbkit.runtime.backends.registry import default_device, open_backend
    from kdbkit.runtime.handle import Handle

    sizes, layout = NETWORKS[name]
    net = models.build(name, dtype="fp32", layout=layout, **sizes)
    backend = open_backend(default_device())
    launches = [0]
    if stub:  # before any invoker exists, so that every launcher made is a no-op too
        cls = type(backend)

        def launch(self, *args, **kwargs):
            launches[0] += 1

        def launcher(self, *args, **kwargs):
            def run(*buffers):
                launches[0] += 1
            return run

        cls.launch, cls.launcher = launch, launcher
    handle = Handle(backend=backend)
    net.to_device(handle)
    x = net.input_tensor(handle, np.random.default_rng(1).standard_normal(net.input_shape).astype(np.float32))
    for _ in range(2):
        net.forward(handle, x)
    backend.synchronize()
    launches[0] = 0
    times = []
    for _ in range(forwards):
        t0 = time.perf_counter()
        net.forward(handle, x)
        times.append((time.perf_counter() - t0) * 1e3)
        if not stub:
            backend.synchronize()  # not timed: each forward's issue alone
    per_forward = launches[0] // forwards if stub else None
    return {"network": name, "stub": stub, "device": handle.device.name, "ms": statistics.median(times),
            "launches": per_forward}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--networks", default=",".join(NETWORKS))
    ap.add_argument("--forwards", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("docs"))
    ap.add_argument("--commit", default="")
    ap.add_argument("--child", nargs=2, metavar=("NETWORK", "STUB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        json.dump(child(args.child[0], args.child[1] == "1", args.forwards), sys.stdout)
        return 0
    rows = []
    for name in args.networks.split(","):
        run = {}
        for stub in (False, True):
            done = subprocess.run([sys.executable, __file__, "--child", name, str(int(stub)), "--forwards",
                                   str(args.forwards)], capture_output=True, text=True, check=True)
            run[stub] = json.loads(done.stdout.strip().splitlines()[-1])
        launches = run[True]["launches"]
        rows.append({"network": name, "device": run[False]["device"], "launches": launches,
                     "issue_ms": run[False]["ms"], "kdbkit_ms": run[True]["ms"],
                     "issue_us_per_launch": run[False]["ms"] * 1e3 / launches,
                     "kdbkit_us_per_launch": run[True]["ms"] * 1e3 / launches})
        print(name, {k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"commit": args.commit, "machine": platform.processor() or platform.machine(), "python": sys.version.split()[0],
              "forwards": args.forwards, "rows": rows}
    (args.out / "bench_host_time.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# kdbkit's host time per launch", "",
             f"`python scripts/bench_host_time.py --forwards {args.forwards}` at {args.commit or 'this tree'}; "
             "medians of later forwards of small networks with every layer. `issue`: the forward as it "
             "is, every launch issued; `kdbkit`: the backend's launches made no-ops, kdbkit's own Python left.", "",
             "| network | device | launches a forward | issue, ms | kdbkit, ms | issue, us a launch | kdbkit, us a launch |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['network']} | {r['device']} | {r['launches']} | {r['issue_ms']:.3f} | {r['kdbkit_ms']:.3f} | "
              f"{r['issue_us_per_launch']:.1f} | {r['kdbkit_us_per_launch']:.1f} |" for r in rows]
    (args.out / "bench_host_time.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
