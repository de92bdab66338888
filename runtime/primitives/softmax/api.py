"""softmax_forward and softmax_backward: fast, accurate and log; instance and channel modes."""

from __future__ import annotations

from typing import Any

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.arguments import scalar
from kdbkit.runtime.primitives.invoke import invoke
from kdbkit.runtime.primitives.repeat import repeatable
from kdbkit.runtime.primitives.operands import Operands, device_default
from kdbkit.runtime.primitives.softmax.problem import SoftmaxProblem, as_nchw


@repeatable("softmax_fwd", ('x', 'y'))
def softmax_forward(handle, x: Any, *, algorithm: str = "accurate", mode: str = "channel", alpha: float = 1.0,
                    beta: float = 0.0, y: Any = None, dtype: str | None = None,
                    solver: int | str | None = None) -> Any:
    """``y = alpha * softmax(x) + beta * y`` over C*H*W (``mode="instance"``) or C (``"channel"``).

    Args:
        x: N x C or N x C x H x W: a NumPy array (fp32, fp16, bf16 bits with ``dtype="bf16"``)
            or a :class:`DeviceTensor`.
        algorithm: ``accurate`` (max subtracted), ``fast`` or ``log`` (log-softmax).
        y: ``None``, or an array or device tensor of x's shape and type (read too when beta != 0).

    Raises:
        ProblemError: bad arguments (named), before any launch. NoSolverError: no solver applies.
    """
    alpha, beta = scalar(alpha, "alpha"), scalar(beta, "beta")
    with Operands(handle.backend) as ops:
        xb, xd = ops.input(x, dtype, "x")
        yb, yd, result = ops.output(device_default(handle, y, x, xd), xd, "y", read=beta != 0)
        shape, xs = as_nchw(xd.shape, xd.strides)
        problem = SoftmaxProblem("fwd", algorithm, mode, xd.dtype, shape, xs, as_nchw(yd.shape, yd.strides)[1],
                                 alpha, beta)
        invoke(handle, problem, solver, {"x": (xb, xd)}, {"y": (yb, yd)})
    return result


@repeatable("softmax_bwd", ('y', 'dy', 'dx'))
def softmax_backward(handle, y: Any, dy: Any, *, algorithm: str = "accurate", mode: str = "channel",
                     alpha: float = 1.0, beta: float = 0.0, dx: Any = None, dtype: str | None = None,
                     solver: int | str | None = None) -> Any:
    """``dx = alpha * grad + beta * dx`` from the forward's output ``y`` and its gradient ``dy``.

    Raises:
        ProblemError: bad arguments (named), before any launch. NoSolverError: no solver applies.
    """
    alpha, beta = scalar(alpha, "alpha"), scalar(beta, "beta")
    with Operands(handle.backend) as ops:
        yb, yd = ops.input(y, dtype, "y")
        dyb, dyd = ops.input(dy, dtype, "dy")
        if dyd != yd:
            raise ProblemError(f"dy is {dyd.dtype.label} {dyd.shape} strides {dyd.strides}, y is {yd.dtype.label} "
                               f"{yd.shape} strides {yd.strides}", "y and dy must share shape, type and layout")
        dxb, dxd, result = ops.output(device_default(handle, dx, y, yd), yd, "dx", read=beta != 0)
        shape, ys = as_nchw(yd.shape, yd.strides)
        problem = SoftmaxProblem("bwd", algorithm, mode, yd.dtype, shape, ys, as_nchw(dxd.shape, dxd.strides)[1],
                                 alpha, beta)
        invoke(handle, problem, solver, {"y": (yb, yd), "dy": (dyb, dyd)}, {"dx": (dxb, dxd)})
    return result
