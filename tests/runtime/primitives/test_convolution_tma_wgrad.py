"""Hopper's backward weights through tensor copies and wgmma (ConvTmaBwdWeights*, ids 42-44,
kernels/conv_wgrad_tma.cu).

No GPU needed: the programs compile offline for sm_90a; the gates and their reasons; the plan
(orientation, slices) and the tile choice; and conv_wgrad_tma with conv_wgrad_reduce emulated
in NumPy from the very arguments the invoker launches them with (scalars, both tensor maps:
the im2col copy's walk of the bounding box with its zero fill, dy's tiles, the slabs and the
reduction's mapping into dw's strides), against the reference's backward weights, in both
orientations, both layouts (NCHW 1 x 1 read in place) and with several slices. On an sm_90 GPU
(KDB_TEST_BACKEND=cuda with PyTorch): every tile shape, type and layout against PyTorch in
float64 on odd sizes, strides, padding, dilation, 1 x 1 / 3 x 3 / 7 x 7 filters, channels not a
multiple of the 64-channel step, batch 1, and twice with new tensors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.base import DeviceInfo
from kdbkit.runtime.primitives.convolution import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers import tma_wgrad
from kdbkit.runtime.reference import convolution as ref
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.tensor import DataType
from .conftest import assert_written_in_place, sm90

SOLVERS = ("ConvTmaBwdWeights128x256", "ConvTmaBwdWeights128x128", "ConvTmaBwdWeights128x64")


def wgrad(c=64, k=64, hw=(9, 9), n=2, f=(3, 3), pad=(1, 1), stride=(1, 1), dilation=(1, 1), layout="NHWC",
          dtype=DataType.FP16, groups=1, direction="W") -> ConvProblem:
    return ConvProblem(direction, dtype, layout, (n, c, *hw), k, f, pad, stride, dilation, groups)


# ---------------------------------------------------------------- no GPU needed


@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("dtype", [DataType.FP16, DataType.BF16])
@pytest.mark.parametrize("layout, f", [("NHWC", (3, 3)), ("NCHW", (1, 1)), ("NCHW", (3, 3))])
def test_every_program_compiles_offline_for_sm90a(name, dtype, layout, f):
    from tests.prerequisites import require_nvrtc

    require_nvrtc()
    from kdbkit.runtime.backends.elf_notes import cubin_arch
    from kdbkit.runtime.compilers.nvrtc import NvrtcCompiler

    from ..conftest import compile_file

    p = wgrad(dtype=dtype, layout=layout, f=f, pad=(0, 0) if f == (1, 1) else (1, 1), hw=(8, 8))
    requests = REGISTRY.find(name).programs(p)
    assert requests[0].kernel_file == "conv_wgrad_tma.cu"
    assert f"-DWG_NCHW={int(layout == 'NCHW' and f == (1, 1))}" in requests[0].options
    assert [r.kernel_file for r in requests[1:]] == (["conv_gemm.c"] if layout == "NCHW" and f != (1, 1) else [])
    cubin = compile_file(Target.parse("sm_90"), requests[0].kernel_file, *requests[0].options,
                         compiler=NvrtcCompiler())
    assert cubin_arch(cubin) == "sm_90" and b"\0conv_wgrad_tma\0" in cubin and b"\0conv_wgrad_reduce\0" in cubin


def test_the_gates_name_what_they_refuse():
    solver = REGISTRY.find("ConvTmaBwdWeights128x256")

    def reason(device=None, **change):
        verdict = solver.is_applicable(wgrad(**change), device or sm90())
        return "" if verdict else verdict.reason

    assert reason() == reason(layout="NCHW") == reason(dtype=DataType.BF16) == ""
    assert reason(c=24, k=16, stride=(2, 3), dilation=(2, 1), pad=(3, 0)) == reason(f=(7, 7), pad=(3, 3)) == ""
    assert "sm_90 GPU (this is sm_80)" in reason(DeviceInfo("cuda", 0, "an A100", Target.parse("sm_80_108"), 1 << 30))
    assert "fp32 is not fp16 or bf16" in reason(dtype=DataType.FP32)
    assert "backward weights only" in reason(direction="F") and "backward weights only" in reason(direction="B")
    assert "one group, not 2" in reason(groups=2)
    assert reason(c=3, f=(7, 7), pad=(3, 3), stride=(2, 2)) == reason(c=5, stride=(9, 1), hw=(20, 20)) == ""  # packed
    assert "dy's 20 channels are not a multiple of 8" in reason(k=20)
    assert "steps at most 8 pixels" in reason(stride=(9, 1), hw=(20, 20))
    assert "beyond -128..127" in reason(dilation=(70, 1), pad=(0, 0), hw=(200, 200))


def test_the_plan_puts_the_larger_side_on_the_rows_and_splits_a_long_reduction():
    units = 132
    tall = tma_wgrad.plan(wgrad(c=64, k=512, hw=(28, 28), n=32, f=(1, 1), pad=(0, 0)), 64, units)
    assert (tall.swap, tall.m, tall.n) == (False, 512, 64)
    wide = tma_wgrad.plan(wgrad(c=256, k=64, hw=(56, 56), n=32, f=(1, 1), pad=(0, 0)), 64, units)
    assert (wide.swap, wide.m, wide.n) == (True, 256, 64) and wide.slices > 8
    assert 1 <= wide.slices <= wide.steps and wide.items(64) <= 4 * units
    tiny = tma_wgrad.plan(wgrad(c=8, k=8, hw=(4, 4), n=1, f=(1, 1), pad=(0, 0)), 64, units)
    assert (tiny.steps, tiny.slices, tiny.m, tiny.n) == (1, 1, 8, 64)  # one step: never an empty slice
    direct = tma_wgrad.plan(wgrad(c=64, k=64, hw=(14, 16), n=3, f=(1, 1), pad=(0, 0), layout="NCHW"), 64, units)
    assert direct.direct and direct.steps == 3 * 4  # 224 pixels an image: 4 steps each
    staged = tma_wgrad.plan(wgrad(c=64, k=64, hw=(14, 14), n=3, f=(1, 1), pad=(0, 0), layout="NCHW"), 64, units)
    assert not staged.direct and staged.steps == -(-3 * 196 // 64)  # 196 pixels: rows not 16-byte aligned


@pytest.mark.parametrize("c, k, hw, f, expected", [(512, 512, (7, 7), 3, 256), (64, 64, (56, 56), 1, 64),
                                                   (128, 512, (28, 28), 1, 128)])
def test_immediate_mode_takes_the_cheapest_tile(c, k, hw, f, expected):
    from kdbkit.runtime.immediate import heuristic

    p = wgrad(c=c, k=k, hw=hw, n=32, f=(f, f), pad=(f // 2, f // 2))
    assert [name for name in SOLVERS if REGISTRY.find(name).suits(p, sm90())] == [f"ConvTmaBwdWeights128x{expected}"]
    assert heuristic(p, sm90(), ()).solver.name == f"ConvTmaBwdWeights128x{expected}"


def test_immediate_mode_falls_back_where_it_cannot_run():
    from kdbkit.runtime.immediate import heuristic

    far = heuristic(wgrad(stride=(9, 1), hw=(20, 20)), sm90(), ())
    assert far.solver.name == "ConvWrwImplicitGemmTensorCore"
    assert "ConvTmaBwdWeights128x256: rejected, stride (9, 1)" in "\n".join(far.trace)
    a100 = DeviceInfo("cuda", 0, "an A100", Target.parse("sm_80_108"), 80 << 30)
    assert heuristic(wgrad(), a100, ()).solver.name == "ConvWrwImplicitGemmTensorCore"


def test_a_first_layer_packs_its_taps():
    """3 channels x 7 x 7 taps = 147 columns, padded to 152: a 1 x 1 convolution over 112 x 112
    receptive fields, its 3 chunks of 64 columns on the tiles' rows (K = 64 the other side)."""
    from kdbkit.runtime.immediate import heuristic

    p = wgrad(c=3, k=64, hw=(224, 224), n=32, f=(7, 7), pad=(3, 3), stride=(2, 2))
    q = tma_wgrad.computed(p)
    assert tma_wgrad.packed_taps(p) and q.x_shape == (32, 152, 112, 112) and q.filter == (1, 1)
    assert tma_wgrad.plan(p, 64, 132).swap and tma_wgrad.gemm_sides(p) == (64, 192, 32 * 112 * 112 // 64)
    assert heuristic(p, sm90(), ()).solver.name.startswith("ConvTmaBwdWeights")
    assert REGISTRY.find("ConvTmaBwdWeights128x64").workspace(p) >= 2 * 32 * 112 * 112 * 152


def test_the_reduction_takes_8_channels_a_thread_where_dw_has_them_contiguous():
    def vectors(**change):
        p = wgrad(**change)
        return tma_wgrad.reduces_in_vectors(p, dataclasses.replace(tma_wgrad.plan(p, 128, 132), swap=False))

    assert vectors() and vectors(f=(1, 1), pad=(0, 0), layout="NCHW")  # KYXC; a 1 x 1's KCYX
    assert not vectors(layout="NCHW")  # KCYX 3 x 3: channels 9 apart
    assert not vectors(c=3, f=(7, 7), pad=(3, 3))  # packed taps: 3 channels
    p = wgrad(c=64, k=256, hw=(56, 56), n=32, f=(1, 1), pad=(0, 0))
    assert not tma_wgrad.reduces_in_vectors(p, dataclasses.replace(tma_wgrad.plan(p, 64, 132), swap=True))
    assert [int(v) for v in tma_wgrad.reduce_arguments(wgrad(), tma_wgrad.plan(wgrad(), 64, 132), True)][-1] == 1


def test_the_workspace_holds_the_slabs_and_the_nchw_staging():
    solver = REGISTRY.find("ConvTmaBwdWeights128x64")
    p = wgrad(c=64, k=32)
    plan = tma_wgrad.plan(p, 64, 132)
    assert solver.workspace(p) == 4 * plan.slices * plan.m * plan.n
    q = dataclasses.replace(p, layout="NCHW")
    assert solver.workspace(q) == 4 * plan.slices * plan.m * plan.n + 2 * (2 * 64 * 81 + 2 * 32 * 81)
    assert solver.programs(wgrad(dtype=DataType.FP32)) == []


def walk(start, count, dims, lower, upper, steps):
    """The im2col copy's pixels: from ``start`` (n, h, w) through the bounding box (W from the
    lower corner to the far edge plus the upper corner in the element strides, then H, then N)."""
    (_, hx, wx), (lw, lh), (uw, uh), (sh, sw) = dims, lower, upper, steps
    pn, ph, pw = start
    out = []
    for _ in range(count):
        out.append((pn, ph, pw))
        pw += sw
        if pw > wx - 1 + uw:
            pw, ph = lw, ph + sh
            if ph > hx - 1 + uh:
                ph, pn = lh, pn + 1
    return np.array(out).T


def emulate_columns(problem: ConvProblem, x: np.ndarray) -> np.ndarray:
    """conv_wgrad_columns in NumPy from its arguments: x (NCHW) -> the packed receptive fields,
    N x Ho x Wo x width, column (r X + s) C + c."""
    (n, c, h, w, ho, wo, fy, fx, ph, pw, sh, sw, dh, dw_, *strides, width, pixels) = (
        int(v) for v in tma_wgrad.columns_arguments(problem))
    layout = problem.descs()["x"].strides
    assert tuple(strides) == layout and x.shape == (n, c, h, w) and width % 8 == 0 and width >= fy * fx * c
    assert 1 <= pixels <= 64 and pixels * width * 2 <= tma_wgrad.COLUMN_BYTES
    col = np.zeros((n, ho, wo, width))
    for j in range(fy * fx * c):
        tap, cc = divmod(j, c)
        r, s = divmod(tap, fx)
        for i in range(ho):
            for jj in range(wo):
                hh, vv = i * sh - ph + r * dh, jj * sw - pw + s * dw_
                if 0 <= hh < h and 0 <= vv < w:
                    col[:, i, jj, j] = x[:, cc, hh, vv]
    return col


def emulate(problem: ConvProblem, x: np.ndarray, dy: np.ndarray, tile_n: int, units: int = 132) -> np.ndarray:
    """conv_wgrad_tma then conv_wgrad_reduce in NumPy from the invoker's arguments: dw packed in
    the problem's layout (as a K x C x Y x X view). x and dy as the kernel reads them (NCHW in
    place, else channels-last)."""
    p = tma_wgrad.plan(problem, tile_n, units)
    (m, n_cols, steps, slices, swap, c_chunks, s_taps, plane, wo, pad_h, pad_w, sh, sw, dh, dw_, hw_steps,
     plain) = (int(v) for v in tma_wgrad.scalars(problem, p))
    assert plain == tma_wgrad.plain_x(problem)
    assert (m, n_cols, steps, slices, swap) == (p.m, p.n, p.steps, p.slices, p.swap)
    map_dy, map_x = tma_wgrad.operand_maps(problem, p, tile_n)
    q = tma_wgrad.computed(problem)  # the convolution the kernel computes (x's taps packed, or problem)
    k, c = q.out_channels, q.x_shape[1]
    taps = q.filter[0] * q.filter[1]
    cols = taps * c_chunks * 64
    assert {m, n_cols} == {k, cols} or (m, n_cols) == ((cols, k) if swap else (k, cols))

    def sides(ks):
        """(64 pixels x K of dy, 64 pixels x cols of x's chunks) of step ks."""
        if p.direct:
            (hw, kd, nd), _, (box, rows_dy, _) = map_dy
            (_, cd, _), _, (_, rows_x, _) = map_x
            assert (kd, cd, box) == (k, c, 64) and (rows_dy, rows_x) == ((tile_n, 128) if swap else (128, tile_n))
            img, hw0 = divmod(ks, hw_steps)
            a, b = np.zeros((64, k)), np.zeros((64, cols))
            part = slice(hw0 * 64, min(hw0 * 64 + 64, hw))
            a[:part.stop - part.start] = dy[img].reshape(k, hw)[:, part].T
            b[:part.stop - part.start, :c] = x[img].reshape(c, hw)[:, part].T
            return a, b
        (kd, pixels, _), _, box = map_dy
        if plain:  # x as the matrix pixels x C, tiles of 64 x 64 (zeros past either edge)
            (cx, px, _), _, box_x = map_x
            assert (kd, box, box_x, px, taps) == (k, (64, 64, 1), (64, 64, 1), pixels, 1)
            p0 = ks * 64
            a, b = np.zeros((64, k)), np.zeros((64, cols))
            a[:min(64, pixels - p0)] = dy.reshape(pixels, k)[p0:p0 + 64]
            b[:min(64, pixels - p0), :cx] = x.reshape(pixels, cx)[p0:p0 + 64]
            return a, b
        (cx, wx, hx, nx), _, lower, upper, channels, count, element = map_x
        assert (kd, box, channels, count, element) == (k, (64, 64, 1), 64, 64, (1, sw, sh, 1))
        p0 = ks * 64
        img, rest = divmod(p0, plane)
        ho, wo0 = divmod(rest, wo)
        pn, ph, pw = walk((img, ho * sh - pad_h, wo0 * sw - pad_w), 64, (nx, hx, wx), lower, upper, (sh, sw))
        a = np.zeros((64, k))
        a[:min(64, pixels - p0)] = dy.reshape(pixels, k)[p0:p0 + 64]
        b = np.zeros((64, cols))
        for chunk in range(taps * c_chunks):
            tap, c0 = divmod(chunk, c_chunks)
            r, s = divmod(tap, s_taps)
            hh, ww = ph + r * dh, pw + s * dw_
            inside = (pn < nx) & (hh >= 0) & (hh < hx) & (ww >= 0) & (ww < wx)
            cs = slice(c0 * 64, min(c0 * 64 + 64, c))
            b[inside, chunk * 64:chunk * 64 + cs.stop - cs.start] = x[pn[inside], hh[inside], ww[inside], cs]
        return a, b

    ws = np.full((slices, m, n_cols), np.nan)
    for z in range(slices):
        acc = np.zeros((k, cols))
        for ks in range(z * steps // slices, (z + 1) * steps // slices):
            a, b = sides(ks)
            acc += a.T @ b
        ws[z] = acc.T if swap else acc
    # conv_wgrad_reduce
    kw, cw, fy, fx, col_tap, cols_r, slices_r, swap_r, *strides, vec = (
        int(v) for v in tma_wgrad.reduce_arguments(problem, p))
    assert vec == 0  # the 8-channel walk sums the same elements (tested on the GPU)
    assert (kw, cw, (fy, fx), cols_r, slices_r, swap_r) == (k, problem.x_shape[1], problem.filter, cols, slices, swap)
    c, taps = cw, fy * fx
    flat = ws.reshape(slices, -1)
    memory = np.full(k * c * taps, np.nan)
    for kk in range(k):
        for cc in range(c):
            for tap in range(taps):
                col = tap * col_tap + cc
                at = col * k + kk if swap else kk * cols + col
                r, s = divmod(tap, fx)
                memory[kk * strides[0] + cc * strides[1] + r * strides[2] + s * strides[3]] = flat[:, at].sum()
    return np.lib.stride_tricks.as_strided(memory, (k, c, fy, fx), tuple(8 * v for v in strides))


# (N, C, H, W, K, filter, pad, stride, dilation, tile, units): small enough to emulate; units
# few so that the plans split the reduction
EMULATED = [(4, 24, 15, 17, 16, (3, 3), (1, 1), (1, 1), (1, 1), 64, 40),  # 1020 pixels: 16 steps, the last cut
            (3, 72, 12, 13, 8, (3, 3), (2, 2), (1, 1), (2, 2), 64, 40),  # dilation 2; 72 = 64 + 8 channels
            (3, 16, 17, 15, 136, (5, 3), (2, 0), (2, 1), (1, 2), 128, 60),  # strides, each axis its own; K past 128
            (2, 8, 11, 10, 16, (7, 7), (3, 3), (2, 2), (1, 1), 256, 3),  # 7 x 7 / 2: many taps, 8 channels
            (3, 16, 4, 6, 24, (1, 1), (0, 0), (1, 1), (1, 1), 64, 5),  # 1 x 1: NCHW in place (24 pixels)
            (2, 200, 3, 5, 8, (1, 1), (0, 0), (1, 1), (1, 1), 64, 7),  # 1 x 1 NCHW 15 pixels: staged
            (2, 3, 13, 12, 16, (7, 7), (3, 3), (2, 2), (1, 1), 64, 20),  # a first layer: 3 channels, taps packed
            (1, 5, 9, 8, 8, (3, 2), (1, 0), (1, 3), (2, 1), 128, 9)]  # 5 channels, 30 columns padded to 32


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", EMULATED, ids=["x".join(map(str, c[:5])) + f"-{c[-2]}" for c in EMULATED])
def test_the_kernels_arguments_compute_dw(layout, case):
    n, c, h, w, k, f, pad, stride, dilation, tile_n, units = case
    p = wgrad(c=c, k=k, hw=(h, w), n=n, f=f, pad=pad, stride=stride, dilation=dilation, layout=layout)
    solver = next(s for s in map(REGISTRY.find, SOLVERS) if s.tile_n == tile_n)
    assert solver.is_applicable(p, sm90()), solver.is_applicable(p, sm90()).reason
    rng = np.random.default_rng(sum(case[:5]))
    x = rng.standard_normal(p.x_shape)
    dy = rng.standard_normal(p.y_shape)
    direct = tma_wgrad.direct_nchw(p)
    x_read = emulate_columns(p, x) if tma_wgrad.packed_taps(p) else x if direct else x.transpose(0, 2, 3, 1)
    dw = emulate(p, x_read, dy if direct else dy.transpose(0, 2, 3, 1), tile_n, units)
    expected = ref.backward_weights(dy, x, p.w_shape, pad, stride, dilation)
    np.testing.assert_allclose(dw, expected, rtol=1e-9, atol=1e-9)


def test_the_emulated_plans_split_and_swap():
    """The emulated cases above cover both orientations and split reductions."""
    seen = set()
    for layout in ("NHWC", "NCHW"):
        for n, c, h, w, k, f, pad, stride, dilation, tile_n, units in EMULATED:
            p = tma_wgrad.plan(wgrad(c=c, k=k, hw=(h, w), n=n, f=f, pad=pad, stride=stride, dilation=dilation,
                                     layout=layout), tile_n, units)
            seen.add((p.swap, p.slices > 1, p.direct))
    assert {(False, True, False), (True, True, False), (False, True, True)} <= seen


# ---------------------------------------------------------------- on an sm_90 GPU

# (N, C, H, W, K, filter, pad, stride, dilation)
CASES = [
    (2, 24, 9, 11, 64, (3, 3), (1, 1), (1, 1), (1, 1)),  # 24 channels, odd W
    (3, 72, 13, 11, 16, (5, 3), (2, 0), (1, 1), (1, 2)),  # each axis its own; dilation on W
    (1, 136, 10, 17, 72, (3, 3), (2, 2), (1, 1), (2, 2)),  # batch 1; dilation 2, pad 2; 136 = 2 x 64 + 8
    (2, 64, 15, 13, 136, (3, 3), (1, 1), (2, 2), (1, 1)),  # stride 2, odd sizes; K past 128
    (2, 16, 23, 19, 64, (7, 7), (3, 3), (2, 2), (1, 1)),  # 7 x 7 / 2
    (3, 3, 29, 31, 64, (7, 7), (3, 3), (2, 2), (1, 1)),  # a first layer: 3 channels, taps packed
    (2, 5, 11, 9, 16, (3, 3), (1, 1), (1, 1), (2, 1)),  # 5 channels: 45 columns padded to 48
    (2, 48, 8, 12, 64, (1, 1), (0, 0), (1, 1), (1, 1)),  # 1 x 1: NCHW in place (96 pixels)
    (3, 256, 14, 14, 40, (1, 1), (0, 0), (1, 1), (1, 1)),  # 1 x 1, 196 pixels: NCHW staged; the transpose
    (2, 64, 13, 15, 256, (1, 1), (0, 0), (2, 2), (1, 1)),  # 1 x 1 / 2 (a downsample)
    (1, 512, 7, 7, 512, (3, 3), (1, 1), (1, 1), (1, 1)),  # wide: many tiles, few steps
    (4, 64, 56, 56, 64, (1, 1), (0, 0), (1, 1), (1, 1)),  # a long reduction: many slices
]


@pytest.mark.gpu
@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=["x".join(map(str, c[:5])) + f"-{c[5][0]}s{c[7][0]}" for c in CASES])
def test_backward_weights_matches_pytorch(sm90_torch, name, layout, dtype, case):
    import kdbkit

    handle, torch = sm90_torch
    n, c, h, w, k, f, pad, stride, dilation = case
    tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    gen = torch.Generator(device="cuda").manual_seed(hash(case) % 1000)
    ho, wo = ((size + 2 * p - d * (fs - 1) - 1) // s + 1 for size, p, d, fs, s in zip((h, w), pad, dilation, f,
                                                                                        stride))
    dw = torch.full((k, c, *f), float("nan"), device="cuda", dtype=tdtype).to(memory_format=fmt)  # poisoned
    for call in range(2):  # new tensors on the second call: new tensor maps
        x = torch.randn(n, c, h, w, device="cuda", dtype=tdtype, generator=gen).to(memory_format=fmt)
        dy = torch.randn(n, k, ho, wo, device="cuda", dtype=tdtype, generator=gen).to(memory_format=fmt)
        expected = torch.nn.grad.conv2d_weight(x.double(), (k, c, *f), dy.double(), stride, pad, dilation)
        out = kdbkit.convolution_backward_weights(handle, dy, x, (k, c, *f), pad=pad, stride=stride,
                                                  dilation=dilation, dw=dw, solver=name)
        assert_written_in_place(out, dw, expected, f"{name} {layout} {dtype} call {call}", fmt)


@pytest.mark.gpu
def test_the_result_is_the_same_every_call(sm90_torch):
    """The slabs are summed in a fixed order: the same inputs give the same bits."""
    import kdbkit

    handle, torch = sm90_torch
    x = torch.randn(8, 64, 56, 56, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    dy = torch.randn(8, 64, 56, 56, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    first = kdbkit.convolution_backward_weights(handle, dy, x, (64, 64, 3, 3), pad=1)
    for _ in range(3):
        again = kdbkit.convolution_backward_weights(handle, dy, x, (64, 64, 3, 3), pad=1)
        assert torch.equal(first, again)
