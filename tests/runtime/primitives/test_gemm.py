"""GEMM on the chain device against NumPy: transposes, batches, alpha/beta, each type."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import NoSolverError, ProblemError
from kdbkit.runtime.immediate import choose, invoker
from kdbkit.runtime.primitives.gemm import GemmProblem
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.solver import REGISTRY
from kdbkit.runtime.reference.gemm import gemm as ref
from kdbkit.runtime.tensor import DataType

from .conftest import TYPES


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("batch", [1, 3])
def test_gemm_matches_numpy(handle, dtype, trans_a, trans_b, batch):
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(batch * 4 + trans_a * 2 + trans_b)
    m, n, k = 37, 19, 45
    a_shape, b_shape = ((k, m) if trans_a else (m, k)), ((n, k) if trans_b else (k, n))
    prefix = (batch,) if batch > 1 else ()
    a, b = store(rng.standard_normal(prefix + a_shape)), store(rng.standard_normal(prefix + b_shape))
    c0 = store(rng.standard_normal(prefix + (m, n)))
    expected = ref(read(a), read(b), trans_a, trans_b, 0.5, -1.5, read(c0))
    solvers = ["GemmTiled", "GemmBlocked"] + (["GemmTensorCore"] if handle.device.backend == "cuda" and dtype != "fp32"
                                              else [])
    for solver in solvers:
        c = c0.copy()
        kdbkit.gemm(handle, a, b, trans_a=trans_a, trans_b=trans_b, alpha=0.5, beta=-1.5, c=c, dtype=dtype,
                    solver=solver)
        # each output sums k products of unit-variance values: its error grows with sqrt(k)
        np.testing.assert_allclose(read(c), expected, rtol=tol * 4, atol=tol * 4 * np.sqrt(k), err_msg=solver)


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_the_blocked_kernel_on_tiles_cut_at_every_edge(handle, trans_a, trans_b):
    """GemmBlocked: 2 x 2 tiles of 128 cut at both edges, K over several steps and not a
    multiple of 8, batched, leading dimensions wider than the matrices, beta reading C."""
    rng = np.random.default_rng(trans_a * 2 + trans_b)
    m, n, k, batch = 200, 150, 37, 2
    a_shape, b_shape = ((k, m + 3) if trans_a else (m, k + 3)), ((n, k + 5) if trans_b else (k, n + 5))
    a = rng.standard_normal((batch, *a_shape)).astype(np.float32)
    b = rng.standard_normal((batch, *b_shape)).astype(np.float32)
    c0 = rng.standard_normal((batch, m, n)).astype(np.float32)
    problem = GemmProblem(DataType.FP32, m, n, k, trans_a, trans_b, batch, a_shape[1], b_shape[1], n,
                          a[0].size, b[0].size, m * n, 0.5, -1.5)
    be = handle.backend
    buffers = [be.to_device(v) for v in (a, b, c0)]
    invoker(handle, problem, REGISTRY.find("GemmBlocked"))(a=buffers[0], b=buffers[1], c=buffers[2])
    op_a = (a[:, :, :m].transpose(0, 2, 1) if trans_a else a[:, :, :k]).astype(np.float64)
    op_b = (b[:, :, :k].transpose(0, 2, 1) if trans_b else b[:, :, :n]).astype(np.float64)
    expected = 0.5 * op_a @ op_b - 1.5 * c0
    np.testing.assert_allclose(be.to_host(buffers[2], np.empty_like(c0)), expected, rtol=1e-5, atol=1e-4)
    for buffer in buffers:
        buffer.free()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("batch", [1, 2])
def test_tile_multiple_sizes(handle, dtype, batch):
    """Sizes the CUDA tensor-core solver's aligned fast path takes (M, N multiples of 128, K of 32)."""
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(batch)
    prefix = (batch,) if batch > 1 else ()
    m, n, k = 256, 384, 96
    a, b = store(rng.standard_normal(prefix + (m, k))), store(rng.standard_normal(prefix + (k, n)))
    c0 = store(rng.standard_normal(prefix + (m, n)))
    c = c0.copy()
    kdbkit.gemm(handle, a, b, alpha=0.75, beta=0.5, c=c, dtype=dtype)
    expected = ref(read(a), read(b), False, False, 0.75, 0.5, read(c0))
    np.testing.assert_allclose(read(c), expected, rtol=tol * 4, atol=tol * 4 * np.sqrt(k))


@pytest.mark.parametrize("kernel", ["gemm_tc_nn", "gemm_tc_nn_k64", "gemm_tc_nn_wide", "gemm_tc_nn_wide_k64",
                                    "gemm_tc_nn_wide_deep"])
