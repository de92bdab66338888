"""ActivStrided (id 2): any element strides up to 5-D, each index computed from the shape."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.activation.problem import ActivationProblem
from kdbkit.runtime.primitives.activation.solvers.common import INT_MAX, mode_args, program
from kdbkit.runtime.solver import APPLIES, Solution, Solver, launcher_1d, not_applicable, padded_ints

MAX_DIMS = 5


class ActivStrided(Solver):
    id = 2
    name = "ActivStrided"
    primitive = "activ"

    def is_applicable(self, problem: ActivationProblem, device):
        if len(problem.shape) > MAX_DIMS:
            return not_applicable(f"{len(problem.shape)} dimensions; it handles up to {MAX_DIMS}")
        if problem.numel > INT_MAX or max(problem.x_strides + problem.y_strides) > INT_MAX:
            return not_applicable("sizes or strides exceed the kernel's int arguments")
        return APPLIES

    def programs(self, problem: ActivationProblem):
        return [program(problem)]

    def solution(self, problem: ActivationProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            dims = padded_ints(problem.shape, 1, MAX_DIMS)[1:]  # the outermost size is implied by n
            xs, ys = padded_ints(problem.x_strides, 0, MAX_DIMS), padded_ints(problem.y_strides, 0, MAX_DIMS)
            n, tail = np.int32(problem.numel), mode_args(problem)
            if problem.direction == "fwd":
                kernel = prog.function("activ_fwd_strided")
                run = launcher_1d(context, kernel, problem.numel, [None, None, n, *dims, *xs, *ys, *tail])
                return lambda x, y: run(x, y)
            kernel = prog.function("activ_bwd_strided")
            run = launcher_1d(context, kernel, problem.numel, [None, None, None, None, n, *dims, *xs, *ys, *tail])
            return lambda x, y, dy, dx: run(x, y, dy, dx)

        return Solution(self.programs(problem), invoker_factory)
