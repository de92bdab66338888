"""Hopper's backward data at a stride above 1 by output phase (ConvTmaBwdDataStrided*, ids 39-41).

No GPU needed: the programs compile offline for sm_90a; the phase decomposition (each phase's
taps, pad and rows) as an identity on the NumPy reference; the gates' reasons, workspace, tile
and immediate mode's order; and the whole chain short of the tensor cores: conv_gemm.c's
conv_phase_weights run on the chain device (PoCL in CI) from either layout's weights, conv_fwd_tma
emulated in NumPy (test_convolution_tma_dgrad's emulator) from the very arguments the invoker
launches each phase with, and conv_phase_scatter run on the chain device into a poisoned dx,
against the reference's backward data. On an sm_90 GPU (KDB_TEST_BACKEND=cuda with PyTorch):
every tile shape, type and layout against PyTorch in float64."""

from __future__ import annotations

import numpy as np
import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.base import DeviceInfo
from kdbkit.runtime.primitives.convolution import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers import tma, tma_sdgrad
from kdbkit.runtime.reference import convolution as ref
from kdbkit.runtime.solver import REGISTRY, launcher_1d
from kdbkit.runtime.tensor import DataType

from .test_convolution_tma_dgrad import emulate_conv_fwd_tma
from .conftest import assert_written_in_place, sm90

SOLVERS = ("ConvTmaBwdDataStrided128x256", "ConvTmaBwdDataStrided128x128", "ConvTmaBwdDataStrided128x64")


def dgrad(c=64, k=64, hw=(9, 9), n=2, f=(1, 1), pad=(0, 0), stride=(2, 2), dilation=(1, 1), layout="NHWC",
          dtype=DataType.FP16, groups=1, direction="B") -> ConvProblem:
    """Backward data of x (n x c x hw) convolved into k channels: dx's c channels from dy's k."""
    return ConvProblem(direction, dtype, layout, (n, c, *hw), k, f, pad, stride, dilation, groups)


def phase_by_reference(dy: np.ndarray, wt: np.ndarray, phase, stride) -> np.ndarray:
    """The phase's forward convolution in NumPy, written out: dy padded by p' before (cropped
    where p' < 0) and zeros after, correlated at stride 1 with the flipped sub-filter; N x C x
    Hp x Wp."""
    h, w = phase.h, phase.w
    sub = wt[:, :, [h.r0 + stride[0] * (h.taps - 1 - u) for u in range(h.taps)]]
    sub = sub[:, :, :, [w.r0 + stride[1] * (w.taps - 1 - v) for v in range(w.taps)]]  # K x C x Th x Tw
    n, k, ho, wo = dy.shape
    out = np.zeros((n, wt.shape[1], h.rows, w.rows))
    for i in range(h.rows):
        for j in range(w.rows):
            for u in range(h.taps):
                for v in range(w.taps):
                    y, x = i - h.pad + u, j - w.pad + v
                    if 0 <= y < ho and 0 <= x < wo:
                        out[:, :, i, j] += dy[:, :, y, x] @ sub[:, :, u, v]
    return out


# (N, C, H, W, K, filter, pad, stride): odd sizes, H and W not multiples of the stride
IDENTITY = [(2, 3, 7, 9, 5, (1, 1), (0, 0), (2, 2)), (1, 4, 11, 6, 6, (1, 1), (0, 0), (3, 3)),
            (2, 5, 9, 10, 4, (3, 3), (1, 1), (2, 2)), (1, 3, 8, 7, 2, (3, 3), (0, 0), (2, 2)),
            (2, 2, 10, 11, 3, (3, 3), (1, 1), (3, 3)), (1, 3, 10, 11, 4, (3, 3), (0, 0), (3, 3)),
            (1, 2, 9, 8, 3, (5, 3), (2, 1), (2, 3)), (1, 2, 12, 13, 3, (7, 7), (3, 3), (2, 2)),
            (1, 2, 8, 9, 3, (2, 2), (0, 0), (3, 3)),  # phase 2 of each axis has no tap: zeros
            (1, 2, 7, 7, 3, (1, 1), (1, 1), (2, 2)),  # padded 1 x 1: phase 1 live with p' = -1
            (1, 2, 4, 5, 3, (3, 3), (1, 1), (4, 4))]  # stride past the filter: a phase without taps


