"""Hopper's backward data through the TMA forward kernel (ConvTmaBwdData*, ids 36-38).

No GPU needed: the programs compile offline for sm_90a; the gates and their reasons; the
flipped pad; the identity dx = forward(dy, flipped w, dilation x (filter - 1) - pad) on the
NumPy reference; and the whole chain short of the tensor cores: conv_gemm.c's conv_flip_weights
run on the chain device (PoCL in CI) from either layout, then conv_fwd_tma emulated in NumPy
from the very arguments the invoker launches it with (its scalars and both tensor maps: the
im2col copy's walk of the bounding box, its zero fill, the weights' tiles), against the
reference's backward data; an NCHW 1 x 1 one's batched GEMM on the reference. On an sm_90 GPU
(KDB_TEST_BACKEND=cuda with PyTorch): every tile shape, type and layout against PyTorch in
float64 on odd sizes, dilation 2, padding 0/1/2 (H and W padded differently), 24/72/130
channels of dx, dy's channels not a multiple of the 64-channel step, 1 x 1 filters (the GEMM
and the staged path), more tiles than multiprocessors, and new weights on the second call."""

from __future__ import annotations

import numpy as np
import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.base import DeviceInfo
from kdbkit.runtime.primitives.convolution import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers import tma, tma_dgrad
from kdbkit.runtime.primitives.convolution.solvers.igemm_tc import as_forward, flipped_pad
from kdbkit.runtime.reference import convolution as ref
from kdbkit.runtime.solver import REGISTRY, launcher_1d
from kdbkit.runtime.tensor import DataType
from .conftest import assert_written_in_place, sm90

SOLVERS = ("ConvTmaBwdData128x256", "ConvTmaBwdData128x128", "ConvTmaBwdData128x64")


def dgrad(c=64, k=64, hw=(9, 9), n=2, f=(3, 3), pad=(1, 1), stride=(1, 1), dilation=(1, 1), layout="NHWC",
          dtype=DataType.FP16, groups=1, direction="B") -> ConvProblem:
    """Backward data of x (n x c x hw) convolved into k channels: dx's c channels from dy's k."""
    return ConvProblem(direction, dtype, layout, (n, c, *hw), k, f, pad, stride, dilation, groups)


def flipped(w: np.ndarray) -> np.ndarray:
    """w'[c, k, a, b] = w[k, c, Y-1-a, X-1-b]."""
    return w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1]


# ---------------------------------------------------------------- no GPU needed


@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("dtype", [DataType.FP16, DataType.BF16])
def test_every_program_compiles_offline_for_sm90a(name, dtype):
    """conv_tma.cu (the forward's kernel, same options) and conv_gemm.c (the flip, the staging)."""
    from tests.prerequisites import require_nvrtc

    require_nvrtc()
    from kdbkit.runtime.backends.elf_notes import cubin_arch
    from kdbkit.runtime.compilers.nvrtc import NvrtcCompiler

    from ..conftest import compile_file

    solver = REGISTRY.find(name)
    kernel, moves = solver.programs(dgrad(dtype=dtype))
    assert kernel == tma.kernel_request(dtype, solver.tile_n)  # no program of its own in a bundle
    assert moves.kernel_file == "conv_gemm.c"
    for request, entry in ((kernel, b"\0conv_fwd_tma\0"), (moves, b"\0conv_flip_weights\0")):
        cubin = compile_file(Target.parse("sm_90"), request.kernel_file, *request.options, compiler=NvrtcCompiler())
        assert cubin_arch(cubin) == "sm_90" and entry in cubin


