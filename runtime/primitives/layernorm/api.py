"""layernorm_forward and layernorm_backward, with or without weight and bias."""

from __future__ import annotations

from typing import Any

import numpy as np

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.arguments import integer, scalar
from kdbkit.runtime.primitives.invoke import invoke
from kdbkit.runtime.primitives.layernorm.problem import LayerNormProblem
from kdbkit.runtime.primitives.repeat import repeatable
from kdbkit.runtime.primitives.operands import Operands, device_default
from kdbkit.runtime.tensor import DataType, TensorDesc


def _dim(dim: int, ndim: int) -> int:
    dim = integer(dim, "dim")
    return dim + ndim if dim < 0 else dim


def _packed(desc: TensorDesc, what: str) -> None:
    if not desc.is_packed:
        raise ProblemError(f"{what} is not packed (strides {desc.strides})", "layer norm takes packed tensors")


def _row_input(ops: Operands, value: Any, like: TensorDesc, shape: tuple[int, ...], what: str):
    if value is None:
        return None
    buf, desc = ops.input(value, like.dtype, what)
    if desc.shape != shape:
        raise ProblemError(f"{what} has shape {desc.shape}, the normalised dimensions are {shape}",
                           f"pass a {what} of one row's shape")
    return buf, desc


def _rows_like(value: Any, stats: TensorDesc) -> TensorDesc:
    """The statistics' descriptor in the caller's own shape when it has one row count of
    elements (a 1-D array of rows, or the leading dimensions' shape), so either is accepted."""
    shape = tuple(getattr(value, "shape", ()) or ())
    if value is not None and shape and int(np.prod(shape)) == stats.numel:
        return TensorDesc.packed(stats.dtype, shape)
    return stats


@repeatable("lnorm_fwd", ("x", "weight", "bias", "y", "mean", "rstd"))
def layernorm_forward(handle, x: Any, weight: Any = None, bias: Any = None, *, dim: int = -1, eps: float = 1e-5,
                      y: Any = None, mean: Any = None, rstd: Any = None, dtype: str | None = None,
                      solver: int | str | None = None) -> tuple[Any, Any, Any]:
    """``y = (x - mean) / sqrt(var + eps) * weight + bias`` over x's dimensions from ``dim`` on.

    Args:
        x: a packed NumPy array or device tensor (fp32, fp16, bf16).
        weight, bias: both or neither, each of the normalised dimensions' shape.
        dim: the first normalised dimension (negative counts from the end).
        y, mean, rstd: where to write (each as :func:`activation_forward`'s ``y``): ``None``
            for new ones; mean and rstd are float32 with one element per row.

    Returns:
        ``(y, mean, rstd)``; mean and 1/std are float32, one per row.

    Raises:
        ProblemError: bad arguments (named), before any launch.
    """
    if (weight is None) != (bias is None):
        raise ProblemError("layer norm got a weight without a bias, or a bias without a weight",
                           "pass both, or neither")
    with Operands(handle.backend) as ops:
        xb, xd = ops.input(x, dtype, "x")
        _packed(xd, "x")
        problem = LayerNormProblem("fwd", xd.dtype, xd.shape, _dim(dim, len(xd.shape)), weight is not None,
                                   scalar(eps, "eps"))
        row = xd.shape[problem.dim:]
        w, b = _row_input(ops, weight, xd, row, "weight"), _row_input(ops, bias, xd, row, "bias")
        yb, yd, y = ops.output(device_default(handle, y, x, xd), xd, "y")
        stats = TensorDesc.packed(DataType.FP32, xd.shape[: problem.dim] or (1,))
        mb, md, mean = ops.output(device_default(handle, mean, x, stats), _rows_like(mean, stats), "mean")
        rb, rd, rstd = ops.output(device_default(handle, rstd, x, stats), _rows_like(rstd, stats), "rstd")
        affine = {"weight": w, "bias": b} if w else {}
        invoke(handle, problem, solver, {"x": (xb, xd), **affine}, {"y": (yb, yd), "mean": (mb, md), "rstd": (rb, rd)},
               unused=None if w else {"weight": (xb, xd), "bias": (xb, xd)})
    return y, mean, rstd


@repeatable("lnorm_bwd", ('x', 'dy', 'mean', 'rstd', 'weight', 'dx', 'dweight', 'dbias'))
def layernorm_backward(handle, x: Any, dy: Any, mean: Any, rstd: Any, weight: Any = None, *, dim: int = -1,
                       dtype: str | None = None, solver: int | str | None = None) -> tuple[Any, Any, Any]:
    """Gradients of :func:`layernorm_forward`, from its input, its mean and rstd, and ``dy``.

    Returns:
        ``(dx, dweight, dbias)``; the last two are ``None`` without a weight.

    Raises:
        ProblemError: bad arguments (named), before any launch.
    """
    with Operands(handle.backend) as ops:
        xb, xd = ops.input(x, dtype, "x")
        _packed(xd, "x")
        dyb, dyd = ops.input(dy, dtype, "dy")
        if dyd != xd:
            raise ProblemError(f"dy is {dyd.dtype.label} {dyd.shape}, x {xd.dtype.label} {xd.shape}",
                               "x and dy must share shape, type and layout")
        problem = LayerNormProblem("bwd", xd.dtype, xd.shape, _dim(dim, len(xd.shape)), weight is not None)
        stats_shape = xd.shape[: problem.dim] or (1,)  # dim 0: the whole tensor is one row
        stats = {}
        for name, value in (("mean", mean), ("rstd", rstd)):
            buf, desc = ops.input(value, "fp32", name)
            if desc.shape != stats_shape:
                raise ProblemError(f"{name} has shape {desc.shape}, expected {stats_shape} (one per row)",
                                   f"pass the {name} layernorm_forward returned")
            stats[name] = (buf, desc)
        row = xd.shape[problem.dim:]
        w = _row_input(ops, weight, xd, row, "weight")
        dxb, dxd, dx = ops.output(device_default(handle, None, x, xd), xd, "dx")
        row_desc = TensorDesc.packed(xd.dtype, row)
        wb, wd, dweight = ops.output(device_default(handle, None, x, row_desc), row_desc, "dweight")
        bb, bd, dbias = ops.output(device_default(handle, None, x, row_desc), row_desc, "dbias")
        grads = {"dweight": (wb, wd), "dbias": (bb, bd)}
        invoke(handle, problem, solver, {"x": (xb, xd), "dy": (dyb, dyd), "weight": w or (xb, xd), **stats},
               {"dx": (dxb, dxd), **(grads if w else {})}, unused=None if w else grads)
    return (dx, dweight, dbias) if weight is not None else (dx, None, None)
