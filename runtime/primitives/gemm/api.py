"""gemm: C = alpha * op(A) op(B) + beta * C, batched, row-major, fp16/bf16 accumulating in fp32."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.arguments import scalar
from kdbkit.runtime.primitives.invoke import invoke
from kdbkit.runtime.primitives.repeat import repeatable
from kdbkit.runtime.primitives.operands import Operands, device_default
from kdbkit.runtime.tensor import TensorDesc


def _matrix(desc: TensorDesc, what: str) -> tuple[int, int, int, int, int]:
    """(batch, rows, cols, row stride, batch stride) of a 2-D or 3-D row-major operand."""
    if len(desc.shape) not in (2, 3):
        raise ProblemError(f"{what} is {len(desc.shape)}-D; gemm takes matrices or batches of them",
                           "pass a 2-D (rows, cols) or 3-D (batch, rows, cols) array")
    if desc.strides[-1] != 1 and desc.shape[-1] > 1:
        raise ProblemError(f"{what}'s last dimension is not contiguous (strides {desc.strides})",
                           "pass a row-major operand (transpose it with trans_a/trans_b instead)")
    batch = desc.shape[0] if len(desc.shape) == 3 else 1
    rows, cols = desc.shape[-2:]
    return batch, rows, cols, max(desc.strides[-2], cols) if rows > 1 else cols, \
        (desc.strides[0] if len(desc.shape) == 3 and batch > 1 else 0)


@repeatable("gemm", ('a', 'b', 'c'))
def gemm(handle, a: Any, b: Any, *, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0,
         beta: float = 0.0, c: Any = None, dtype: str | None = None, solver: int | str | None = None) -> Any:
    """``c = alpha * op(a) @ op(b) + beta * c``; 3-D operands are batches (one may be 2-D: shared).

    Raises:
        ProblemError: shapes that do not multiply, or a bad operand (named), before any launch.
    """
    with Operands(handle.backend) as ops:
        call = gemm_operands(ops, handle, a, b, c, trans_a, trans_b, alpha, beta, dtype)
        invoke(handle, call.problem, solver, {"a": call.a, "b": call.b}, {"c": call.c})
    return call.result


@dataclass
class GemmCall:
    """A gemm call's operands (buffer, descriptor) as :class:`Operands` made them, its problem and
    what it returns."""

    a: tuple
    b: tuple
    c: tuple
    problem: GemmProblem
    result: Any


def gemm_operands(ops: Operands, handle, a: Any, b: Any, c: Any, trans_a: bool, trans_b: bool, alpha: float,
                  beta: float, dtype: str | None) -> GemmCall:
    """The operands and problem of ``c = alpha * op(a) @ op(b) + beta * c`` (c made where None).

    Raises:
        ProblemError: shapes that do not multiply, or a bad operand (named).
    """
    alpha, beta = scalar(alpha, "alpha"), scalar(beta, "beta")
    ab, ad = ops.input(a, dtype, "a")
    bb, bd = ops.input(b, dtype, "b")
    if bd.dtype is not ad.dtype:
        raise ProblemError(f"b holds {bd.dtype.label} elements, a {ad.dtype.label}", "give a and b one type")
    batch_a, ra, ca, lda, sa = _matrix(ad, "a")
    batch_b, rb, cb, ldb, sb = _matrix(bd, "b")
    m, k = (ca, ra) if trans_a else (ra, ca)
    k2, n = (cb, rb) if trans_b else (rb, cb)
    if k != k2:
        raise ProblemError(f"op(a) is {m}x{k} but op(b) is {k2}x{n}: the inner sizes differ",
                           "check the shapes and trans_a/trans_b")
    if batch_a != batch_b and 1 not in (batch_a, batch_b):
        raise ProblemError(f"a has {batch_a} matrices, b {batch_b}", "give both one batch size, or one of them 1")
    batch = max(batch_a, batch_b)
    shape = (batch, m, n) if batch > 1 else (m, n)
    cb_, cd, result = ops.output(device_default(handle, c, a, TensorDesc.packed(ad.dtype, shape)),
                                 TensorDesc.packed(ad.dtype, shape), "c", read=beta != 0)
    _, _, _, ldc, sc = _matrix(cd, "c")
    problem = GemmProblem(ad.dtype, m, n, k, bool(trans_a), bool(trans_b), batch, lda, ldb, ldc,
                          sa if batch_a > 1 else 0, sb if batch_b > 1 else 0, sc, alpha, beta)
    return GemmCall((ab, ad), (bb, bd), (cb_, cd), problem, result)
