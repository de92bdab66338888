"""What the fused calls share (:mod:`~kdbkit.runtime.primitives.convolution.fused`,
:mod:`~kdbkit.runtime.primitives.gemm.fused`): their residual's checks, and which solver a fused
convolution takes: one whose kernel applies the epilogue itself, or the find-db's best followed
by the epilogue's pass of its own (ConvEpilogue). Find times the convolution alone, so where its
best does not fuse, a fusing solver ranked within the pass's cost is taken instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.solver import enabled
from kdbkit.runtime.tensor import DataType

if TYPE_CHECKING:  # imported by the gemm package, which the convolution package imports
    from kdbkit.runtime.primitives.convolution.epilogue import ConvEpilogueProblem

# Where the device does not say its bandwidth: a separate pass is taken to cost this many GB/s.
FALLBACK_BANDWIDTH_GBS = 1000.0
PASS_LAUNCH_MS = 0.005  # a launch's own cost on top of the bytes it moves


def fuses(solver, problem) -> bool:
    """Whether ``solver``'s kernel applies the epilogue itself for ``problem`` (it declares so
    with ``fuses_epilogue``)."""
    declares = getattr(solver, "fuses_epilogue", None)
    return bool(declares(problem)) if declares is not None else False


def separate_pass_ms(epilogue: ConvEpilogueProblem, device) -> float:
    """What ConvEpilogue's pass adds: y read and written, the residual read, at the device's
    bandwidth."""
    moved = epilogue.tensors()["y"].numel * epilogue.dtype.itemsize * (3 if epilogue.residual else 2)
    bandwidth = getattr(getattr(device, "memory", None), "bandwidth_gbs", 0.0) or FALLBACK_BANDWIDTH_GBS
    return moved / (bandwidth * 1e6) + PASS_LAUNCH_MS


def fusing_choice(handle, problem, epilogue: ConvEpilogueProblem):
    """Where the find-db ranks first a solver that does not take the epilogue, the best-ranked
    one that does, if its time is within what the separate pass would add; else None. (Find
    times the convolution or gemm alone; the call costs it and the pass.)"""
    # Taken lazily: each solver's applicability is asked only when the walk reaches it, and the
    # walk stops at the first one slower than the limit (a network's first forward asks this
    # of every fused convolution).
    ranking = handle.dispatcher.ranked(problem)
    first = next(ranking, None)
    if first is None or fuses(first[1], problem):
        return None
    limit = first[0].time_ms + separate_pass_ms(epilogue, handle.device)
    for record, solver, _ in ranking:
        if record.time_ms > limit:
            return None
        if fuses(solver, problem) and enabled(solver):
            return solver
    return None


def per_output_vector(ops, value, what: str, count: int, each: str, all_of: str) -> tuple:
    """A float32 epilogue vector's (buffer, descriptor): ``count`` packed values, one per
    ``each`` of the output (``output channel`` of a convolution's, ``column of c`` of a gemm's;
    ``all_of``: the plural, for the message).

    Raises:
        ProblemError: another shape or not packed.
    """
    buffer, desc = ops.input(value, DataType.FP32, what)
    if desc.shape != (count,) or not desc.is_packed:
        raise ProblemError(f"{what} has shape {desc.shape} for {count} {all_of}",
                           f"give {what} as {count} packed float32 values, one per {each}")
    return buffer, desc


def residual_operand(ops, residual, dtype, out: tuple, name: str, what: str) -> tuple:
    """The residual's (buffer, descriptor): laid out as the output ``out`` (its buffer and
    descriptor; ``name``: ``c`` or ``y``), and not in its memory (:func:`refuse_aliased`).

    Raises:
        ProblemError: another shape, type or layout, or the output's memory.
    """
    buffer, desc = ops.input(residual, dtype, "residual")
    out_buffer, out_desc = out
    if desc != out_desc:
        raise ProblemError(f"residual is {desc.dtype.label} {desc.shape} strides {desc.strides}, {name} is "
                           f"{out_desc.dtype.label} {out_desc.shape} strides {out_desc.strides}",
                           f"give a residual of {name}'s shape, type and layout")
    refuse_aliased(buffer, out_buffer, name, what)
    return buffer, desc


def refuse_aliased(residual, out, name: str, what: str) -> None:
    """Refuse a residual buffer that is the output ``name`` (the same object, or the same device
    address where buffers have one): ``what`` (the gemm, the convolution) would overwrite it
    before it is added. A repeat call's plan asks too, since it skips the full path.

    Raises:
        ProblemError: naming both.
    """
    ptr = getattr(residual, "ptr", None)
    if residual is out or (ptr is not None and ptr == getattr(out, "ptr", None)):
        raise ProblemError(f"residual and {name} are the same tensor",
                           f"write {name} elsewhere: the {what} would overwrite the residual before it is added")
