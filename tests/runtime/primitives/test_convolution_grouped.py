"""The grouped tensor-core convolution (ConvGroupedTensorCore, kernels/conv_grouped_tc.cu) and the
grouped fp32 one (ConvGroupedFp32, kernels/conv_grouped_fp32.cu): their programs compile offline
for sm_80 and sm_90, the gates, the supergroups and the tile plans need no GPU; on a CUDA GPU
(KDB_TEST_BACKEND=cuda with PyTorch) every group width, depthwise included, both layouts and
types against PyTorch in float64: odd sizes, strides, dilation, uneven padding, tiles cut at
every edge."""

from __future__ import annotations

import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.base import DeviceInfo
from kdbkit.runtime.primitives.convolution import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers import depthwise, grouped_fp32, grouped_tc
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.tensor import DataType
from .conftest import assert_written_in_place, gpu_with_torch, sm90

NAME = "ConvGroupedTensorCore"
FP32 = "ConvGroupedFp32"


def conv(c=128, k=None, hw=(56, 56), n=32, f=(3, 3), pad=(1, 1), stride=(1, 1), dilation=(1, 1), layout="NHWC",
         dtype=DataType.FP16, direction="F", groups=32) -> ConvProblem:
    return ConvProblem(direction, dtype, layout, (n, c, *hw), c if k is None else k, f, pad, stride, dilation, groups)


# ---------------------------------------------------------------- no GPU needed


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", [DataType.FP16, DataType.BF16])
def test_the_program_compiles_offline(arch, dtype):
    from tests.prerequisites import require_nvrtc

    require_nvrtc()
    from kdbkit.runtime.backends.elf_notes import cubin_arch
    from kdbkit.runtime.compilers.nvrtc import NvrtcCompiler

    from ..conftest import compile_file

    request, staging = REGISTRY.find(NAME).programs(conv(dtype=dtype))
    assert staging.kernel_file == "conv_gemm.c"
    cubin = compile_file(Target.parse(arch), request.kernel_file, *request.options, compiler=NvrtcCompiler())
    assert cubin_arch(cubin) == arch
    assert all(f"\0{name}\0".encode() in cubin for name in grouped_tc.KERNELS.values())


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_fp32_program_compiles_offline(arch):
    from tests.prerequisites import require_nvrtc

    require_nvrtc()
    from kdbkit.runtime.backends.elf_notes import cubin_arch
    from kdbkit.runtime.compilers.nvrtc import NvrtcCompiler

    from ..conftest import compile_file

    (request,) = REGISTRY.find(FP32).programs(conv(dtype=DataType.FP32))
    cubin = compile_file(Target.parse(arch), request.kernel_file, *request.options, compiler=NvrtcCompiler())
    assert cubin_arch(cubin) == arch
    assert all(f"\0{name}\0".encode() in cubin for name in grouped_fp32.KERNELS.values())
    assert REGISTRY.find(FP32).programs(conv()) == [] and REGISTRY.find(NAME).programs(conv(dtype=DataType.FP32)) == []


@pytest.mark.parametrize("c, k, groups, expected", [
    (128, 128, 32, 2),  # ResNeXt's 4 channels a group: pairs
    (256, 256, 32, 1), (512, 512, 32, 1), (1024, 1024, 32, 1),  # 8, 16, 32 a group as they are
    (96, 96, 96, 8),  # depthwise: 8 channels a supergroup
    (96, 192, 96, 8),  # depthwise, 2 outputs a channel: 8 in, 16 out
    (40, 80, 4, None),  # 10 in, 20 out a group: four make 40 and 80, no kernel's width
    (48, 48, 4, None),  # 12 a group: pairs of 24, no kernel's width
    (48, 48, 3, 1),  # 16 a group: as they are
])
def test_narrow_groups_merge_into_supergroups_of_8(c, k, groups, expected):
    assert grouped_tc.merge(conv(c=c, k=k, groups=groups)) == expected


