"""op_tensor: c = op(alpha1 * a, alpha2 * b) + beta * c with add, mul, min or max; b broadcasts."""

from __future__ import annotations

from typing import Any

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.arguments import scalar
from kdbkit.runtime.primitives.invoke import invoke
from kdbkit.runtime.primitives.repeat import repeatable
from kdbkit.runtime.primitives.operands import Operands, device_default
from kdbkit.runtime.primitives.tensorop.problem import TensorOpProblem


@repeatable("op_tensor", ('a', 'b', 'c'))
def op_tensor(handle, op: str, a: Any, b: Any, *, alpha1: float = 1.0, alpha2: float = 1.0, beta: float = 0.0,
              c: Any = None, dtype: str | None = None, solver: int | str | None = None) -> Any:
    """``c = op(alpha1 * a, alpha2 * b) + beta * c``; ``b``'s sizes are each 1 or ``a``'s.

    Args:
        op: ``add``, ``mul``, ``min`` or ``max``.
        a, b: NumPy arrays or :class:`DeviceTensor` s of one type (b may have fewer dimensions).
        c: ``None`` or an output of a's shape (read too when beta != 0); may be ``a``.

    Raises:
        ProblemError: bad arguments (named), before any launch. NoSolverError: no solver applies.
    """
    alpha1, alpha2, beta = scalar(alpha1, "alpha1"), scalar(alpha2, "alpha2"), scalar(beta, "beta")
    with Operands(handle.backend) as ops:
        ab, ad = ops.input(a, dtype, "a")
        bb, bd = ops.input(b, dtype, "b")
        if bd.dtype is not ad.dtype:
            raise ProblemError(f"b holds {bd.dtype.label} elements, a {ad.dtype.label}", "give a and b one type")
        cb, cd, result = ops.output(device_default(handle, c, a, ad), ad, "c", read=beta != 0)
        problem = TensorOpProblem(op, ad.dtype, ad.shape, ad.strides, bd.shape, bd.strides, cd.strides,
                                  alpha1, alpha2, beta)
        invoke(handle, problem, solver, {"a": (ab, ad), "b": (bb, bd)}, {"c": (cb, cd)})
    return result
