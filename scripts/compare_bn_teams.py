#!/usr/bin/env python3
"""BatchNormPersistent's team plans side by side on a CUDA GPU: the benchmark's training problem
(32 x 64 x 112 x 112, fp16, bf16, fp32) for several builds of the kernel (BN_REGS vectors in
flight per thread, which bounds a group's chunk; BN_MIN_GROUPS groups a multiprocessor must
hold, which caps the registers) under several costs per round of channels (runtime/primitives/
batchnorm/solvers/persistent.py's ROUND_COST: higher means fewer, longer rounds), timed like
bench_primitives with the copy bandwidth of the same run.

Every variant writes the same output from the same input (where buffers lie moves a
streaming kernel's time by up to a few per cent), and the variants take turns over several
passes (each variant's figure is its median over the passes), so drift falls on all alike.
Tells which ROUND_COST and which (BN_REGS, BN_MIN_GROUPS) per type (persistent.BUILDS) to keep.

    python scripts/compare_bn_teams.py            # on the GPU machine
    python scripts/compare_bn_teams.py --types fp16 --builds 8 6:5 8+LOAD_FIRST=4   # BN_REGS[:BN_MIN_GROUPS][+BN_...]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys

from bench_primitives import copy_bandwidth, timed, with_options

COSTS = (4096,)
PASSES = 5
BUILDS = ("8", "4", "4:6", "3:6", "6:5")  # BN_REGS[:BN_MIN_GROUPS][+BN_ option...]


def parse_build(text: str) -> tuple[int, int | None, tuple[str, ...]]:
    """'4:6' -> (4, 6, ()), '8+LOAD_FIRST=4' -> (8, None, ('-DBN_LOAD_FIRST=4',)): persistent.BUILDS'
    form, then other options of the kernel's."""
    base, *extra = text.split("+")
    regs, _, groups = base.partition(":")
    return int(regs), int(groups) if groups else None, tuple(f"-DBN_{e}" for e in extra)


def label_of(regs: int, groups: int | None, extra: tuple[str, ...]) -> str:
    return f"BN_REGS={regs}" + ("" if groups is None else f", {groups} groups") + "".join(f" {e[2:]}" for e in extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--types", nargs="+", default=["fp16", "bf16", "fp32"], choices=["fp16", "bf16", "fp32"])
    parser.add_argument("--builds", nargs="+", default=list(BUILDS), help="BN_REGS[:BN_MIN_GROUPS][+BN_ option without its prefix...] each")
    args = parser.parse_args()
    builds_asked = [parse_build(b) for b in args.builds]
    import kdbkit
    import torch
    from kdbkit.runtime.errors import NoSolverError
    from kdbkit.runtime.tensor import DataType
    from kdbkit.runtime.primitives.batchnorm.solvers import persistent

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    copy = copy_bandwidth(20, 5)
    print(f"device-to-device copy: {copy:.0f} GB/s", flush=True)
    builds, cost, program = persistent.BUILDS, persistent.ROUND_COST, persistent.program
    for dt, label in ((torch.float16, "fp16"), (torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        if label not in args.types:
            continue
        x = torch.randn(32, 64, 112, 112, device="cuda", dtype=dt)
        y, s = torch.empty_like(x), torch.rand(64, device="cuda") + 0.5
        m, v = torch.empty(64, device="cuda"), torch.empty(64, device="cuda")
        ref = torch.nn.functional.batch_norm(x.float(), None, None, s, s, training=True)
        variants = {}
        for regs, groups, extra in builds_asked:
            name = label_of(regs, groups, extra)
            for round_cost in COSTS:
                persistent.BUILDS = {dtype: (regs, groups) for dtype in DataType}
                persistent.program = functools.partial(with_options, program, extra)
                persistent.ROUND_COST = round_cost
                h = kdbkit.Handle()
                call = functools.partial(kdbkit.batchnorm_training, h, x, s, s, y=y, saved_mean=m, saved_invstd=v,
                                         solver="BatchNormPersistent")
                try:
                    call()  # the invoker, planned under this variant, is cached in its handle
                except NoSolverError as error:
                    print(f"{label} {name}: {error}", flush=True)
                    h.close()
                    continue
                finally:
                    persistent.BUILDS, persistent.ROUND_COST, persistent.program = builds, cost, program
                error = float((y.float() - ref).abs().max())
                assert error < 0.05, f"{name}, ROUND_COST={round_cost} {label}: y off by {error}"
                stats_error = float((m - x.float().mean((0, 2, 3))).abs().max())
                assert stats_error < 1e-2, f"{name}, ROUND_COST={round_cost} {label}: mean off by {stats_error}"
                variants[(name, round_cost)] = (h, call, _plan(h))
        times = {key: [] for key in variants}
        for _ in range(PASSES):
            for key, (_, call, _) in variants.items():
                times[key].append(timed(call, iters=20, blocks=3))
        for (name, round_cost), (_, call, _) in variants.items():  # still right after many launches
            call()
            error = float((y.float() - ref).abs().max())
            assert error < 0.05, f"{name}, ROUND_COST={round_cost} {label}: y off by {error} after the timing"
        nbytes = 2 * x.numel() * x.element_size()
        for (name, round_cost), (h, _, (members, chunk, teams)) in variants.items():
            ms = statistics.median(times[(name, round_cost)])
            print(f"{label} {name:<28} round cost {round_cost:>5}: members {members:>3}, chunk {chunk:>4}, "
                  f"teams {teams:>2}, rounds {-(-64 // teams)}: {ms * 1000:6.2f} µs {nbytes / ms / 1e6 / copy:6.1%} "
                  f"of copy", flush=True)
            h.close()
    return 0


def _plan(handle) -> tuple[int, int, int]:
    """The team plan of the one BatchNormPersistent invoker the handle has built."""
    plans = [inv.grid for inv in handle.invokers.values() if hasattr(inv, "grid")]
    assert len(plans) == 1, plans
    return plans[0]


if __name__ == "__main__":
    raise SystemExit(main())