def test_the_gates_name_what_the_kernel_cannot_take():
    solver = REGISTRY.find(NAME)

    def reason(device=None, **change):
        verdict = solver.is_applicable(conv(**change), device or sm90())
        return "" if verdict else verdict.reason

    a100 = DeviceInfo("cuda", 0, "an A100", Target.parse("sm_80_108"), 80 << 30)
    assert reason() == reason(layout="NCHW") == reason(dtype=DataType.BF16) == reason(device=a100) == ""
    assert reason(c=96, groups=96, stride=(2, 2)) == "" and reason(c=13 * 8, groups=13 * 8) == ""
    assert "fp32 is not fp16 or bf16" in reason(dtype=DataType.FP32)
    assert "forward direction only" in reason(direction="B")
    assert "not one group" in reason(groups=1)
    assert "supergroup" in reason(c=36, groups=12)  # 3 a group: 8 groups do not divide 12
    assert "supergroup" in reason(c=256, k=256, groups=2)  # 128 a group: wider than 64
    assert "shared memory" in reason(c=1024, f=(11, 11), pad=(5, 5), hw=(20, 20))
    sm75 = DeviceInfo("cuda", 0, "a T4", Target.parse("sm_75_40"), 16 << 30)
    assert "mma.sync" in reason(device=sm75)


def test_every_plan_fits_and_covers_the_groups():
    for problem in [conv(), conv(c=256, stride=(2, 2)), conv(c=1024, hw=(7, 7)), conv(c=96, groups=96, hw=(112, 112),
                    stride=(2, 2)), conv(c=960, groups=960, hw=(7, 7)), conv(c=40, groups=5, hw=(9, 13), n=1)]:
        p = grouped_tc.plan(problem)
        g = problem.groups // p.f
        assert g % p.sgb == 0 and p.shared <= grouped_tc.SHARED_BUDGET
        assert p.shared == grouped_tc.shared_bytes(problem, p.f, p.th, p.tw, p.sgb)
        tiles, slabs, images = p.grid(problem)
        ho, wo = problem.out_hw
        assert tiles * p.th * p.tw >= ho * wo and p.th * p.tw <= grouped_tc.THREADS
        assert slabs * p.sgb * p.f == problem.groups and images == problem.x_shape[0]


def test_64_channel_groups_keep_the_whole_tile():
    # ResNeXt-101 32x8d's last stage: one group's weights (64 x 9 x 64 halves) fill most of a
    # block, so the tile stays whole (7 x 7 positions on 4 warps) rather than one row of 7 on one
    for problem in (conv(c=2048, hw=(14, 14), stride=(2, 2), n=12), conv(c=2048, hw=(7, 7), n=1)):
        p = grouped_tc.plan(problem)
        assert (p.th, p.tw, p.sgb) == (7, 7, 1) and p.shared <= grouped_tc.SHARED_MAX
        assert p.shared == grouped_tc.shared_bytes(problem, 1, 7, 7, 1)
    assert grouped_tc.plan(conv(c=1024, hw=(7, 7))).shared <= grouped_tc.SHARED_BUDGET  # 32 a group: as before


def test_every_fp32_plan_fits_and_covers_the_groups():
    for problem in [conv(), conv(c=256, hw=(28, 28)), conv(c=256, hw=(15, 9), stride=(2, 2)), conv(c=64, groups=16,
                    hw=(37, 70)), conv(c=32, k=16, groups=8, hw=(9, 9), n=3), conv(c=96, k=48, groups=6, f=(3, 2))]:
        problem = ConvProblem(problem.direction, DataType.FP32, problem.layout, problem.x_shape, problem.out_channels,
                              problem.filter, problem.pad, problem.stride, problem.dilation, problem.groups)
        p = grouped_fp32.plan(problem)
        assert problem.groups % p.sgb == 0 and p.shared <= grouped_fp32.SHARED_LIMIT and p.th % grouped_fp32.PY == 0
        assert p.shared == grouped_fp32.shared_bytes(problem, p.th, p.tw, p.sgb) and p.threads <= grouped_fp32.THREADS
        tiles, slabs, images = p.grid(problem)
        ho, wo = problem.out_hw
        assert tiles * p.th * p.tw >= ho * wo and p.tw <= 32
        assert slabs * p.sgb == problem.groups and images == problem.x_shape[0]


