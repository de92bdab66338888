"""The gemm with its epilogue fused (kdbkit.gemm_fused): c = act(alpha op(a) op(b) scale + shift
(+ residual)). On the chain device (PoCL in CI) no gemm solver takes the epilogue, so
ConvEpilogue's pass runs after the gemm: each type, with and without scale, residual, ReLU and
GELU, batched with a shared operand, against NumPy in float64; repeat calls (the plan) give the
same; bad arguments are named. On an sm_90 GPU, after GemmTma's kernel (or GemmTensorCore's
where N is odd): tiles cut at every edge against PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.primitives.convolution.epilogue import dense_inner
from kdbkit.runtime.primitives.gemm.fused import epilogue_problem
from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc

from .conftest import TYPES, assert_written_in_place


def _gelu(v: np.ndarray) -> np.ndarray:
    return 0.5 * v * (1.0 + np.vectorize(math.erf)(v / math.sqrt(2.0)))


def _expected(a, b, trans_b, alpha, scale, shift, residual, activation):
    y = alpha * (a.astype(np.float64) @ np.swapaxes(b.astype(np.float64), -1, -2) if trans_b
                 else a.astype(np.float64) @ b.astype(np.float64))
    y = y * (1.0 if scale is None else scale.astype(np.float64)) + shift.astype(np.float64)
    if residual is not None:
        y = y + residual
    return {"none": y, "relu": np.maximum(y, 0.0), "gelu_erf": _gelu(y)}[activation]


def _device(be, array: np.ndarray, dtype: str) -> DeviceTensor:
    return DeviceTensor(be.to_device(np.ascontiguousarray(array)),
                        TensorDesc.packed(DataType.parse(dtype), array.shape))


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("scaled, residual, activation", [(False, False, "none"), (False, False, "gelu_erf"),
                                                          (False, True, "none"), (True, True, "relu"),
                                                          (True, False, "gelu_erf")])
def test_the_epilogue_on_the_chain_device(handle, dtype, scaled, residual, activation):
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(11)
    batch, m, n, k = 3, 13, 10, 17
    a, b = store(rng.standard_normal((batch, m, k))), store(rng.standard_normal((n, k)) / 3)  # b shared, transposed
    shift = rng.standard_normal(n).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, n).astype(np.float32) if scaled else None
    res = store(rng.standard_normal((batch, m, n))) if residual else None
    expected = _expected(read(a), read(b), True, 0.5, scale, shift, None if res is None else read(res), activation)
    out = kdbkit.gemm_fused(handle, a, b, shift, scale=scale, residual=res, activation=activation, trans_b=True,
                            alpha=0.5, dtype=dtype)
    atol = 4 * tol * max(1.0, np.abs(expected).max())
    np.testing.assert_allclose(read(out), expected, rtol=4 * tol, atol=atol)
    be = handle.backend  # device tensors: the second call runs the plan the first left
    ad, bd, cd = _device(be, a, dtype), _device(be, b, dtype), _device(be, np.zeros((batch, m, n), a.dtype), dtype)
    rd = _device(be, res, dtype) if res is not None else None
    for _ in range(2):
        kdbkit.gemm_fused(handle, ad, bd, shift, scale=scale, residual=rd, activation=activation, trans_b=True,
                          alpha=0.5, c=cd)
        got = read(be.to_host(cd.buffer, np.empty((batch, m, n), a.dtype)))
        np.testing.assert_allclose(got, expected, rtol=4 * tol, atol=atol)


def test_the_pass_sees_packed_c_as_channels_last():
    p = GemmProblem(DataType.FP16, 5, 8, 3, False, False, 2, 3, 8, 8, 15, 0, 40, 1.0, 0.0)
    epilogue = epilogue_problem(p, TensorDesc.packed(DataType.FP16, (2, 5, 8)), True, "gelu_erf", False)
    assert epilogue.config() == "convepi,type=fp16,shape=2x8x5x1,ys=40x1x8x8,res=1,act=gelu_erf,scale=0"
    assert parse_config(epilogue.config()) == epilogue and "scale" not in epilogue.tensors()
    scaled = epilogue_problem(p, TensorDesc.packed(DataType.FP16, (2, 5, 8)), False, "relu", True)
    assert scaled.config() == "convepi,type=fp16,shape=2x8x5x1,ys=40x1x8x8,res=0,act=relu"  # a convolution's key as before
    assert dense_inner(epilogue) == 1  # the dense kernel, a column a channel
    with pytest.raises(ProblemError, match="scale=2"):
        parse_config("convepi,type=fp16,shape=2x8x5x1,ys=40x1x8x8,res=0,act=relu,scale=2")


def test_bad_arguments_are_named(handle):
    a, b = np.ones((4, 3), np.float32), np.ones((3, 5), np.float32)
    shift = np.ones(5, np.float32)
    with pytest.raises(ProblemError, match="activation 'gelu'"):
        kdbkit.gemm_fused(handle, a, b, shift, activation="gelu")
    with pytest.raises(ProblemError, match="shift has shape"):
        kdbkit.gemm_fused(handle, a, b, np.ones(4, np.float32))
    with pytest.raises(ProblemError, match="scale has shape"):
        kdbkit.gemm_fused(handle, a, b, shift, scale=np.ones((5, 1), np.float32))
    with pytest.raises(ProblemError, match="residual is"):
        kdbkit.gemm_fused(handle, a, b, shift, residual=np.ones((5, 4), np.float32))
    be = handle.backend
    c = _device(be, np.zeros((4, 5), np.float32), "fp32")
    with pytest.raises(ProblemError, match="residual and c are the same tensor"):
        kdbkit.gemm_fused(handle, a, b, shift, residual=c, c=c)
    ad, bd, sd = _device(be, a, "fp32"), _device(be, b, "fp32"), _device(be, shift, "fp32")
    r = _device(be, np.ones((4, 5), np.float32), "fp32")
    kdbkit.gemm_fused(handle, ad, bd, sd, residual=r, c=c)  # device tensors only: it leaves a plan
    plans = len(handle.dispatcher.plans)
    with pytest.raises(ProblemError, match="residual and c are the same tensor"):  # the plan checks it too
        kdbkit.gemm_fused(handle, ad, bd, sd, residual=DeviceTensor(c.buffer, c.desc), c=c)
    assert len(handle.dispatcher.plans) == plans
    y = kdbkit.gemm_fused(handle, a, b, -shift, scale=shift * 2, activation="relu")
    np.testing.assert_allclose(y, np.full((4, 5), 5.0))  # 3 x 2 - 1


# ---------------------------------------------------------------- sm_90 GPU

# m, n, k, batch: whole 128 x 256 tiles, edge tiles both ways with K no multiple of a step,
# BERT's feed-forward shape (small), three batches; N odd (no TMA: the pass after GemmTensorCore)
CASES = [(256, 512, 128, 1), (200, 136, 72, 1), (384, 768, 256, 1), (130, 264, 64, 3), (96, 45, 64, 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("scaled, residual, activation", [(False, False, "gelu_erf"), (False, True, "none"),
                                                          (True, True, "relu")])
@pytest.mark.parametrize("case", CASES, ids=["x".join(map(str, c)) for c in CASES])
def test_the_epilogue_after_the_tma_kernel(sm90_torch, dtype, scaled, residual, activation, case):
    from kdbkit.runtime.immediate import choose

    handle, torch = sm90_torch
    m, n, k, batch = case
    tdtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    gen = torch.Generator(device="cuda").manual_seed(sum(case))
    a = torch.randn(batch, m, k, device="cuda", dtype=tdtype, generator=gen)
    if batch == 1:
        a = a[0]  # one matrix is 2-D: gemm makes c of one batch m x n
    w = torch.randn(n, k, device="cuda", dtype=tdtype, generator=gen) / k ** 0.5  # a linear layer's weight
    shift = torch.randn(n, device="cuda", generator=gen)
    scale = torch.rand(n, device="cuda", generator=gen) + 0.5 if scaled else None
    ref = a.double() @ w.double().T
    ref = ref * (scale.double() if scaled else 1.0) + shift.double()
    res = torch.randn(ref.shape, device="cuda", dtype=tdtype, generator=gen) if residual else None
    if res is not None:
        ref = ref + res.double()
    ref = {"none": ref, "relu": ref.clamp_min(0), "gelu_erf": torch.nn.functional.gelu(ref)}[activation]
    c = torch.full(ref.shape, float("nan"), device="cuda", dtype=tdtype)  # poisoned
    if n % 2 == 0:
        strides = (m * k, 0, m * n) if batch > 1 else (0, 0, 0)  # as the call makes them
        problem = GemmProblem(DataType.parse(dtype), m, n, k, False, True, batch, k, k, n, *strides, 1.0, 0.0)
        solver = choose(handle, problem).solver
        assert solver.name.startswith("GemmTma"), solver.name
    for _ in range(2):  # the second call runs the plan
        out = kdbkit.gemm_fused(handle, a, w, shift, scale=scale, residual=res, activation=activation,
                                trans_b=True, c=c)
        assert_written_in_place(out, c, ref, f"{case} {dtype} scaled={scaled} residual={residual} {activation}")
