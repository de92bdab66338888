"""SoftmaxRows (id 12): forward over rows of 65 to 1024 elements, 32 threads per row and 8 rows per group."""

from __future__ import annotations

from kdbkit.runtime.primitives.softmax.problem import SoftmaxProblem
from kdbkit.runtime.primitives.softmax.solvers.common import (
    arguments,
    evenly_spaced,
    fits_int_arguments,
    kernel_and_buffers,
    program,
)
from kdbkit.runtime.solver import Solution, Solver, not_applicable

BLOCK, ROWS_PER_GROUP, MAX_ROW, MAX_GROUPS = 256, 8, 1024, 65535


class SoftmaxRows(Solver):
    id = 12
    name = "SoftmaxRows"
    primitive = "softmax"

    def is_applicable(self, problem: SoftmaxProblem, device):
        if problem.direction != "fwd":
            return not_applicable("it computes the forward pass only")
        if problem.row_length > MAX_ROW:
            return not_applicable(f"rows of {problem.row_length} elements; it keeps at most {MAX_ROW} in registers")
        if not evenly_spaced(problem):
            return not_applicable("a row's elements are not evenly spaced (instance mode over a non-packed tensor)")
        return fits_int_arguments(problem)

    def programs(self, problem: SoftmaxProblem):
        return [program(problem)]

    def solution(self, problem: SoftmaxProblem, device):
        def invoker_factory(programs, context):
            kernel, order = kernel_and_buffers(problem, programs[0], "rows")
            tail = arguments(problem)
            groups = min(-(-problem.rows // ROWS_PER_GROUP), MAX_GROUPS)
            run = context.backend.launcher(kernel, (groups, 1, 1), (BLOCK, 1, 1), [*(None for _ in order), *tail])
            return lambda **t: run(*(t[name] for name in order))

        return Solution(self.programs(problem), invoker_factory)
