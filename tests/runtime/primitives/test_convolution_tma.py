"""Hopper's forward convolution (ConvTma*, kernels/conv_tma.cu): its programs compile offline for
sm_90a, the gates, the tile choice and the tensor maps' arguments need no GPU; on an sm_90 GPU
(KDB_TEST_BACKEND=cuda with PyTorch) every tile shape and type in both layouts against PyTorch
in float64, on tiles cut at every edge: odd sizes, strides, dilation, uneven padding, channels
not a multiple of the 64-channel step, output channels not a multiple of the tile or of 8, more
tiles than multiprocessors; x's channels stepped 64, 32 or 16 at a time (few channels: the
narrower steps' own programs)."""

from __future__ import annotations

import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.base import DeviceInfo
from kdbkit.runtime.primitives.convolution import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers import tma
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.tensor import DataType
from .conftest import assert_written_in_place, sm90

TMA_SOLVERS = ("ConvTma128x256", "ConvTma128x128", "ConvTma128x64")


def conv(c=64, k=64, hw=(9, 9), n=2, f=(3, 3), pad=(1, 1), stride=(1, 1), dilation=(1, 1), layout="NHWC",
         dtype=DataType.FP16, direction="F", groups=1) -> ConvProblem:
    return ConvProblem(direction, dtype, layout, (n, c, *hw), k, f, pad, stride, dilation, groups)


# ---------------------------------------------------------------- no GPU needed


@pytest.mark.parametrize("name", TMA_SOLVERS)
@pytest.mark.parametrize("dtype", [DataType.FP16, DataType.BF16])
@pytest.mark.parametrize("c", [64, 32, 16])  # x's channels: each step's program
def test_every_program_compiles_offline_for_sm90a(name, dtype, c):
    from tests.prerequisites import require_nvrtc

    require_nvrtc()
    from kdbkit.runtime.backends.elf_notes import cubin_arch
    from kdbkit.runtime.compilers.nvrtc import NvrtcCompiler

    from ..conftest import compile_file

    request, staging = REGISTRY.find(name).programs(conv(c=c, dtype=dtype))
    assert staging.kernel_file == "conv_gemm.c"
    assert (f"-DCONV_BK={c}" in request.options) == (c != 64)
    cubin = compile_file(Target.parse("sm_90"), request.kernel_file, *request.options, compiler=NvrtcCompiler())
    assert cubin_arch(cubin) == "sm_90" and b"\0conv_fwd_tma\0" in cubin


def test_the_gates_name_what_the_copies_cannot_take():
    solver = REGISTRY.find("ConvTma128x256")

    def reason(device=None, **change):
        verdict = solver.is_applicable(conv(**change), device or sm90())
        return "" if verdict else verdict.reason

    assert reason() == reason(layout="NCHW") == reason(dtype=DataType.BF16) == ""
    assert reason(c=24, k=10, stride=(2, 3), dilation=(2, 1), pad=(3, 0)) == ""
    assert "sm_90 GPU (this is sm_80)" in reason(DeviceInfo("cuda", 0, "an A100", Target.parse("sm_80_108"), 1 << 30))
    assert "fp32 is not fp16 or bf16" in reason(dtype=DataType.FP32)
    assert "forward direction only" in reason(direction="B")
    assert "one group, not 2" in reason(groups=2)
    assert "3 channels are not a multiple of 8" in reason(c=3)
    assert reason(k=7) == reason(k=255) == ""  # odd output channels: the epilogue stores them one by one
    assert "steps at most 8 pixels" in reason(stride=(9, 1), hw=(20, 20))
    assert "beyond -128..127" in reason(pad=(0, 130), hw=(9, 9))
    assert "beyond -128..127" in reason(f=(1, 3), dilation=(1, 70), pad=(0, 0), hw=(200, 200))


