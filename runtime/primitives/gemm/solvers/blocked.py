"""GemmBlocked (id 29): gemm.c's gemm_blocked, igemm_core.h's register-blocked multiply (128 x
128 tiles, 8 x 8 fp32 sums a thread, double-buffered shared memory), any backend and type:
the fast path for fp32, which the tensor-core solvers do not take. Immediate mode passes over
it for products that would leave most of a tile empty (GemmTiled's 16 x 16 tiles fit them)."""

from __future__ import annotations

from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.gemm.solvers.common import fits, gemm_arguments
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, Solver, not_applicable

TILE, THREADS, MAX_GRID_Y = 128, 256, 65535  # igemm_core.h's IG_BM = IG_BN, IG_THREADS


class GemmBlocked(Solver):
    id = 29
    name = "GemmBlocked"
    primitive = "gemm"

    def is_applicable(self, problem: GemmProblem, device):
        if -(-problem.n // TILE) > MAX_GRID_Y:
            return not_applicable(f"N = {problem.n} needs more than {MAX_GRID_Y} column tiles")
        return fits(problem)

    def suits(self, problem: GemmProblem, device):
        used = min(problem.m, TILE) * min(problem.n, TILE) / TILE**2
        if used < 1 / 8:
            return not_applicable(f"its {TILE} x {TILE} tiles would be {100 * (1 - used):.0f}% empty (M {problem.m}, "
                                  f"N {problem.n})")
        return APPLIES

    def programs(self, problem: GemmProblem):
        return [ProgramRequest("gemm.c", problem.dtype.options)]

    def solution(self, problem: GemmProblem, device):
        def invoker_factory(programs, context):
            kernel = programs[0].function("gemm_blocked")
            grid = (-(-problem.m // TILE), -(-problem.n // TILE), problem.batch)
            fast = context.backend.launcher(kernel, grid, (THREADS, 1, 1), [None, None, None, *gemm_arguments(problem)])
            return lambda a, b, c: fast(a, b, c)

        return Solution(self.programs(problem), invoker_factory)
