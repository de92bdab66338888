#!/usr/bin/env python3
"""Where a network's first and later forwards spend their time, in one process (a tuning aid
for bench_network.py): cProfile of the handle and the first forward, the host's issue time
against the whole time of later forwards, and each layer's time with a synchronise after it.

With ``--first-layers`` it profiles nothing and instead runs the *first* forward layer by layer,
with a synchronise after each, and reports the handle's prepare steps and every program's
resolution steps: where a fresh process's first result spends its time, uninflated by cProfile.

Usage: KDB_SYSTEM_DB_PATH=<bundle folder> python scripts/profile_network.py resnet50 [--first-layers] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("network")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--first-layers", action="store_true")
    ap.add_argument("--no-profile", action="store_true", help="with --first-layers: time the first layer "
                    "without cProfile (which inflates it)")
    args = ap.parse_args()
    if args.first_layers:
        first_layers(args)
        return
    import numpy as np

    import bench_network
    import kdbkit
    from kdbkit.runtime.backends.registry import default_device, open_backend
    from kdbkit.runtime.handle import Handle

    net = bench_network._network(args.network)
    x = np.random.default_rng(1).standard_normal(net.input_shape).astype(np.float32)
    backend = open_backend(default_device())
    report: dict = {"network": args.network}
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    handle = Handle(backend=backend)
    profile.disable()
    report["handle_ms"] = (time.perf_counter() - t0) * 1e3
    net.to_device(handle)
    staged = net.input_tensor(handle, x)
    backend.synchronize()
    t0 = time.perf_counter()
    profile.enable()
    result = net.forward(handle, staged)
    issued = time.perf_counter()
    net.download(handle, result)
    profile.disable()
    report["first"] = {"issue_ms": (issued - t0) * 1e3, "total_ms": (time.perf_counter() - t0) * 1e3,
                       "resolved": handle.resolved_by_source}
    for order in ("tottime", "cumtime"):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(45)
        report[f"first_profile_{order}"] = text.getvalue()
    later = []
    for _ in range(5):
        t0 = time.perf_counter()
        result = net.forward(handle, staged)
        issued = time.perf_counter()
        backend.synchronize()
        later.append({"issue_ms": (issued - t0) * 1e3, "total_ms": (time.perf_counter() - t0) * 1e3})
    report["later"] = later
    steady = cProfile.Profile()
    steady.enable()
    for _ in range(5):
        net.forward(handle, staged)
    steady.disable()
    backend.synchronize()
    text = io.StringIO()
    pstats.Stats(steady, stream=text).sort_stats("tottime").print_stats(40)
    report["later_profile_tottime"] = text.getvalue()
    text = io.StringIO()
    pstats.Stats(steady, stream=text).sort_stats("cumtime").print_stats(40)
    report["later_profile_cumtime"] = text.getvalue()
    # each layer with a synchronise after it: its issue plus its kernels
    state = net._device
    values = dict(state.values)
    values[net.graph.input] = staged
    layers = []
    for _ in range(2):
        layers = []
        for node, site in net._sites(values, state.params, state.scratch):
            t0 = time.perf_counter()
            node.layer.run(kdbkit, handle, site)
            t1 = time.perf_counter()
            backend.synchronize()
            layers.append({"layer": f"{type(node.layer).__name__} {node.output}", "issue_ms": (t1 - t0) * 1e3,
                           "total_ms": (time.perf_counter() - t0) * 1e3})
    by_kind = report["layers_by_kind"] = _by_kind(layers)
    report["layers"] = layers
    if backend.name == "cuda":
        report["gpu_layers"] = _gpu_layers(net, handle, values, state)
        report["gpu_layers_by_kind"] = _by_kind(report["gpu_layers"]["layers"], "gpu_ms")
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text)
    print(report["first"], report["later"][-1], json.dumps(by_kind, indent=1))
    if "gpu_layers" in report:
        print("GPU time by layer kind:", report["gpu_layers"]["total_ms"], "ms",
              json.dumps(report["gpu_layers_by_kind"], indent=1))
    print(report["first_profile_tottime"][:6000])


def _by_kind(layers: list[dict], *fields: str) -> dict:
    fields = fields or ("issue_ms", "total_ms")
    by_kind: dict = {}
    for row in layers:
        agg = by_kind.setdefault(row["layer"].split()[0], {"count": 0, **{f: 0.0 for f in fields}})
        agg["count"] += 1
        for f in fields:
            agg[f] += row[f]
    return by_kind


def _gpu_layers(net, handle, values, state) -> dict:
    """Each layer's GPU time in a later forward: a CUDA event recorded after every layer, with
    no synchronise between, behind a backlog of one whole forward so that the GPU, not the
    host's issue, sets the pace (what the events measure is then the kernels' own time)."""
    import kdbkit

    backend = handle.backend
    drv = backend._drv
    events = [drv.cuEventCreate(0)[1] for _ in range(len(list(net.graph.nodes)) + 1)]
    net.forward(handle, values[net.graph.input])  # the backlog
    drv.cuEventRecord(events[0], backend.stream)
    names = []
    for i, (node, site) in enumerate(net._sites(values, state.params, state.scratch)):
        node.layer.run(kdbkit, handle, site)
        drv.cuEventRecord(events[i + 1], backend.stream)
        names.append(f"{type(node.layer).__name__} {node.output}")
    backend.synchronize()
    times = [drv.cuEventElapsedTime(a, b)[1] for a, b in zip(events, events[1:len(names) + 1])]
    for e in events:
        drv.cuEventDestroy(e)
    return {"total_ms": sum(times), "layers": [{"layer": n, "gpu_ms": t} for n, t in zip(names, times)]}


def _table_us(profile, order: str, limit: int) -> str:
    """A cProfile table in microseconds (pstats prints milliseconds to 3 places, which rounds
    a first layer's calls to nothing)."""
    stats = pstats.Stats(profile).stats
    key = 2 if order == "tottime" else 3
    rows = sorted(stats.items(), key=lambda kv: -kv[1][key])[:limit]
    lines = [f"{'calls':>9} {'tottime us':>11} {'cumtime us':>11}  function"]
    for (file, line, fn), (cc, nc, tt, ct, _) in rows:
        calls = f"{nc}/{cc}" if nc != cc else str(nc)
        lines.append(f"{calls:>9} {tt * 1e6:11.0f} {ct * 1e6:11.0f}  {Path(file).name}:{line}({fn})")
    return "\n".join(lines)


def first_layers(args) -> None:
    import numpy as np

    import bench_network
    import kdbkit
    from kdbkit.runtime.backends.registry import default_device, open_backend
    from kdbkit.runtime.handle import Handle

    net = bench_network._network(args.network)
    x = np.random.default_rng(1).standard_normal(net.input_shape).astype(np.float32)
    backend = open_backend(default_device())
    backend.synchronize()
    t0 = time.perf_counter()
    handle = Handle(backend=backend)
    report: dict = {"network": args.network, "handle_ms": (time.perf_counter() - t0) * 1e3,
                    "prepare_steps": [(s.name, round(s.ms, 3), s.outcome) for s in handle.prepare_steps]}
    net.to_device(handle)
    staged = net.input_tensor(handle, x)
    backend.synchronize()
    state = net._device
    values = dict(state.values)
    values[net.graph.input] = staged
    layers = []
    t_all = time.perf_counter()
    before = set(sys.modules)
    profile = cProfile.Profile()  # the first layer alone, which pays every one-time cost
    for node, site in net._sites(values, state.params, state.scratch):
        t0 = time.perf_counter()
        if not layers and not args.no_profile:
            profile.enable()
        node.layer.run(kdbkit, handle, site)
        t1 = time.perf_counter()
        if not layers:
            profile.disable()
            report["imported_by_first_layer"] = sorted(set(sys.modules) - before)
        backend.synchronize()
        layers.append({"layer": f"{type(node.layer).__name__} {node.output}", "issue_ms": (t1 - t0) * 1e3,
                       "total_ms": (time.perf_counter() - t0) * 1e3})
    report["first_forward_ms"] = (time.perf_counter() - t_all) * 1e3
    report["layers_by_kind"] = _by_kind(layers)
    report["layers"] = layers
    programs = list(handle.chain.memory.values())
    report["programs"] = [{"request": str(p.request), "source": p.source,
                           "steps": [(s.name, round(s.ms, 3), s.outcome) for s in p.steps]} for p in programs]
    steps: dict = {}
    for p in programs:
        for s in p.steps:
            steps[s.name.split()[0]] = steps.get(s.name.split()[0], 0.0) + s.ms
    report["program_steps_ms"] = steps
    if not args.no_profile:
        report["first_layer_profile_cumtime"] = _table_us(profile, "cumtime", 70)
        report["first_layer_profile_tottime"] = _table_us(profile, "tottime", 50)
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text)
    slow = sorted(layers, key=lambda r: -r["total_ms"])[:15]
    print(json.dumps({k: report[k] for k in ("handle_ms", "prepare_steps", "first_forward_ms", "program_steps_ms",
                                             "layers_by_kind")}, indent=1))
    print("slowest layers:", json.dumps(slow, indent=0))
    print("imported by the first layer:", report["imported_by_first_layer"])
    if not args.no_profile:
        print(report["first_layer_profile_tottime"])
        print(report["first_layer_profile_cumtime"])


if __name__ == "__main__":
    main()
