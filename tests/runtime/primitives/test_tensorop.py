"""Tensor operations on the chain device against NumPy: every op, broadcasting, alpha/beta, each type."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.immediate import choose
from kdbkit.runtime.primitives.tensorop import TensorOpProblem
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.tensor import DataType

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