def test_the_fp32_gates():
    solver = REGISTRY.find(FP32)

    def reason(**change):
        verdict = solver.is_applicable(conv(**{"dtype": DataType.FP32, **change}), sm90())
        return "" if verdict else verdict.reason

    assert reason() == reason(layout="NCHW") == reason(c=256) == reason(c=32, k=16, groups=8) == ""
    assert "not fp32" in reason(dtype=DataType.FP16)
    assert "forward direction only" in reason(direction="B")
    assert "not one group" in reason(groups=1)
    assert "2, 4 or 8 outputs" in reason(c=512)  # 16 a group: the implicit GEMM's
    assert "2, 4 or 8 outputs" in reason(c=1024, k=256)  # 32 in a group
    sm75 = DeviceInfo("cuda", 0, "a T4", Target.parse("sm_75_40"), 16 << 30)
    assert "cp.async" in solver.is_applicable(conv(dtype=DataType.FP32), sm75).reason


def test_immediate_mode_takes_the_fp32_kernel_for_resnext_narrow_groups():
    from kdbkit.runtime.immediate import heuristic

    for layout in ("NCHW", "NHWC"):
        for problem in (conv(layout=layout), conv(c=256, hw=(28, 28), layout=layout)):  # ResNeXt-50 layer1, layer2
            fp32 = ConvProblem("F", DataType.FP32, layout, problem.x_shape, problem.out_channels, problem.filter,
                               problem.pad, problem.stride, problem.dilation, problem.groups)
            assert heuristic(fp32, sm90(), ()).solver.name == FP32
    wide = ConvProblem("F", DataType.FP32, "NCHW", (32, 1024, 14, 14), 1024, (3, 3), (1, 1), (1, 1), (1, 1), 32)
    assert heuristic(wide, sm90(), ()).solver.name == "ConvImplicitGemm"


def test_immediate_mode_takes_it_for_resnext_and_depthwise_layers():
    from kdbkit.runtime.immediate import heuristic

    for problem in (conv(), conv(c=1024, hw=(14, 14), stride=(2, 2), layout="NCHW"),
                    conv(c=40, groups=40, f=(5, 5), pad=(2, 2), dtype=DataType.BF16)):
        assert heuristic(problem, sm90(), ()).solver.name == NAME
    assert heuristic(conv(c=144, groups=144, dtype=DataType.FP32), sm90(), ()).solver.name == "ConvDepthwise"
    strided = heuristic(conv(c=144, groups=144, stride=(2, 2)), sm90(), ())
    assert strided.solver.name == "ConvDepthwise" and "faster on strided depthwise" in strided.trace[0]
    for layout, hw in (("NHWC", (112, 112)), ("NHWC", (56, 56)), ("NCHW", (28, 28)), ("NCHW", (7, 7))):
        narrow = heuristic(conv(c=144, groups=144, hw=hw, layout=layout, dtype=DataType.BF16), sm90(), ())
        assert narrow.solver.name == "ConvDepthwise" and "up to 3 wide" in narrow.trace[0]  # MobileNet's 3 x 3 / 1
    for hw in ((56, 56), (112, 112)):  # NCHW's large planes stay here
        assert heuristic(conv(c=32, groups=32, hw=hw, layout="NCHW"), sm90(), ()).solver.name == NAME


def test_the_workspace_holds_an_nchw_input_staged():
    # x staged channels-last, and the weights expanded: pairs of 4-channel groups to 8 channels
    assert REGISTRY.find(NAME).workspace(conv(layout="NCHW", n=2, hw=(9, 9))) == 2 * (2 * 128 * 81 + 128 * 9 * 8)
    assert REGISTRY.find(NAME).workspace(conv()) == 2 * 128 * 9 * 8
    assert REGISTRY.find(NAME).workspace(conv(c=256)) == 0  # 8 a group: the user's KYXC weights as they are
    assert REGISTRY.find(NAME).workspace(conv(c=256, layout="NCHW", n=1, hw=(4, 4))) == 2 * (256 * 16 + 256 * 9 * 8)


