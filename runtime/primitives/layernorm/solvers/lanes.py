"""LayerNormLanes (id 15): forward over rows of whole 16-byte vectors, a power-of-two run of
threads per row holding it in registers, the mean and variance reduced across the run."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.lanes import MAX_VECTORS, BLOCK, lanes_groups, lanes_options, lanes_tile
from kdbkit.runtime.primitives.layernorm.problem import LayerNormProblem
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import (APPLIES, Solution, Solver, aligned16, fallback_invoker, not_applicable,
                                   vector_elements)

INT_MAX = 2**31 - 1


def vectors_per_row(problem: LayerNormProblem) -> int:
    return problem.inner // vector_elements(problem.dtype)


class LayerNormLanes(Solver):
    id = 15
    name = "LayerNormLanes"
    primitive = "layernorm"

    def is_applicable(self, problem: LayerNormProblem, device):
        per = vector_elements(problem.dtype)
        if problem.direction != "fwd":
            return not_applicable("it computes the forward pass only")
        if problem.inner % per:
            return not_applicable(f"rows of {problem.inner} elements are not whole 16-byte vectors of {per}")
        if vectors_per_row(problem) > MAX_VECTORS:
            return not_applicable(f"rows of {problem.inner} elements; it keeps at most {MAX_VECTORS * per} in registers")
        if problem.rows * problem.inner > INT_MAX:
            return not_applicable("more elements than the kernel's int arguments")
        return APPLIES

    def programs(self, problem: LayerNormProblem):
        return [ProgramRequest("layernorm.c", problem.dtype.options + lanes_options(vectors_per_row(problem)))]

    def solution(self, problem: LayerNormProblem, device):
        def invoker_factory(programs, context):
            kernel = programs[0].function("layernorm_fwd_lanes")
            _, lanes = lanes_tile(vectors_per_row(problem))
            args = [np.int32(problem.rows), np.int32(problem.inner), np.int32(problem.affine), np.float32(problem.eps),
                    np.int32(lanes)]
            groups = lanes_groups(problem.rows, lanes, context.device.target.cu)
            fast = context.backend.launcher(kernel, groups, (BLOCK, 1, 1), [*(None,) * 6, *args])
            fallback = fallback_invoker(context, problem, "LayerNormBlock")  # tensors not 16-byte aligned

            def forward(x, weight, bias, y, mean, rstd):
                (fast if aligned16(x, weight, bias, y) else fallback)(x, weight, bias, y, mean, rstd)

            return forward

        return Solution(self.programs(problem), invoker_factory)
