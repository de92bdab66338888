"""SoftmaxThread (id 3): one thread per row, for the many short rows of channel mode."""

from __future__ import annotations

from kdbkit.runtime.primitives.softmax.problem import SoftmaxProblem
from kdbkit.runtime.primitives.softmax.solvers.common import arguments, fits_int_arguments, kernel_and_buffers, program
from kdbkit.runtime.solver import Solution, Solver, launcher_1d, not_applicable

MAX_ROW = 64  # a longer row is read one strided element per thread per step: SoftmaxBlock's case


class SoftmaxThread(Solver):
    id = 3
    name = "SoftmaxThread"
    primitive = "softmax"

    def is_applicable(self, problem: SoftmaxProblem, device):
        if problem.row_length > MAX_ROW:
            return not_applicable(f"rows of {problem.row_length} elements; one thread per row takes at most {MAX_ROW}")
        return fits_int_arguments(problem)

    def programs(self, problem: SoftmaxProblem):
        return [program(problem)]

    def solution(self, problem: SoftmaxProblem, device):
        def invoker_factory(programs, context):
            kernel, order = kernel_and_buffers(problem, programs[0], "thread")
            tail = arguments(problem)
            run = launcher_1d(context, kernel, problem.rows, [*(None for _ in order), *tail], block=64)
            return lambda **t: run(*(t[name] for name in order))

        return Solution(self.programs(problem), invoker_factory)
