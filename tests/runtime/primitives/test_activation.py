"""Activations on the chain device against the NumPy reference: every mode, both directions, each type."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import NoSolverError, ProblemError
from kdbkit.runtime.immediate import choose
from kdbkit.runtime.primitives.activation import ActivationMode, ActivationProblem
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.reference import activation as ref
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc

from .conftest import TYPES

_erfc = np.vectorize(math.erfc, otypes=[np.float64])
PARAMS = {"alpha": 0.7, "beta": 1.3, "gamma": 2.0}
SHAPES = [(7,), (3, 5), (2, 3, 5, 7), (1, 3, 1, 17, 2)]


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("mode", list(ActivationMode), ids=lambda m: m.label)
def test_forward_and_backward_match_the_reference(handle, mode, dtype):
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(int(mode))
    shape = SHAPES[int(mode) % len(SHAPES)]
    x = store(rng.standard_normal(shape) * 2)
    dy = store(rng.standard_normal(shape))
    y = kdbkit.activation_forward(handle, x, mode, dtype=dtype, **PARAMS)
    expected = ref.forward(read(x), int(mode), **PARAMS)
    np.testing.assert_allclose(read(y), expected, rtol=tol, atol=tol)
    dx = kdbkit.activation_backward(handle, x, y, dy, mode, dtype=dtype, **PARAMS)
    expected_dx = ref.backward(read(x), read(y), read(dy), int(mode), **PARAMS)
    np.testing.assert_allclose(read(dx), expected_dx, rtol=tol, atol=tol)
    assert dx.dtype == x.dtype and dx.shape == x.shape


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("mode", ["relu", "leaky_relu", "clipped-relu", "abs", "gelu"])  # the spellings PyTorch and MIOpen use
def test_packed_forward_over_many_groups_and_a_tail(handle, mode, dtype):
    # Thousands of 16-byte vectors (many groups, one vector per thread in activ_fwd_vec_light,
    # four in activ_fwd_vec) and a last partial vector.
    store, read, tol = TYPES[dtype]
    x = store(np.random.default_rng(11).standard_normal(128 * 8 * 37 + 5) * 2)
    y = kdbkit.activation_forward(handle, x, mode, dtype=dtype, solver="ActivPacked", **PARAMS)
    np.testing.assert_allclose(read(y), ref.forward(read(x), int(ActivationMode.parse(mode)), **PARAMS),
                               rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_16_bit_gelu_is_within_a_unit_of_the_exact_value_into_the_tails(handle, dtype):
    # Every input of the type in [-12, 12] (the 16-bit kernels' own erfc formulation): each
    # result within one unit in the last place of the exact gelu, also where it is tiny (x < 0),
    # which 0.5 * x * (1 + erff(x / sqrt 2)) in fp32 misses by cancellation.
    store, read, _ = TYPES[dtype]
    grid = np.linspace(-12, 12, 200_001)
    x = read(store(grid))
    exact = 0.5 * x.astype(np.float64) * _erfc(-x.astype(np.float64) / math.sqrt(2.0))
    got = read(kdbkit.activation_forward(handle, store(x), "gelu", dtype=dtype)).astype(np.float64)
    if dtype == "fp16":
        unit = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    else:
        unit = np.maximum(np.abs(exact) * 2.0**-7, 1e-38)
    worst = np.argmax(np.abs(got - exact) / unit)
    assert np.abs(got - exact)[worst] <= unit[worst], f"x={x[worst]}: {got[worst]} against {exact[worst]}"


def test_which_modes_take_the_light_kernel():
    from kdbkit.runtime.primitives.activation.solvers.packed import light_kernel

    def problem(direction, mode, dtype):
        return ActivationProblem(direction, ActivationMode.parse(mode), DataType.parse(dtype), (8,), (1,), (1,))

    assert light_kernel(problem("fwd", "relu", "fp16")) and light_kernel(problem("fwd", "leaky_relu", "bf16"))
    assert not light_kernel(problem("fwd", "gelu", "fp16"))  # 8 erf a vector: four vectors a thread
    assert not light_kernel(problem("fwd", "gelu", "fp32")) and light_kernel(problem("fwd", "sigmoid", "fp32"))
    assert not light_kernel(problem("fwd", "softrelu", "fp32")) and not light_kernel(problem("fwd", "power", "fp32"))
    assert not light_kernel(problem("bwd", "relu", "fp32"))


def test_the_light_kernel_s_residency_cap(handle):
    """activ_fwd_vec_light runs a little below full occupancy on CUDA where that keeps enough in
    flight (an H100's bandwidth per multiprocessor): the dynamic shared memory residency_cap asks
    for leaves exactly the groups wanted (the least that does); no cap where the backend has no
    occupancy calculator."""
    from kdbkit.runtime.primitives.activation.solvers.packed import LIGHT_BLOCK, light_groups_per_unit
    from kdbkit.runtime.solver import residency_cap

    from .test_streaming_launch import H100

    LIGHT_GROUPS_PER_UNIT = light_groups_per_unit(H100)
    kernel = handle.program("activ.c").function("activ_fwd_vec_light")
    shared = residency_cap(handle, kernel, LIGHT_BLOCK, LIGHT_GROUPS_PER_UNIT)
    if handle.device.backend != "cuda":
        assert shared == 0
        return
    resident = handle.backend.resident_groups
    assert resident(kernel, LIGHT_BLOCK, 0) > LIGHT_GROUPS_PER_UNIT  # the cap is needed
    assert resident(kernel, LIGHT_BLOCK, shared) <= LIGHT_GROUPS_PER_UNIT < resident(kernel, LIGHT_BLOCK, shared - 256)


def test_strided_device_tensors_take_the_strided_solver(handle):
    be = handle.backend
    rng = np.random.default_rng(3)
    padded = rng.standard_normal((4, 6, 9)).astype(np.float32)  # the tensor is padded[:, :5, :7]
    x = DeviceTensor(be.to_device(padded), TensorDesc(DataType.FP32, (4, 5, 7), (54, 9, 1)))
    y = DeviceTensor.empty(be, TensorDesc.packed("fp32", (4, 5, 7)))
    out = kdbkit.activation_forward(handle, x, "elu", alpha=0.5, y=y)
    assert out is y
    np.testing.assert_allclose(y.to_host(be), ref.forward(padded[:, :5, :7], 9, alpha=0.5), rtol=1e-5, atol=1e-6)
    problem = ActivationProblem("fwd", ActivationMode.ELU, DataType.FP32, (4, 5, 7), (54, 9, 1), (35, 7, 1), 0.5)
    choice = choose(handle, problem)
    assert choice.solver.name == "ActivStrided"
    assert choice.trace[0] == "ActivPacked: rejected, the tensors are not packed"
    with pytest.raises(NoSolverError, match="ActivPacked does not apply .*not packed"):
        kdbkit.activation_forward(handle, x, "elu", alpha=0.5, y=y, solver="ActivPacked")


def test_both_solvers_agree_on_packed_tensors(handle):
    x = np.random.default_rng(5).standard_normal(1001).astype(np.float32)
    by_packed = kdbkit.activation_forward(handle, x, "gelu-tanh", solver=1)
    by_strided = kdbkit.activation_forward(handle, x, "gelu-tanh", solver="ActivStrided")
    np.testing.assert_array_equal(by_packed, by_strided)


def test_in_place_and_output_arrays(handle):
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    expected = np.maximum(x, 0)
    out = np.empty_like(x)
    assert kdbkit.activation_forward(handle, x, "relu", y=out) is out
    np.testing.assert_array_equal(out, expected)
    kdbkit.activation_forward(handle, x, "relu", y=x)
    np.testing.assert_array_equal(x, expected)


def test_config_strings_round_trip():
    problem = ActivationProblem("bwd", ActivationMode.POWER, DataType.BF16, (2, 3), (3, 1), (3, 1), 1.0, 0.5, 3.0)
    text = problem.config()
    assert text == "activ,dir=bwd,mode=power,type=bf16,shape=2x3,xs=3x1,ys=3x1,a=1.0,b=0.5,g=3.0"
    assert parse_config(text) == problem


@pytest.mark.parametrize("text, match", [
    ("convolution,dir=fwd", "names no known primitive"),
    ("activ,dir=fwd,mode=relu,type=fp32,shape=2x3,xs=3x1", "has no ys="),
    ("activ,dir=sideways,mode=relu,type=fp32,shape=2,xs=1,ys=1", "direction 'sideways'"),
    ("activ,dir=fwd,mode=swish,type=fp32,shape=2,xs=1,ys=1", "unknown activation mode 'swish'"),
    ("activ,dir=fwd,mode=relu,type=fp64,shape=2,xs=1,ys=1", "unsupported data type 'fp64'"),
    ("activ,dir=fwd,mode=relu,type=fp32,shape=2x0,xs=1x1,ys=1x1", "size below 1"),
    ("activ,dir=fwd,mode=relu,type=fp32,shape=2xA,xs=1,ys=1", "not sizes separated by 'x'"),
    ("activ,dir=fwd,mode=relu,type=fp32,shape=2,xs=1,ys=1,a=zero", "a='zero' is not a number"),
    ("activ,dir=fwd,mode=relu,type=fp32,shape=2,xs=1,ys=1,colour=red", "unknown keys colour"),
    ("activ,dir=fwd,dir=bwd", "not a new key=value pair"),
])
def test_malformed_config_strings_are_named(text, match):
    with pytest.raises(ProblemError, match=match):
        parse_config(text)


def test_bad_arguments_are_refused_before_any_launch(handle):
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ProblemError, match="y is fp32 2x2 but must be fp32 2x3"):
        kdbkit.activation_forward(handle, x, y=np.ones((2, 2), np.float32))
    with pytest.raises(ProblemError, match="unsupported data type"):
        kdbkit.activation_forward(handle, x.astype(np.float64))
    with pytest.raises(ProblemError, match="size below 1"):
        kdbkit.activation_forward(handle, np.ones((0, 3), np.float32))
    with pytest.raises(ProblemError, match="x holds fp32 elements but dtype=fp16"):
        kdbkit.activation_forward(handle, x, dtype="fp16")
    with pytest.raises(ProblemError, match="dy is .* x is"):
        kdbkit.activation_backward(handle, x, x, np.ones((3, 2), np.float32))
    with pytest.raises(ProblemError, match="x is a list"):
        kdbkit.activation_forward(handle, [1.0, 2.0])
    with pytest.raises(NoSolverError, match="no activ solver 'Nope'"):
        kdbkit.activation_forward(handle, x, solver="Nope")



def test_a_0d_array_comes_back_0d(handle):
    """A 0-d input was returned with shape (1,)."""
    y = kdbkit.activation_forward(handle, np.array(-2.0, np.float32), "relu")
    assert y.shape == () and y == 0.0
    dx = kdbkit.activation_backward(handle, np.array(3.0, np.float32), np.array(3.0, np.float32),
                                    np.array(5.0, np.float32), "relu")
    assert dx.shape == () and dx == 5.0
