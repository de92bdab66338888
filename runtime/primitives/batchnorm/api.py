"""batchnorm_inference, batchnorm_training and batchnorm_backward; spatial and per-activation."""

from __future__ import annotations

from typing import Any

import numpy as np

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.batchnorm.problem import MODES, BatchNormProblem
from kdbkit.runtime.primitives.arguments import scalar
from kdbkit.runtime.primitives.invoke import invoke
from kdbkit.runtime.primitives.repeat import repeatable
from kdbkit.runtime.primitives.operands import Operands, device_default
from kdbkit.runtime.tensor import DataType, DeviceTensor, TensorDesc


def _channels(shape: tuple[int, ...], mode: str) -> int:
    if mode not in MODES:
        raise ProblemError(f"batch norm mode {mode!r}", f"use one of {', '.join(MODES)}")
    return shape[1] if mode == "spatial" else shape[1] * shape[2] * shape[3]


def _x(ops: Operands, x: Any, dtype, what: str = "x"):
    buf, desc = ops.input(x, dtype, what)
    if len(desc.shape) != 4:
        raise ProblemError(f"{what} is {len(desc.shape)}-D; batch norm takes N x C x H x W", "reshape it to 4-D")
    return buf, desc


def _param(ops: Operands, value: Any, count: int, what: str, *, output: bool = False):
    """A float32 per-channel parameter: ``count`` elements in any shape (1xCx1x1, C, ...)."""
    if value is None:
        raise ProblemError(f"batch norm needs {what}", f"pass {what} (float32, one per channel)")
    if output:
        buf, desc, _ = ops.output(value, TensorDesc.packed(DataType.FP32, np.shape(value) or (1,)), what, read=True)
    else:
        buf, desc = ops.input(value, "fp32", what)
    if desc.numel != count:
        raise ProblemError(f"{what} has {desc.numel} elements; this batch norm has {count} channels",
                           f"pass one float32 {what} per channel")
    return buf, desc


def _new_stats(ops: Operands, handle, x: Any, count: int, what: str, given: Any = None):
    """A float32 per-channel output: ``given`` (count elements in any shape), or a new one of
    the caller's kind (NumPy, device tensor, PyTorch...)."""
    shape = (count,) if given is None else tuple(given.desc.shape if isinstance(given, DeviceTensor) else
                                                  np.shape(given))
    desc = TensorDesc.packed(DataType.FP32, shape if int(np.prod(shape)) == count else (count,))
    return ops.output(device_default(handle, given, x, desc), desc, what)


@repeatable("bnorm_infer", ('x', 'scale', 'bias', 'mean', 'var', 'y'))
def batchnorm_inference(handle, x: Any, scale: Any, bias: Any, mean: Any, var: Any, *, mode: str = "spatial",
                        eps: float = 1e-5, y: Any = None, dtype: str | None = None,
                        solver: int | str | None = None) -> Any:
    """``y = scale * (x - mean) / sqrt(var + eps) + bias`` with given (running) statistics."""
    with Operands(handle.backend) as ops:
        xb, xd = _x(ops, x, dtype)
        count = _channels(xd.shape, mode)
        params = {name: _param(ops, value, count, name)
                  for name, value in (("scale", scale), ("bias", bias), ("mean", mean), ("var", var))}
        yb, yd, result = ops.output(device_default(handle, y, x, xd), xd, "y")
        problem = BatchNormProblem("infer", mode, xd.dtype, xd.shape, xd.strides, yd.strides, scalar(eps, "eps"))
        invoke(handle, problem, solver, {"x": (xb, xd), **params}, {"y": (yb, yd)})
    return result


