"""The forward convolution with its epilogue fused (kdbkit.convolution_forward_fused): y =
act(conv(x, w) scale + shift (+ residual)). On the chain device (PoCL in CI) the convolution's
solvers take no epilogue, so ConvEpilogue's pass runs after them: both layouts, each type, with
and without the residual and ReLU, against NumPy in float64; repeat calls (the plan) give the
same; bad arguments are named. On an sm_90 GPU, ConvTma's kernel applies the epilogue as it
stores each tile: tiles cut at every edge against PyTorch, and the fused path is the one taken."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.convolution import ConvEpilogueProblem
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.reference import convolution as ref_convolution
from kdbkit.runtime.tensor import DataType

from .conftest import TYPES, assert_written_in_place
from .test_convolution import _channels_last, _from_channels_last


def _expected(x, w, scale, shift, residual, relu, pad, stride):
    y = ref_convolution.forward(x.astype(np.float64), w.astype(np.float64), (pad, pad), (stride, stride))
    y = y * scale[None, :, None, None] + shift[None, :, None, None]
    if residual is not None:
        y = y + residual
    return np.maximum(y, 0) if relu else y


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("residual, relu", [(False, False), (False, True), (True, True), (True, False)])
def test_the_epilogue_on_the_chain_device(handle, dtype, layout, residual, relu):
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(5)
    n, c, h, w, k = 2, 6, 7, 5, 10
    x, wt = store(rng.standard_normal((n, c, h, w))), store(rng.standard_normal((k, c, 3, 3)) / 5)
    scale, shift = rng.uniform(0.5, 1.5, k).astype(np.float32), rng.standard_normal(k).astype(np.float32)
    res = store(rng.standard_normal((n, k, 4, 3))) if residual else None
    expected = _expected(read(x), read(wt), scale.astype(np.float64), shift.astype(np.float64),
                         None if res is None else read(res).astype(np.float64), relu, 1, 2)
    be = handle.backend
    if layout == "NCHW":
        out = kdbkit.convolution_forward_fused(handle, x, wt, scale, shift, residual=res,
                                               activation="relu" if relu else "none", pad=1, stride=2, dtype=dtype)
        got = read(out)
    else:
        as_dev = lambda a: _channels_last(be, a, dtype)  # noqa: E731
        xd, wd = as_dev(x), as_dev(wt)
        rd = as_dev(res) if res is not None else None
        yd = as_dev(np.zeros((n, k, 4, 3), x.dtype))
        for _ in range(2):  # the second call runs the plan the first left
            kdbkit.convolution_forward_fused(handle, xd, wd, scale, shift, residual=rd,
                                             activation="relu" if relu else "none", pad=1, stride=2, y=yd)
        got = read(_from_channels_last(be, yd))
    np.testing.assert_allclose(got, expected, rtol=4 * tol, atol=4 * tol * max(1.0, np.abs(expected).max()))


def test_its_problem_and_bad_arguments(handle):
    problem = ConvEpilogueProblem(DataType.FP16, (2, 3, 4, 5), (60, 1, 15, 3), True, "relu")
    assert parse_config(problem.config()) == problem
    assert problem.config() == "convepi,type=fp16,shape=2x3x4x5,ys=60x1x15x3,res=1,act=relu"
    x, w = np.ones((1, 2, 4, 4), np.float32), np.ones((3, 2, 1, 1), np.float32)
    one = np.ones(3, np.float32)
    with pytest.raises(ProblemError, match="activation 'gelu'"):
        kdbkit.convolution_forward_fused(handle, x, w, one, one, activation="gelu")
    with pytest.raises(ProblemError, match="scale has shape"):
        kdbkit.convolution_forward_fused(handle, x, w, np.ones(4, np.float32), one)
    with pytest.raises(ProblemError, match="residual is"):
        kdbkit.convolution_forward_fused(handle, x, w, one, one, residual=np.ones((1, 3, 4, 5), np.float32))
    with pytest.raises(ProblemError, match="res=2"):
        parse_config("convepi,type=fp16,shape=2x3x4x5,ys=60x1x15x3,res=2,act=relu")
    y = kdbkit.convolution_forward_fused(handle, x, w, one * 2, -one, activation="relu")
    np.testing.assert_allclose(y, np.full((1, 3, 4, 4), 3.0))  # (2 channels x 1) x 2 - 1


# ---------------------------------------------------------------- sm_90 GPU

# n, c, h, w, k, filter, pad, stride: whole tiles, edge tiles in both directions, K not a multiple of 8
CASES = [(4, 64, 16, 16, 256, 1, 0, 1), (3, 40, 11, 13, 72, 3, 1, 2), (2, 16, 9, 7, 10, 3, 1, 1),
         (8, 128, 14, 14, 128, 3, 1, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("residual, relu", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("case", CASES, ids=["x".join(map(str, c[:5])) for c in CASES])
def test_the_tma_kernel_applies_the_epilogue(sm90_torch, dtype, residual, relu, case):
    from kdbkit.runtime.immediate import choose
    from kdbkit.runtime.primitives.convolution.problem import ConvProblem

    handle, torch = sm90_torch
    n, c, h, w, k, f, pad, stride = case
    tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    cl = torch.channels_last
    gen = torch.Generator(device="cuda").manual_seed(sum(case))
    x = torch.randn(n, c, h, w, device="cuda", dtype=tdtype, generator=gen).to(memory_format=cl)
    wt = (torch.randn(k, c, f, f, device="cuda", dtype=tdtype, generator=gen) / (c * f * f) ** 0.5).to(memory_format=cl)
    scale = torch.rand(k, device="cuda", generator=gen) + 0.5
    shift = torch.randn(k, device="cuda", generator=gen)
    ref = torch.nn.functional.conv2d(x.double(), wt.double(), None, stride, pad)
    ref = ref * scale.double()[None, :, None, None] + shift.double()[None, :, None, None]
    res = torch.randn(ref.shape, device="cuda", dtype=tdtype, generator=gen).to(memory_format=cl) if residual else None
    if res is not None:
        ref = ref + res.double()
    if relu:
        ref = ref.clamp_min(0)
    problem = ConvProblem("F", DataType.parse(dtype), "NHWC", (n, c, h, w), k, (f, f), (pad, pad), (stride, stride),
                          (1, 1), 1)
    solver = choose(handle, problem).solver
    if k % 2 == 0:
        assert solver.name.startswith("ConvTma"), solver.name
        assert hasattr(handle.dispatcher.invoker(problem, solver), "fuse")
    y = torch.full(ref.shape, float("nan"), device="cuda", dtype=tdtype).to(memory_format=cl)  # poisoned
    for _ in range(2):  # the second call runs the plan
        out = kdbkit.convolution_forward_fused(handle, x, wt, scale, shift, residual=res,
                                               activation="relu" if relu else "none", pad=pad, stride=stride, y=y)
        assert_written_in_place(out, y, ref, f"{case} {dtype} residual={residual} relu={relu}", cl)


@pytest.mark.parametrize("residual", [False, True])
def test_the_epilogue_pass_through_strides(handle, residual):
    """A y that is not packed (rows padded to 7 of 5 values) takes the general kernel, which
    walks the strides and leaves the padding alone; packed ones take the dense kernel."""
    from kdbkit.runtime.primitives.convolution.epilogue import dense_inner
    from kdbkit.runtime.primitives.invoke import invoke

    rng = np.random.default_rng(9)
    shape, strides = (2, 3, 4, 5), (84, 28, 7, 1)
    problem = ConvEpilogueProblem(DataType.FP32, shape, strides, residual, "relu")
    assert dense_inner(problem) is None
    assert dense_inner(ConvEpilogueProblem(DataType.FP32, shape, (60, 20, 5, 1), residual, "relu")) == 20
    assert dense_inner(ConvEpilogueProblem(DataType.FP32, shape, (60, 1, 15, 3), residual, "relu")) == 1
    memory = rng.standard_normal(2 * 84).astype(np.float32)
    res_memory = rng.standard_normal(2 * 84).astype(np.float32)
    scale, shift = rng.uniform(0.5, 1.5, 3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    be = handle.backend
    y, res = be.to_device(memory), be.to_device(res_memory)
    s, h = be.to_device(scale), be.to_device(shift)
    desc = problem.tensors()
    inputs = {"scale": (s, desc["scale"]), "shift": (h, desc["shift"])}
    if residual:
        inputs["residual"] = (res, desc["residual"])
    invoke(handle, problem, None, inputs, {"y": (y, desc["y"])})
    got = be.to_host(y, np.empty_like(memory))
    view = np.lib.stride_tricks.as_strided
    grid = lambda a: view(a, shape, tuple(a.itemsize * v for v in strides))  # noqa: E731
    want = grid(memory) * scale[None, :, None, None] + shift[None, :, None, None]
    if residual:
        want = want + grid(res_memory)
    np.testing.assert_allclose(grid(got), np.maximum(want, 0), rtol=1e-6, atol=1e-6)
    padding = np.ones(2 * 84, bool)
    padding[np.ravel(grid(np.arange(2 * 84)))] = False
    np.testing.assert_array_equal(got[padding], memory[padding])


def test_find_db_winners_that_do_not_fuse_give_way_within_the_cost_of_the_pass():
    """Find times the convolution alone: a fusing solver ranked within the separate pass's cost
    of a non-fusing winner is taken instead; one ranked further behind is not."""
    from types import SimpleNamespace

    from kdbkit.kdb.find_db import FindRecord
    from kdbkit.runtime.backends.base import MemorySystem
    from kdbkit.runtime.primitives.fusing import fuses, fusing_choice, separate_pass_ms
    from kdbkit.runtime.primitives.convolution.problem import ConvProblem
    from kdbkit.runtime.solver import REGISTRY
    from .conftest import sm90

    problem = ConvProblem("F", DataType.FP16, "NHWC", (32, 128, 28, 28), 512, (1, 1), (0, 0), (1, 1), (1, 1), 1)
    epilogue = ConvEpilogueProblem(DataType.FP16, problem.y_shape, problem.descs()["y"].strides, True, "relu")
    device = sm90()
    device = SimpleNamespace(target=device.target, memory=MemorySystem(4000.0, 50 << 20, 2048))
    im2col, tma = REGISTRY.find("ConvIm2colGemm"), REGISTRY.find("ConvTma128x128")
    assert fuses(tma, problem) and not fuses(im2col, problem)
    assert not fuses(tma, ConvProblem("F", DataType.FP16, "NCHW", (32, 128, 28, 28), 512, (1, 1), (0, 0), (1, 1),
                                      (1, 1), 1))
    pass_ms = separate_pass_ms(epilogue, device)  # 3 x 32 x 512 x 28 x 28 x 2 bytes at 4 TB/s, and a launch
    assert abs(pass_ms - (3 * 32 * 512 * 28 * 28 * 2 / 4e12 * 1e3 + 0.005)) < 1e-9

    def handle_ranking(times):
        ranking = [(FindRecord(s.id, s.name, i, t, 0), s, "test") for i, (s, t) in enumerate(times)]
        return SimpleNamespace(device=device, dispatcher=SimpleNamespace(ranked=lambda p: iter(ranking)))

    assert fusing_choice(handle_ranking([(im2col, 0.020), (tma, 0.020 + pass_ms * 0.9)]), problem, epilogue) is tma
    assert fusing_choice(handle_ranking([(im2col, 0.020), (tma, 0.020 + pass_ms * 1.1)]), problem, epilogue) is None
    assert fusing_choice(handle_ranking([(tma, 0.020), (im2col, 0.021)]), problem, epilogue) is None

    # the walk stops at the first solver slower than the limit: those behind it are not asked
    def stops_at_the_limit(_):
        yield FindRecord(im2col.id, im2col.name, 0, 0.020, 0), im2col, "test"
        yield FindRecord(tma.id, tma.name, 1, 0.020 + pass_ms * 1.1, 0), tma, "test"
        raise AssertionError("the ranking was walked past the first solver slower than the limit")

    walked = SimpleNamespace(device=device, dispatcher=SimpleNamespace(ranked=stops_at_the_limit))
    assert fusing_choice(walked, problem, epilogue) is None
