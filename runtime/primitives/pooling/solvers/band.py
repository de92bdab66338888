"""PoolBand (id 17): forward through shared memory, a group per band of a plane's rows: the
band's input rows are staged once (as 16-byte vectors where the rows allow), then every output
of the band is computed from shared memory, so each input element leaves device memory once."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.pooling.problem import MODES, PoolProblem
from kdbkit.runtime.primitives.pooling.solvers.common import (
    fits_int_arguments,
    geometry,
    program,
    vector_or_element,
)
from kdbkit.runtime.solver import Solution, Solver, not_applicable, vector_elements

BAND = 6144  # pooling.c's POOL_BAND: floats of input a group stages
THREADS, MAX_GROUPS = 256, 65535


def band_rows(problem: PoolProblem) -> int:
    """Output rows per band whose input rows fit the stage (0: not even one)."""
    (kh, _), (sh, _), w = problem.window, problem.stride, problem.shape[3]
    rows = BAND // w
    return 0 if rows < kh else min((rows - kh) // sh + 1, problem.out_hw[0])


class PoolBand(Solver):
    id = 17
    name = "PoolBand"
    primitive = "pool"

    def is_applicable(self, problem: PoolProblem, device):
        if problem.direction != "fwd":
            return not_applicable("it computes the forward pass only")
        if band_rows(problem) < 1:
            return not_applicable(f"{problem.window[0]} input rows of {problem.shape[3]} elements exceed its "
                                  f"{BAND}-float stage")
        return fits_int_arguments(problem)

    def programs(self, problem: PoolProblem):
        return [program(problem)]

    def solution(self, problem: PoolProblem, device):
        def invoker_factory(programs, context):
            kernel = programs[0].function("pool_fwd_band")
            geometry_args = geometry(problem)
            bh = band_rows(problem)
            n, c, _, w = problem.shape
            jobs = n * c * -(-problem.out_hw[0] // bh)
            tail = [np.int32(MODES.index(problem.mode)), np.int32(problem.indices and problem.mode == "max"),
                    np.int32(bh)]
            per, xs = vector_elements(problem.dtype), problem.x_strides
            rows_whole = xs[3] == 1 and w % per == 0 and all(s % per == 0 for s in xs[:3])
            grid, block = (min(jobs, MAX_GROUPS), 1, 1), (THREADS, 1, 1)
            return vector_or_element(
                lambda vec: context.backend.launcher(kernel, grid, block,
                                                     [None, None, None, *geometry_args, *tail, vec]),
                rows_whole)

        return Solution(self.programs(problem), invoker_factory)
