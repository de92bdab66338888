"""SoftmaxLanes (id 14): rows of contiguous 16-byte vectors, a power-of-two run of threads per
row holding it in registers, reductions across the run (shuffles where the backend has them)."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.lanes import BLOCK, MAX_VECTORS, lanes_groups, lanes_options, lanes_tile
from kdbkit.runtime.primitives.softmax.problem import SoftmaxProblem
from kdbkit.runtime.primitives.softmax.solvers.common import KERNEL_FILE, arguments, fits_int_arguments
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import (Solution, Solver, aligned16, fallback_invoker, not_applicable,
                                   vector_elements)


def vectors_per_row(problem: SoftmaxProblem) -> int:
    return problem.row_length // vector_elements(problem.dtype)


def tile(problem: SoftmaxProblem) -> tuple[int, int]:
    return lanes_tile(vectors_per_row(problem))


def _contiguous_rows(problem: SoftmaxProblem, strides: tuple[int, ...], per: int) -> bool:
    """Each row's elements one apart, every row starting on a whole vector."""
    n, c, h, w = problem.shape
    if problem.mode == "channel":
        return (strides[1] == 1 or c == 1) and all(s % per == 0 for s, size in zip(
            (strides[0], strides[2], strides[3]), (n, h, w)) if size > 1)
    packed = strides[3] == 1 and strides[2] == w and strides[1] == h * w
    return packed and (strides[0] % per == 0 or n == 1)


class SoftmaxLanes(Solver):
    id = 14
    name = "SoftmaxLanes"
    primitive = "softmax"

    def is_applicable(self, problem: SoftmaxProblem, device):
        per = vector_elements(problem.dtype)
        if problem.row_length % per:
            return not_applicable(f"rows of {problem.row_length} elements are not whole 16-byte vectors of {per}")
        if not all(_contiguous_rows(problem, s, per) for s in (problem.x_strides, problem.y_strides)):
            return not_applicable("a row's elements are not contiguous, or a row does not start on a 16-byte vector")
        if vectors_per_row(problem) > MAX_VECTORS:
            return not_applicable(f"rows of {problem.row_length} elements; it keeps at most "
                                  f"{MAX_VECTORS * per} in registers")
        return fits_int_arguments(problem)

    def programs(self, problem: SoftmaxProblem):
        return [ProgramRequest(KERNEL_FILE, problem.dtype.options + lanes_options(vectors_per_row(problem)))]

    def solution(self, problem: SoftmaxProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            _, lanes = tile(problem)
            kernel = prog.function(f"softmax_{problem.direction}_lanes")
            order = ("x", "y") if problem.direction == "fwd" else ("y", "dy", "dx")
            tail = [*arguments(problem), np.int32(lanes)]
            groups = lanes_groups(problem.rows, lanes, context.device.target.cu)
            # Tensors at an offset that is not 16-byte aligned go to the block kernels (same program
            # for short rows; the block solver's for long ones, resolved only if ever needed).
            fast = context.backend.launcher(kernel, groups, (BLOCK, 1, 1), [*(None for _ in order), *tail])
            fallback = fallback_invoker(context, problem, "SoftmaxBlock")

            def run(**named):
                tensors = [named[name] for name in order]
                if aligned16(*tensors):
                    fast(*tensors)
                else:
                    fallback(**named)

            return run

        return Solution(self.programs(problem), invoker_factory)
