"""ConvImplicitGemmTf32 (kernels/conv_igemm.c with igemm_core.h's -DIG_TF32): fp32 stays fp32
unless KDB_CONV_ALLOW_TF32=1 (the gate, immediate mode's choice with and without it, no GPU
needed); its program compiles offline for sm_80 and sm_90; on a CUDA GPU (KDB_TEST_BACKEND=cuda)
every direction in both layouts against PyTorch in float64, at TF32's accuracy, not fp32's."""

from __future__ import annotations

import pytest

from kdbkit.kdb.target import Target
from kdbkit.runtime.backends.base import DeviceInfo
from kdbkit.runtime.primitives.convolution import ConvProblem
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.tensor import DataType

from .conftest import gpu_with_torch, sm90


def conv(direction="F", dtype=DataType.FP32, layout="NCHW", c=64, k=128, hw=(28, 28), f=(3, 3), stride=(1, 1)):
    return ConvProblem(direction, dtype, layout, (32, c, *hw), k, f, (f[0] // 2, f[1] // 2), stride)


@pytest.mark.parametrize("direction", "FBW")
def test_fp32_never_takes_tf32_without_the_flag(monkeypatch, direction):
    from kdbkit.runtime.immediate import heuristic

    monkeypatch.delenv("KDB_CONV_ALLOW_TF32", raising=False)
    solver = REGISTRY.find("ConvImplicitGemmTf32")
    verdict = solver.is_applicable(conv(direction), sm90())
    assert not verdict and "KDB_CONV_ALLOW_TF32=1" in verdict.reason
    for layout in ("NCHW", "NHWC"):
        for shape in ({}, {"c": 512, "k": 512, "hw": (7, 7)}, {"f": (1, 1)}, {"stride": (2, 2)}):
            assert heuristic(conv(direction, layout=layout, **shape), sm90(), ()).solver.name != solver.name
    monkeypatch.setenv("KDB_CONV_ALLOW_TF32", "0")
    assert not solver.is_applicable(conv(direction), sm90())


@pytest.mark.parametrize("direction", "FBW")
def test_the_flag_lets_fp32_take_tf32_and_nothing_else(monkeypatch, direction):
    from kdbkit.runtime.immediate import heuristic

    monkeypatch.setenv("KDB_CONV_ALLOW_TF32", "1")
    assert heuristic(conv(direction), sm90(), ()).solver.name == "ConvImplicitGemmTf32"
    solver = REGISTRY.find("ConvImplicitGemmTf32")
    assert "fp16" in solver.is_applicable(conv(direction, dtype=DataType.FP16), sm90()).reason
    volta = DeviceInfo("cuda", 0, "a V100", Target.parse("sm_70_80"), 16 << 30)
    assert "mma.sync" in solver.is_applicable(conv(direction), volta).reason
    assert not solver.builds_for(Target.parse("sm_70")) and solver.builds_for(Target.parse("sm_90"))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_program_compiles_offline(arch):
    from tests.prerequisites import require_nvrtc

    require_nvrtc()
    from kdbkit.runtime.backends.elf_notes import cubin_arch
    from kdbkit.runtime.compilers.nvrtc import NvrtcCompiler

    from ..conftest import compile_file

    (request,) = REGISTRY.find("ConvImplicitGemmTf32").programs(conv())
    assert request.kernel_file == "conv_igemm.c" and "-DIG_TF32=1" in request.options
    cubin = compile_file(Target.parse(arch), request.kernel_file, *request.options, compiler=NvrtcCompiler())
    assert cubin_arch(cubin) == arch
    for kernel in (b"conv_fwd_igemm", b"conv_bwd_data_igemm", b"conv_wrw_igemm", b"conv_igemm_split_finish"):
        assert b"\0" + kernel + b"\0" in cubin


# ---------------------------------------------------------------- on a CUDA GPU


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("c, k, hw, f, stride", [(40, 136, (9, 11), 3, 1), (130, 20, (8, 16), 3, 1),
                                                 (20, 130, (8, 16), 3, 1), (24, 72, (13, 10), 1, 2)])
def test_every_direction_at_tf32_accuracy(handle, monkeypatch, layout, c, k, hw, f, stride):
    _, torch = gpu_with_torch(handle, "mma.sync",
                              "TF32 needs a CUDA GPU with mma.sync (KDB_TEST_BACKEND=cuda on the GPU machine)")
    import kdbkit

    monkeypatch.setenv("KDB_CONV_ALLOW_TF32", "1")
    fmt = torch.channels_last if layout == "NHWC" else torch.contiguous_format
    g = torch.Generator(device="cuda").manual_seed(c + k)
    x = torch.randn(3, c, *hw, device="cuda", generator=g).to(memory_format=fmt)
    w = torch.randn(k, c, f, f, device="cuda", generator=g).to(memory_format=fmt)
    geometry = {"pad": f // 2, "stride": stride, "solver": "ConvImplicitGemmTf32"}
    y64 = torch.nn.functional.conv2d(x.double(), w.double(), None, stride, f // 2)
    dy = torch.randn(y64.shape, device="cuda", generator=g).to(memory_format=fmt)
    results = {
        "F": (kdbkit.convolution_forward(handle, x, w, y=torch.full(y64.shape, float("nan"), device="cuda").to(
            memory_format=fmt), **geometry), y64),  # poisoned: every element must be written
        "B": (kdbkit.convolution_backward_data(handle, dy, w, x.shape, dx=torch.full_like(x, float("nan")),
                                               **geometry),
              torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double(), stride, f // 2)),
        "W": (kdbkit.convolution_backward_weights(handle, dy, x, w.shape, dw=torch.full_like(w, float("nan")),
                                                  **geometry),
              torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), stride, f // 2)),
    }
    for direction, (got, want) in results.items():
        error = float((got.double() - want).norm() / want.norm())
        # TF32's 10-bit mantissa: far above fp32's rounding, far below a wrong result
        assert 1e-5 < error < 3e-3, (direction, error)
