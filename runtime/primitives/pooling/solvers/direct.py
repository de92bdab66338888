"""PoolDirect (id 8): forward a thread per output (four down a column for windows up to 3 x 3),
backward a thread per input (gathering: no atomics)."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.pooling.problem import MODES, PoolProblem
from kdbkit.runtime.primitives.pooling.solvers.common import INT_MAX, fits_int_arguments, geometry, program
from kdbkit.runtime.solver import Solution, Solver, launch_1d

MAX_GRID_Z = 65535
SMALL_WINDOW, SMALL_RUN = 3, 4  # pooling.c's POOL_SMALL and POOL_RUN


class PoolDirect(Solver):
    id = 8
    name = "PoolDirect"
    primitive = "pool"

    def is_applicable(self, problem: PoolProblem, device):
        return fits_int_arguments(problem)

    def programs(self, problem: PoolProblem):
        return [program(problem)]

    def solution(self, problem: PoolProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            geometry_args = geometry(problem)
            mode = np.int32(MODES.index(problem.mode))
            if problem.direction == "fwd":
                save = np.int32(problem.indices and problem.mode == "max")
                n, c = problem.shape[:2]
                ho, wo = problem.out_hw
                (h, w), xs, ys = problem.shape[2:], problem.x_strides, problem.y_strides
                small = max(problem.window) <= SMALL_WINDOW and max(
                    (h - 1) * xs[2] + (w - 1) * xs[3], (ho - 1) * ys[2] + (wo - 1) * ys[3]) <= INT_MAX  # int offsets
                if n * c <= MAX_GRID_Z and small:  # unrolled windows, four outputs per thread
                    kernel = prog.function("pool_fwd_small")
                    grid = (-(-wo // 32), -(-ho // (8 * SMALL_RUN)), n * c)
                    fast = context.backend.launcher(kernel, grid, (32, 8, 1),
                                                    [None, None, None, *geometry_args, mode, save])
                    return lambda x, y, indices: fast(x, y, indices)
                if n * c <= MAX_GRID_Z:  # a grid z per plane: no index division per output
                    kernel, launch = prog.function("pool_fwd_2d"), context.backend.launch
                    grid = (-(-wo // 16), -(-ho // 16), n * c)
                    return lambda x, y, indices: launch(kernel, grid, (16, 16, 1),
                                                        [x, y, indices, *geometry_args, mode, save])
                kernel, outputs = prog.function("pool_fwd"), int(np.prod(problem.out_shape))
                return lambda x, y, indices: launch_1d(context, kernel, outputs,
                                                       [x, y, indices, *geometry_args, mode, save])
            kernel, inputs = prog.function("pool_bwd"), int(np.prod(problem.shape))
            return lambda dy, indices, dx: launch_1d(context, kernel, inputs, [dy, indices, dx, *geometry_args, mode])

        return Solution(self.programs(problem), invoker_factory)
