"""A gemm with its epilogue in one call: c = act(alpha op(a) op(b) scale[j] + shift[j] (+ residual)),
the shape of a linear layer with its bias, activation (GELU in BERT's feed-forward) and residual
addition (cuBLASLt's epilogues do this for bias and activation).

The gemm runs, then the epilogue as one pass of its own (ConvEpilogue over C seen as N x C x H x
W = batch x n x m x 1: a column is a channel), which is still one pass instead of an addition's,
an activation's and another addition's. No gemm solver's kernel takes the epilogue itself yet:
GemmTma's store with the epilogue compiled in was five times the cubin and ten times the compile
(docs/performance.md), so it stays out until it is built and timed on a GPU; a fusing one would
then be chosen as a fused convolution's is (:mod:`~kdbkit.runtime.primitives.fusing`).
"""

from __future__ import annotations

from typing import Any

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives import repeat
from kdbkit.runtime.primitives.convolution.epilogue import ACTIVATIONS, ConvEpilogueProblem
from kdbkit.runtime.primitives.fusing import per_output_vector, refuse_aliased, residual_operand
from kdbkit.runtime.primitives.gemm.api import gemm_operands
from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.invoke import chosen_invoker, invoke
from kdbkit.runtime.primitives.operands import Operands
from kdbkit.runtime.tensor import TensorDesc


def epilogue_problem(problem: GemmProblem, c: TensorDesc, residual: bool, activation: str,
                     scaled: bool) -> ConvEpilogueProblem:
    """C as the epilogue pass sees it: batch x n x m x 1, a column a channel (packed C is then
    channels-last, the pass's dense case)."""
    batch_stride = c.strides[0] if len(c.shape) == 3 else problem.m * problem.ldc
    return ConvEpilogueProblem(c.dtype, (problem.batch, problem.n, problem.m, 1),
                               (batch_stride, 1, problem.ldc, problem.n), residual, activation, scaled)


@repeat.repeatable("gemm_fused", ("a", "b", "shift", "scale", "residual", "c"))
def gemm_fused(handle, a: Any, b: Any, shift: Any, *, scale: Any = None, residual: Any = None,
               activation: str = "none", trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0,
               c: Any = None, dtype: str | None = None, solver: int | str | None = None) -> Any:
    """c = act(alpha op(a) op(b) scale[j] + shift[j] (+ residual)), act ``none``, ``relu`` or
    ``gelu_erf`` (x Phi(x), PyTorch's default GELU).

    ``shift`` (a linear layer's bias) and ``scale`` (None: 1) are float32, one per column of c;
    ``residual`` is a tensor of c's shape, type and layout (or None). 3-D operands are batches,
    as :func:`~kdbkit.runtime.primitives.gemm.api.gemm` takes them; ``solver`` picks the gemm's.

    Raises:
        ProblemError: bad arguments (named), before any launch.
    """
    if activation not in ACTIVATIONS:
        raise ProblemError(f"activation {activation!r}", f"use one of {', '.join(ACTIVATIONS)}")
    with Operands(handle.backend) as ops:
        call = gemm_operands(ops, handle, a, b, c, trans_a, trans_b, alpha, 0.0, dtype)
        problem, (cb, cd) = call.problem, call.c
        tensors = {"shift": per_output_vector(ops, shift, "shift", problem.n, "column of c", "columns of c")}
        if scale is not None:
            tensors["scale"] = per_output_vector(ops, scale, "scale", problem.n, "column of c", "columns of c")
        if residual is not None:
            tensors["residual"] = residual_operand(ops, residual, dtype, (cb, cd), "c", "gemm")
        epilogue = epilogue_problem(problem, cd, residual is not None, activation, scale is not None)
        if repeat.full_path_only():  # numerics checks and command logs see each problem on its own
            invoke(handle, problem, solver, {"a": call.a, "b": call.b}, {"c": (cb, cd)})
            invoke(handle, epilogue, None, {n: t for n, t in tensors.items()}, {"y": (cb, cd)})
            return call.result
        run = _runner(handle, problem, solver, epilogue)
        buffers = {"a": call.a[0], "b": call.b[0], "c": cb, **{n: t[0] for n, t in tensors.items()}}
        run(**buffers)
        repeat.note_invoke(run, buffers)
    return call.result


def _runner(handle, problem: GemmProblem, solver, epilogue: ConvEpilogueProblem):
    """One invoker of the whole call, ``run(a, b, c, shift[, scale][, residual])`` (a repeat
    call's plan keeps it): the gemm, then ConvEpilogue's pass. Both problems are chosen for here,
    so that the programs a call needs are resolved (and listed) at once."""
    multiply = chosen_invoker(handle, problem, solver)[1]
    separate = chosen_invoker(handle, epilogue, None)[1]

    def run(a, b, c, shift, scale=None, residual=None):
        if residual is not None:
            refuse_aliased(residual, c, "c", "gemm")
        multiply(a=a, b=b, c=c)
        separate(y=c, shift=shift, scale=scale, residual=residual)

    return run