@pytest.mark.parametrize("case", IDENTITY, ids=["x".join(map(str, c[:5])) + f"-s{c[-1][0]}" for c in IDENTITY])
def test_each_phase_of_dx_is_a_stride_one_convolution_of_dy(case):
    """The decomposition the solvers rest on, on the NumPy reference in float64."""
    n, c, h, w, k, f, pad, stride = case
    p = dgrad(c=c, k=k, hw=(h, w), n=n, f=f, pad=pad, stride=stride)
    rng = np.random.default_rng(sum(case[:5]))
    wt, dy = rng.standard_normal((k, c, *f)), rng.standard_normal(p.y_shape)
    expected = ref.backward_data(dy, wt, p.x_shape, pad, stride)
    dx = np.full(p.x_shape, np.nan)
    for phase in tma_sdgrad.phases(p):
        dx[:, :, phase.h.a::stride[0], phase.w.a::stride[1]] = phase_by_reference(dy, wt, phase, stride)
    np.testing.assert_allclose(dx, expected, rtol=1e-12, atol=1e-12)
    taps = sorted((a.r0 + stride[0] * t) for a in tma_sdgrad.axis_phases(h, f[0], pad[0], stride[0])
                  for t in range(a.taps))
    assert taps == list(range(f[0]))  # every tap in exactly one phase


def test_the_phases_of_resnets_strided_layers():
    """3 x 3 / 2 pad 1: phase 0 the middle tap unpadded, phase 1 the outer taps flipped; 1 x 1
    / 2: one phase, the others zeros; odd H: the last phase a row short."""
    three = tma_sdgrad.axis_phases(56, 3, 1, 2)
    assert three == [tma_sdgrad.AxisPhase(0, 28, 1, 1, 0), tma_sdgrad.AxisPhase(1, 28, 0, 2, 0)]
    assert tma_sdgrad.axis_phases(7, 3, 1, 2) == [tma_sdgrad.AxisPhase(0, 4, 1, 1, 0),
                                                   tma_sdgrad.AxisPhase(1, 3, 0, 2, 0)]
    one = tma_sdgrad.phases(dgrad(hw=(56, 56)))
    assert [(ph.h.a, ph.w.a, ph.live) for ph in one] == [(0, 0, True), (0, 1, False), (1, 0, False), (1, 1, False)]
    assert tma_sdgrad.axis_phases(2, 1, 0, 3) == [tma_sdgrad.AxisPhase(0, 1, 0, 1, 0),
                                                  tma_sdgrad.AxisPhase(1, 1, 1, 0, -1)]  # no phase 2: H = 2


@pytest.mark.parametrize("f, pad, hw", [((3, 3), (1, 1), (9, 11)), ((5, 3), (2, 0), (13, 7)), ((1, 1), (0, 0), (8, 8)),
                                         ((3, 3), (0, 0), (7, 6)), ((7, 7), (3, 3), (12, 10))])
