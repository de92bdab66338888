"""KDB_HALF_TO_FLOAT / KDB_FLOAT_TO_HALF on the OpenCL device, bit-exact against NumPy, in a kernel
with a barrier inside a loop.

That is the shape PyPI's PoCL 3.0 (LLVM 14) miscompiled with the former vload_half/vstore_half_rte
helpers: the library call got the address of the last work-item's copy of the private variable, so
fp16 kernels (pooling, layer norm, softmax, ...) gave garbage; kdb_compat.h now converts on values.
"""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import compile_text

BLOCK, GROUPS = 256, 16  # 65536 halves: 16 trips of the loop per group

SOURCE = r"""
#include "kdb_compat.h"
/* Grid-stride loop with a barrier in it, as pooling, layer norm and softmax have. */
KDB_KERNEL void half_round_trip(KDB_GLOBAL const ushort* h, KDB_GLOBAL float* f, KDB_GLOBAL ushort* back, int n)
{
    KDB_SHARED(float, s, BLOCK);
    const int t = KDB_LOCAL_ID_X;
    for (int i = KDB_GROUP_ID_X * BLOCK + t; i - t < n; i += KDB_NUM_GROUPS_X * BLOCK) {
        KDB_BARRIER;
        s[t] = i < n ? KDB_HALF_TO_FLOAT(h[i]) : 0.0f;
        KDB_BARRIER;
        if (i < n) {
            f[i] = s[t];
            back[i] = KDB_FLOAT_TO_HALF(s[t]);
        }
    }
}
KDB_KERNEL void float_to_half(KDB_GLOBAL const float* x, KDB_GLOBAL ushort* y, int n)
{
    KDB_SHARED(float, s, BLOCK);
    const int t = KDB_LOCAL_ID_X;
    for (int i = KDB_GROUP_ID_X * BLOCK + t; i - t < n; i += KDB_NUM_GROUPS_X * BLOCK) {
        KDB_BARRIER;
        s[t] = i < n ? x[i] : 0.0f;
        KDB_BARRIER;
        if (i < n)
            y[i] = KDB_FLOAT_TO_HALF(s[t]);
    }
}
"""


@pytest.fixture(scope="module")
def module(opencl_backend):
    return opencl_backend.load(compile_text(opencl_backend.device.target, SOURCE, f"-DBLOCK={BLOCK}", name="half.c"))


def run(backend, module, name, x, out_dtypes):
    bufs = [backend.to_device(x)] + [backend.alloc(x.size * np.dtype(d).itemsize) for d in out_dtypes]
    backend.launch(module.function(name), (GROUPS, 1, 1), (BLOCK, 1, 1), bufs + [np.int32(x.size)])
    outs = [backend.to_host(b, np.empty(x.size, d)) for b, d in zip(bufs[1:], out_dtypes)]
    for b in bufs:
        b.free()
    return outs


def assert_same_bits(what, inputs, got, want, nan):
    """Bits equal where ``nan`` is False; where True, ``got`` only has to be a NaN (payload free)."""
    exp_mask, man_mask = (0x7C00, 0x3FF) if got.dtype == np.uint16 else (0x7F800000, 0x7FFFFF)
    bad = np.where(nan, ((got & exp_mask) != exp_mask) | ((got & man_mask) == 0), got != want)
    if bad.any():
        i = np.flatnonzero(bad)[:4]
        pytest.fail(f"{what}: {bad.sum()} of {bad.size} wrong, e.g. input {inputs[i]} "
                    f"(bits {[hex(v) for v in inputs[i].view(f'u{inputs.itemsize}')]}) gave "
                    f"{[hex(v) for v in got[i]]}, NumPy {[hex(v) for v in want[i]]}", pytrace=False)


def test_every_half_to_float_and_back(opencl_backend, module):
    h = np.arange(1 << 16, dtype=np.uint16)
    f, back = run(opencl_backend, module, "half_round_trip", h, (np.float32, np.uint16))
    half = h.view(np.float16)
    nan = np.isnan(half)
    assert_same_bits("half -> float", half, f.view(np.uint32), half.astype(np.float32).view(np.uint32), nan)
    assert_same_bits("half -> float -> half", half, back, h, nan)


def float_inputs() -> np.ndarray:
    """Every rounding midpoint of the finite halves and its float neighbours, the edges, random floats."""
    pos = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)  # +0 up to 65504
    mid = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)  # exact in float32; subnormal ones too
    edges = np.array([0.0, 65504, 65519.99, 65520, np.nextafter(np.float32(65520), np.float32(0)), 65536, 1e30, np.inf,
                      2.0**-14, np.nextafter(np.float32(2**-14), np.float32(0)), 2.0**-24, 2.0**-25,
                      np.nextafter(np.float32(2**-25), np.float32(1)), 2.0**-26, 1e-45, 1e-40, np.nan], np.float32)
    rng = np.random.default_rng(0)
    random = rng.integers(0, 1 << 32, 20_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    in_range = rng.integers(0x33000000, 0x47900000, 20_000, dtype=np.uint32).view(np.float32)  # around half's range
    up, down = np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(0))
    one_sign = np.concatenate([mid, up, down, edges, in_range])
    return np.concatenate([one_sign, -one_sign, random]).astype(np.float32)


def test_floats_to_half_round_to_nearest_even(opencl_backend, module):
    x = float_inputs()
    (got,) = run(opencl_backend, module, "float_to_half", x, (np.uint16,))
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    assert_same_bits("float -> half", x, got, want, np.isnan(x))