# ---------------------------------------------------------------- on a CUDA GPU

# (N, C, H, W, K, groups, filter, pad, stride, dilation)
CASES = [
    (2, 128, 13, 11, 128, 32, (3, 3), (1, 1), (1, 1), (1, 1)),  # ResNeXt's 4 a group: pairs, odd sizes
    (3, 256, 15, 9, 256, 32, (3, 3), (1, 1), (2, 2), (1, 1)),  # 8 a group, strided
    (2, 512, 9, 9, 512, 32, (3, 3), (1, 1), (1, 1), (1, 1)),  # 16 a group
    (2, 1024, 7, 7, 1024, 32, (3, 3), (1, 1), (1, 1), (1, 1)),  # 32 a group, the last stage
    (1, 1024, 14, 14, 1024, 32, (3, 3), (1, 1), (2, 2), (1, 1)),  # 32 a group, strided
    (2, 96, 19, 17, 96, 96, (3, 3), (1, 1), (2, 2), (1, 1)),  # depthwise, strided, odd sizes
    (2, 40, 23, 30, 40, 40, (5, 5), (2, 2), (1, 1), (1, 1)),  # depthwise 5 x 5 (40 channels: 5 supergroups)
    (2, 24, 12, 12, 48, 24, (3, 3), (2, 0), (1, 2), (2, 1)),  # 2 outputs a channel, uneven pad, dilation
    (2, 64, 10, 10, 128, 4, (3, 3), (1, 1), (1, 1), (1, 1)),  # 16 in, 32 out a group
    (2, 256, 6, 6, 512, 8, (1, 1), (0, 0), (1, 1), (1, 1)),  # 32 in, 64 out a group: two n32 loads
    (4, 128, 40, 40, 128, 32, (3, 3), (1, 1), (1, 1), (1, 1)),  # more tiles than multiprocessors
    (3, 2048, 7, 7, 2048, 32, (3, 3), (1, 1), (1, 1), (1, 1)),  # 64 a group: the whole tile
    (1, 384, 15, 19, 512, 8, (3, 3), (1, 1), (2, 2), (1, 1)),  # 48 in, 64 out, strided: the whole tile
    (2, 1024, 9, 11, 1024, 16, (3, 3), (1, 1), (1, 1), (1, 1)),  # 64 a group, the whole odd tile, one part
    (1, 512, 13, 10, 512, 8, (3, 3), (1, 1), (1, 1), (1, 1)),  # 64 a group, rows cut: 7 and 6
]


@pytest.fixture
def tensor_core_torch(handle):
    return gpu_with_torch(handle, "mma.sync", "needs an sm_80+ GPU (KDB_TEST_BACKEND=cuda on the GPU machine)")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=["x".join(map(str, c[:6])) for c in CASES])
def test_matches_pytorch(tensor_core_torch, layout, dtype, case):
    import kdbkit

    handle, torch = tensor_core_torch
    n, c, h, w, k, groups, f, pad, stride, dilation = case
    tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    gen = torch.Generator(device="cuda").manual_seed(sum(case[:6]))
    x = torch.randn(n, c, h, w, device="cuda", dtype=tdtype, generator=gen).to(memory_format=fmt)
    cg = c // groups
    wt = (torch.randn(k, cg, *f, device="cuda", dtype=tdtype, generator=gen) / (cg * f[0] * f[1]) ** 0.5).to(
        memory_format=fmt)
    ref = torch.nn.functional.conv2d(x.double(), wt.double(), None, stride, pad, dilation, groups)
    y = torch.full(ref.shape, float("nan"), device="cuda", dtype=tdtype).to(memory_format=fmt)  # poisoned
    for _ in range(2):
        out = kdbkit.convolution_forward(handle, x, wt, pad=pad, stride=stride, dilation=dilation, groups=groups,
                                         y=y, solver=NAME)
        assert_written_in_place(out, y, ref, f"{layout} {dtype}")


