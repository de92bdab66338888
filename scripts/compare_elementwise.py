#!/usr/bin/env python3
"""The packed element-wise kernels (ActivPacked's activ_fwd_vec and activ_fwd_vec_light,
OpTensorPacked's op_tensor_vec) as the solvers build them, then under several (threads per
group, vectors per thread and step) pairs given to all of them, each next to PyTorch in
alternating blocks like bench_primitives (relu, gelu and add on 2^26 elements, fp16, bf16,
fp32). The unroll is a compile option (ACTIV_UNROLL, ACTIV_LIGHT_UNROLL, OP_UNROLL); the grid
still gives each thread one step. Tells which pair each kernel and mode should take.

    python scripts/compare_elementwise.py            # on the GPU machine
"""

from __future__ import annotations

import functools
import statistics
import sys

from bench_primitives import copy_bandwidth, timed_pair, with_options

VARIANTS = (None, (256, 4), (128, 1), (256, 1), (128, 2), (256, 2))  # None: as the solvers build them


def launcher_for(original, block: int):
    """OpTensorPacked's launcher_1d with ``block`` threads (its grid follows its UNROLL)."""

    def launcher_1d(handle, kernel, n, args, max_groups=4096):
        return original(handle, kernel, n, args, block=block, max_groups=max_groups)

    return launcher_1d


def main() -> int:
    import kdbkit
    import torch
    from kdbkit.runtime.primitives.activation.solvers import packed as activ
    from kdbkit.runtime.primitives.tensorop.solvers import packed as tensorop

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU for PyTorch: run this on the GPU machine")
    copy = copy_bandwidth(20, 5)
    print(f"device-to-device copy: {copy:.0f} GB/s", flush=True)
    names = ("program", "BLOCK", "UNROLL", "LIGHT_BLOCK", "LIGHT_UNROLL")
    saved_activ = {k: getattr(activ, k) for k in names}
    saved_op = (tensorop.program, tensorop.launcher_1d, tensorop.UNROLL)
    try:
        for variant in VARIANTS:
            if variant is not None:
                block, unroll = variant
                activ.program = functools.partial(
                    with_options, saved_activ["program"], (f"-DACTIV_UNROLL={unroll}", f"-DACTIV_LIGHT_UNROLL={unroll}"))
                activ.BLOCK = activ.LIGHT_BLOCK = block
                activ.UNROLL = activ.LIGHT_UNROLL = unroll
                tensorop.program = functools.partial(with_options, saved_op[0], (f"-DOP_UNROLL={unroll}",))
                tensorop.launcher_1d = launcher_for(saved_op[1], block)
                tensorop.UNROLL = unroll
            label_v = "as built" if variant is None else f"{variant}"
            with kdbkit.Handle() as h:
                for dt, label in ((torch.float16, "fp16"), (torch.bfloat16, "bf16"), (torch.float32, "fp32")):
                    n = 1 << 26
                    x, b = torch.randn(n, device="cuda", dtype=dt), torch.randn(n, device="cuda", dtype=dt)
                    y = torch.empty_like(x)
                    for name, ours, theirs, nbytes, ref in (
                            ("relu", lambda x=x, y=y: kdbkit.activation_forward(h, x, "relu", y=y),
                             lambda x=x: torch.relu(x), 2 * n * x.element_size(), lambda x=x: torch.relu(x)),
                            ("gelu", lambda x=x, y=y: kdbkit.activation_forward(h, x, "gelu", y=y),
                             lambda x=x: torch.nn.functional.gelu(x), 2 * n * x.element_size(), None),
                            ("add", lambda x=x, b=b, y=y: kdbkit.op_tensor(h, "add", x, b, c=y),
                             lambda x=x, b=b, y=y: torch.add(x, b, out=y), 3 * n * x.element_size(),
                             lambda x=x, b=b: x + b)):
                        ours()
                        if ref is not None:
                            assert torch.equal(y, ref()), f"{label_v} {name} {label}: wrong result"
                        t_ours, t_torch, ratios = timed_pair(ours, theirs, iters=20, blocks=9)
                        q = statistics.quantiles(ratios, n=4)
                        print(f"{label_v:9s} {name:4s} {label}: {t_ours * 1000:7.2f} us "
                              f"{nbytes / t_ours / 1e6 / copy:4.0%} of copy, torch / kdbkit "
                              f"{t_torch / t_ours:.3f} [{q[0]:.3f}, {q[2]:.3f}]", flush=True)
    finally:
        for k, v in saved_activ.items():
            setattr(activ, k, v)
        tensorop.program, tensorop.launcher_1d, tensorop.UNROLL = saved_op
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
