"""LayerNormBlock (id 7): one group of 256 threads per row; weight gradients one thread per column."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.layernorm.problem import LayerNormProblem
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, Solver, launch_1d, not_applicable

BLOCK, MAX_GROUPS, INT_MAX = 256, 65535, 2**31 - 1


def program(problem: LayerNormProblem) -> ProgramRequest:
    return ProgramRequest("layernorm.c", problem.dtype.options)


class LayerNormBlock(Solver):
    id = 7
    name = "LayerNormBlock"
    primitive = "layernorm"

    def is_applicable(self, problem: LayerNormProblem, device):
        if problem.rows * problem.inner > INT_MAX:
            return not_applicable("more elements than the kernel's int arguments")
        return APPLIES

    def programs(self, problem: LayerNormProblem):
        return [program(problem)]

    def solution(self, problem: LayerNormProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            launch, groups = context.backend.launch, (min(problem.rows, MAX_GROUPS), 1, 1)
            rows, inner, affine = np.int32(problem.rows), np.int32(problem.inner), np.int32(problem.affine)
            if problem.direction == "fwd":
                kernel, eps = prog.function("layernorm_fwd"), np.float32(problem.eps)
                run = context.backend.launcher(kernel, groups, (BLOCK, 1, 1), [*(None,) * 6, rows, inner, affine, eps])
                return lambda x, weight, bias, y, mean, rstd: run(x, weight, bias, y, mean, rstd)
            data, weights = prog.function("layernorm_bwd_data"), prog.function("layernorm_bwd_weight")

            def backward(x, dy, weight, mean, rstd, dx, dweight, dbias):
                launch(data, groups, (BLOCK, 1, 1), [x, dy, weight, mean, rstd, dx, rows, inner, affine])
                if problem.affine:
                    launch_1d(context, weights, problem.inner, [x, dy, mean, rstd, dweight, dbias, rows, inner],
                              block=64)

            return backward

        return Solution(self.programs(problem), invoker_factory)