def test_the_im2col_map_walks_the_filters_top_left_corner():
    """Corners (W, H) from -pad to pad - dilation x (filter - 1); element strides (1, sw, sh, 1)."""
    p = conv(c=24, k=10, hw=(13, 11), n=3, f=(5, 3), pad=(2, 0), stride=(2, 1), dilation=(1, 2))
    dims, strides, lower, upper, channels, pixels, steps = tma.input_map(p)
    assert dims == (24, 11, 13, 3) and strides == (48, 48 * 11, 48 * 11 * 13)
    assert lower == (0, -2) and upper == (0 - 2 * 2, 2 - 4) and (channels, pixels) == (64, 128)
    assert steps == (1, 1, 2, 1)
    assert tma.filter_map(p, 64) == ((24, 15, 10), (48, 48 * 15), (64, 1, 64))


@pytest.mark.parametrize("c, step", [(8, 16), (16, 16), (24, 32), (32, 32), (40, 64), (64, 64), (520, 64)])
def test_the_step_follows_the_channels(c, step):
    """Few channels, narrower stages: the copies' rows and the program's step are the same."""
    p = conv(c=c, k=96, hw=(11, 9), n=3)
    assert tma.step_for(p) == step
    assert tma.input_map(p, step)[4] == step and tma.filter_map(p, 128, step)[2] == (step, 1, 128)
    request = REGISTRY.find("ConvTma128x128").programs(p)[0]
    assert f"-DCONV_STAGES={6 * 64 // step}" in request.options
    # the 64-channel programs are the ones bundles already hold: their options name no step
    assert [o for o in request.options if o.startswith("-DCONV_BK")] == ([] if step == 64 else [f"-DCONV_BK={step}"])
    # the same bytes of shared memory whatever the step
    assert tma.stages(128, step) * (128 + 128) * step == tma.STAGES[128] * (128 + 128) * tma.STEP


@pytest.mark.parametrize("k, expected", [(64, 64), (128, 128), (256, 256), (2048, 256)])
def test_the_tile_follows_the_output_channels(k, expected):
    p = conv(c=64, k=k, hw=(56, 56), n=32)
    assert tma.forward_tile_n(p, 132) == expected
    chosen = [name for name in TMA_SOLVERS if REGISTRY.find(name).suits(p, sm90())]
    assert chosen == [f"ConvTma128x{expected}"]


def test_every_tile_shape_fits_the_shared_memory_of_a_block():
    assert all(tma.shared_bytes(n) <= 227 * 1024 for n in tma.STAGES)