def test_at_stride_one_the_phase_is_conv_tma_bwd_datas_forward(f, pad, hw):
    """Stride 1 is one phase: its launch arguments are exactly those ConvTmaBwdData gives
    conv_fwd_tma (passed on the H200 at 58b2d1e), and its weights block is conv_flip_weights's."""
    from kdbkit.runtime.primitives.convolution.solvers.igemm_tc import as_forward

    p = dgrad(c=24, k=16, hw=hw, n=3, f=f, pad=pad, stride=(1, 1))
    (phase,) = tma_sdgrad.phases(p)
    forward = as_forward(p)
    assert [int(v) for v in tma_sdgrad.phase_scalars(p, phase)] == [int(v) for v in tma.scalars(forward)]
    assert tma_sdgrad.phase_input_map(p, phase) == tma.input_map(forward)
    assert tma_sdgrad.phase_filter_map(p, phase, 128) == tma.filter_map(forward, 128)
    assert tma_sdgrad.weight_offset(p, phase) == 0 and tma_sdgrad.output_offsets(p) == [0, -(-3 * 24 * hw[0] * hw[1]
                                                                                            // 128) * 128]


@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("dtype", [DataType.FP16, DataType.BF16])
def test_every_program_compiles_offline_for_sm90a(name, dtype):
    """conv_tma.cu (the forward's kernel, same options) and conv_gemm.c (the phases' weights
    and scatter, the staging)."""
    from tests.prerequisites import require_nvrtc

    require_nvrtc()
    from kdbkit.runtime.backends.elf_notes import cubin_arch
    from kdbkit.runtime.compilers.nvrtc import NvrtcCompiler

    from ..conftest import compile_file

    solver = REGISTRY.find(name)
    kernel, moves = solver.programs(dgrad(dtype=dtype))
    assert kernel == tma.kernel_request(dtype, solver.tile_n)  # no program of its own in a bundle
    assert moves.kernel_file == "conv_gemm.c"
    entries = {kernel: [b"\0conv_fwd_tma\0"], moves: [b"\0conv_phase_weights\0", b"\0conv_phase_scatter\0"]}
    for request, names in entries.items():
        cubin = compile_file(Target.parse("sm_90"), request.kernel_file, *request.options, compiler=NvrtcCompiler())
        assert cubin_arch(cubin) == "sm_90" and all(entry in cubin for entry in names)


# (N, C, H, W, K, filter, pad, stride, tile): small enough to emulate; C 24/72/130
EMULATED = [(2, 24, 9, 11, 16, (1, 1), (0, 0), (2, 2), 64),  # ResNet's downsample, odd H and W
            (1, 130, 7, 8, 72, (1, 1), (0, 0), (3, 3), 256),  # stride 3: 8 of 9 phases zeros; 72 = 64 + 8 deep
            (2, 72, 6, 5, 8, (1, 1), (0, 0), (2, 3), 128),  # each axis its own stride
            (2, 24, 9, 11, 16, (3, 3), (1, 1), (2, 2), 64),  # ResNet's 3 x 3 / 2: phase 1 two taps, odd sizes
            (1, 130, 8, 7, 72, (3, 3), (1, 1), (2, 2), 256),  # 130 columns, 72 = 64 + 8 deep
            (1, 72, 10, 11, 24, (3, 3), (0, 0), (3, 3), 128),  # stride 3 unpadded: one tap per phase
            (2, 24, 11, 9, 8, (5, 3), (2, 1), (2, 3), 64),  # each axis its own filter, pad and stride
            (1, 24, 8, 10, 8, (2, 2), (0, 0), (3, 3), 64),  # phase 2 of each axis has no tap: zeros
            (1, 24, 7, 9, 8, (1, 1), (1, 1), (2, 2), 64)]  # a padded 1 x 1: p' = -1, the corner at +1


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", EMULATED, ids=["x".join(map(str, c[:5])) + f"-s{c[7][0]}{c[7][1]}-{c[-1]}"
                                                for c in EMULATED])
def test_the_phase_kernels_and_the_kernels_arguments_compute_dx(handle, layout, case):
    """Per phase: conv_phase_weights on the chain device, from w packed in ``layout``; conv_fwd_tma
    emulated with the invoker's arguments (dy channels-last: NCHW's staging is the forward's,
    tested there); conv_phase_scatter on the chain device into dx channels-last (the solver's
    layout for both) poisoned with NaN; dx = the reference's."""
    n, c, h, w, k, f, pad, stride, tile_n = case
    p = dgrad(c=c, k=k, hw=(h, w), n=n, f=f, pad=pad, stride=stride, layout=layout)
    solver = next(s for s in map(REGISTRY.find, SOLVERS) if s.tile_n == tile_n)
    assert solver.is_applicable(p, sm90()), solver.is_applicable(p, sm90()).reason
    rng = np.random.default_rng(sum(case[:5]))
    wt = rng.standard_normal((k, c, *f)).astype(np.float16)
    dy = rng.standard_normal(p.y_shape).astype(np.float16)
    w_memory = np.ascontiguousarray(wt if layout == "NCHW" else wt.transpose(0, 2, 3, 1))

    be = handle.backend
    program = handle.program("conv_gemm.c", p.dtype.options)
    weights = launcher_1d(handle, program.function("conv_phase_weights"), wt.size,
                          [None, None, *tma_sdgrad.weight_arguments(p)], max_groups=1 << 16)
    scatter = tma_sdgrad.scatter_launcher(handle, program, p, tma_sdgrad.channels_last_strides(p.x_shape))
    subs = be.alloc(wt.nbytes)
    weights(be.to_device(w_memory), subs)
    subs_host = be.to_host(subs, np.empty(wt.size, np.float16)).astype(np.float64)
    offsets = tma_sdgrad.output_offsets(p)
    outs = np.full(offsets[-1], np.nan, np.float16)  # the gaps between phases too: never read
    dy_nhwc = dy.transpose(0, 2, 3, 1).astype(np.float64)
    for phase, offset in zip(tma_sdgrad.phases(p), offsets):
        if offset is None:
            continue
        start, size = tma_sdgrad.weight_offset(p, phase), k * c * phase.h.taps * phase.w.taps
        y = emulate_conv_fwd_tma(dy_nhwc, subs_host[start:start + size], tma_sdgrad.phase_scalars(p, phase),
                                 tma_sdgrad.phase_input_map(p, phase), tma_sdgrad.phase_filter_map(p, phase, tile_n))
        outs[offset:offset + y.size] = y.ravel()  # the phase's N x Hp x Wp x C, in fp16 as the kernel writes
    dx_buffer = be.to_device(np.full((n, h, w, c), np.nan, np.float16))
    scatter(be.to_device(outs), dx_buffer)
    dx = be.to_host(dx_buffer, np.empty((n, h, w, c), np.float16)).transpose(0, 3, 1, 2).astype(np.float64)
    assert np.isfinite(dx).all(), "an element of dx was not written"
    expected = ref.backward_data(dy, wt, p.x_shape, pad, stride)
    np.testing.assert_allclose(dx, expected, rtol=2e-3, atol=2e-3)  # the phase's output rounded to fp16