@pytest.mark.parametrize("f, pad, dilation, expected", [
    ((3, 3), (1, 1), (1, 1), (1, 1)),  # "same" 3 x 3: the same padding
    ((3, 3), (0, 0), (1, 1), (2, 2)),  # valid: dy padded by the whole filter
    ((3, 3), (2, 2), (1, 1), (0, 0)),  # padded past "same": dy unpadded
    ((3, 3), (2, 2), (2, 2), (2, 2)),  # dilation 2 spans 5
    ((5, 3), (2, 0), (1, 2), (2, 4)),  # each axis its own
    ((7, 7), (3, 3), (1, 1), (3, 3)),
    ((1, 1), (0, 0), (1, 1), (0, 0)),
    ((1, 1), (1, 0), (1, 1), (-1, 0)),  # wider than the filter: no such forward convolution
    ((3, 1), (3, 0), (1, 4), (-1, 0)),
])
def test_the_flipped_pad_is_dilation_times_filter_less_one_minus_pad(f, pad, dilation, expected):
    p = dgrad(f=f, pad=pad, dilation=dilation, hw=(12, 12))
    assert flipped_pad(p) == expected
    if min(expected) >= 0:
        forward = as_forward(p)
        assert forward.out_hw == p.x_shape[2:] and forward.x_shape == p.y_shape and forward.pad == expected
        assert (forward.x_shape[1], forward.out_channels, forward.direction, forward.layout) == (64, 64, "F", "NHWC")


# (N, C, H, W, K, filter, pad, dilation): stride 1, odd sizes, H and W padded differently
IDENTITY = [(2, 3, 7, 9, 5, (3, 3), (1, 1), (1, 1)), (1, 4, 11, 6, 6, (3, 2), (1, 0), (1, 2)),
            (2, 5, 9, 10, 4, (5, 4), (2, 3), (2, 1)), (1, 3, 8, 7, 2, (3, 3), (0, 0), (2, 2)),
            (2, 2, 6, 5, 3, (3, 3), (2, 2), (1, 1)), (1, 3, 10, 11, 4, (2, 3), (0, 2), (2, 1)),
            (3, 2, 5, 5, 3, (1, 1), (0, 0), (1, 1)), (1, 2, 7, 8, 3, (7, 7), (3, 3), (1, 1))]


@pytest.mark.parametrize("case", IDENTITY, ids=["x".join(map(str, c[:5])) for c in IDENTITY])
def test_dx_is_the_forward_convolution_of_dy_with_the_flipped_weights(case):
    """The identity the solvers rest on, on the NumPy reference in float64."""
    n, c, h, w, k, f, pad, dilation = case
    p = dgrad(c=c, k=k, hw=(h, w), n=n, f=f, pad=pad, dilation=dilation)
    rng = np.random.default_rng(sum(case[:5]))
    wt, dy = rng.standard_normal((k, c, *f)), rng.standard_normal(p.y_shape)
    expected = ref.backward_data(dy, wt, p.x_shape, pad, (1, 1), dilation)
    dx = ref.forward(dy, flipped(wt), flipped_pad(p), (1, 1), dilation)
    assert dx.shape == expected.shape == p.x_shape
    np.testing.assert_allclose(dx, expected, rtol=1e-12, atol=1e-12)


