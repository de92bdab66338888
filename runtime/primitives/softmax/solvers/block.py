"""SoftmaxBlock (id 4): one group of 256 threads per row, reducing in shared memory."""

from __future__ import annotations

from kdbkit.runtime.primitives.softmax.problem import SoftmaxProblem
from kdbkit.runtime.primitives.softmax.solvers.common import (
    arguments,
    evenly_spaced,
    fits_int_arguments,
    kernel_and_buffers,
    program,
)
from kdbkit.runtime.solver import Solution, Solver

BLOCK = 256  # the kernel's default -DBLOCK
MAX_GROUPS = 65535


class SoftmaxBlock(Solver):
    id = 4
    name = "SoftmaxBlock"
    primitive = "softmax"

    def is_applicable(self, problem: SoftmaxProblem, device):
        return fits_int_arguments(problem)

    def programs(self, problem: SoftmaxProblem):
        return [program(problem)]

    def solution(self, problem: SoftmaxProblem, device):
        def invoker_factory(programs, context):
            even = problem.direction == "fwd" and evenly_spaced(problem)
            kernel, order = kernel_and_buffers(problem, programs[0],
                                               "block_even" if even else "block")
            tail, groups = arguments(problem), min(problem.rows, MAX_GROUPS)
            run = context.backend.launcher(kernel, (groups, 1, 1), (BLOCK, 1, 1), [*(None for _ in order), *tail])
            return lambda **t: run(*(t[name] for name in order))

        return Solution(self.programs(problem), invoker_factory)
