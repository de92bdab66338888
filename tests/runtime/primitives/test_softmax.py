"""Softmax on the chain device against the NumPy reference: algorithms, modes, types, both solvers."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import NoSolverError, ProblemError
from kdbkit.runtime.immediate import choose
from kdbkit.runtime.primitives.softmax import SoftmaxProblem
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.reference import softmax as ref
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc

from kdbkit.runtime.primitives import lanes

from .conftest import TYPES


@pytest.mark.parametrize("solver", ["SoftmaxThread", "SoftmaxBlock"])
@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("algorithm", ["fast", "accurate", "log"])
@pytest.mark.parametrize("mode", ["instance", "channel"])
def test_forward_and_backward_match_the_reference(handle, mode, algorithm, dtype, solver):
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(len(mode) + len(algorithm))
    shape = (3, 5, 2, 7) if mode == "channel" else (2, 3, 3, 5)
    x = store(rng.standard_normal(shape) * 2)
    y = kdbkit.softmax_forward(handle, x, algorithm=algorithm, mode=mode, dtype=dtype, solver=solver)
    np.testing.assert_allclose(read(y), ref.forward(read(x), algorithm, mode), rtol=tol, atol=tol)
    rows = kdbkit.softmax_forward(handle, x, algorithm=algorithm, mode=mode, dtype=dtype, solver="SoftmaxRows")
    np.testing.assert_allclose(read(rows), ref.forward(read(x), algorithm, mode), rtol=tol, atol=tol)
    dy = store(rng.standard_normal(shape))
    dx = kdbkit.softmax_backward(handle, y, dy, algorithm=algorithm, mode=mode, dtype=dtype, solver=solver)
    np.testing.assert_allclose(read(dx), ref.backward(read(y), read(dy), algorithm, mode), rtol=tol, atol=tol)


def test_two_dimensional_input_and_alpha_beta(handle):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 33)).astype(np.float32)
    y = rng.standard_normal((4, 33)).astype(np.float32)
    expected = 0.5 * ref.forward(x) + 2.0 * y
    out = kdbkit.softmax_forward(handle, x, alpha=0.5, beta=2.0, y=y)
    assert out is y
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_long_rows_go_to_the_block_solver_and_nhwc_strides_work(handle):
    n, c, h, w = 2, 4, 3, 5
    rng = np.random.default_rng(4)
    nhwc = rng.standard_normal((n, h, w, c)).astype(np.float32)
    be = handle.backend
    x = DeviceTensor(be.to_device(nhwc), TensorDesc(DataType.FP32, (n, c, h, w), (h * w * c, 1, w * c, c)))
    y = kdbkit.softmax_forward(handle, x, mode="channel")
    expected = ref.forward(nhwc.transpose(0, 3, 1, 2), "accurate", "channel")
    np.testing.assert_allclose(y.to_host(be), expected, rtol=1e-5, atol=1e-6)
    long_rows = SoftmaxProblem("fwd", "accurate", "instance", DataType.FP32, (2, 41, 5, 7), (1435, 35, 7, 1),
                               (1435, 35, 7, 1))
    choice = choose(handle, long_rows)
    assert choice.solver.name == "SoftmaxBlock"
    assert list(choice.trace[:2]) == ["SoftmaxLanes: rejected, rows of 1435 elements are not whole 16-byte vectors of 4",
                                "SoftmaxThread: rejected, rows of 1435 elements; one thread per row takes at most 64"]
    with pytest.raises(NoSolverError, match="SoftmaxThread does not apply"):
        kdbkit.softmax_forward(handle, np.ones((2, 40, 6, 6), np.float32), mode="instance", solver=3)


def test_config_strings_round_trip_and_bad_input(handle):
    problem = SoftmaxProblem("bwd", "log", "instance", DataType.FP16, (2, 3, 1, 1), (3, 1, 1, 1), (3, 1, 1, 1), 1.0,
                             0.5)
    assert parse_config(problem.config()) == problem
    assert problem.config().startswith("softmax,dir=bwd,algo=log,mode=instance,type=fp16,shape=2x3x1x1")
    with pytest.raises(ProblemError, match="N x C or N x C x H x W tensor, not 3-D"):
        kdbkit.softmax_forward(handle, np.ones((2, 3, 4), np.float32))
    with pytest.raises(ProblemError, match="softmax algorithm 'exact'"):
        kdbkit.softmax_forward(handle, np.ones((2, 3), np.float32), algorithm="exact")
    with pytest.raises(ProblemError, match="softmax mode 'spatial'"):
        parse_config(problem.config().replace("instance", "spatial"))


def test_rows_too_long_for_registers_take_the_three_pass_path(handle):
    x = np.random.default_rng(8).standard_normal((2, 3, 30, 30)).astype(np.float32)  # rows of 2700 > 256 * 8
    for algorithm in ("fast", "accurate", "log"):
        y = kdbkit.softmax_forward(handle, x, algorithm=algorithm, mode="instance", solver="SoftmaxBlock")
        np.testing.assert_allclose(y, ref.forward(x, algorithm, "instance"), rtol=1e-5, atol=1e-6)


def test_the_rows_solver_on_rows_of_65_to_1024_and_odd_counts(handle):
    rng = np.random.default_rng(12)
    for shape in [(13, 65), (9, 1024), (1, 300)]:  # row counts that do not fill the last group of 8
        x = rng.standard_normal(shape).astype(np.float32) * 3
        for algorithm in ("fast", "accurate", "log"):
            y = kdbkit.softmax_forward(handle, x, algorithm=algorithm)
            np.testing.assert_allclose(y, ref.forward(x, algorithm, "channel"), rtol=1e-5, atol=1e-6)
    from kdbkit.runtime.primitives.softmax import SoftmaxProblem as P

    assert choose(handle, P("fwd", "accurate", "channel", DataType.FP32, (9, 1020, 1, 1), (1020, 1, 1, 1),
                            (1020, 1, 1, 1))).solver.name == "SoftmaxLanes"
    assert choose(handle, P("fwd", "accurate", "channel", DataType.FP32, (9, 1022, 1, 1), (1022, 1, 1, 1),
                            (1022, 1, 1, 1))).solver.name == "SoftmaxRows"


# Rows of 8 to 16384 elements: one lane per row, runs within a warp, runs across warps (through
# shared memory), and the long-row program; row counts that leave the last group part-empty.
LANE_SHAPES = [(5, 8), (7, 24), (33, 256), (3, 1024), (3, 8192), (2, 12288)]
# 12288 elements are whole vectors of 16-bit types within the long-row program's reach, not of fp32
LANE_CASES = [(rows, length, dtype) for rows, length in LANE_SHAPES for dtype in TYPES
              if length // (16 // DataType.parse(dtype).itemsize) <= lanes.MAX_VECTORS]


@pytest.mark.parametrize("rows,length,dtype", LANE_CASES, ids=lambda v: str(v))
def test_the_lanes_solver_forward_and_backward_with_alpha_and_beta(handle, rows, length, dtype):
    from kdbkit.runtime.primitives.softmax.solvers.lanes import tile

    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(rows + length)
    x = store(rng.standard_normal((rows, length)) * 3)
    for algorithm in ("fast", "accurate", "log"):
        prior = store(rng.standard_normal((rows, length)))
        expected = 0.5 * ref.forward(read(x), algorithm, "channel") + 0.25 * read(prior)
        y = kdbkit.softmax_forward(handle, x, algorithm=algorithm, alpha=0.5, beta=0.25, y=prior, dtype=dtype,
                                   solver="SoftmaxLanes")
        np.testing.assert_allclose(read(y), expected, rtol=tol, atol=tol * 2, err_msg=algorithm)
        y = kdbkit.softmax_forward(handle, x, algorithm=algorithm, dtype=dtype, solver="SoftmaxLanes")
        dy = store(rng.standard_normal((rows, length)))
        dx = kdbkit.softmax_backward(handle, y, dy, algorithm=algorithm, dtype=dtype, solver="SoftmaxLanes")
        np.testing.assert_allclose(read(dx), ref.backward(read(y), read(dy), algorithm, "channel"), rtol=tol * 2,
                                   atol=tol * 2, err_msg=algorithm)
    per = 16 // DataType.parse(dtype).itemsize
    problem = SoftmaxProblem("fwd", "accurate", "channel", DataType.parse(dtype), (rows, length, 1, 1), (length, 1, 1, 1),
                             (length, 1, 1, 1))
    vecs, width = tile(problem)
    assert width * vecs >= length // per and vecs in (lanes.SHORT, lanes.LONG) and width & (width - 1) == 0


def test_instance_mode_over_a_non_packed_tensor_takes_the_general_kernels(handle):
    n, c, h, w = 2, 3, 4, 5
    nhwc = np.random.default_rng(14).standard_normal((n, h, w, c)).astype(np.float32)
    be = handle.backend
    x = DeviceTensor(be.to_device(nhwc), TensorDesc(DataType.FP32, (n, c, h, w), (h * w * c, 1, w * c, c)))
    expected = ref.forward(nhwc.transpose(0, 3, 1, 2), "accurate", "instance")
    for solver in ("SoftmaxBlock", "SoftmaxThread"):
        y = kdbkit.softmax_forward(handle, x, mode="instance", solver=solver)
        np.testing.assert_allclose(y.to_host(be), expected, rtol=1e-5, atol=1e-6, err_msg=solver)
    with pytest.raises(NoSolverError, match="SoftmaxRows does not apply.*not evenly spaced"):
        kdbkit.softmax_forward(handle, x, mode="instance", solver="SoftmaxRows")


def test_unaligned_tensors_take_the_fallback_solver(handle, monkeypatch):
    """SoftmaxLanes hands a call whose tensors are not 16-byte aligned (seen on CUDA: a view at an
    odd offset) to SoftmaxBlock's invoker, made by the dispatcher on that first call (solver.fallback_invoker)."""
    from kdbkit.runtime.primitives.softmax.solvers import lanes as lanes_solver

    built = []
    from kdbkit.runtime.solver import REGISTRY

    block = REGISTRY.find("SoftmaxBlock")
    real_solution = type(block).solution
    monkeypatch.setattr(type(block), "solution", lambda self, p, d: built.append(p) or real_solution(self, p, d))
    monkeypatch.setattr(lanes_solver, "aligned16", lambda *tensors: False)
    x = np.random.default_rng(21).standard_normal((6, 64)).astype(np.float32)
    for _ in range(2):
        y = kdbkit.softmax_forward(handle, x, solver="SoftmaxLanes")
        np.testing.assert_allclose(y, ref.forward(x), rtol=1e-5, atol=1e-6)
    assert len(built) == 1  # built once, on the first unaligned call


@pytest.mark.parametrize("algorithm", ["accurate", "log"])
@pytest.mark.parametrize("cols", [128, 1024, 2048])  # one warp, two, eight of lanes per row
def test_masked_rows_with_whole_threads_of_minus_infinity(handle, algorithm, cols):
    # An attention mask: stretches of -inf wider than one thread's elements, so some threads of
    # a row take their own maximum off nothing but -inf (SoftmaxLanes combines per-thread sums).
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((6, cols)) * 4).astype(np.float32)
    x[:, cols // 8: cols // 2] = -np.inf
    x[1, : cols - 1] = -np.inf  # one element left in the row
    y = kdbkit.softmax_forward(handle, x, algorithm=algorithm, mode="instance", solver="SoftmaxLanes")
    np.testing.assert_allclose(y, ref.forward(x, algorithm, "instance"), rtol=1e-5, atol=1e-6)