def emulate_conv_fwd_tma(x_nhwc: np.ndarray, w_flat: np.ndarray, scalars, x_map, w_map) -> np.ndarray:
    """conv_fwd_tma (kernels/conv_tma.cu) in NumPy, from its launch arguments: y (M x K).

    Per output tile, the producer's steps (taps, then 64 channels at a time, as its loop
    advances c0, s, r): A, the im2col copy's 128 pixels, walked from the tile's first pixel's
    window corner (stride x (ho, wo) - pad) through the map's bounding box (W from the lower
    corner to the far edge + the upper corner in steps of the element stride, then H, then
    N), each moved by the tap's offset (dilation x (r, s)), zeros outside the image, past C
    and past the last image; B, the tile copy of w as (C, taps, K), zeros past either edge.
    The consumers sum A B^T; the epilogue writes the tile's rows and columns inside M x K.
    """
    m, k, c, ho, wo, s_taps, pad_h, pad_w, sh, sw, dh, dw, taps, _ = (int(v) for v in scalars)
    (cx, wx, hx, nx), x_strides, (lw, lh), (uw, uh), step, pixels, steps = x_map
    assert x_nhwc.shape == (nx, hx, wx, cx) and x_strides == (2 * cx, 2 * wx * cx, 2 * hx * wx * cx)
    assert (step, pixels, steps) == (64, 128, (1, sw, sh, 1)) and cx == c
    (cw, taps_w, kw), w_strides, (box_c, box_tap, tile_n) = w_map
    assert (cw, taps_w, kw) == (c, taps, k) and w_strides == (2 * cw, 2 * taps_w * cw) and (box_c, box_tap) == (64, 1)
    w = w_flat.reshape(kw, taps_w, cw)
    c_steps, plane = -(-c // 64), ho * wo
    y = np.full((m, k), np.nan)
    for tm in range(-(-m // 128)):
        for tn in range(-(-k // tile_n)):
            m0, k0 = tm * 128, tn * tile_n
            img = m0 // plane
            row, col = divmod(m0 - img * plane, wo)
            walk, (pn, ph, pw) = [], (img, row * sh - pad_h, col * sw - pad_w)
            for _ in range(128):
                walk.append((pn, ph, pw))
                pw += sw
                if pw > wx - 1 + uw:
                    pw, ph = lw, ph + sh
                    if ph > hx - 1 + uh:
                        ph, pn = lh, pn + 1
            pn, ph, pw = np.array(walk).T
            acc = np.zeros((128, tile_n))
            for ks in range(taps * c_steps):
                tap, c0 = ks // c_steps, ks % c_steps * 64
                r, s = divmod(tap, s_taps)
                hh, ww, cs = ph + r * dh, pw + s * dw, slice(c0, min(c0 + 64, c))
                inside = (pn < nx) & (hh >= 0) & (hh < hx) & (ww >= 0) & (ww < wx)
                a, b = np.zeros((128, 64)), np.zeros((tile_n, 64))
                a[inside, :cs.stop - c0] = x_nhwc[pn[inside], hh[inside], ww[inside], cs]
                ks_ = slice(k0, min(k0 + tile_n, k))
                b[:ks_.stop - k0, :cs.stop - c0] = w[ks_, tap, cs]
                acc += a @ b.T
            rows, cols = min(128, m - m0), min(tile_n, k - k0)
            y[m0:m0 + rows, k0:k0 + cols] = acc[:rows, :cols]
    return y


# (N, C, H, W, K, filter, pad, dilation, tile): small enough to emulate
EMULATED = [(2, 24, 9, 11, 16, (3, 3), (1, 1), (1, 1), 64),  # 198 pixels: two tiles, the second cut
            (1, 130, 6, 7, 72, (3, 3), (2, 2), (2, 2), 64),  # dilation 2, pad 2; 130 columns, 72 = 64 + 8 deep
            (1, 130, 6, 7, 72, (3, 3), (2, 2), (2, 2), 256),
            (3, 72, 7, 5, 8, (5, 3), (2, 0), (1, 2), 128),  # p' = (2, 4): each axis its own; 8 channels of dy
            (2, 16, 5, 6, 24, (3, 3), (0, 0), (1, 1), 64),  # pad 0: dy 3 x 4 padded by 2
            (1, 10, 6, 6, 8, (3, 3), (2, 1), (1, 1), 64),  # p' = (0, 1)
            (2, 8, 4, 5, 16, (1, 1), (0, 0), (1, 1), 64)]  # 1 x 1: the flip is a transpose


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", EMULATED, ids=["x".join(map(str, c[:5])) + f"-{c[-1]}" for c in EMULATED])
def test_the_flip_and_the_kernels_arguments_compute_dx(handle, layout, case):
    """conv_flip_weights on the chain device, from w packed in ``layout`` (KCYX or KYXC), into
    the forward's KYXC weights; then conv_fwd_tma emulated with the arguments the invoker gives
    it (dy channels-last: NCHW's staging is the forward's, tested there); dx = the reference's."""
    n, c, h, w, k, f, pad, dilation, tile_n = case
    p = dgrad(c=c, k=k, hw=(h, w), n=n, f=f, pad=pad, dilation=dilation, layout=layout)
    solver = next(s for s in map(REGISTRY.find, SOLVERS) if s.tile_n == tile_n)
    assert solver.is_applicable(p, sm90()), solver.is_applicable(p, sm90()).reason
    rng = np.random.default_rng(sum(case[:5]))
    wt = rng.standard_normal((k, c, *f)).astype(np.float16)
    dy = rng.standard_normal(p.y_shape).astype(np.float16)
    w_memory = np.ascontiguousarray(wt if layout == "NCHW" else wt.transpose(0, 2, 3, 1))

    be = handle.backend
    program = handle.program("conv_gemm.c", p.dtype.options)
    flip = launcher_1d(handle, program.function("conv_flip_weights"), wt.size,
                       [None, None, *tma_dgrad.flip_arguments(p)], max_groups=1 << 16)
    out = be.alloc(wt.nbytes)
    flip(be.to_device(w_memory), out)
    w_flipped = be.to_host(out, np.empty(wt.size, np.float16))
    np.testing.assert_array_equal(w_flipped.reshape(c, *f, k), flipped(wt).transpose(0, 2, 3, 1))

    computed = as_forward(p)
    y = emulate_conv_fwd_tma(dy.transpose(0, 2, 3, 1).astype(np.float64), w_flipped.astype(np.float64),
                             tma.scalars(computed), tma.input_map(computed), tma.filter_map(computed, tile_n))
    dx = y.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    expected = ref.backward_data(dy, wt, p.x_shape, pad, (1, 1), dilation)
    np.testing.assert_allclose(dx, expected, rtol=1e-9, atol=1e-9)


def test_the_emulator_computes_the_forward_convolution():
    """The emulator itself, on a strided forward problem (ConvTma's own arguments): a check of
    the check, so that a wrong walk of the bounding box cannot pass both sides."""
    p = ConvProblem("F", DataType.FP16, "NHWC", (2, 24, 13, 11), 10, (5, 3), (2, 0), (2, 1), (1, 2))
    rng = np.random.default_rng(3)
    x, wt = rng.standard_normal(p.x_shape), rng.standard_normal(p.w_shape)
    y = emulate_conv_fwd_tma(x.transpose(0, 2, 3, 1), wt.transpose(0, 2, 3, 1).ravel(), tma.scalars(p),
                             tma.input_map(p), tma.filter_map(p, 64))
    expected = ref.forward(x, wt, p.pad, p.stride, p.dilation)
    np.testing.assert_allclose(y.reshape(2, *p.out_hw, 10).transpose(0, 3, 1, 2), expected, rtol=1e-9, atol=1e-9)


def test_the_gates_name_what_they_refuse():
    solver = REGISTRY.find("ConvTmaBwdData128x256")

    def reason(device=None, **change):
        verdict = solver.is_applicable(dgrad(**change), device or sm90())
        return "" if verdict else verdict.reason

    assert reason() == reason(layout="NCHW") == reason(dtype=DataType.BF16) == ""
    assert reason(c=130, k=72, dilation=(2, 2), pad=(2, 2)) == reason(c=24, k=8, f=(5, 3), pad=(2, 0)) == ""
    assert reason(f=(3, 3), pad=(0, 0)) == reason(f=(1, 1), pad=(0, 0)) == ""
    assert "sm_90 GPU (this is sm_80)" in reason(DeviceInfo("cuda", 0, "an A100", Target.parse("sm_80_108"), 1 << 30))
    assert "fp32 is not fp16 or bf16" in reason(dtype=DataType.FP32)
    assert "backward data only" in reason(direction="F") and "backward data only" in reason(direction="W")
    assert "one group, not 2" in reason(groups=2)
    assert "stride (2, 1) is ConvTmaBwdDataStrided's" in reason(stride=(2, 1))
    assert "would need a negative pad (-1, 0)" in reason(f=(1, 1), pad=(1, 0))
    assert "dy's 130 channels are not a multiple of 8" in reason(k=130)
    assert "dx's 7 channels are odd" in reason(c=7)
    # p' = 140 on H: the window's lower corner -140
    assert "pads dy by (140, 2)" in reason(dilation=(70, 1), pad=(0, 0), hw=(200, 200))
    assert "leave -128..127" in reason(f=(3, 3), dilation=(70, 1), pad=(0, 0), hw=(200, 200))
    assert reason(f=(3, 3), dilation=(64, 1), pad=(0, 0), hw=(200, 200)) == ""  # p' = 128: corner -128


def test_the_dgrad_forward_maps_walk_dy():
    """The forward problem's im2col map over dy (K channels, Ho x Wo) and the flipped weights
    as (K, Y X, C): corners -p' and -pad."""
    p = dgrad(c=24, k=16, hw=(13, 11), n=3, f=(5, 3), pad=(2, 0), dilation=(1, 2))
    computed = as_forward(p)
    assert computed.x_shape == (3, 16, 13, 7) and computed.out_hw == (13, 11)
    dims, strides, lower, upper, channels, pixels, steps = tma.input_map(computed)
    assert dims == (16, 7, 13, 3) and lower == (-4, -2) and upper == (0, -2) and steps == (1, 1, 1, 1)
    assert tma.filter_map(computed, 64) == ((16, 15, 24), (32, 32 * 15), (64, 1, 64))
    assert [int(v) for v in tma.scalars(computed)] == [3 * 13 * 11, 24, 16, 13, 11, 3, 2, 4, 1, 1, 1, 2, 15, 1]


def test_the_workspace_holds_the_flipped_weights_and_the_nchw_staging():
    solver = REGISTRY.find("ConvTmaBwdData128x64")
    assert solver.workspace(dgrad(c=64, k=32)) == 2 * 32 * 64 * 9
    assert solver.workspace(dgrad(c=64, k=32, layout="NCHW")) == 2 * (32 * 64 * 9 + 2 * 32 * 81)  # dx written in planes
    assert solver.programs(dgrad(dtype=DataType.FP32)) == []


def test_a_pointwise_nchw_backward_data_is_a_batched_gemm():
    """dx[n] (C x HW) = w^T (C x K) dy[n] (K x HW): the GEMM's own descriptions of A, B and C
    laid over w's, dy's and dx's NCHW memory give the reference's backward data."""
    from numpy.lib.stride_tricks import as_strided

    from kdbkit.runtime.reference.gemm import gemm as reference_gemm

    p = dgrad(c=48, k=64, hw=(8, 12), n=3, f=(1, 1), pad=(0, 0), layout="NCHW")
    gemm = tma_dgrad.as_gemm(p)
    assert (gemm.m, gemm.n, gemm.k, gemm.batch, gemm.trans_a, gemm.trans_b) == (48, 96, 64, 3, True, False)
    rng = np.random.default_rng(5)
    wt, dy = rng.standard_normal(p.w_shape), rng.standard_normal(p.y_shape)
    t = gemm.tensors()

    def view(flat, desc):
        return as_strided(flat, desc.shape, tuple(8 * s for s in desc.strides))

    dx = reference_gemm(view(wt.ravel(), t["a"]), view(dy.ravel(), t["b"]), trans_a=True)
    assert t["c"].shape == (3, 48, 96) and t["c"].strides == (48 * 96, 96, 1)  # dx packed NCHW
    np.testing.assert_allclose(dx.reshape(p.x_shape), ref.backward_data(dy, wt, p.x_shape), rtol=1e-12, atol=1e-12)

    big = REGISTRY.find("ConvTmaBwdData128x256")
    (request,) = big.programs(p)
    assert request.kernel_file == "gemm_tma.cu" and {"-DGEMM_TA=1", "-DGEMM_TB=0"} <= set(request.options)
    assert big.workspace(p) == 0 and big.is_applicable(p, sm90())
    assert [name for name in SOLVERS if REGISTRY.find(name).suits(p, sm90())] == ["ConvTmaBwdData128x128"]
    assert "runs as a GEMM of 128 x 256 or 128 x 128" in REGISTRY.find("ConvTmaBwdData128x64").suits(p, sm90()).reason
    assert REGISTRY.find("ConvTmaBwdData128x64").programs(p)[0].kernel_file == "conv_tma.cu"  # staged instead
    assert tma_dgrad.as_gemm(dgrad(c=256, hw=(14, 14), f=(1, 1), pad=(0, 0), layout="NCHW")) is None  # 196 pixels
    assert tma_dgrad.as_gemm(dgrad(c=20, hw=(8, 8), f=(1, 1), pad=(0, 0), layout="NCHW")) is None  # w's rows of 20
    assert tma_dgrad.as_gemm(dgrad(c=48, hw=(8, 12), f=(1, 1), pad=(0, 0))) is None  # NHWC: the im2col kernel
    assert tma_dgrad.as_gemm(dgrad(c=48, hw=(8, 12), f=(1, 1), pad=(0, 0), stride=(2, 2), layout="NCHW")) is None


@pytest.mark.parametrize("c, expected", [(64, 64), (128, 128), (256, 256), (2048, 256)])
def test_the_tile_follows_dxs_channels(c, expected):
    p = dgrad(c=c, k=64, hw=(56, 56), n=32)
    chosen = [name for name in SOLVERS if REGISTRY.find(name).suits(p, sm90())]
    assert chosen == [f"ConvTmaBwdData128x{expected}"]


def test_immediate_mode_tries_it_before_the_mma_sync_solver_on_sm90():
    from kdbkit.runtime.immediate import heuristic

    assert heuristic(dgrad(c=256, hw=(56, 56), n=32), sm90(), ()).solver.name == "ConvTmaBwdData128x256"
    assert heuristic(dgrad(c=256, hw=(56, 56), n=32, layout="NCHW"), sm90(), ()).solver.name == \
        "ConvTmaBwdData128x256"
    strided = heuristic(dgrad(c=256, stride=(2, 2), hw=(56, 56)), sm90(), ())
    assert strided.solver.name.startswith("ConvTmaBwdDataStrided")  # one forward convolution per phase
    assert "ConvTmaBwdData128x256: rejected, stride (2, 2) is ConvTmaBwdDataStrided's" in "\n".join(strided.trace)
    odd = heuristic(dgrad(k=130), sm90(), ())
    assert odd.solver.name == "ConvImplicitGemmTensorCore"
    assert "ConvTmaBwdData128x256: rejected, dy's 130 channels are not a multiple of 8" in "\n".join(odd.trace)
    a100 = DeviceInfo("cuda", 0, "an A100", Target.parse("sm_80_108"), 80 << 30)
    assert heuristic(dgrad(), a100, ()).solver.name == "ConvImplicitGemmTensorCore"
    assert heuristic(dgrad(direction="F"), sm90(), ()).solver.name.startswith("ConvTma128x")


# ---------------------------------------------------------------- on an sm_90 GPU

# (N, C, H, W, K, filter, pad, dilation): C is dx's channels, K dy's
CASES = [
    (2, 24, 9, 11, 64, (3, 3), (1, 1), (1, 1)),  # 24 channels of dx, odd W, one step of dy's channels
    (3, 72, 13, 11, 16, (5, 3), (2, 0), (1, 2)),  # p' = (2, 4): each axis its own; 16 channels of dy
    (1, 130, 10, 17, 72, (3, 3), (2, 2), (2, 2)),  # dilation 2, pad 2; 130 columns (2-channel stores); 72 deep
    (2, 64, 7, 9, 128, (3, 3), (0, 0), (1, 1)),  # pad 0: dy 5 x 7 padded by 2
    (2, 40, 9, 9, 24, (3, 3), (2, 2), (1, 1)),  # pad 2 with a 3 x 3: dy unpadded (p' = 0)
    (4, 128, 9, 9, 200, (3, 3), (1, 2), (2, 1)),  # dilation on H: p' = (3, 0)
    (2, 48, 8, 12, 64, (1, 1), (0, 0), (1, 1)),  # 1 x 1: NCHW the batched GEMM (96 pixels); NHWC a flip
    (2, 256, 14, 14, 64, (1, 1), (0, 0), (1, 1)),  # 1 x 1, 196 pixels: rows not 16-byte aligned, staged
    (2, 16, 7, 8, 64, (7, 7), (3, 3), (1, 1)),  # a filter as large as the image
    (8, 512, 30, 30, 64, (3, 3), (1, 1), (1, 1)),  # 57 x 2..8 tiles: more than the multiprocessors
]


@pytest.mark.gpu
@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=["x".join(map(str, c[:5])) for c in CASES])
def test_backward_data_matches_pytorch(sm90_torch, name, layout, dtype, case):
    import kdbkit

    handle, torch = sm90_torch
    n, c, h, w, k, f, pad, dilation = case
    tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    gen = torch.Generator(device="cuda").manual_seed(hash(case) % 1000)
    ho, wo = (size + 2 * p - d * (fs - 1) for size, p, d, fs in zip((h, w), pad, dilation, f))
    dx = torch.full((n, c, h, w), float("nan"), device="cuda", dtype=tdtype).to(memory_format=fmt)  # poisoned
    for call in range(2):  # new weights on the second call: flipped again; dy's tensor map reused
        if call == 0:
            dy = torch.randn(n, k, ho, wo, device="cuda", dtype=tdtype, generator=gen).to(memory_format=fmt)
        wt = (torch.randn(k, c, *f, device="cuda", dtype=tdtype, generator=gen) / (k * f[0] * f[1]) ** 0.5).to(
            memory_format=fmt)
        expected = torch.nn.grad.conv2d_input((n, c, h, w), wt.double(), dy.double(), 1, pad, dilation)
        out = kdbkit.convolution_backward_data(handle, dy, wt, (n, c, h, w), pad=pad, dilation=dilation, dx=dx,
                                               solver=name)
        assert_written_in_place(out, dx, expected, f"{name} {layout} {dtype} call {call}", fmt)


@pytest.mark.gpu
@pytest.mark.parametrize("name", SOLVERS)
def test_nchw_dx_written_two_bytes_off_alignment(sm90_torch, name):
    """dx a view one element into its storage (2 bytes off 4-byte alignment): the kernel's planes
    store writes its pairs element by element there, and every value is right."""
    import kdbkit

    handle, torch = sm90_torch
    dy = torch.randn(2, 64, 14, 14, device="cuda", dtype=torch.float16)
    wt = torch.randn(64, 72, 3, 3, device="cuda", dtype=torch.float16) / 24
    expected = torch.nn.grad.conv2d_input((2, 72, 14, 14), wt.double(), dy.double(), 1, 1)
    storage = torch.full((expected.numel() + 1,), float("nan"), device="cuda", dtype=torch.float16)
    dx = storage[1:].view(expected.shape)
    assert dx.data_ptr() % 4 == 2
    out = kdbkit.convolution_backward_data(handle, dy, wt, (2, 72, 14, 14), pad=1, dx=dx, solver=name)
    assert_written_in_place(out, dx, expected, f"{name} dx two bytes off")


@pytest.mark.gpu
def test_immediate_mode_takes_it_on_new_tensors(sm90_torch):
    import kdbkit
    from kdbkit.runtime.immediate import choose

    handle, torch = sm90_torch
    for _ in range(3):  # new buffers each call: new tensor maps
        dy = torch.randn(4, 128, 14, 14, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        wt = (torch.randn(128, 64, 3, 3, device="cuda", dtype=torch.float16) / 34).to(
            memory_format=torch.channels_last)
        dx = kdbkit.convolution_backward_data(handle, dy, wt, (4, 64, 14, 14), pad=1)
        expected = torch.nn.grad.conv2d_input((4, 64, 14, 14), wt.double(), dy.double(), 1, 1)
        assert float((dx.double() - expected).norm() / expected.norm()) < 1e-2
    assert choose(handle, dgrad(c=64, k=128, hw=(14, 14), n=4)).solver.name.startswith("ConvTmaBwdData")