@pytest.mark.parametrize("batch", [1, 3])
def test_each_fast_tensor_core_kernel(handle, monkeypatch, kernel, batch):
    """Every fast kernel of gemm_tc.cu, forced (immediate mode takes one by the problem's size),
    on a grid whose tiles span several groups of 8 tile rows and a ragged last group."""
    if handle.device.backend != "cuda":
        pytest.skip("the tensor-core kernels are CUDA only (KDB_TEST_BACKEND=cuda on the GPU machine)")
    from kdbkit.runtime.primitives.gemm.solvers import tensor_core

    monkeypatch.setattr(tensor_core, "fast_kernel", lambda problem, units: kernel)
    store, read, tol = TYPES["bf16"]
    rng = np.random.default_rng(batch)
    prefix = (batch,) if batch > 1 else ()
    m, n, k = 128 * 11, 512, 192  # K a multiple of 64 for gemm_tc_nn_k64
    a, b = store(rng.standard_normal(prefix + (m, k))), store(rng.standard_normal(prefix + (k, n)))
    c0 = store(rng.standard_normal(prefix + (m, n)))
    c = c0.copy()
    kdbkit.gemm(handle, a, b, alpha=0.75, beta=0.5, c=c, dtype="bf16", solver="GemmTensorCore")
    expected = ref(read(a), read(b), False, False, 0.75, 0.5, read(c0))
    np.testing.assert_allclose(read(c), expected, rtol=tol * 4, atol=tol * 4 * np.sqrt(k))


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("batch, shared_b", [(1, False), (3, False), (3, True)])
def test_the_wgmma_solver(handle, trans_b, batch, shared_b):
    """GemmWgmma on sm_90: B transposed into its workspace first or taken as it is, batches
    with their own B or one shared B, tiles over several groups of 8 tile rows."""
    if handle.device.backend != "cuda" or handle.device.target.arch != "sm_90":
        pytest.skip("wgmma needs an sm_90 GPU (KDB_TEST_BACKEND=cuda on the H100 machine)")
    store, read, tol = TYPES["fp16"]
    rng = np.random.default_rng(batch + trans_b)
    m, n, k = 128 * 9, 256, 192
    a = store(rng.standard_normal(((batch,) if batch > 1 else ()) + (m, k)))
    b_shape = (n, k) if trans_b else (k, n)
    b = store(rng.standard_normal(((batch,) if batch > 1 and not shared_b else ()) + b_shape))
    c0 = store(rng.standard_normal(((batch,) if batch > 1 else ()) + (m, n)))
    c = c0.copy()
    kdbkit.gemm(handle, a, b, trans_b=trans_b, alpha=0.5, beta=0.25, c=c, dtype="fp16", solver="GemmWgmma")
    expected = ref(read(a), read(b), False, trans_b, 0.5, 0.25, read(c0))
    np.testing.assert_allclose(read(c), expected, rtol=tol * 4, atol=tol * 4 * np.sqrt(k))


def test_a_shared_matrix_against_a_batch(handle):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((4, 8, 5)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32)
    np.testing.assert_allclose(kdbkit.gemm(handle, a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_solver_choice_config_and_bad_input(handle):
    problem = GemmProblem(DataType.FP16, 64, 32, 16, True, False, 2, 64, 32, 32, 1024, 512, 2048, 1.0, 0.5)
    assert parse_config(problem.config()) == problem
    choice = choose(handle, problem)
    if handle.device.backend == "cuda":  # the GPU run: the H100 has tensor cores
        hopper = handle.device.target.arch_facts.has("wgmma")
        if hopper:  # the TMA kernels take any transposition; 64 x 32 fits the narrowest tile best
            assert choice.solver.name == "GemmTma128x128"
            assert choice.trace[0].startswith("GemmTma128x256: applies, passed over: 128 x 128 tiles fit")
        else:
            assert choice.solver.name == "GemmTensorCore"
            assert choice.trace[0].startswith("GemmTma128x256: rejected, wgmma and TMA need an sm_90 GPU")
            assert choice.trace[3] == "GemmWgmma: rejected, wgmma needs an sm_90 GPU (this is " \
                f"{handle.device.target.arch})"
        fp32 = choose(handle, GemmProblem(DataType.FP32, 4, 4, 4, lda=4, ldb=4, ldc=4))
        assert fp32.solver.name == "GemmTiled" and fp32.trace[4] == "GemmTensorCore: rejected, fp32 is not fp16 or bf16"
        assert fp32.trace[5] == "GemmBlocked: applies, passed over: its 128 x 128 tiles would be 100% empty (M 4, N 4)"
        assert choose(handle, GemmProblem(DataType.FP32, 512, 256, 64, lda=64, ldb=256, ldc=256)).solver.name == \
            "GemmBlocked"
        whole = choose(handle, GemmProblem(DataType.BF16, 256, 384, 128, lda=128, ldb=384, ldc=384))
        assert whole.solver.name.startswith("GemmTma" if hopper else "GemmTensorCore")
    else:
        assert choice.solver.name == "GemmBlocked"  # 64 x 32 of its 128 x 128 tile: an eighth, enough
        assert choice.trace[0].startswith("GemmTma128x256: rejected, wgmma and TMA need an sm_90 GPU")
        assert choice.trace[3].startswith("GemmWgmma: rejected, wgmma needs an sm_90 GPU")
        assert choice.trace[4].startswith("GemmTensorCore: rejected, tensor cores through mma.sync are CUDA only")
        with pytest.raises(NoSolverError, match="GemmTensorCore does not apply"):
            kdbkit.gemm(handle, np.ones((4, 4), np.float16), np.ones((4, 4), np.float16), solver="GemmTensorCore")
    with pytest.raises(ProblemError, match="op\\(a\\) is 2x3 but op\\(b\\) is 4x2"):
        kdbkit.gemm(handle, np.ones((2, 3), np.float32), np.ones((4, 2), np.float32))
    with pytest.raises(ProblemError, match="a has 2 matrices, b 3"):
        kdbkit.gemm(handle, np.ones((2, 2, 2), np.float32), np.ones((3, 2, 2), np.float32))
    with pytest.raises(ProblemError, match="1-D; gemm takes matrices"):
        kdbkit.gemm(handle, np.ones(4, np.float32), np.ones((4, 2), np.float32))
    with pytest.raises(ProblemError, match="lda=2 is smaller"):
        GemmProblem(DataType.FP32, 4, 4, 4, lda=2, ldb=4, ldc=4)