@repeatable("bnorm_train", ('x', 'scale', 'bias', 'running_mean', 'running_var', 'y', 'saved_mean', 'saved_invstd'))
def batchnorm_training(handle, x: Any, scale: Any, bias: Any, *, mode: str = "spatial", eps: float = 1e-5,
                       momentum: float = 0.1, running_mean: Any = None, running_var: Any = None, y: Any = None,
                       saved_mean: Any = None, saved_invstd: Any = None, dtype: str | None = None,
                       solver: int | str | None = None) -> tuple[Any, Any, Any]:
    """Normalise with the batch's statistics; update running ones (float32 arrays, in place) if given.

    ``y``, ``saved_mean`` and ``saved_invstd`` are where to write (``None``: new ones).

    Returns:
        ``(y, saved_mean, saved_invstd)`` for :func:`batchnorm_backward`.
    """
    if (running_mean is None) != (running_var is None):
        raise ProblemError("batch norm got one running statistic without the other", "pass both, or neither")
    with Operands(handle.backend) as ops:
        xb, xd = _x(ops, x, dtype)
        count = _channels(xd.shape, mode)
        params = {"scale": _param(ops, scale, count, "scale"), "bias": _param(ops, bias, count, "bias")}
        running = running_mean is not None
        if running:
            stats = {"running_mean": _param(ops, running_mean, count, "running_mean", output=True),
                     "running_var": _param(ops, running_var, count, "running_var", output=True)}
        yb, yd, result = ops.output(device_default(handle, y, x, xd), xd, "y")
        mb, md, saved_mean = _new_stats(ops, handle, x, count, "saved_mean", saved_mean)
        sb, sd, saved_invstd = _new_stats(ops, handle, x, count, "saved_invstd", saved_invstd)
        if not running:  # the kernel leaves them alone: any buffer will do
            stats = {"running_mean": (mb, md), "running_var": (mb, md)}
        problem = BatchNormProblem("train", mode, xd.dtype, xd.shape, xd.strides, yd.strides, scalar(eps, "eps"),
                                   scalar(momentum, "momentum"), running)
        outputs = {"y": (yb, yd), "saved_mean": (mb, md), "saved_invstd": (sb, sd)}
        invoke(handle, problem, solver, {"x": (xb, xd), **params}, {**outputs, **(stats if running else {})},
               unused=None if running else stats)
    return result, saved_mean, saved_invstd


@repeatable("bnorm_bwd", ('x', 'dy', 'scale', 'saved_mean', 'saved_invstd', 'dx', 'dscale', 'dbias'))
def batchnorm_backward(handle, x: Any, dy: Any, scale: Any, saved_mean: Any = None, saved_invstd: Any = None, *,
                       mode: str = "spatial", eps: float = 1e-5, dx: Any = None, dtype: str | None = None,
                       solver: int | str | None = None) -> tuple[Any, Any, Any]:
    """``(dx, dscale, dbias)``; with no saved statistics they are computed again from x."""
    if (saved_mean is None) != (saved_invstd is None):
        raise ProblemError("batch norm backward got one saved statistic without the other", "pass both, or neither")
    with Operands(handle.backend) as ops:
        xb, xd = _x(ops, x, dtype)
        dyb, dyd = _x(ops, dy, dtype, "dy")
        if dyd != xd:
            raise ProblemError(f"dy is {dyd.dtype.label} {dyd.shape} strides {dyd.strides}, x is {xd.dtype.label} "
                               f"{xd.shape} strides {xd.strides}", "x and dy must share shape, type and layout")
        count = _channels(xd.shape, mode)
        saved = saved_mean is not None
        scale_t = _param(ops, scale, count, "scale")
        if saved:
            stats = {"saved_mean": _param(ops, saved_mean, count, "saved_mean"),
                     "saved_invstd": _param(ops, saved_invstd, count, "saved_invstd")}
        else:
            stats = {"saved_mean": scale_t, "saved_invstd": scale_t}  # not read
        dxb, dxd, result = ops.output(device_default(handle, dx, x, xd), xd, "dx")
        gb, gd, dscale = _new_stats(ops, handle, x, count, "dscale")
        bb, bd, dbias = _new_stats(ops, handle, x, count, "dbias")
        problem = BatchNormProblem("bwd", mode, xd.dtype, xd.shape, xd.strides, dxd.strides, scalar(eps, "eps"),
                                   saved=saved)
        inputs = {"x": (xb, xd), "dy": (dyb, dyd), "scale": scale_t, **(stats if saved else {})}
        invoke(handle, problem, solver, inputs, {"dx": (dxb, dxd), "dscale": (gb, gd), "dbias": (bb, bd)},
               unused=None if saved else stats)
    return result, dscale, dbias
