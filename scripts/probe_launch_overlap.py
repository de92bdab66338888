#!/usr/bin/env python3
"""What programmatic dependent launch (sm_90+) buys back-to-back calls, on a CUDA GPU: the
benchmark's relu, max pooling and batch-norm training (fp16, bf16) next to PyTorch in
alternating blocks like bench_primitives, for each variant:

- as built: cuLaunchKernel (cuLaunchCooperativeKernel for batch-norm training);
- wait: the kernels built with -DKDB_PDL=1 (griddepcontrol.wait first), launched as before,
  which is what the wait costs when nothing overlaps;
- overlap: the same kernels launched through cuLaunchKernelEx with programmatic stream
  serialisation allowed, so a launch is processed while the grid before drains;
- overlap + release: built with -DKDB_PDL=2 (griddepcontrol.launch_dependents after the wait),
  so the next grid's groups take multiprocessors as this grid's leave.

Also, for relu fp16, our time with the output at several addresses (is the gap to PyTorch the
kernel's or where the buffers lie?) and device-to-device copies of the primitives' sizes.
Each result is checked against PyTorch's.

    python scripts/probe_launch_overlap.py --out gpu-out      # on the GPU machine
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
from pathlib import Path

from bench_primitives import copy_bandwidth, timed, timed_pair, with_options


class OverlapDriver:
    """The cuda.bindings driver module, but cuLaunchKernel and cuLaunchCooperativeKernel go
    through cuLaunchKernelEx with programmatic stream serialisation allowed."""

    def __init__(self, drv):
        self._drv = drv
        self._configs = {}

    def __getattr__(self, name):
        return getattr(self._drv, name)

    def _config(self, f, dims, shared, stream, cooperative):
        key = (int(f), dims, shared, int(stream), cooperative)
        config = self._configs.get(key)
        if config is None:
            drv = self._drv
            config = drv.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX, config.blockDimY, config.blockDimZ = dims
            config.sharedMemBytes = shared
            config.hStream = stream
            attrs = []
            overlap = drv.CUlaunchAttribute()
            overlap.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            overlap.value.programmaticStreamSerializationAllowed = 1
            attrs.append(overlap)
            if cooperative:
                together = drv.CUlaunchAttribute()
                together.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
                together.value.cooperative = 1
                attrs.append(together)
            config.attrs = attrs
            config.numAttrs = len(attrs)
            self._configs[key] = config
        return config

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        return self._drv.cuLaunchKernelEx(self._config(f, (gx, gy, gz, bx, by, bz), shared, stream, False),
                                          f, params, 0)

    def cuLaunchCooperativeKernel(self, f, gx, gy, gz, bx, by, bz, shared, stream, params):
        return self._drv.cuLaunchKernelEx(self._config(f, (gx, gy, gz, bx, by, bz), shared, stream, True),
                                          f, params, 0)


@contextlib.contextmanager
def built_with(extra: tuple[str, ...]):
    """The three solvers' programs with ``extra`` compile options meanwhile."""
    from kdbkit.runtime.primitives.activation.solvers import packed
    from kdbkit.runtime.primitives.batchnorm.solvers import persistent
    from kdbkit.runtime.primitives.pooling.solvers import strip

    modules = (packed, strip, persistent)
    saved = [m.program for m in modules]
    for m, program in zip(modules, saved):
        m.program = functools.partial(with_options, program, extra) if extra else program
    try:
        yield
    finally:
        for m, program in zip(modules, saved):
            m.program = program


