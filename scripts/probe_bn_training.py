#!/usr/bin/env python3
"""Where BatchNormPersistent's time goes, on a CUDA GPU: the benchmark's training problem
(32 x 64 x 112 x 112, fp16 and fp32) launched straight through the backend as the solver
launches it (cooperatively), each variant timed and its y checked against NumPy:

- as built, and with -DBN_TRACE: each group's global timer at its start and at each stage of
  every channel (this channel staged and summed, its arrival published; the channel before's
  statistics seen, its writes issued), the median over groups per round relative to the first
  group's start, and how many groups found a member's sums missing from their early copy;
- other compile options given with --variant=-DBN_REGS=4 (vectors in flight per thread).

    python scripts/probe_bn_training.py --out gpu-out      # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

SHAPE = (32, 64, 112, 112)
ROUNDS = 15  # batchnorm_persistent.cu's BN_TRACE_ROUNDS
# Per round r: channel r staged and summed, its arrival published; the statistics of channel
# r - 1 seen, its writes issued (the round after the last: the last channel's).
MARKS = ("staged and summed", "arrived", "statistics seen (channel before)", "writes issued (channel before)")


def regs_of(options: tuple[str, ...]) -> int:
    for option in options:
        if option.startswith("-DBN_REGS="):
            return int(option.split("=", 1)[1])
    return 8


def run_variant(h, dtype, extra: tuple[str, ...], trace: bool, iters: int) -> dict:
    from kdbkit.runtime.primitives.batchnorm.solvers import persistent

    backend = h.backend
    n, c, hh, ww = SHAPE
    options = (*dtype.options, *extra, *(("-DBN_TRACE",) if trace else ()))
    kernel = h.program("batchnorm_persistent.cu", options).function("bn_train_persistent")
    per = 16 // dtype.itemsize
    vectors = n * hh * ww // per
    cu = h.device.target.cu or 1
    resident = persistent.resident_for(backend, kernel, cu)
    saved, persistent.MAX_CHUNK = persistent.MAX_CHUNK, persistent.BLOCK * regs_of(extra)
    try:
        members, chunk, teams = persistent.team_plan(vectors, c, resident)
    finally:
        persistent.MAX_CHUNK = saved
    per_sm = resident(chunk, members) // cu
    groups = members * teams
    rng = np.random.default_rng(0)
    host = (rng.standard_normal(SHAPE) * 2 + 1).astype(dtype.storage)
    x = backend.to_device(host)
    y = backend.alloc(x.nbytes)
    ones = backend.to_device(np.ones(c, np.float32))
    zeros = [backend.to_device(np.zeros(c, np.float32)) for _ in range(5)]  # bias, then the four statistics
    pairs, gen = backend.to_device(np.zeros(2 * c * members, np.uint64)), backend.to_device(np.zeros(c, np.uint32))
    slots = 4 * ROUNDS + 2
    tail = [backend.to_device(np.zeros(groups * (slots + ROUNDS + 1), np.uint64))] if trace else []
    plane = hh * ww // per
    args = [x, y, ones, *zeros, pairs, gen, *persistent.kernel_args(
        n, c, plane, (c * plane, plane, c * plane, plane), members, chunk, n * hh * ww, 1e-5, 0.1, True), *tail]
    launch = backend.launcher(kernel, (groups, 1, 1), (persistent.BLOCK, 1, 1), args,
                              shared_bytes=persistent.shared_bytes(chunk, members), cooperative=True)
    for _ in range(3):
        launch()
    backend.synchronize()
    ms = statistics.median(backend.time_ms(launch, iters) for _ in range(5))
    # Each variant checked: y against NumPy's normalisation (scale 1, bias 0).
    out = backend.to_host(y, np.empty(SHAPE, dtype.storage)).astype(np.float64)
    ref = host.astype(np.float64)
    ref = (ref - ref.mean((0, 2, 3), keepdims=True)) / np.sqrt(ref.var((0, 2, 3), keepdims=True) + 1e-5)
    error = float(np.abs(out - ref).max())
    assert error < (2e-2 if dtype.itemsize == 2 else 1e-4), f"{extra}: y is off by {error}"
    row = {"type": dtype.label, "options": list(extra), "groups_per_sm": per_sm,
           "plan": {"members": members, "chunk_vectors": chunk, "teams": teams, "rounds": -(-c // teams)},
           "ms": ms, "copy_bytes": 2 * x.nbytes}
    if trace:
        launch()
        backend.synchronize()
        raw = backend.to_host(tail[0], np.zeros(groups * (slots + ROUNDS + 1), np.uint64)).astype(np.int64)
        marks = raw[:groups * slots].reshape(groups, slots)
        late = raw[groups * slots:groups * (slots + ROUNDS)].reshape(groups, ROUNDS)
        sms = raw[groups * (slots + ROUNDS):]
        start = int(marks[:, 0].min())
        rel = (marks - start) / 1000.0  # µs after the first group's start
        rounds = []
        for r in range(min(ROUNDS, row["plan"]["rounds"] + 1)):
            cols = marks[:, 1 + 4 * r:5 + 4 * r]
            stages = {}
            for i, mark in enumerate(MARKS):
                live = cols[:, i] > 0
                if live.any():
                    stages[mark] = round(float(np.median(rel[live, 1 + 4 * r + i])), 2)
            if r > 0 and r < ROUNDS:  # the team's sums of the channel before, read in this round
                stages["groups whose early copy missed a member"] = int((late[:, r] > 0).sum())
                stages["most members missed"] = int(late[:, r].max())
            rounds.append(stages)
        row["trace_us"] = {"group start, last": round(float(rel[:, 0].max()), 2), "rounds": rounds,
                           "group end, median": round(float(np.median(rel[:, -1])), 2),
                           "group end, last": round(float(rel[:, -1].max()), 2),
                           "tail": tail_of(rel, sms, members, row["plan"]["rounds"])}
    return row


def tail_of(rel, sms, members: int, rounds: int) -> dict:
    """Where the last groups' time goes: end percentiles; the last round's staging (its reads
    arrived) and its statistics seen, each a spread over groups; the teams ordered by their
    last member's end; and whether the latest groups share multiprocessors."""
    end = rel[:, -1]
    last = rounds - 1
    staged, seen = rel[:, 1 + 4 * last], rel[:, 3 + 4 * rounds]
    team_end = end.reshape(-1, members).max(1)
    latest = np.argsort(end)[-8:]
    pct = lambda v: {f"p{q}": round(float(np.percentile(v, q)), 2) for q in (10, 50, 90, 99, 100)}
    return {"group end": pct(end), "last channel staged": pct(staged), "last channel's statistics seen": pct(seen),
            "team end, earliest and latest": [round(float(team_end.min()), 2), round(float(team_end.max()), 2)],
            "latest groups (end, multiprocessor, its groups' ends)": [
                [round(float(end[g]), 2), int(sms[g]), sorted(round(float(e), 1) for e in end[sms == sms[g]])]
                for g in latest]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-out"))
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--variant", action="append", default=[], help="compile options, e.g. '-DBN_REGS=4'")
    args = parser.parse_args()

    import kdbkit
    from kdbkit.runtime.tensor import DataType

    rows = []
    with kdbkit.Handle() as h:
        if h.backend.name != "cuda":
            sys.exit("no CUDA device: run this on the GPU machine")
        for dtype in (DataType.FP16, DataType.FP32):
            for extra in [(), *(tuple(v.split()) for v in args.variant)]:
                for trace in (False, True):
                    row = run_variant(h, dtype, extra, trace, args.iters)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_bn_training.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