# (N, C, H, W, K, groups, filter, pad, stride, dilation)
FP32_CASES = [
    (2, 128, 13, 11, 128, 32, (3, 3), (1, 1), (1, 1), (1, 1)),  # ResNeXt's 4 a group, odd sizes: rows cut
    (3, 256, 15, 9, 256, 32, (3, 3), (1, 1), (2, 2), (1, 1)),  # 8 a group, strided
    (2, 64, 37, 70, 64, 16, (3, 3), (1, 1), (1, 1), (1, 1)),  # columns cut (24, 24, 22) and rows (20, 17)
    (3, 32, 9, 9, 16, 8, (3, 3), (1, 1), (1, 1), (1, 1)),  # 4 in, 2 out a group
    (1, 96, 12, 12, 48, 6, (3, 2), (2, 0), (1, 2), (2, 1)),  # 16 in, 8 out: uneven pad, dilation, a 3 x 2 filter
    (2, 256, 28, 28, 256, 32, (3, 3), (1, 1), (1, 1), (1, 1)),  # ResNeXt-50's layer2
]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", FP32_CASES, ids=["x".join(map(str, c[:6])) for c in FP32_CASES])
def test_fp32_matches_pytorch(tensor_core_torch, layout, case):
    """fp32 throughout: far closer than TF32's 1e-3 (relative) could come."""
    import kdbkit

    handle, torch = tensor_core_torch
    n, c, h, w, k, groups, f, pad, stride, dilation = case
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    gen = torch.Generator(device="cuda").manual_seed(sum(case[:6]))
    x = torch.randn(n, c, h, w, device="cuda", generator=gen).to(memory_format=fmt)
    wt = torch.randn(k, c // groups, *f, device="cuda", generator=gen).to(memory_format=fmt)
    ref = torch.nn.functional.conv2d(x.double(), wt.double(), None, stride, pad, dilation, groups)
    y = torch.full(ref.shape, float("nan"), device="cuda").to(memory_format=fmt)  # poisoned
    for _ in range(2):
        out = kdbkit.convolution_forward(handle, x, wt, pad=pad, stride=stride, dilation=dilation, groups=groups,
                                         y=y, solver=FP32)
        assert_written_in_place(out, y, ref, layout)
        err = float((y.double() - ref).norm() / ref.norm())
        assert err < 1e-5, f"{layout}: relative error {err:.2e}"


# ---------------------------------------------------------------- ConvDepthwise's forward kernels (any backend)


@pytest.mark.parametrize("kernel", ["direct", "tiled"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("n, c, hw, f, pad, stride, dilation, dtype", [
    (2, 40, (33, 21), (5, 5), (2, 2), (1, 1), (1, 1), "fp32"),  # a slab of 32 channels, a cut one; rows cut by tiles
    (2, 24, (17, 19), (3, 3), (1, 0), (2, 2), (1, 1), "fp32"),  # strided, uneven pad
    (2, 6, (12, 9), (3, 2), (2, 1), (1, 2), (2, 1), "fp32"),  # row dilation, a filter 2 wide, few channels
    (2, 3, (9, 9), (7, 7), (3, 3), (1, 1), (1, 1), "fp32"),  # 49 taps: past the 25 kept in registers
    (1, 144, (7, 9), (3, 3), (1, 1), (1, 1), (1, 1), "fp32"),  # MobileNet's 3 x 3: 36 vectors in 2 slabs of 18
    (1, 48, (11, 13), (3, 3), (1, 1), (2, 2), (1, 1), "fp16"),  # 3 x 3 / 2, odd sizes: runs cut at the row's end
    (2, 16, (7, 6), (3, 3), (1, 1), (1, 1), (1, 1), "fp16"),  # 3 x 3 / 1, 2 vectors of 8 halfs, a run cut
    (1, 8, (6, 5), (3, 3), (0, 2), (2, 1), (1, 1), "fp16"),  # no row pad, wide column pad, strided rows
])
def test_the_depthwise_forward_matches_the_reference(handle, monkeypatch, kernel, layout, n, c, hw, f, pad, stride,
                                                    dilation, dtype):
    """Each forward kernel: NHWC's vectors of channels (vectors of 4 floats or 8 halfs; 6 and 3
    channels fall back to the tiles), NCHW's runs of rows, and the tiles; the 3-wide filters at
    column stride 1 and 2 take the direct kernels' register path."""
    import numpy as np

    import kdbkit
    from kdbkit.runtime.reference import convolution as ref

    from .test_convolution import _channels_last, _from_channels_last

    monkeypatch.setitem(depthwise.PREFERRED, layout, kernel)
    data = DataType.parse(dtype)
    problem = ConvProblem("F", data, layout, (n, c, *hw), c, f, pad, stride, dilation, c)
    vec = 16 // data.itemsize
    expected = {("direct", "NHWC"): "vec" if c % vec == 0 else "tiled", ("direct", "NCHW"): "rows"}
    assert depthwise.forward_kernel(problem) == expected.get((kernel, layout), "tiled")
    rng = np.random.default_rng(c)
    x = rng.standard_normal((n, c, *hw)).astype(data.storage)
    wt = rng.standard_normal((c, 1, *f)).astype(data.storage)
    geometry = {"pad": pad, "stride": stride, "dilation": dilation, "groups": c, "solver": "ConvDepthwise"}
    if layout == "NHWC":
        be = handle.backend
        y = _from_channels_last(be, kdbkit.convolution_forward(handle, _channels_last(be, x), _channels_last(be, wt),
                                                               **geometry))
    else:
        y = kdbkit.convolution_forward(handle, x, wt, **geometry)
    expect = ref.forward(x.astype(np.float32), wt.astype(np.float32), pad, stride, dilation, c)
    tol = {"rtol": 1e-5, "atol": 1e-4} if dtype == "fp32" else {"rtol": 2e-3, "atol": 4e-3}
    np.testing.assert_allclose(np.asarray(y, np.float32), expect, **tol)


def test_the_vector_lanes_split_the_channels_evenly():
    assert [depthwise.vector_lanes(v) for v in (4, 18, 32, 36, 48, 72, 120, 144, 37)] == [4, 18, 32, 18, 24, 24, 30,
                                                                                         24, 32]
    p = conv(c=144, groups=144, hw=(56, 56), dtype=DataType.FP32)  # 36 vectors: 2 slabs of 18, 14 runs a group
    assert depthwise.vec_grid(p, 18, 132) == (16 * 132 // 2, 2, 1)  # of 1792 groups, 1056 striding
    assert depthwise.vec_grid(conv(c=960, groups=960, hw=(7, 7)), 30, 132)[1:] == (4, 1)
    assert depthwise.vec_grid(conv(c=32, groups=32, hw=(112, 112)), 4, 2) == (32, 1, 1)  # 16 groups a unit


def test_the_depthwise_tiles_fit_the_shared_memory():
    for layout in ("NHWC", "NCHW"):
        for c, hw, s in ((32, 112, 1), (96, 112, 2), (960, 7, 1), (3, 9, 1)):
            p = conv(c=c, groups=c, hw=(hw, hw), stride=(s, s), layout=layout, dtype=DataType.FP32)
            th, tw, cb = depthwise.tile(p)
            (fy, fx), (ho, wo) = p.filter, p.out_hw
            halo = ((th - 1) * s + fy) * ((tw - 1) * s + fx)
            assert cb * (halo + fy * fx) <= depthwise.TILE_FLOATS and th <= ho and tw <= wo
            assert depthwise.THREADS % cb == 0 if layout == "NHWC" else th * tw <= depthwise.THREADS
    assert depthwise.tile(conv(c=64, groups=64, f=(61, 61), pad=(30, 30), hw=(64, 64), layout="NHWC")) is None
