"""pooling_forward and pooling_backward: max (with indices) and average, padding included or not."""

from __future__ import annotations

from typing import Any

import numpy as np

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.arguments import integer
from kdbkit.runtime.primitives.invoke import invoke
from kdbkit.runtime.primitives.repeat import repeatable
from kdbkit.runtime.primitives.operands import Operands, device_default
from kdbkit.runtime.primitives.pooling.problem import PoolProblem, _pair
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc, packed_strides


def _four_d(desc: TensorDesc, what: str) -> None:
    if len(desc.shape) != 4:
        raise ProblemError(f"{what} is {len(desc.shape)}-D; pooling takes N x C x H x W", "reshape it to 4-D")


@repeatable("pool_fwd", ('x', 'y'))
def pooling_forward(handle, x: Any, *, mode: str = "max", window=(2, 2), stride=None, pad=(0, 0),
                    save_indices: bool = True, y: Any = None, dtype: str | None = None,
                    solver: int | str | None = None) -> tuple[Any, Any]:
    """Pool each H x W plane of ``x`` (N x C x H x W).

    Args:
        mode: ``max``, ``avg`` (padding excluded) or ``avg_in`` (padding included).
        window, stride, pad: (h, w) pairs or one int; stride defaults to the window.
        save_indices: with max, also return each output's argmax (h * W + w, int32), which
            :func:`pooling_backward` needs.

    Returns:
        ``(y, indices)``; indices is ``None`` unless max pooling saved them (an int32 NumPy
        array, or a device buffer for device-tensor calls).

    Raises:
        ProblemError: bad arguments (named), before any launch.
    """
    window = _pair(window, "window")
    stride, pad = _pair(stride if stride is not None else window, "stride"), _pair(pad, "pad")
    with Operands(handle.backend) as ops:
        xb, xd = ops.input(x, dtype, "x")
        _four_d(xd, "x")
        probe = PoolProblem("fwd", mode, xd.dtype, xd.shape, window, stride, pad, xd.strides,
                            packed_strides((*xd.shape[:2], 1, 1)))  # validates before the output is sized
        out = TensorDesc.packed(xd.dtype, probe.out_shape)
        yb, yd, result = ops.output(device_default(handle, y, x, out), out, "y")
        keep = bool(save_indices) and mode == "max"
        problem = PoolProblem("fwd", mode, xd.dtype, xd.shape, window, stride, pad, xd.strides, yd.strides, keep)
        n_out = int(np.prod(problem.out_shape))
        index_desc = TensorDesc.packed(DataType.FP32, problem.out_shape)
        if not keep:  # the kernel writes no index: y's buffer stands in, nothing is allocated per call
            invoke(handle, problem, solver, {"x": (xb, xd)}, {"y": (yb, yd)}, unused={"indices": (yb, index_desc)})
            return result, None
        indices = handle.backend.alloc(4 * n_out)
        try:
            invoke(handle, problem, solver, {"x": (xb, xd)}, {"y": (yb, yd)}, unused={"indices": (indices, index_desc)})
            if isinstance(x, DeviceTensor):
                kept, indices = indices, None  # the caller owns it now
            else:
                kept = handle.backend.to_host(indices, np.empty(problem.out_shape, np.int32))
        finally:
            if indices is not None:
                indices.free()
    return result, kept


@repeatable("pool_bwd", ('dy', 'indices', 'dx'))
def pooling_backward(handle, dy: Any, x_shape: tuple[int, ...], *, mode: str = "max", window=(2, 2), stride=None,
                     pad=(0, 0), indices: Any = None, dx: Any = None, dtype: str | None = None,
                     solver: int | str | None = None) -> Any:
    """``dx`` of shape ``x_shape`` from the output gradient ``dy`` (max needs the forward's indices).

    Raises:
        ProblemError: bad arguments (named), before any launch.
    """
    window = _pair(window, "window")
    stride, pad = _pair(stride if stride is not None else window, "stride"), _pair(pad, "pad")
    if mode == "max" and indices is None:
        raise ProblemError("max pooling backward needs the indices the forward saved",
                           "call pooling_forward(..., save_indices=True) and pass its indices")
    with Operands(handle.backend) as ops:
        dyb, dyd = ops.input(dy, dtype, "dy")
        x_shape = tuple(integer(s, "x_shape") for s in x_shape)
        probe = PoolProblem("bwd", mode, dyd.dtype, x_shape, window, stride, pad, packed_strides(x_shape), dyd.strides)
        if dyd.shape != probe.out_shape:
            raise ProblemError(f"dy is {dyd.shape}, but pooling {x_shape} gives {probe.out_shape}",
                               "pass the gradient of pooling_forward's output")
        dxb, dxd, result = ops.output(device_default(handle, dx, dy, TensorDesc.packed(dyd.dtype, x_shape)),
                                      TensorDesc.packed(dyd.dtype, x_shape), "dx")
        problem = PoolProblem("bwd", mode, dyd.dtype, x_shape, window, stride, pad, dxd.strides, dyd.strides)
        index_desc = TensorDesc.packed(DataType.FP32, problem.out_shape)
        if indices is None:
            index_buffer, owned = handle.backend.alloc(4), True  # average pooling reads none
        elif isinstance(indices, np.ndarray):
            if indices.shape != problem.out_shape or indices.dtype != np.int32:
                raise ProblemError(f"indices are {indices.dtype} {indices.shape}, expected int32 {problem.out_shape}",
                                   "pass the indices pooling_forward returned")
            index_buffer, owned = handle.backend.to_device(np.ascontiguousarray(indices)), True
        else:
            index_buffer, owned = indices, False
        try:
            invoke(handle, problem, solver, {"dy": (dyb, dyd)}, {"dx": (dxb, dxd)},
                   unused={"indices": (index_buffer, index_desc)})
        finally:
            if owned:
                index_buffer.free()
    return result
