"""activation_forward and activation_backward: every mode, fp32/fp16/bf16, NumPy or device tensors."""

from __future__ import annotations

from typing import Any

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.arguments import scalar
from kdbkit.runtime.primitives.invoke import invoke
from kdbkit.runtime.primitives.activation.problem import ActivationMode, ActivationProblem
from kdbkit.runtime.primitives.repeat import repeatable
from kdbkit.runtime.primitives.operands import Operands, device_default


@repeatable("activ_fwd", ('x', 'y'))
def activation_forward(handle, x: Any, mode: ActivationMode | str | int = "relu", *, alpha: float = 0.0,
                       beta: float = 0.0, gamma: float = 0.0, y: Any = None, dtype: str | None = None,
                       solver: int | str | None = None) -> Any:
    """``y = f(x)`` for an activation ``mode`` (see :class:`ActivationMode` for alpha, beta, gamma).

    Args:
        handle: a :class:`kdbkit.Handle`.
        x: a NumPy array (fp32, fp16, or bf16 bits as uint16 with ``dtype="bf16"``) or a
            :class:`DeviceTensor`.
        y: where to write: ``None`` (a new array, or a new device tensor when ``x`` is one), a
            NumPy array or a device tensor of ``x``'s shape and type. May be ``x`` itself.
        solver: a solver id or name to use instead of kdbkit's choice.

    Returns:
        ``y``.

    Raises:
        ProblemError: bad arguments (named), before any launch. NoSolverError: no solver applies.
    """
    with Operands(handle.backend) as ops:
        xb, xd = ops.input(x, dtype, "x")
        yb, yd, result = ops.output(device_default(handle, y, x, xd), xd, "y")
        problem = ActivationProblem("fwd", ActivationMode.parse(mode), xd.dtype, xd.shape, xd.strides, yd.strides,
                                    scalar(alpha, "alpha"), scalar(beta, "beta"), scalar(gamma, "gamma"))
        invoke(handle, problem, solver, {"x": (xb, xd)}, {"y": (yb, yd)})
    return result


@repeatable("activ_bwd", ('x', 'y', 'dy', 'dx'))
def activation_backward(handle, x: Any, y: Any, dy: Any, mode: ActivationMode | str | int = "relu", *,
                        alpha: float = 0.0, beta: float = 0.0, gamma: float = 0.0, dx: Any = None,
                        dtype: str | None = None, solver: int | str | None = None) -> Any:
    """``dx = dy * f'(x)``, given the forward's input ``x`` and output ``y``.

    ``x``, ``y`` and ``dy`` must have one shape, type and layout; ``dx`` as in
    :func:`activation_forward`'s ``y``.

    Raises:
        ProblemError: bad arguments (named), before any launch. NoSolverError: no solver applies.
    """
    with Operands(handle.backend) as ops:
        xb, xd = ops.input(x, dtype, "x")
        tensors = {"x": (xb, xd)}
        for name, value in (("y", y), ("dy", dy)):
            buf, desc = ops.input(value, dtype, name)
            if desc != xd:
                raise ProblemError(f"{name} is {desc.dtype.label} {desc.shape} with strides {desc.strides}, "
                                   f"x is {xd.dtype.label} {xd.shape} with strides {xd.strides}",
                                   "x, y and dy must share shape, type and layout")
            tensors[name] = (buf, desc)
        dxb, dxd, result = ops.output(device_default(handle, dx, x, xd), xd, "dx")
        problem = ActivationProblem("bwd", ActivationMode.parse(mode), xd.dtype, xd.shape, xd.strides, dxd.strides,
                                    scalar(alpha, "alpha"), scalar(beta, "beta"), scalar(gamma, "gamma"))
        invoke(handle, problem, solver, tensors, {"dx": (dxb, dxd)})
    return result