def test_the_scatter_writes_through_dxs_strides(handle):
    """conv_phase_scatter into an NCHW dx directly (its strides, not the solver's staging), from
    phases at their offsets, a phase without taps (the 2 x 2 filter's phase 2 at stride 3) zeros."""
    p = dgrad(c=6, k=8, hw=(7, 8), n=2, f=(2, 2), stride=(2, 3), layout="NCHW")
    be = handle.backend
    program = handle.program("conv_gemm.c", p.dtype.options)
    offsets = tma_sdgrad.output_offsets(p)
    outs = np.full(offsets[-1], np.nan, np.float16)
    expected = np.zeros(p.x_shape)
    rng = np.random.default_rng(1)
    live = 0
    for phase, offset in zip(tma_sdgrad.phases(p), offsets):
        if offset is None:
            assert phase.w.a == 2
            continue
        live += 1
        src = rng.standard_normal((2, phase.h.rows, phase.w.rows, 6)).astype(np.float16)
        outs[offset:offset + src.size] = src.ravel()
        expected[:, :, phase.h.a::2, phase.w.a::3] = src.transpose(0, 3, 1, 2)
    assert live == 4 and all(o % tma_sdgrad.PHASE_ALIGN == 0 for o in offsets if o is not None)
    scatter = tma_sdgrad.scatter_launcher(handle, program, p, p.descs()["x"].strides)
    dx = np.full(p.x_shape, np.nan, np.float16)
    dx_buffer = be.to_device(dx)
    scatter(be.to_device(outs), dx_buffer)
    np.testing.assert_array_equal(be.to_host(dx_buffer, dx).astype(np.float64), expected)


def test_the_weights_blocks_follow_the_phases():
    """conv_phase_weights's blocks, phase after phase, hold every tap once: a 3 x 3 / 2 pad 1
    gives 1, 2, 2 and 4 taps, and a 2 x 2 / 3 an empty block for each axis's phase 2."""
    p = dgrad(c=4, k=8, f=(3, 3), pad=(1, 1))
    blocks = [(tma_sdgrad.weight_offset(p, ph), ph.h.taps * ph.w.taps) for ph in tma_sdgrad.phases(p)]
    assert blocks == [(0, 1), (32, 2), (96, 2), (160, 4)]  # C K = 32 elements a tap
    q = dgrad(c=4, k=8, f=(2, 2), stride=(3, 3), hw=(8, 8))
    assert [tma_sdgrad.weight_offset(q, ph) for ph in tma_sdgrad.phases(q)] == [0, 32, 64, 64, 96, 128, 128, 128,
                                                                                   128]


