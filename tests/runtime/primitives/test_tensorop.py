"""Tensor operations on the chain device against NumPy: every op, broadcasting, alpha/beta, each type."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.immediate import choose
from kdbkit.runtime.primitives.tensorop import TensorOpProblem
from kdbkit.runtime.primitives.tensorop.solvers.strided import rows_geometry
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc

from .conftest import TYPES

NUMPY_OPS = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("op", list(NUMPY_OPS))
@pytest.mark.parametrize("a_shape, b_shape", [((3, 5), (3, 5)), ((2, 3, 4, 5), (1, 3, 1, 1)), ((2, 3, 7), (7,)),
                                              ((1, 2, 3, 4, 5), (1, 2, 1, 4, 1))])
def test_ops_with_broadcasting_match_numpy(handle, op, dtype, a_shape, b_shape):
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(len(a_shape) * 10 + len(op))
    a, b, c0 = (store(rng.standard_normal(s)) for s in (a_shape, b_shape, a_shape))
    c = c0.copy()
    kdbkit.op_tensor(handle, op, a, b, alpha1=0.5, alpha2=-2.0, beta=0.25, c=c, dtype=dtype)
    expected = NUMPY_OPS[op](0.5 * read(a).astype(np.float64), -2.0 * read(b)) + 0.25 * read(c0)
    np.testing.assert_allclose(read(c), expected, rtol=tol, atol=tol * 4)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("op", ["add", "max"])
def test_packed_ops_over_many_groups_and_a_tail(handle, op, dtype):
    # Thousands of 16-byte vectors (many groups of one-vector threads) and a last partial vector.
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(13)
    a, b, c0 = (store(rng.standard_normal(256 * 4 * 29 + 3)) for _ in range(3))
    for beta in (0.0, 0.5):
        c = c0.copy()
        kdbkit.op_tensor(handle, op, a, b, alpha1=1.5, beta=beta, c=c, dtype=dtype, solver="OpTensorPacked")
        expected = NUMPY_OPS[op](1.5 * read(a).astype(np.float64), read(b)) + beta * read(c0)
        np.testing.assert_allclose(read(c), expected, rtol=tol, atol=tol * 4)


def test_solver_choice_and_the_result_array(handle):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(kdbkit.op_tensor(handle, "max", a, a[::-1].copy()), np.maximum(a, a[::-1]))
    same = TensorOpProblem("add", DataType.FP32, (3, 4), (4, 1), (3, 4), (4, 1), (4, 1))
    assert choose(handle, same).solver.name == "OpTensorPacked"
    broadcast = TensorOpProblem("add", DataType.FP32, (3, 4), (4, 1), (1, 4), (4, 1), (4, 1))
    choice = choose(handle, broadcast)
    assert choice.solver.name == "OpTensorStrided" and choice.trace[0] == "OpTensorPacked: rejected, b broadcasts"
    assert parse_config(broadcast.config()) == broadcast
    assert broadcast.config() == "tensorop,op=add,type=fp32,shape=3x4,as=4x1,bshape=1x4,bs=4x1,cs=4x1,a1=1.0,a2=1.0,b=0.0"


T, H, D = 6, 3, 16  # tokens, heads, head size: rows of 16 elements, whole 16-byte vectors in every type
SPLIT = TensorOpProblem("add", DataType.FP16, (T, H, D), (H * D, D, 1), (1, H, D), (H * D, D, 1), (D, T * D, 1))


@pytest.mark.parametrize("dtype", list(TYPES))
def test_a_bias_added_along_rows_and_heads_split_through_permuted_strides(handle, dtype):
    """The layouts op_tensor_rows takes 16 bytes at a time (a linear layer's bias; BERT's
    projection into heads, written head-major), against NumPy, with beta both ways."""
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(7)
    x, bias = store(rng.standard_normal((T * 4, 40))), store(rng.standard_normal(40))
    y = kdbkit.op_tensor(handle, "add", x, bias, alpha2=0.5, dtype=dtype)
    np.testing.assert_allclose(read(y), read(x) + 0.5 * read(bias), rtol=tol, atol=tol * 4)
    be = handle.backend
    x, bias, c0 = store(rng.standard_normal((T, H, D))), store(rng.standard_normal((1, H, D))), rng.standard_normal((H, T, D))
    head_major = TensorDesc(DataType.parse(dtype), (T, H, D), (D, T * D, 1))
    for beta in (0.0, 0.5):
        c = DeviceTensor(be.to_device(store(c0)), head_major)
        kdbkit.op_tensor(handle, "max", x, bias, beta=beta, c=c, dtype=dtype)
        got = be.to_host(c.buffer, store(c0).copy())
        want = np.maximum(read(x), read(bias)).transpose(1, 0, 2) + beta * read(store(c0))
        np.testing.assert_allclose(read(got), want, rtol=tol, atol=tol * 4)


def test_which_layouts_go_16_bytes_at_a_time():
    assert rows_geometry(SPLIT) is not None
    bias = TensorOpProblem("add", DataType.FP16, (4096, 3072), (3072, 1), (3072,), (1,), (3072, 1))
    vectors, per_row, d1, d2, d3, *strides = rows_geometry(bias)
    assert (vectors, per_row, d1, d2, d3) == (4096 * 384, 384, 1, 1, 4096)
    assert strides == [0, 0, 0, 384, 0, 0, 0, 0, 0, 0, 0, 384]  # a, b (broadcast: 0), c, in vectors
    merge = TensorOpProblem("max", DataType.FP16, (32, 128, 12, 64), (8192, 64, 262144, 1), (32, 128, 12, 64),
                            (8192, 64, 262144, 1), (98304, 768, 64, 1))
    assert rows_geometry(merge) is not None
    fp32_rows_of_6 = TensorOpProblem("add", DataType.FP32, (5, 6), (6, 1), (6,), (1,), (6, 1))
    per_column = TensorOpProblem("add", DataType.FP16, (4, 16), (16, 1), (4, 1), (1, 1), (16, 1))
    column_major = TensorOpProblem("add", DataType.FP16, (16, 16), (1, 16), (16, 16), (1, 16), (16, 1))
    odd_row_stride = TensorOpProblem("add", DataType.FP16, (4, 16), (20, 1), (16,), (1,), (16, 1))
    for problem in (fp32_rows_of_6, per_column, column_major, odd_row_stride):  # element by element
        assert rows_geometry(problem) is None, problem


def test_bad_input(handle):
    a = np.ones((3, 4), np.float32)
    with pytest.raises(ProblemError, match="b's size 3 in dimension 1 neither is 1 nor matches a's 4"):
        kdbkit.op_tensor(handle, "add", a, np.ones((3, 3), np.float32))
    with pytest.raises(ProblemError, match="more dimensions than a"):
        kdbkit.op_tensor(handle, "add", a, np.ones((1, 3, 4), np.float32))
    with pytest.raises(ProblemError, match="tensor op 'sub'"):
        kdbkit.op_tensor(handle, "sub", a, a)
    with pytest.raises(ProblemError, match="b holds fp16 elements, a fp32"):
        kdbkit.op_tensor(handle, "add", a, a.astype(np.float16))


def test_a_0d_array_comes_back_0d(handle):
    """A 0-d input was returned with shape (1,)."""
    c = kdbkit.op_tensor(handle, "mul", np.array(2.0, np.float32), np.array(3.5, np.float32))
    assert c.shape == () and c == 7.0