def cases(h, torch, kdbkit):
    """(name, kdbkit call, torch call, check, bytes moved)."""
    F = torch.nn.functional
    for dt, label in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
        n = 1 << 26
        x = torch.randn(n, device="cuda", dtype=dt)
        y = torch.empty_like(x)
        yield (f"relu {label}", lambda x=x, y=y: kdbkit.activation_forward(h, x, "relu", y=y),
               lambda x=x: torch.relu(x), lambda x=x, y=y: torch.equal(y, torch.relu(x)), 4 * n)
        img = torch.randn(32, 64, 112, 112, device="cuda", dtype=dt)
        pooled = torch.empty(32, 64, 56, 56, device="cuda", dtype=dt)
        yield (f"max pool {label}",
               lambda img=img, p=pooled: kdbkit.pooling_forward(h, img, window=3, stride=2, pad=1,
                                                                save_indices=False, y=p, solver="PoolStrip"),
               lambda img=img: F.max_pool2d(img, 3, 2, 1),
               lambda img=img, p=pooled: torch.equal(p, F.max_pool2d(img, 3, 2, 1)),
               2 * (img.numel() + pooled.numel()))
        scale, shift = torch.rand(64, device="cuda") + 0.5, torch.randn(64, device="cuda")
        out = torch.empty_like(img)
        saved = (torch.empty(64, device="cuda"), torch.empty(64, device="cuda"))
        sc, sh = scale.to(dt), shift.to(dt)
        yield (f"batch norm (training) {label}",
               lambda img=img, o=out: kdbkit.batchnorm_training(h, img, scale, shift, y=o, saved_mean=saved[0],
                                                                saved_invstd=saved[1], solver="BatchNormPersistent"),
               lambda img=img: F.batch_norm(img, None, None, sc, sh, training=True),
               lambda img=img, o=out: float((o.float() - F.batch_norm(img.float(), None, None, scale, shift,
                                                                        training=True)).abs().max()) < 0.05,
               4 * img.numel())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--blocks", type=int, default=15)
    args = parser.parse_args()
    import torch

    import kdbkit

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    copy = copy_bandwidth(args.iters, args.blocks)
    print(f"device-to-device copy (1 GiB): {copy:.0f} GB/s", flush=True)
    result = {"copy_gbs": copy, "copies": {}, "variants": {}, "relu_fp16_outputs": []}
    for mb in (32, 51, 64, 134):
        a = torch.empty(mb << 20, dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        ms = timed(lambda: b.copy_(a), iters=args.iters, blocks=args.blocks)
        result["copies"][f"{mb} MiB"] = {"ms": ms, "share_of_1gib": 2 * a.numel() / ms / 1e6 / copy}
        print(f"copy of {mb} MiB: {ms * 1000:.2f} µs, {result['copies'][f'{mb} MiB']['share_of_1gib']:.1%} "
              "of the 1 GiB copy's bandwidth", flush=True)
    variants = (("as built", (), False), ("wait", ("-DKDB_PDL=1",), False), ("overlap", ("-DKDB_PDL=1",), True),
                ("overlap + release", ("-DKDB_PDL=2",), True))
    for name, extra, overlap in variants:
        with built_with(extra), kdbkit.Handle() as h:
            if overlap:
                h.backend._drv = OverlapDriver(h.backend._drv)
            rows = result["variants"][name] = {}
            for case, ours, theirs, check, nbytes in cases(h, torch, kdbkit):
                ours()
                torch.cuda.synchronize()
                assert check(), f"{name}: {case} differs from PyTorch"
                t_ours, t_theirs, ratios = timed_pair(ours, theirs, iters=args.iters, blocks=args.blocks)
                assert check(), f"{name}: {case} differs from PyTorch after the timing"
                rows[case] = {"ms": t_ours, "torch_ms": t_theirs, "speedup": statistics.median(ratios),
                              "copy_share": nbytes / t_ours / 1e6 / copy}
                print(f"{name:>18} {case:<26} {t_ours * 1000:7.2f} µs (torch {t_theirs * 1000:7.2f}) "
                      f"{statistics.median(ratios):.3f}x torch, {rows[case]['copy_share']:.1%} of copy", flush=True)
    # Relu fp16 as built, its output at several addresses, each timed against PyTorch.
    with kdbkit.Handle() as h:
        x = torch.randn(1 << 26, device="cuda", dtype=torch.float16)
        outputs = [torch.empty_like(x) for _ in range(4)]
        for i, y in enumerate(outputs):
            t_ours, t_theirs, ratios = timed_pair(lambda y=y: kdbkit.activation_forward(h, x, "relu", y=y),
                                                  lambda: torch.relu(x), iters=args.iters, blocks=args.blocks)
            result["relu_fp16_outputs"].append({"output": i, "ms": t_ours, "torch_ms": t_theirs,
                                                "speedup": statistics.median(ratios)})
            print(f"relu fp16, output {i} at {y.data_ptr():#x} (input {x.data_ptr():#x}): {t_ours * 1000:.2f} µs, "
                  f"torch {t_theirs * 1000:.2f} µs, {statistics.median(ratios):.3f}x", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_launch_overlap.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