# ResNet-50's channels-last fp16 forward convolutions at batch 32, as `kdb tune` ranked the three
# tile widths on an H200 (docs/performance.md): (c, k, hw, filter, stride) -> the fastest width.
# The share of useful work alone picked 128 x 256 for the first five.
@pytest.mark.parametrize("c, k, hw, f, stride, fastest", [
    (512, 2048, (7, 7), (1, 1), (1, 1), 128),  # 13.8 us against 21.5 for 128 x 256
    (1024, 2048, (14, 14), (1, 1), (2, 2), 128),  # 18.6 against 25.7
    (256, 512, (56, 56), (1, 1), (2, 2), 128),  # 22.5 against 29.6
    (128, 512, (28, 28), (1, 1), (1, 1), 128),  # 20.1 against 23.7
    (64, 256, (56, 56), (1, 1), (1, 1), 128),  # 22.1 against 24.9
    (512, 512, (7, 7), (3, 3), (1, 1), 64),  # 21.1 against 26.8 for 128 x 128
    (64, 64, (56, 56), (3, 3), (1, 1), 64),  # 21.4 against 46.9
    (256, 256, (14, 14), (3, 3), (1, 1), 128),  # 16.2 against 22.7 for 128 x 64
])
def test_the_forward_tile_is_the_one_the_h200_ranked_fastest(c, k, hw, f, stride, fastest):
    p = conv(c=c, k=k, hw=hw, n=32, f=f, pad=tuple(x // 2 for x in f), stride=stride)
    assert tma.forward_tile_n(p, 132) == fastest
    chosen = [name for name in TMA_SOLVERS if REGISTRY.find(name).suits(p, sm90())]
    assert chosen == [f"ConvTma128x{fastest}"]


@pytest.mark.parametrize("n, hw, d, fastest", [
    (16, (65, 65), 36, 256),  # DeepLab's ASPP: 0.898 against 1.446 ms for 128 x 128 (channels-last)
    (6, (97, 97), 12, 256),  # 0.816 against 0.888
    (1, (65, 65), 24, 128),  # one image: every tile in one wave, the narrower ones the shorter
])
def test_a_dilated_filter_takes_the_tile_the_h200_ranked_fastest(n, hw, d, fastest):
    """A dilated 3 x 3 over 2048 channels: each narrower tile reads x again, from memory (the
    taps lie rows apart), so the wider tile wins where the waves alone said otherwise."""
    p = conv(c=2048, k=256, hw=hw, n=n, pad=(d, d), dilation=(d, d))
    assert tma.forward_tile_n(p, 132) == fastest


def test_immediate_mode_prefers_the_tma_kernels_on_sm90():
    from kdbkit.runtime.immediate import heuristic

    assert heuristic(conv(k=256, hw=(56, 56), n=32), sm90(), ()).solver.name == "ConvTma128x256"
    assert heuristic(conv(k=256, layout="NCHW", hw=(56, 56), n=32), sm90(), ()).solver.name == "ConvTma128x256"
    first_layer = heuristic(conv(c=3, k=64, f=(7, 7), pad=(3, 3), stride=(2, 2), hw=(224, 224)), sm90(), ())
    assert first_layer.solver.name == "ConvImplicitGemmTensorCore"
    assert any("ConvTma128x256: rejected, x's 3 channels are not a multiple of 8" in line for line in first_layer.trace)
    assert any("ConvStem: applies, passed over: 9408 multiply-adds a pixel" in line for line in first_layer.trace)
    # a stem of little work a pixel (3 x 3 x 3 taps, 16 outputs), either layout: the direct stem kernel
    for layout in ("NCHW", "NHWC"):
        small = heuristic(conv(c=3, k=16, f=(3, 3), pad=(1, 1), stride=(2, 2), hw=(224, 224), layout=layout), sm90(), ())
        assert small.solver.name == "ConvStem"
    resnet = heuristic(conv(c=3, k=64, f=(7, 7), pad=(3, 3), stride=(2, 2), hw=(224, 224), layout="NCHW"), sm90(), ())
    assert resnet.solver.name == "ConvImplicitGemmTensorCore"
    a100 = DeviceInfo("cuda", 0, "an A100", Target.parse("sm_80_108"), 80 << 30)
    assert heuristic(conv(k=256), a100, ()).solver.name == "ConvImplicitGemmTensorCore"
    # backward data at stride 1 goes to the TMA kernel too (ConvTmaBwdData, test_convolution_tma_dgrad.py)
    assert heuristic(conv(k=256, direction="B"), sm90(), ()).solver.name.startswith("ConvTmaBwdData")
    # and backward weights (ConvTmaBwdWeights, test_convolution_tma_wgrad.py)
    assert heuristic(conv(k=256, direction="W"), sm90(), ()).solver.name.startswith("ConvTmaBwdWeights")


def test_immediate_mode_and_find_take_the_narrow_steps():
    """An expansion from 24 channels and a 3 x 3 over 32, channels-last: immediate mode's
    ConvTma runs the 32-channel step's program, and every tile width is find's to time."""
    from kdbkit.runtime.immediate import heuristic

    for p in (conv(c=24, k=144, hw=(56, 56), n=192, f=(1, 1), pad=(0, 0)),
              conv(c=32, k=32, hw=(149, 149), n=48, pad=(0, 0)), conv(c=16, k=96, hw=(112, 112), n=96, f=(1, 1),
                                                                    pad=(0, 0))):
        chosen = heuristic(p, sm90(), ()).solver
        assert chosen.name.startswith("ConvTma")
        assert f"-DCONV_BK={tma.step_for(p)}" in chosen.programs(p)[0].options
        assert all(REGISTRY.find(name).is_applicable(p, sm90()) for name in TMA_SOLVERS)


def test_a_pointwise_nchw_convolution_is_a_batched_gemm():
    """y[n] (K x HW) = w (K x C) x[n] (C x HW): the TMA GEMM's program and tiles, no staging."""
    p = conv(c=256, k=64, hw=(56, 56), n=32, f=(1, 1), pad=(0, 0), layout="NCHW")
    gemm = tma.as_gemm(p)
    assert (gemm.m, gemm.n, gemm.k, gemm.batch) == (64, 3136, 256, 32)
    assert (gemm.lda, gemm.ldb, gemm.ldc, gemm.stride_a, gemm.stride_b, gemm.stride_c) == \
        (256, 3136, 3136, 0, 256 * 3136, 64 * 3136)
    (request,) = REGISTRY.find("ConvTma128x256").programs(p)
    assert request.kernel_file == "gemm_tma.cu" and "-DGEMM_TA=0" in request.options
    assert REGISTRY.find("ConvTma128x256").workspace(p) == 0
    # 64 output channels fill half of a 128-row tile either way: the narrower pixel tile wastes less
    assert [name for name in TMA_SOLVERS if REGISTRY.find(name).suits(p, sm90())] == ["ConvTma128x128"]
    assert "the GEMM's 128 x 128 tiles fit" in REGISTRY.find("ConvTma128x256").suits(p, sm90()).reason
    assert "runs as a GEMM of 128 x 256 or 128 x 128" in REGISTRY.find("ConvTma128x64").suits(p, sm90()).reason
    assert REGISTRY.find("ConvTma128x64").programs(p)[0].kernel_file == "conv_tma.cu"  # staged instead
    assert tma.as_gemm(conv(c=256, k=64, hw=(14, 14), f=(1, 1), pad=(0, 0), layout="NCHW")) is None  # 196 pixels
    assert tma.as_gemm(conv(c=256, k=64, hw=(56, 56), f=(1, 1), pad=(0, 0), stride=(2, 2), layout="NCHW")) is None
    assert tma.as_gemm(conv(c=256, k=64, hw=(56, 56), f=(1, 1), pad=(0, 0))) is None  # NHWC: the im2col kernel


def test_the_workspace_holds_the_nchw_staging():
    """x and the weights moved channels-last; y none: the kernel writes its planes."""
    p = conv(c=64, k=32, hw=(9, 9), n=2, layout="NCHW")
    assert REGISTRY.find("ConvTma128x64").workspace(p) == 2 * (2 * 64 * 81 + 32 * 64 * 9)
    assert REGISTRY.find("ConvTma128x64").workspace(conv(f=(1, 1), pad=(0, 0), layout="NCHW")) == \
        2 * (2 * 64 * 81)  # a 1 x 1 filter's KCYX is KYXC already
    assert REGISTRY.find("ConvTma128x64").workspace(conv()) == 0


# ---------------------------------------------------------------- on an sm_90 GPU

# (N, C, H, W, K, filter, pad, stride, dilation)
CASES = [
    (2, 64, 9, 9, 64, (3, 3), (1, 1), (1, 1), (1, 1)),  # a whole step of channels, 162 pixels: two tiles
    (3, 24, 13, 11, 10, (5, 3), (2, 0), (2, 1), (1, 2)),  # 24 channels, 10 outputs (not 8s), uneven everything
    (1, 72, 20, 17, 130, (3, 3), (1, 2), (2, 2), (1, 1)),  # 72 channels: two steps, the second mostly zeros
    (4, 128, 9, 9, 200, (3, 3), (2, 2), (1, 1), (2, 2)),  # dilation 2, pad 2
    (2, 32, 15, 15, 48, (1, 1), (0, 0), (2, 2), (1, 1)),  # a strided 1 x 1 projection
    (2, 16, 7, 8, 64, (7, 7), (3, 3), (1, 1), (1, 1)),  # a filter as large as the image
    (8, 64, 30, 30, 512, (3, 3), (1, 1), (1, 1), (1, 1)),  # 57 x 2..8 tiles: more than the multiprocessors
    (3, 48, 8, 12, 72, (1, 1), (0, 0), (1, 1), (1, 1)),  # NCHW: the batched GEMM (96 pixels, 48-deep)
    (2, 64, 14, 14, 256, (1, 1), (0, 0), (1, 1), (1, 1)),  # NCHW: 196 pixels, rows not 16-byte aligned: staged
    (2, 32, 9, 7, 21, (1, 1), (0, 0), (1, 1), (1, 1)),  # 21 outputs (odd: rows of y start on odd elements)
    (2, 16, 11, 9, 13, (3, 3), (1, 1), (2, 1), (1, 1)),  # 13 outputs, strided 3 x 3
    (2, 64, 8, 8, 255, (1, 1), (0, 0), (1, 1), (1, 1)),  # 255 outputs (YOLO's heads); NCHW: the batched GEMM
    (2, 8, 10, 10, 40, (3, 3), (1, 1), (1, 1), (1, 1)),  # 8 channels: a 16-channel step, half of it zeros
    (2, 24, 12, 13, 144, (1, 1), (0, 0), (1, 1), (1, 1)),  # an expansion 24 > 144: 32-channel steps
    (2, 32, 17, 15, 32, (3, 3), (0, 0), (1, 1), (1, 1)),  # 32 > 32 3 x 3 unpadded: whole 32-channel steps
    (1, 16, 23, 21, 96, (1, 1), (0, 0), (1, 1), (1, 1)),  # an expansion 16 > 96: whole 16-channel steps
]


@pytest.mark.gpu
@pytest.mark.parametrize("name", TMA_SOLVERS)
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=["x".join(map(str, c[:5])) for c in CASES])
def test_tiles_cut_at_every_edge(sm90_torch, name, layout, dtype, case):
    import kdbkit

    handle, torch = sm90_torch
    n, c, h, w, k, f, pad, stride, dilation = case
    tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    gen = torch.Generator(device="cuda").manual_seed(hash(case) % 1000)
    x = torch.randn(n, c, h, w, device="cuda", dtype=tdtype, generator=gen).to(memory_format=fmt)
    wt = (torch.randn(k, c, *f, device="cuda", dtype=tdtype, generator=gen) / (c * f[0] * f[1]) ** 0.5).to(
        memory_format=fmt)
    ref = torch.nn.functional.conv2d(x.double(), wt.double(), None, stride, pad, dilation)
    y = torch.full(ref.shape, float("nan"), device="cuda", dtype=tdtype).to(memory_format=fmt)  # poisoned
    for _ in range(2):  # the second call reuses the encoded tensor maps and launch
        out = kdbkit.convolution_forward(handle, x, wt, pad=pad, stride=stride, dilation=dilation, y=y, solver=name)
        assert_written_in_place(out, y, ref, f"{name} {layout} {dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", TMA_SOLVERS)
def test_nchw_planes_written_two_bytes_off_alignment(sm90_torch, name):
    """y a view one element into its storage (2 bytes off 4-byte alignment): the staged NCHW
    path's planes store writes its pairs element by element there, and every value is right."""
    import kdbkit

    handle, torch = sm90_torch
    x = torch.randn(2, 64, 14, 14, device="cuda", dtype=torch.float16)  # 196 pixels: staged, y in planes
    wt = torch.randn(72, 64, 3, 3, device="cuda", dtype=torch.float16) / 24
    ref = torch.nn.functional.conv2d(x.double(), wt.double(), None, 1, 1)
    storage = torch.full((ref.numel() + 1,), float("nan"), device="cuda", dtype=torch.float16)
    y = storage[1:].view(ref.shape)
    assert y.data_ptr() % 4 == 2
    out = kdbkit.convolution_forward(handle, x, wt, pad=1, y=y, solver=name)
    assert_written_in_place(out, y, ref, f"{name} y two bytes off")


@pytest.mark.gpu
def test_immediate_mode_takes_the_tma_kernel_on_new_tensors(sm90_torch):
    import kdbkit
    from kdbkit.runtime.immediate import choose

    handle, torch = sm90_torch
    for _ in range(3):  # new buffers each call: new tensor maps
        x = torch.randn(4, 64, 14, 14, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        wt = (torch.randn(128, 64, 3, 3, device="cuda", dtype=torch.float16) / 24).to(
            memory_format=torch.channels_last)
        y = kdbkit.convolution_forward(handle, x, wt, pad=1)
        ref = torch.nn.functional.conv2d(x.double(), wt.double(), None, 1, 1)
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    assert choose(handle, conv(c=64, k=128, hw=(14, 14), n=4)).solver.name.startswith("ConvTma")
