"""Pooling on the chain device against the NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.pooling import PoolProblem
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.reference import pooling as ref
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc

from .conftest import TYPES

# Windows up to 3 x 3 take the unrolled kernel (pool_fwd_small); 4 x 5 the general one.
GEOMETRIES = [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)), ((3, 2), (1, 2), (1, 0)), ((2, 3), (3, 1), (0, 1)),
              ((4, 5), (2, 3), (1, 2))]


@pytest.mark.parametrize("solver", ["PoolBand", "PoolDirect"])
@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("mode", ["max", "avg", "avg_in"])
@pytest.mark.parametrize("window, stride, pad", GEOMETRIES)
def test_forward_and_backward_match_the_reference(handle, mode, dtype, window, stride, pad, solver):
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(sum(window) + sum(stride))
    shape = (2, 3, 11, 9)  # runs of four outputs down a column that end past the last row
    x = store(rng.standard_normal(shape))
    y, indices = kdbkit.pooling_forward(handle, x, mode=mode, window=window, stride=stride, pad=pad, dtype=dtype,
                                        solver=solver)
    ry, ridx = ref.forward(read(x), mode, window, stride, pad)
    np.testing.assert_allclose(read(y), ry, rtol=tol, atol=tol)
    if mode == "max":
        np.testing.assert_array_equal(indices, ridx)
    else:
        assert indices is None
    dy = store(rng.standard_normal(ry.shape))
    dx = kdbkit.pooling_backward(handle, dy, shape, mode=mode, window=window, stride=stride, pad=pad,
                                 indices=indices, dtype=dtype)
    expected = ref.backward(read(dy), shape, ridx, mode, window, stride, pad)
    np.testing.assert_allclose(read(dx), expected, rtol=tol * 4, atol=tol * 4)


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("width", [1000, 999])  # rows of whole 16-byte vectors, and not
def test_the_band_solver_over_several_bands_per_plane(handle, dtype, width):
    """Rows of 1000 elements: a band of 6 input rows, so each plane takes several bands."""
    from kdbkit.runtime.primitives.pooling.solvers.band import band_rows

    store, read, tol = TYPES[dtype]
    x = store(np.random.default_rng(width).standard_normal((2, 2, 23, width)))
    for mode, save in (("max", True), ("max", False), ("avg_in", False), ("avg", False)):
        y, indices = kdbkit.pooling_forward(handle, x, mode=mode, window=3, stride=2, pad=1, dtype=dtype,
                                            save_indices=save)
        ry, ridx = ref.forward(read(x), mode, (3, 3), (2, 2), (1, 1))
        np.testing.assert_allclose(read(y), ry, rtol=tol, atol=tol, err_msg=f"{mode} {save}")
        if save:
            np.testing.assert_array_equal(indices, ridx)
    problem = PoolProblem("fwd", "max", DataType.FP32, (2, 2, 23, width), (3, 3), (2, 2), (1, 1),
                          (46 * width, 23 * width, width, 1), (2 * 12 * 500, 12 * 500, 500, 1))
    assert band_rows(problem) == 2  # 6 rows staged: outputs 2 rows at a time, 6 bands per plane


def test_device_tensors_keep_the_indices_on_the_device(handle):
    be = handle.backend
    x = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)
    xt = DeviceTensor.from_host(be, x)
    y, indices = kdbkit.pooling_forward(handle, xt, window=3, stride=3)
    assert isinstance(y, DeviceTensor) and not isinstance(indices, np.ndarray)
    dy = DeviceTensor.from_host(be, np.ones((1, 2, 2, 2), np.float32))
    dx = kdbkit.pooling_backward(handle, dy, (1, 2, 6, 6), window=3, stride=3, indices=indices)
    ry, ridx = ref.forward(x, "max", (3, 3), (3, 3), (0, 0))
    np.testing.assert_allclose(y.to_host(be), ry, rtol=1e-6)
    np.testing.assert_allclose(dx.to_host(be), ref.backward(np.ones((1, 2, 2, 2)), x.shape, ridx, "max", (3, 3),
                                                            (3, 3), (0, 0)))
    indices.free()


def test_config_and_bad_input(handle):
    problem = PoolProblem("bwd", "avg_in", DataType.FP16, (2, 3, 8, 8), (2, 2), (2, 2), (1, 1), (192, 64, 8, 1),
                          (75, 25, 5, 1))
    assert parse_config(problem.config()) == problem
    x = np.ones((1, 1, 4, 4), np.float32)
    with pytest.raises(ProblemError, match="leaves no output"):
        kdbkit.pooling_forward(handle, x, window=5)
    with pytest.raises(ProblemError, match="pad .* is not smaller than the window"):
        kdbkit.pooling_forward(handle, x, window=2, pad=2)
    with pytest.raises(ProblemError, match="pooling mode 'median'"):
        kdbkit.pooling_forward(handle, x, mode="median")
    with pytest.raises(ProblemError, match="3-D; pooling takes N x C x H x W"):
        kdbkit.pooling_forward(handle, np.ones((1, 4, 4), np.float32))
    with pytest.raises(ProblemError, match="needs the indices"):
        kdbkit.pooling_backward(handle, np.ones((1, 1, 2, 2), np.float32), (1, 1, 4, 4))
    with pytest.raises(ProblemError, match=r"dy is \(1, 1, 3, 3\), but pooling"):
        kdbkit.pooling_backward(handle, np.ones((1, 1, 3, 3), np.float32), (1, 1, 4, 4), mode="avg")


def test_more_planes_than_a_grid_z_takes_the_one_dimensional_kernel(handle):
    x = np.random.default_rng(5).standard_normal((65536 + 3, 1, 2, 3)).astype(np.float32)  # N * C > 65535
    y, indices = kdbkit.pooling_forward(handle, x, window=2, stride=1)
    ry, ridx = ref.forward(x, "max", (2, 2), (1, 1), (0, 0))
    np.testing.assert_allclose(y, ry, rtol=1e-6)
    np.testing.assert_array_equal(indices, ridx)


# PoolStrip's geometries, each with a top pad of its own (any is taken), on widths of whole
# 16-byte vectors (16 or 32 elements: the vector reads) and not (13: element by element), and
# heights whose last strip of four output rows ends past the last row.
STRIP_CASES = [(3, 2, (1, 1)), (3, 2, (0, 1)), (3, 2, (0, 0)), (3, 2, (2, 0)), (2, 2, (0, 0)), (2, 2, (1, 0)),
               (3, 1, (1, 1)), (3, 1, (0, 1))]


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("window, stride, pad", STRIP_CASES)
@pytest.mark.parametrize("width", [16, 32, 13])
def test_the_strip_solver_matches_the_reference(handle, dtype, window, stride, pad, width):
    store, read, tol = TYPES[dtype]
    shape = (2, 3, 14, width)
    x = store(np.random.default_rng(width + window + pad[0]).standard_normal(shape))
    for mode, save in (("max", True), ("max", False), ("avg", False), ("avg_in", False)):
        y, indices = kdbkit.pooling_forward(handle, x, mode=mode, window=window, stride=stride, pad=pad, dtype=dtype,
                                            save_indices=save, solver="PoolStrip")
        ry, ridx = ref.forward(read(x), mode, (window,) * 2, (stride,) * 2, pad)
        np.testing.assert_allclose(read(y), ry, rtol=tol, atol=tol, err_msg=f"{mode} {save}")
        if save:
            np.testing.assert_array_equal(indices, ridx)


def test_the_strip_solver_on_strided_input_and_ties(handle):
    """Columns of a wider array (rows not contiguous from the plane's start: element reads), and
    planes of equal values, where the first maximum in row-major order must win."""
    base = np.random.default_rng(3).standard_normal((2, 2, 20, 40)).astype(np.float32)
    x = base[:, :, 1:18, 3:35]
    y, indices = kdbkit.pooling_forward(handle, x, window=3, stride=2, pad=1, solver="PoolStrip")
    ry, ridx = ref.forward(np.ascontiguousarray(x), "max", (3, 3), (2, 2), (1, 1))
    np.testing.assert_allclose(y, ry, rtol=1e-6)
    np.testing.assert_array_equal(indices, ridx)
    flat = np.ones((1, 2, 9, 16), np.float32)
    y, indices = kdbkit.pooling_forward(handle, flat, window=3, stride=2, pad=1, solver="PoolStrip")
    np.testing.assert_array_equal(indices, ref.forward(flat, "max", (3, 3), (2, 2), (1, 1))[1])


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("window, stride, pad", STRIP_CASES[::2])
@pytest.mark.parametrize("width, row", [(17, 24), (203, 208)])
def test_the_strip_solver_on_rows_of_whole_vectors_with_a_partial_last_group(handle, dtype, window, stride, pad,
                                                                              width, row):
    """x's rows start on whole vectors (row > width): the vector reads, a last group past the
    row's end, and (where lanes shuffle) halo columns from the neighbouring lanes, a warp's
    first and last lanes and the ends of rows reading theirs."""
    store, read, tol = TYPES[dtype]
    be = handle.backend
    shape = (2, 3, 23, width)
    wide = store(np.random.default_rng(width + window).standard_normal((*shape[:3], row)))
    desc = TensorDesc(DataType.parse(dtype), shape, (3 * 23 * row, 23 * row, row, 1))
    x = DeviceTensor(be.to_device(wide), desc)
    for mode, save in (("max", True), ("max", False), ("avg", False)):
        y, indices = kdbkit.pooling_forward(handle, x, mode=mode, window=window, stride=stride, pad=pad,
                                            save_indices=save, solver="PoolStrip")
        ry, ridx = ref.forward(read(wide)[..., :width], mode, (window,) * 2, (stride,) * 2, pad)
        np.testing.assert_allclose(read(y.to_host(be)), ry, rtol=tol, atol=tol, err_msg=f"{mode} {save}")
        if save:
            np.testing.assert_array_equal(be.to_host(indices, np.empty(ry.shape, np.int32)), ridx)


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("stride", [2, 1])
def test_the_strip_solver_writes_rows_of_a_wider_output(handle, dtype, stride):
    """y's rows 16 elements apart, 7 outputs each: runs of outputs go out in one store, except
    the row's last, partial run (element stores); the columns past the 7th keep their value."""
    store, read, tol = TYPES[dtype]
    be = handle.backend
    width = 13 if stride == 2 else 7
    x = store(np.random.default_rng(stride).standard_normal((2, 3, 14, width)))
    ho = 7 if stride == 2 else 14
    sentinel = store(np.full((2, 3, ho, 16), 5.0))
    desc = TensorDesc(DataType.parse(dtype), (2, 3, ho, 7), (3 * ho * 16, ho * 16, 16, 1))
    y = DeviceTensor(be.to_device(sentinel), desc)
    kdbkit.pooling_forward(handle, x, window=3, stride=stride, pad=1, dtype=dtype, y=y, save_indices=False,
                           solver="PoolStrip")
    got = read(be.to_host(y.buffer, np.empty_like(sentinel)))
    ry, _ = ref.forward(read(x), "max", (3, 3), (stride, stride), (1, 1))
    np.testing.assert_allclose(got[..., :7], ry, rtol=tol, atol=tol)
    np.testing.assert_array_equal(got[..., 7:], 5.0)


def test_the_strip_solver_names_the_geometries_it_takes(handle):
    from kdbkit.runtime.solver import REGISTRY

    x = np.ones((1, 1, 8, 8), np.float32)
    problem = PoolProblem("fwd", "max", DataType.FP32, (1, 1, 8, 8), (3, 3), (2, 2), (0, 2), (64, 64, 8, 1),
                          (12, 12, 3, 1))
    verdict = REGISTRY.find("PoolStrip").is_applicable(problem, handle.device)
    assert not verdict and "3x3/2 pad 1" in verdict.reason
    with pytest.raises(kdbkit.KdbError, match="PoolStrip"):
        kdbkit.pooling_forward(handle, x, window=(3, 2), stride=2, solver="PoolStrip")


# Channels-last tensors: C a multiple of every type's vector (16: 16-byte reads and writes) and
# not (13: element by element), through the geometries above.
@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("window, stride, pad", GEOMETRIES)
@pytest.mark.parametrize("channels", [16, 13])
def test_channels_last_pooling_matches_the_reference(handle, dtype, window, stride, pad, channels):
    store, _, _ = TYPES[dtype]
    x = store(np.random.default_rng(channels + sum(window)).standard_normal((2, channels, 11, 9)))
    _check_channels_last_pooling(handle, x, dtype, window, stride, pad,
                                 (("max", True), ("max", False), ("avg", False), ("avg_in", False)))


def _check_channels_last_pooling(handle, x, dtype, window, stride, pad, modes):
    """PoolChannelsLast on ``x`` (N C H W, stored as ``dtype``) laid out channels-last, into a
    channels-last y, against the reference for each (mode, save indices) of ``modes``."""
    from .test_convolution import _channels_last, _from_channels_last

    be = handle.backend
    _, read, tol = TYPES[dtype]
    xt = _channels_last(be, x, dtype)
    for mode, save in modes:
        ry, ridx = ref.forward(read(x), mode, window, stride, pad)
        yt = _channels_last(be, np.zeros(ry.shape, np.float32).astype(x.dtype), dtype)
        _, indices = kdbkit.pooling_forward(handle, xt, mode=mode, window=window, stride=stride, pad=pad,
                                            save_indices=save, y=yt, solver="PoolChannelsLast")
        np.testing.assert_allclose(read(_from_channels_last(be, yt)), ry, rtol=tol, atol=tol, err_msg=f"{mode} {save}")
        if save:
            np.testing.assert_array_equal(be.to_host(indices, np.empty(ry.shape, np.int32)), ridx)
            indices.free()
        yt.buffer.free()
    xt.buffer.free()


def test_immediate_mode_pools_channels_last_tensors_by_channels(handle):
    """Channels-last x and y take PoolChannelsLast; NCHW ones keep the plane-walking solvers,
    and a channels-last x into an NCHW y too (its writes would be a plane apart)."""
    from kdbkit.runtime.primitives.pooling.solvers.channels_last import PoolChannelsLast

    def problem(xs, ys, c=64):
        return PoolProblem("fwd", "max", DataType.FP16, (32, c, 112, 112), (3, 3), (2, 2), (1, 1), xs, ys)

    nhwc_x, nhwc_y = (802816, 1, 7168, 64), (200704, 1, 3584, 64)
    nchw_x, nchw_y = (802816, 12544, 112, 1), (200704, 3136, 56, 1)
    solver = PoolChannelsLast()
    assert solver.is_applicable(problem(nhwc_x, nhwc_y), None)
    assert not solver.is_applicable(problem(nchw_x, nchw_y), None)
    assert not solver.is_applicable(problem(nhwc_x, nchw_y), None)
    assert not solver.is_applicable(problem((12544, 1, 112, 1), (3136, 1, 56, 1), c=1), None)
    assert handle.dispatcher.choose(problem(nhwc_x, nhwc_y)).solver.name == "PoolChannelsLast"
    assert handle.dispatcher.choose(problem(nchw_x, nchw_y)).solver.name != "PoolChannelsLast"


# Windows of every length against the kernel's batches of four loads (shorter, longer, a
# multiple, 99 at once as a global pool), ties (the first of equal maxima in the window's order is
# recorded), padding and element reads (5 channels).
@pytest.mark.parametrize("channels", [16, 5])
@pytest.mark.parametrize("window, stride, pad", [((11, 9), (1, 1), (0, 0)), ((3, 3), (2, 2), (1, 1)),
                                                 ((2, 4), (3, 1), (0, 1)), ((4, 4), (1, 1), (2, 2))])
def test_channels_last_pooling_takes_windows_in_batches(handle, channels, window, stride, pad):
    x = np.random.default_rng(channels + sum(window)).standard_normal((2, channels, 11, 9)).astype(np.float32)
    x[0, 3, 4, 2:6] = 7.0
    _check_channels_last_pooling(handle, x, "fp32", window, stride, pad,
                                 (("max", True), ("avg", False), ("avg_in", False)))
