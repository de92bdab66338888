"""A forward convolution with its epilogue in one call: y = act(conv(x, w) scale[k] + shift[k]
(+ residual)), the shape of an inference network's convolution, batch norm (folded into a
scale and shift per output channel), residual addition and ReLU (MIOpen's fusion plans do this
for convolution, bias and activation).

Where the chosen solver's kernel takes the epilogue (ConvTma on channels-last tensors: it
declares ``fuses_epilogue`` and its invoker has ``fuse``), it is applied as the tile is stored,
so the output is written once and nothing else is launched. Any other solver (or unaligned
tensors) runs the convolution, then the epilogue as one pass of its own (ConvEpilogue), which is
still one pass instead of a batch norm's, an addition's and an activation's. Find times the
convolution alone, so where its best does not fuse, a fusing solver ranked within the cost of
that pass is taken instead (:func:`fusing_choice`).
"""

from __future__ import annotations

from typing import Any

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives import repeat
from kdbkit.runtime.primitives.convolution.api import _four_d, _output, _problem
from kdbkit.runtime.primitives.convolution.epilogue import ACTIVATION_CODES, ACTIVATIONS, ConvEpilogueProblem
from kdbkit.runtime.primitives.fusing import fuses, fusing_choice, per_output_vector, refuse_aliased, residual_operand
from kdbkit.runtime.primitives.invoke import chosen_invoker, invoke
from kdbkit.runtime.primitives.operands import Operands
from kdbkit.runtime.solver import aligned16


@repeat.repeatable("conv_fwd_fused", ("x", "w", "scale", "shift", "residual", "y"))
def convolution_forward_fused(handle, x: Any, w: Any, scale: Any, shift: Any, *, residual: Any = None,
                              activation: str = "none", pad=0, stride=1, dilation=1, groups: int = 1, y: Any = None,
                              dtype: str | None = None, solver: int | str | None = None) -> Any:
    """y = act(convolution(x, w) scale[k] + shift[k] (+ residual)), act ``none``, ``relu`` or
    ``gelu_erf``.

    A batch norm in inference folds into ``scale`` = weight / sqrt(running_var + eps) and
    ``shift`` = bias - running_mean scale (float32, one per output channel); ``residual`` is a
    tensor of y's shape, type and layout (or None). ``solver`` picks the convolution's solver.

    Raises:
        ProblemError: bad arguments (named), before any launch.
    """
    if activation not in ACTIVATIONS:
        raise ProblemError(f"activation {activation!r}", f"use one of {', '.join(ACTIVATIONS)}")
    with Operands(handle.backend) as ops:
        xb, xd = ops.input(x, dtype, "x")
        wb, wd = ops.input(w, dtype, "w")
        _four_d(xd, "x"), _four_d(wd, "w")
        problem = _problem("F", xd.shape, wd, {"x": xd, "w": wd}, pad, stride, dilation, groups)
        sb, sd = per_output_vector(ops, scale, "scale", problem.out_channels, "output channel", "output channels")
        hb, hd = per_output_vector(ops, shift, "shift", problem.out_channels, "output channel", "output channels")
        yb, yd, result, problem = _output(ops, handle, y, x, problem, "y", "y", {"x": xd, "w": wd})
        tensors = {"y": (yb, yd), "scale": (sb, sd), "shift": (hb, hd)}
        if residual is not None:
            tensors["residual"] = residual_operand(ops, residual, dtype, (yb, yd), "y", "convolution")
        epilogue = ConvEpilogueProblem(yd.dtype, yd.shape, yd.strides, residual is not None, activation)
        if repeat.full_path_only():  # numerics checks and command logs see each problem on its own
            invoke(handle, problem, solver, {"x": (xb, xd), "w": (wb, wd)}, {"y": (yb, yd)})
            invoke(handle, epilogue, None, {n: t for n, t in tensors.items() if n != "y"}, {"y": (yb, yd)})
            return result
        run = _runner(handle, problem, solver, epilogue)
        buffers = {"x": xb, "w": wb, **{n: b for n, (b, _) in tensors.items()}}
        run(**buffers)
        repeat.note_invoke(run, buffers)
    return result


def _runner(handle, problem, solver, epilogue: ConvEpilogueProblem):
    """One invoker of the whole call, ``run(x, w, y, scale, shift[, residual])`` (a repeat call's
    plan keeps it): the kernel's own epilogue where the solver has one and the tensors are
    aligned for it, else the convolution and then ConvEpilogue's pass. Both problems are
    chosen for here, so that the programs a call may need are resolved (and listed) at once."""
    choice, conv = chosen_invoker(handle, problem, solver)
    if choice.how == "find-db" and not fuses(choice.solver, problem):
        better = fusing_choice(handle, problem, epilogue)
        if better is not None:
            conv = handle.dispatcher.invoker(problem, better)
    separate = chosen_invoker(handle, epilogue, None)[1]
    fuse = getattr(conv, "fuse", None)
    fused = fuse(epilogue.residual, ACTIVATION_CODES[epilogue.activation]) if fuse is not None else None

    def run(x, w, y, scale, shift, residual=None):
        if residual is not None:
            refuse_aliased(residual, y, "y", "convolution")
        extra = () if residual is None else (residual,)
        if fused is not None and aligned16(x, w, y, *extra):
            fused(x, w, y, scale, shift, *extra)
            return
        conv(x=x, w=w, y=y)
        separate(y=y, scale=scale, shift=shift, residual=residual)

    return run
