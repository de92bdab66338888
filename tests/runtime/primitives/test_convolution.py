"""Convolution on the chain device against the NumPy reference: every direction, type and
solver on odd shapes with groups, depthwise filters, dilation, strides and padding; layouts;
MIOpen's keys; bad input."""

from __future__ import annotations

import numpy as np
import pytest

import kdbkit
from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.convolution import ConvProblem
from kdbkit.runtime.problem import parse_config
from kdbkit.runtime.reference import convolution as ref
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc

from .conftest import TYPES

# (N, C, H, W, K, filter, pad, stride, dilation, groups)
CASES = [
    (2, 3, 7, 9, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1),  # odd sizes, a 3 x 3 filter, same padding
    (1, 4, 11, 6, 6, (3, 2), (1, 0), (2, 1), (1, 2), 2),  # groups, a non-square filter, stride, dilation
    (3, 6, 5, 5, 6, (3, 3), (1, 1), (2, 2), (1, 1), 6),  # depthwise, strided
    (2, 5, 8, 7, 3, (1, 1), (0, 0), (1, 1), (1, 1), 1),  # pointwise: x is its own column matrix
    (1, 2, 9, 10, 4, (5, 4), (2, 3), (3, 2), (2, 1), 2),  # large pad, dilation on one axis
    (2, 6, 9, 8, 7, (1, 1), (0, 0), (2, 2), (1, 1), 1),  # 1 x 1 at stride 2 (a projection)
    (1, 3, 10, 11, 4, (2, 3), (0, 2), (2, 3), (2, 1), 1),  # one group, dilation, uneven strides
]
DEPTHWISE = [(2, 6, 9, 7, 6, (3, 3), (1, 1), (2, 1), (1, 1), 6), (1, 5, 11, 12, 5, (5, 3), (2, 0), (1, 2), (2, 1), 5)]
# Winograd's tiles: odd outputs (a last tile half outside), no padding, padding of 2.
WINOGRAD = [(2, 4, 8, 7, 6, (3, 3), (0, 0), (1, 1), (1, 1), 1), (1, 3, 6, 9, 5, (3, 3), (2, 1), (1, 1), (1, 1), 1)]
# The implicit GEMM's tiles cut at every edge over several reduction steps, groups of 40
# channels; backward data's stride phases, some with no rows (stride 4 over 3 rows).
BIG = [(2, 80, 9, 11, 136, (3, 3), (1, 1), (1, 1), (1, 1), 2), (1, 20, 17, 15, 140, (3, 1), (1, 0), (2, 2), (1, 1), 1),
       (2, 3, 3, 5, 4, (3, 3), (1, 1), (4, 4), (1, 1), 1)]
# Each solver on every case it takes (ConvIm2colGemm: one group; ConvDepthwise: groups = C = K).
SOLVER_CASES = ([("ConvDirect", case) for case in CASES + DEPTHWISE]
                + [("ConvImplicitGemm", case) for case in CASES + DEPTHWISE + BIG]
                + [("ConvIm2colGemm", case) for case in CASES if case[-1] == 1]
                + [("ConvDepthwise", case) for case in CASES + DEPTHWISE if case[-1] == case[1] == case[4]]
                + [("ConvWinogradF2x3", case) for case in CASES + WINOGRAD if case[5] == (3, 3) and case[7] == (1, 1)
                   and case[8] == (1, 1) and case[-1] == 1])


def _tolerance(tol: float, expected: np.ndarray) -> dict:
    """Rounding of the result's type, on the scale of the result (sums of many products)."""
    return {"rtol": tol, "atol": tol * max(1.0, float(np.abs(expected).max()))}


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("solver, case", SOLVER_CASES,
                         ids=[f"{s}-" + "x".join(map(str, c[:5])) + f"-{c[5][0]}x{c[5][1]}-g{c[-1]}" for s, c in SOLVER_CASES])