def test_the_gates_name_what_they_refuse():
    solver = REGISTRY.find("ConvTmaBwdDataStrided128x256")

    def reason(device=None, **change):
        verdict = solver.is_applicable(dgrad(**change), device or sm90())
        return "" if verdict else verdict.reason

    assert reason() == reason(layout="NCHW") == reason(dtype=DataType.BF16) == reason(stride=(3, 1)) == ""
    assert reason(c=130, k=72, hw=(13, 11), stride=(3, 3)) == ""
    assert reason(f=(3, 3), pad=(1, 1)) == reason(f=(7, 7), pad=(3, 3), hw=(224, 224)) == ""
    assert reason(f=(5, 3), pad=(2, 1), stride=(2, 3)) == reason(f=(1, 1), pad=(1, 1)) == ""
    # a 259-tap filter at stride 2: phase 0 has 130 taps, dy padded by p' = 129 (corner -129)
    assert "phase (0, 0)'s im2col window corners (W, H) (0, -129)" in reason(f=(259, 1), hw=(300, 9))
    assert reason(f=(255, 1), hw=(300, 9)) == ""  # 128 taps: p' = 127
    assert "sm_90 GPU (this is sm_80)" in reason(DeviceInfo("cuda", 0, "an A100", Target.parse("sm_80_108"), 1 << 30))
    assert "fp32 is not fp16 or bf16" in reason(dtype=DataType.FP32)
    assert "backward data only" in reason(direction="F") and "backward data only" in reason(direction="W")
    assert "one group, not 2" in reason(groups=2)
    assert "stride 1 is ConvTmaBwdData's" in reason(stride=(1, 1))
    assert "dilation (2, 1) at stride (2, 2)" in reason(dilation=(2, 1))
    assert "dy's 130 channels are not a multiple of 8" in reason(k=130)
    assert "dx's 7 channels are odd" in reason(c=7)
    assert "NCHW staging transposes one matrix per image" in reason(layout="NCHW", k=65536 + 8, hw=(2, 2), n=1)


def test_the_workspace_holds_the_live_phases_and_the_nchw_staging():
    solver = REGISTRY.find("ConvTmaBwdDataStrided128x64")
    one = dgrad(c=64, k=32, hw=(9, 9), n=2)  # phase (0, 0): 5 x 5
    assert solver.workspace(one) == 2 * (32 * 64 + 2 * 25 * 64)  # 3,200 elements: a multiple of 128
    assert solver.workspace(dgrad(c=64, k=32, hw=(9, 9), n=2, layout="NCHW")) == \
        2 * (32 * 64 + 2 * 25 * 64 + 2 * 32 * 25 + 2 * 64 * 81)
    three = dgrad(c=6, k=8, hw=(7, 7), n=1, f=(3, 3), pad=(1, 1))  # phases of 4 x 4, 4 x 3, 3 x 4, 3 x 3 pixels
    assert tma_sdgrad.output_offsets(three) == [0, 128, 256, 384, 512]  # 96, 72, 72 and 54 elements, rounded
    assert solver.workspace(three) == 2 * (8 * 6 * 9 + 512)
    assert solver.programs(dgrad(dtype=DataType.FP32)) == []


@pytest.mark.parametrize("c, expected", [(64, 64), (128, 128), (256, 256), (2048, 256)])
def test_the_tile_follows_dxs_channels(c, expected):
    """Chosen on the largest phase (56 x 56 here), as ConvTmaBwdData chooses on its one."""
    p = dgrad(c=c, k=64, hw=(112, 112), n=32)
    chosen = [name for name in SOLVERS if REGISTRY.find(name).suits(p, sm90())]
    assert chosen == [f"ConvTmaBwdDataStrided128x{expected}"]


def test_immediate_mode_tries_it_for_strided_backward_data_on_sm90():
    from kdbkit.runtime.immediate import heuristic

    for layout in ("NHWC", "NCHW"):  # ResNet-50's downsample of stage 3 and its 3 x 3 / 2
        chosen = heuristic(dgrad(c=512, k=1024, hw=(28, 28), n=32, layout=layout), sm90(), ())
        assert chosen.solver.name.startswith("ConvTmaBwdDataStrided128x"), chosen.trace
        chosen = heuristic(dgrad(c=128, k=128, hw=(56, 56), n=32, f=(3, 3), pad=(1, 1), layout=layout), sm90(), ())
        assert chosen.solver.name.startswith("ConvTmaBwdDataStrided128x"), chosen.trace
    assert heuristic(dgrad(f=(3, 3), pad=(1, 1), dilation=(2, 2)), sm90(), ()).solver.name == "ConvImplicitGemm"
    trace = "\n".join(heuristic(dgrad(c=512, k=1024, hw=(28, 28), n=32), sm90(), ()).trace)
    assert "ConvTmaBwdData128x256: rejected, stride (2, 2) is ConvTmaBwdDataStrided's" in trace
    assert heuristic(dgrad(stride=(1, 1)), sm90(), ()).solver.name.startswith("ConvTmaBwdData128x")
    a100 = DeviceInfo("cuda", 0, "an A100", Target.parse("sm_80_108"), 80 << 30)
    assert heuristic(dgrad(), a100, ()).solver.name == "ConvImplicitGemm"


