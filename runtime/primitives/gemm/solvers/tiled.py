"""GemmTiled (id 10): 16 x 16 tiles through shared memory, any backend and type."""

from __future__ import annotations

from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.gemm.solvers.common import fits, gemm_arguments
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import Solution, Solver

TILE = 16


class GemmTiled(Solver):
    id = 10
    name = "GemmTiled"
    primitive = "gemm"

    def is_applicable(self, problem: GemmProblem, device):
        return fits(problem)

    def programs(self, problem: GemmProblem):
        return [ProgramRequest("gemm.c", problem.dtype.options)]

    def solution(self, problem: GemmProblem, device):
        def invoker_factory(programs, context):
            kernel = programs[0].function("gemm_tiled")
            grid = (-(-problem.n // TILE), -(-problem.m // TILE), problem.batch)
            run = context.backend.launcher(kernel, grid, (TILE, TILE, 1), [None, None, None, *gemm_arguments(problem)])
            return lambda a, b, c: run(a, b, c)

        return Solution(self.programs(problem), invoker_factory)