def test_every_direction_matches_the_reference(handle, solver, dtype, case):
    n, c, h, w, k, filt, pad, stride, dilation, groups = case
    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(sum(case[:5]))
    x = store(rng.standard_normal((n, c, h, w)))
    wt = store(rng.standard_normal((k, c // groups, *filt)))
    geometry = {"pad": pad, "stride": stride, "dilation": dilation, "groups": groups}
    y = kdbkit.convolution_forward(handle, x, wt, dtype=dtype, solver=solver, **geometry)
    expected = ref.forward(read(x), read(wt), pad, stride, dilation, groups)
    np.testing.assert_allclose(read(y), expected, **_tolerance(tol, expected))
    dy = store(rng.standard_normal(expected.shape))
    dx = kdbkit.convolution_backward_data(handle, dy, wt, x.shape, dtype=dtype, solver=solver, **geometry)
    expected = ref.backward_data(read(dy), read(wt), x.shape, pad, stride, dilation, groups)
    np.testing.assert_allclose(read(dx), expected, **_tolerance(tol, expected))
    wrw_solver = None if solver == "ConvWinogradF2x3" else solver  # forward and backward data only
    dw = kdbkit.convolution_backward_weights(handle, dy, x, wt.shape, dtype=dtype, solver=wrw_solver, **geometry)
    expected = ref.backward_weights(read(dy), read(x), wt.shape, pad, stride, dilation, groups)
    np.testing.assert_allclose(read(dw), expected, **_tolerance(tol, expected))


def _channels_last(backend, array: np.ndarray, dtype: str | None = None) -> DeviceTensor:
    """A device tensor holding ``array`` (N x C x H x W) packed NHWC; ``dtype`` names the type
    where the storage does not (bf16 bits in a uint16 array)."""
    n, c, h, w = array.shape
    desc = TensorDesc(DataType.parse(dtype or array.dtype), array.shape, (h * w * c, 1, w * c, c))
    return DeviceTensor(backend.to_device(np.ascontiguousarray(array.transpose(0, 2, 3, 1))), desc)


def _from_channels_last(backend, tensor: DeviceTensor) -> np.ndarray:
    n, c, h, w = tensor.desc.shape
    host = backend.to_host(tensor.buffer, np.empty((n, h, w, c), tensor.desc.dtype.storage))
    return host.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("solver, groups, filt, pad, stride", [
    ("ConvDirect", 2, 3, 1, (2, 1)), ("ConvImplicitGemm", 2, 3, 1, (2, 1)), ("ConvImplicitGemm", 1, 1, 0, (1, 1)),
    ("ConvIm2colGemm", 1, 3, 1, (2, 1)), ("ConvIm2colGemm", 1, 1, 0, (1, 1)),
    ("ConvDepthwise", 4, 3, 1, (2, 1)), ("ConvWinogradF2x3", 1, 3, 1, (1, 1))])
def test_channels_last_tensors_in_every_direction(handle, solver, groups, filt, pad, stride):
    """NHWC device tensors (weights KYXC): the outputs kdbkit makes are NHWC too."""
    be = handle.backend
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 9, 7)).astype(np.float32)
    k = 4 if solver == "ConvDepthwise" else 6
    wt = rng.standard_normal((k, 4 // groups, filt, filt)).astype(np.float32)
    geometry = {"pad": pad, "stride": stride, "groups": groups, "solver": solver}
    pads = (pad, pad)
    y = kdbkit.convolution_forward(handle, _channels_last(be, x), _channels_last(be, wt), **geometry)
    expected = ref.forward(x, wt, pads, stride, (1, 1), groups)
    k, ho, wo = expected.shape[1:]
    assert y.desc.strides == (ho * wo * k, 1, wo * k, k)
    np.testing.assert_allclose(_from_channels_last(be, y), expected, rtol=1e-5, atol=1e-5)
    dy = rng.standard_normal(expected.shape).astype(np.float32)
    dx = kdbkit.convolution_backward_data(handle, _channels_last(be, dy), _channels_last(be, wt), x.shape, **geometry)
    np.testing.assert_allclose(_from_channels_last(be, dx),
                               ref.backward_data(dy, wt, x.shape, pads, stride, (1, 1), groups), rtol=1e-5, atol=1e-5)
    wrw = {**geometry, "solver": None if solver == "ConvWinogradF2x3" else solver}  # not backward weights
    dw = kdbkit.convolution_backward_weights(handle, _channels_last(be, dy), _channels_last(be, x), wt.shape, **wrw)
    np.testing.assert_allclose(_from_channels_last(be, dw),
                               ref.backward_weights(dy, x, wt.shape, pads, stride, (1, 1), groups), rtol=1e-4,
                               atol=1e-4)
    for tensor in (y, dx, dw):
        tensor.buffer.free()


@pytest.mark.parametrize("channels_last", [False, True])
def test_split_reductions_of_forward_and_backward_data_match_the_reference(handle, channels_last):
    """Few output positions over a long reduction: the implicit GEMM splits forward and
    backward data (at stride 1 and (2, 1)) in slices that its finish kernel adds (the tile count is set from
    the device's multiprocessors so that the split is taken on any device)."""
    from kdbkit.runtime.primitives.convolution.solvers.igemm import split_slices

    be, cu = handle.backend, handle.target.cu or 132
    n, c, h, w, k = max(1, cu // 2), 130, 8, 16, 20
    geometry = {"pad": (1, 1), "stride": (1, 1), "solver": "ConvImplicitGemm"}
    layout = "NHWC" if channels_last else "NCHW"
    for direction, (cin, cout) in (("F", (c, k)), ("B", (k, c))):
        problem = ConvProblem(direction, DataType.FP32, layout, (n, cin, h, w), cout, (3, 3), (1, 1), (1, 1))
        assert split_slices(problem, cu)[0] > 1
    strided = ConvProblem("B", DataType.FP32, layout, (n, k, 2 * h, w), c, (3, 3), (1, 1), (2, 1))
    assert split_slices(strided, cu)[0] > 1
    rng = np.random.default_rng(11)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((k, c, 3, 3)).astype(np.float32)
    put = (lambda a: _channels_last(be, a)) if channels_last else (lambda a: a)
    get = (lambda t: _from_channels_last(be, t)) if channels_last else (lambda t: t)
    y = kdbkit.convolution_forward(handle, put(x), put(wt), **geometry)
    expected = ref.forward(x, wt, (1, 1), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(get(y), expected, **_tolerance(1e-4, expected))
    # backward data with the roles swapped: 20 input channels, 130 output channels
    wb = rng.standard_normal((c, k, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((n, c, h, w)).astype(np.float32)
    dx = kdbkit.convolution_backward_data(handle, put(dy), put(wb), (n, k, h, w), **geometry)
    expected = ref.backward_data(dy, wb, (n, k, h, w), (1, 1), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(get(dx), expected, **_tolerance(1e-4, expected))
    # backward data at stride (2, 1): two phases of 6 and 3 taps, each split the same
    dx = kdbkit.convolution_backward_data(handle, put(dy), put(wb), (n, k, 2 * h, w),
                                          **{**geometry, "stride": (2, 1)})
    expected = ref.backward_data(dy, wb, (n, k, 2 * h, w), (1, 1), (2, 1), (1, 1), 1)
    np.testing.assert_allclose(get(dx), expected, **_tolerance(1e-4, expected))


def test_the_config_string_is_miopens_key():
    forward = ConvProblem("F", DataType.FP32, "NCHW", (32, 64, 56, 56), 64, (3, 3), (1, 1))
    assert forward.config() == "64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NCHW-FP32-F"
    # Backward: "in" is dy, "out" x, as in MIOpen; layouts written three times unless all NCHW.
    backward = ConvProblem("B", DataType.FP16, "NHWC", (32, 64, 56, 56), 128, (3, 3), (1, 1), (2, 2), groups=4)
    assert backward.config() == "128-28-28-3x3-64-56-56-32-1x1-2x2-1x1-0-NHWC-NHWC-NHWC-FP16-B_g4"
    weights = ConvProblem("W", DataType.BF16, "NCHW", (8, 3, 224, 224), 64, (7, 7), (3, 3), (2, 2))
    assert weights.config() == "64-112-112-7x7-3-224-224-8-3x3-2x2-1x1-0-NCHW-BF16-W"
    for problem in (forward, backward, weights):
        assert parse_config(problem.config()) == problem
        assert problem.flops == 2 * np.prod(problem.y_shape) * np.prod(problem.w_shape[1:])


@pytest.mark.parametrize("key, message", [
    ("64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-1-NCHW-FP32-F", "has a bias"),
    ("64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NCHW-FP64-F", "type FP64"),
    ("64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NHWC-NCHW-NCHW-FP32-F", "layouts NHWC-NCHW-NCHW"),
    ("64-56-56-3x3-64-55-56-32-1x1-1x1-1x1-0-NCHW-FP32-F", "its output is 55x56"),
    ("64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NCHW-FP32-F_g3", "multiples of the group count"),
    ("64-56-56-3x3-64-56-56-32-1x1-1x1-0-NCHW-FP32-F", "not MIOpen's 2-D form"),
    ("64-56-56-3x3-64-56-56-32-1x1-1x1-1x1-0-NCHW-FP32-X", "not MIOpen's 2-D form"),
])
def test_a_bad_key_is_a_clear_error(key, message):
    with pytest.raises(ProblemError, match=message):
        parse_config(key)


def test_bad_input_is_named_before_any_launch(handle):
    x, w = np.ones((1, 4, 5, 5), np.float32), np.ones((6, 2, 3, 3), np.float32)
    with pytest.raises(ProblemError, match="multiples of the group count"):
        kdbkit.convolution_forward(handle, np.ones((1, 3, 5, 5), np.float32), np.ones((4, 1, 3, 3), np.float32),
                                   groups=3)  # 4 output channels in 3 groups
    with pytest.raises(ProblemError, match="w is 6x2x3x3: 2 channels per group, but x has 4 channels in 1 groups"):
        kdbkit.convolution_forward(handle, x, w)
    with pytest.raises(ProblemError, match="leaves no output"):
        kdbkit.convolution_forward(handle, x, np.ones((6, 4, 7, 3), np.float32))
    with pytest.raises(ProblemError, match="pad .* is negative"):
        kdbkit.convolution_forward(handle, x, w, groups=2, pad=-1)
    with pytest.raises(ProblemError, match="stride .* must be >= 1"):
        kdbkit.convolution_forward(handle, x, w, groups=2, stride=0)
    with pytest.raises(ProblemError, match="types differ"):
        kdbkit.convolution_forward(handle, x, w.astype(np.float16), groups=2)
    with pytest.raises(ProblemError, match="3-D; convolution takes 4-D"):
        kdbkit.convolution_forward(handle, x[0], w, groups=2)
    with pytest.raises(ProblemError, match="dy is 1x6x4x4, but convolving 1x4x5x5 gives 1x6x3x3"):
        kdbkit.convolution_backward_data(handle, np.ones((1, 6, 4, 4), np.float32), w, x.shape, groups=2)
    with pytest.raises(ProblemError, match="dy is 1x6x4x4, but convolving x gives 1x6x3x3"):
        kdbkit.convolution_backward_weights(handle, np.ones((1, 6, 4, 4), np.float32), x, w.shape, groups=2)
    with pytest.raises(ProblemError, match="y is fp32 1x6x2x2 but must be fp32 1x6x3x3"):
        kdbkit.convolution_forward(handle, x, w, groups=2, y=np.empty((1, 6, 2, 2), np.float32))


def test_layouts_must_agree_and_be_packed(handle):
    be = handle.backend
    x = np.random.default_rng(0).standard_normal((1, 4, 5, 5)).astype(np.float32)
    w = np.ones((6, 2, 3, 3), np.float32)
    with pytest.raises(ProblemError, match="layouts differ"):
        kdbkit.convolution_forward(handle, _channels_last(be, x), DeviceTensor.from_host(be, w), groups=2)
    wide = be.to_device(np.zeros((1, 4, 5, 8), np.float32))
    columns = DeviceTensor(wide, TensorDesc(DataType.FP32, (1, 4, 5, 5), (160, 40, 8, 1)))
    with pytest.raises(ProblemError, match="x has strides .* neither packed NCHW nor packed NHWC"):
        kdbkit.convolution_forward(handle, columns, DeviceTensor.from_host(be, w), groups=2)
    nchw_out = DeviceTensor.empty(be, TensorDesc.packed(DataType.FP32, (1, 6, 3, 3)))
    with pytest.raises(ProblemError, match="y has strides .* not packed NHWC"):
        kdbkit.convolution_forward(handle, _channels_last(be, x), _channels_last(be, w), groups=2, y=nchw_out)
    # Depthwise weights (one channel per group) fit both layouts: x's decides.
    y = kdbkit.convolution_forward(handle, _channels_last(be, x), _channels_last(be, np.ones((4, 1, 3, 3), np.float32)),
                                   groups=4)
    assert y.desc.strides == (36, 1, 12, 4)


def test_the_tensor_core_solver_says_what_it_takes():
    """ConvImplicitGemmTensorCore's applicability, on descriptions of devices (it runs on CUDA only)."""
    from types import SimpleNamespace

    from kdbkit.kdb import Target
    from kdbkit.runtime.solver import REGISTRY

    solver = REGISTRY.find("ConvImplicitGemmTensorCore")
    h100 = SimpleNamespace(backend="cuda", target=Target.parse("sm_90"))

    def verdict(device=h100, direction="F", dtype=DataType.FP16, layout="NHWC", c=64, k=64, groups=1):
        return solver.is_applicable(ConvProblem(direction, dtype, layout, (2, c, 9, 9), k, (3, 3), (1, 1),
                                                groups=groups), device)

    assert verdict() and verdict(layout="NCHW") and verdict(c=3) and verdict(dtype=DataType.BF16)
    assert "sm_80 or later" in verdict(SimpleNamespace(backend="cuda", target=Target.parse("sm_75"))).reason
    assert "sm_80 or later" in verdict(SimpleNamespace(backend="opencl", target=Target.parse("ocl-3f9a1c2b"))).reason
    assert "fp32 is not fp16 or bf16" in verdict(dtype=DataType.FP32).reason
    assert verdict(direction="B") and verdict(direction="B", layout="NCHW")
    assert "not backward weights" in verdict(direction="W").reason
    strided = ConvProblem("B", DataType.FP16, "NHWC", (2, 64, 9, 9), 64, (3, 3), (1, 1), (2, 2))
    assert "stride 1 only, not (2, 2)" in solver.is_applicable(strided, h100).reason
    wide_pad = ConvProblem("B", DataType.FP16, "NHWC", (2, 64, 9, 9), 64, (1, 1), (1, 1))  # p' = 0 - 1
    assert "pad (1, 1) beyond dilation x (filter - 1)" in solver.is_applicable(wide_pad, h100).reason  # not raised
    assert "one group, not 2" in verdict(groups=2).reason
    assert "must be even" in verdict(k=63).reason
    assert solver.workspace(ConvProblem("F", DataType.FP16, "NCHW", (2, 64, 9, 9), 64, (3, 3), (1, 1))) == \
        2 * (2 * 64 * 81 + 64 * 64 * 9) + 4 * 2 * 2 * 64 * 81  # x and w staged channels-last (y written NCHW)
    # (and, since 2 output tiles cannot fill an H100, the reduction's 18 tiles split in two fp32 slabs of y)
    assert solver.workspace(ConvProblem("F", DataType.FP16, "NHWC", (32, 64, 56, 56), 64, (3, 3), (1, 1))) == 0
    assert solver.workspace(ConvProblem("B", DataType.FP16, "NHWC", (2, 64, 9, 9), 64, (3, 3), (1, 1))) == \
        2 * 64 * 64 * 9 + 4 * 2 * 2 * 64 * 81  # the flipped weights, two fp32 slabs of dx
    assert solver.workspace(ConvProblem("F", DataType.FP16, "NCHW", (2, 3, 9, 9), 64, (3, 3), (1, 1))) == \
        2 * (2 * 81 * 8 + 64 * 9 * 8)  # 3 channels of x and w widened to 8 as they are staged
    assert solver.workspace(ConvProblem("F", DataType.FP16, "NHWC", (2, 3, 9, 9), 64, (3, 3), (1, 1))) == 0


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("matrices, rows, cols", [(3, 45, 70), (2, 70, 130)], ids=["odd", "even"])
def test_the_staging_transpose_moves_every_element(handle, dtype, matrices, rows, cols):
    """The tensor-core solver's NCHW staging (CUDA only there) on the chain device: conv_gemm.c's
    conv_transpose on sizes that cut its 32 x 32 tiles, and (16-bit types, even sizes) its
    conv_transpose_pairs on sizes that cut 64 x 64 tiles."""
    from kdbkit.runtime.primitives.convolution.solvers.igemm_tc import transposer

    store, read, _ = TYPES[dtype]
    be, dt = handle.backend, DataType.parse(dtype)
    transpose = transposer(handle, handle.program("conv_gemm.c", dt.options), dt)(matrices, rows, cols)
    src = store(np.random.default_rng(0).standard_normal((matrices, rows, cols)))
    dst = be.alloc(src.nbytes)
    transpose(be.to_device(src), dst)
    np.testing.assert_array_equal(be.to_host(dst, np.empty((matrices, cols, rows), src.dtype)), src.transpose(0, 2, 1))


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("c, wide", [(3, 8), (3, 16), (16, 16), (5, 5)], ids=["3-8", "3-16", "16", "5-moved"])
def test_the_widening_stage_moves_every_element_and_zeros_the_rest(handle, dtype, channels_last, c, wide):
    """The tensor-core solvers' staging of x channels-last and widened with zero channels (CUDA
    only there) on the chain device: conv_gemm.c's conv_pad_channels_vec where the width is a
    multiple of the 16-byte vector, conv_pad_channels otherwise (a plain move of 5 channels);
    x read through NCHW's or NHWC's strides, sizes odd."""
    from kdbkit.runtime.primitives.convolution.solvers.igemm_tc import widener

    store, read, _ = TYPES[dtype]
    be, dt = handle.backend, DataType.parse(dtype)
    n, h, w = 2, 7, 9
    x = store(np.random.default_rng(c).standard_normal((n, c, h, w)))
    memory = np.ascontiguousarray(x.transpose(0, 2, 3, 1) if channels_last else x)
    strides = (h * w * c, 1, w * c, c) if channels_last else (c * h * w, h * w, w, 1)
    move = widener(handle, handle.program("conv_gemm.c", dt.options), (n, c, h, w), wide, strides, dt)
    dst = be.alloc(n * h * w * wide * x.itemsize)
    move(be.to_device(memory), dst)
    got = be.to_host(dst, np.empty((n, h, w, wide), x.dtype))
    np.testing.assert_array_equal(got[..., :c], x.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(read(got[..., c:]), 0.0)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_depthwise_backward_weights_over_slices_and_channel_blocks(handle, channels_last):
    """40 channels (a block of 32 and a cut one, channels-last), 2178 positions in several
    slices summed in order, a 5 x 5 filter: the same as the reference, and twice the same."""
    be = handle.backend
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 40, 33, 33)).astype(np.float32)
    dy = rng.standard_normal((2, 40, 33, 33)).astype(np.float32)
    geometry = {"pad": 2, "groups": 40, "solver": "ConvDepthwise"}
    expected = ref.backward_weights(dy, x, (40, 1, 5, 5), (2, 2), (1, 1), (1, 1), 40)
    results = []
    for _ in range(2):
        if channels_last:
            dw = kdbkit.convolution_backward_weights(handle, _channels_last(be, dy), _channels_last(be, x),
                                                     (40, 1, 5, 5), **geometry)
            results.append(_from_channels_last(be, dw))
        else:
            results.append(kdbkit.convolution_backward_weights(handle, dy, x, (40, 1, 5, 5), **geometry))
    np.testing.assert_allclose(results[0], expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(results[0], results[1])


def test_immediate_mode_passes_over_mostly_empty_implicit_gemm_tiles(handle):
    """Backward data into 3 channels would fill 3 of the implicit GEMM's 64 tile columns: the
    heuristic says so and takes the next solver; with only it applying, it takes it anyway."""
    from kdbkit.runtime.immediate import choose

    problem = ConvProblem("B", DataType.FP32, "NCHW", (2, 3, 16, 16), 64, (7, 7), (3, 3), (2, 2))
    choice = choose(handle, problem)
    assert choice.solver.name == "ConvIm2colGemm"
    assert "ConvImplicitGemm: applies, passed over: its 256 x 64 tiles would be 98% empty" in "\n".join(choice.trace)
    grouped = ConvProblem("B", DataType.FP32, "NCHW", (2, 4, 16, 16), 4, (3, 3), (1, 1), groups=2)
    monkey = pytest.MonkeyPatch()
    monkey.setenv("KDB_DEBUG_CONV_DIRECT", "0")
    try:
        assert choose(handle, grouped).solver.name == "ConvImplicitGemm"  # im2col takes one group only
    finally:
        monkey.undo()


def test_a_second_process_takes_the_find_db_ranking_for_its_first_call(handle, isolated):
    """Find ranks the solvers once; a new process's first convolution of that layer uses the
    recorded best, timing and searching nothing (cuDNN's benchmark mode searches again in every
    process)."""
    import json
    import os
    import subprocess
    import sys

    from kdbkit.runtime.find import find_solutions

    problem = ConvProblem("F", DataType.FP32, "NCHW", (2, 8, 9, 9), 8, (3, 3), (1, 1))
    ranked = find_solutions(handle, problem)
    assert {s.solver for s in ranked} == {"ConvDirect", "ConvIm2colGemm", "ConvWinogradF2x3", "ConvImplicitGemm"}
    child = """
import json, numpy as np, kdbkit
from kdbkit.runtime.immediate import choose
from kdbkit.runtime.problem import parse_config
timed = []
with kdbkit.Handle() as h:
    real = type(h.backend).time_ms
    type(h.backend).time_ms = lambda self, *a, **k: timed.append(1) or real(self, *a, **k)
    x, w = np.ones((2, 8, 9, 9), np.float32), np.ones((8, 8, 3, 3), np.float32)
    y = kdbkit.convolution_forward(h, x, w, pad=1)
    choice = choose(h, parse_config(KEY))
    print(json.dumps({"timed": len(timed), "how": choice.how, "solver": choice.solver.name,
                      "center": float(y[0, 0, 4, 4])}))
""".replace("KEY", repr(problem.config()))
    env = {**os.environ, "KDB_BACKEND": handle.device.backend}
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"timed": 0, "how": "find-db", "solver": ranked[0].solver, "center": 72.0}


def test_find_frees_each_candidate_s_workspace_and_close_frees_the_kept_ones(make_handle):
    """Find times each solver on an invoker of its own, whose workspace (im2col's columns,
    Winograd's transforms) is freed once timed: kept, every solver's workspace for every problem
    found stayed allocated, and find over a set of 357 layers ran an H200's 140 GB out. The
    invokers calls keep hold theirs until the handle closes, which frees them."""
    from kdbkit.runtime.find import find_solutions
    from kdbkit.runtime.solver import REGISTRY

    handle = make_handle()
    allocated, real_alloc = [], handle.backend.alloc
    handle.backend.alloc = lambda nbytes: allocated.append(real_alloc(nbytes)) or allocated[-1]
    problem = ConvProblem("F", DataType.FP32, "NCHW", (2, 8, 9, 9), 8, (3, 3), (1, 1))
    workspaces = [REGISTRY.find(name).workspace(problem) for name in ("ConvIm2colGemm", "ConvWinogradF2x3")]
    assert min(workspaces) > 0
    find_solutions(handle, problem, fresh=True)
    kept = {id(b) for b in handle.dispatcher.workspace_buffers()}
    assert [b.nbytes for b in allocated if not b.freed and id(b) not in kept] == []
    assert sum(b.nbytes for b in allocated if b.freed) >= sum(workspaces)
    # a call's invoker keeps its workspace for the next call, until the handle closes
    x, w = np.ones((2, 8, 9, 9), np.float32), np.ones((8, 8, 3, 3), np.float32)
    y = kdbkit.convolution_forward(handle, x, w, pad=1, solver="ConvIm2colGemm")
    assert y[0, 0, 4, 4] == 72.0
    held = handle.dispatcher.workspace_buffers()
    assert sum(b.nbytes for b in held) >= workspaces[0] and not any(b.freed for b in held)
    handle.close()
    assert all(b.freed for b in held) and handle.dispatcher.workspace_buffers() == []


@pytest.mark.parametrize("dtype", list(TYPES))
def test_the_bias_forward_and_backward(handle, dtype):
    """y += bias per channel, in place (NumPy arrays and channels-last device tensors); db the sum of dy."""
    from kdbkit.runtime.primitives.convolution import ConvBiasProblem

    store, read, tol = TYPES[dtype]
    rng = np.random.default_rng(3)
    y, bias = store(rng.standard_normal((3, 5, 7, 6))), store(rng.standard_normal(5))
    expected = read(y).astype(np.float64) + read(bias).astype(np.float64)[None, :, None, None]
    out = kdbkit.convolution_bias_forward(handle, y, bias, dtype=dtype)
    assert out is y
    np.testing.assert_allclose(read(y), expected, rtol=tol, atol=tol)
    be = handle.backend
    nhwc = _channels_last(be, read(y).astype(np.float32))
    kdbkit.convolution_bias_forward(handle, nhwc, np.ones(5, np.float32))
    np.testing.assert_allclose(_from_channels_last(be, nhwc), read(y) + 1, rtol=1e-6, atol=1e-6)
    dy = store(rng.standard_normal((3, 5, 7, 6)))
    db = kdbkit.convolution_bias_backward(handle, dy, dtype=dtype)
    wanted = read(dy).astype(np.float64).sum(axis=(0, 2, 3))
    np.testing.assert_allclose(read(db), wanted, rtol=tol * 4, atol=tol * 4 * max(1.0, abs(wanted).max()))
    problem = ConvBiasProblem("bwd", DataType.parse(dtype), (3, 5, 7, 6), (210, 42, 6, 1))
    assert parse_config(problem.config()) == problem
    with pytest.raises(ProblemError, match="bias has shape"):
        kdbkit.convolution_bias_forward(handle, y, store(np.ones(4)), dtype=dtype)
    with pytest.raises(ProblemError, match="2-D; a convolution's bias takes"):
        kdbkit.convolution_bias_backward(handle, np.ones((2, 3), np.float32))
    nhwc.buffer.free()


@pytest.mark.parametrize("filt", [3, 1])
def test_one_channel_inputs_take_a_channels_last_outputs_layout(handle, filt):
    """x with one channel (and w with one, 3 x 3 or 1 x 1) is packed both ways: the
    channels-last y the caller gives decides the layout, instead of being refused as not NCHW."""
    be = handle.backend
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 1, 7, 6)).astype(np.float32)
    wt = rng.standard_normal((5, 1, filt, filt)).astype(np.float32)
    pad = filt // 2
    expected = ref.forward(x, wt, (pad, pad), (1, 1), (1, 1), 1)
    n, k, ho, wo = expected.shape
    y = DeviceTensor.empty(be, TensorDesc(DataType.FP32, expected.shape, (ho * wo * k, 1, wo * k, k)))
    got = kdbkit.convolution_forward(handle, _channels_last(be, x), _channels_last(be, wt), pad=pad, y=y)
    assert got is y
    np.testing.assert_allclose(_from_channels_last(be, y), expected, rtol=1e-5, atol=1e-5)
    y.buffer.free()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_immediate_mode_takes_winograd_for_wide_fp32_3x3_layers_only(layout):
    """Winograd F(2x2, 3x3) before the implicit GEMM where its cost model says it is faster:
    fp32 3 x 3 at stride 1 with many channels, forward and backward data; not at 64 channels
    (the implicit GEMM's 64-column tile wastes nothing there), not for 16-bit types, strides or
    backward weights."""
    from kdbkit.runtime.immediate import heuristic

    from .conftest import sm90

    def chosen(direction="F", c=256, k=256, hw=14, stride=1, dtype=DataType.FP32):
        problem = ConvProblem(direction, dtype, layout, (32, c, hw, hw), k, (3, 3), (1, 1), (stride, stride))
        return heuristic(problem, sm90(), ()).solver.name

    assert chosen() == chosen("B") == "ConvWinogradF2x3"
    assert chosen(c=128, k=128, hw=28) == "ConvWinogradF2x3"
    assert chosen(c=64, k=64, hw=56) == chosen("B", c=64, k=64, hw=56) == "ConvImplicitGemm"
    assert chosen("W") == "ConvImplicitGemm"
    assert chosen(stride=2) == "ConvImplicitGemm"
    assert chosen(dtype=DataType.FP16) != "ConvWinogradF2x3"


# A first layer's few channels (ConvStem): ResNet's 7 x 7 / 2 and MobileNet's 3 x 3 / 2 over 3
# channels, a one-channel 3 x 3 dilated 2, on sizes that cut the block's 16 x 32 output tile and
# its 16 output channels, both layouts, every type. Channels-last, 24 outputs are whole vectors
# (a block of 16 and one cut to 8: vector stores), 20, 5 and 33 are not (element stores).
STEMS = [((2, 3, 37, 70), 20, (7, 7), (3, 3), (2, 2), (1, 1)), ((3, 3, 33, 35), 24, (3, 3), (1, 1), (2, 2), (1, 1)),
         ((1, 1, 20, 40), 5, (3, 3), (0, 2), (1, 1), (2, 2)), ((2, 4, 17, 9), 33, (5, 3), (2, 0), (1, 2), (1, 1))]


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("case", STEMS, ids=["7x7s2", "3x3s2", "1ch-dil2", "4ch-5x3"])
def test_the_stem_kernel_matches_the_reference(handle, dtype, channels_last, case):
    shape, k, filt, pad, stride, dilation = case
    store, read, tol = TYPES[dtype]
    be = handle.backend
    rng = np.random.default_rng(shape[2])
    x, wt = store(rng.standard_normal(shape)), store(rng.standard_normal((k, shape[1], *filt)) * 0.3)
    expected = ref.forward(read(x).astype(np.float64), read(wt).astype(np.float64), pad, stride, dilation, 1)
    geometry = {"pad": pad, "stride": stride, "dilation": dilation, "solver": "ConvStem", "dtype": dtype}
    if channels_last:  # y as kdbkit lays it out (with one channel, x's strides are NCHW's too)
        out = kdbkit.convolution_forward(handle, _channels_last(be, x, dtype), _channels_last(be, wt, dtype),
                                         **geometry)
        flat = be.to_host(out.buffer, np.empty(out.desc.numel, x.dtype))
        y = np.lib.stride_tricks.as_strided(flat, out.desc.shape, [s * x.itemsize for s in out.desc.strides])
    else:
        y = kdbkit.convolution_forward(handle, x, wt, **geometry)
    np.testing.assert_allclose(read(y), expected, rtol=tol * 4, atol=tol * 4 * np.sqrt(wt[0].size))


def test_the_stem_kernel_names_what_it_does_not_take(handle):
    from kdbkit.runtime.solver import REGISTRY

    stem = REGISTRY.find("ConvStem")
    fp16 = DataType.FP16
    assert stem.is_applicable(ConvProblem("F", fp16, "NHWC", (32, 3, 224, 224), 64, (7, 7), (3, 3), (2, 2)),
                              handle.device)
    for problem, words in ((ConvProblem("F", fp16, "NCHW", (1, 8, 16, 16), 8, (3, 3)), "8 channels"),
                           (ConvProblem("B", fp16, "NCHW", (1, 3, 16, 16), 8, (3, 3)), "forward"),
                           (ConvProblem("F", fp16, "NCHW", (1, 3, 64, 64), 8, (11, 11)), "363 taps"),
                           (ConvProblem("F", fp16, "NCHW", (1, 3, 512, 512), 8, (3, 3), (0, 0), (8, 8)), "window")):
        verdict = stem.is_applicable(problem, handle.device)
        assert not verdict and words in verdict.reason, verdict