# ---------------------------------------------------------------- on an sm_90 GPU

# (N, C, H, W, K, filter, pad, stride): C is dx's channels, K dy's
CASES = [
    (2, 24, 9, 11, 64, (1, 1), (0, 0), (2, 2)),  # odd H and W: the last row and column of dx zeros
    (2, 72, 14, 14, 16, (1, 1), (0, 0), (2, 2)),
    (1, 130, 13, 10, 72, (1, 1), (0, 0), (3, 3)),  # 130 columns (2-channel stores); 72 deep
    (2, 64, 9, 8, 128, (1, 1), (0, 0), (2, 3)),
    (8, 256, 28, 28, 512, (1, 1), (0, 0), (2, 2)),  # ResNet's downsample: more tiles than multiprocessors
    (1, 24, 7, 9, 16, (1, 1), (1, 1), (2, 2)),  # a padded 1 x 1: p' = -1, the im2col corner at +1
    (2, 24, 9, 11, 64, (3, 3), (1, 1), (2, 2)),  # ResNet's 3 x 3 / 2 on odd sizes
    (2, 130, 14, 13, 72, (3, 3), (1, 1), (2, 2)),
    (2, 72, 10, 11, 24, (3, 3), (0, 0), (3, 3)),  # stride 3 unpadded
    (2, 40, 11, 9, 16, (5, 3), (2, 1), (2, 3)),  # each axis its own filter, pad and stride
    (1, 24, 8, 10, 8, (2, 2), (0, 0), (3, 3)),  # phases without taps: zeros
    (2, 16, 17, 17, 64, (7, 7), (3, 3), (2, 2)),  # a stem-like 7 x 7 / 2 (dx's 16 channels)
    (8, 128, 56, 56, 128, (3, 3), (1, 1), (2, 2)),  # ResNet-50's stage 2 entry, more tiles than multiprocessors
]


@pytest.mark.gpu
@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=["x".join(map(str, c[:5])) + f"-s{c[7][0]}{c[7][1]}" for c in CASES])
def test_strided_backward_data_matches_pytorch(sm90_torch, name, layout, dtype, case):
    import kdbkit

    handle, torch = sm90_torch
    n, c, h, w, k, f, pad, stride = case
    tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    gen = torch.Generator(device="cuda").manual_seed(hash(case) % 1000)
    ho, wo = ((size + 2 * p - fs) // s + 1 for size, p, fs, s in zip((h, w), pad, f, stride))
    dx = torch.full((n, c, h, w), float("nan"), device="cuda", dtype=tdtype).to(memory_format=fmt)  # poisoned
    for call in range(2):  # new weights on the second call: the phases' weights written again
        if call == 0:
            dy = torch.randn(n, k, ho, wo, device="cuda", dtype=tdtype, generator=gen).to(memory_format=fmt)
        wt = (torch.randn(k, c, *f, device="cuda", dtype=tdtype, generator=gen) / (k * f[0] * f[1]) ** 0.5).to(
            memory_format=fmt)
        expected = torch.nn.grad.conv2d_input((n, c, h, w), wt.double(), dy.double(), stride, pad)
        out = kdbkit.convolution_backward_data(handle, dy, wt, (n, c, h, w), pad=pad, stride=stride, dx=dx,
                                               solver=name)
        assert_written_in_place(out, dx, expected, f"{name} {layout} {dtype} call {call}", fmt)


@pytest.mark.gpu
def test_immediate_mode_takes_it_on_new_tensors(sm90_torch):
    import kdbkit
    from kdbkit.runtime.immediate import choose

    handle, torch = sm90_torch
    for _ in range(3):  # new buffers each call: new tensor maps
        dy = torch.randn(4, 128, 7, 7, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        wt = (torch.randn(128, 64, 1, 1, device="cuda", dtype=torch.float16) / 12).to(
            memory_format=torch.channels_last)
        dx = kdbkit.convolution_backward_data(handle, dy, wt, (4, 64, 14, 14), stride=2)
        expected = torch.nn.grad.conv2d_input((4, 64, 14, 14), wt.double(), dy.double(), 2)
        assert float((dx.double() - expected).norm() / expected.norm()) < 1e-2
    assert choose(handle, dgrad(c=64, k=128, hw=(14, 14), n=4)).solver.name.startswith("ConvTmaBwdDataStrided")
