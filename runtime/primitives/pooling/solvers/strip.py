"""PoolStrip (id 18): forward from registers for the windows CNNs use (3 x 3 stride 2 or 1,
2 x 2 stride 2): a thread reads one 16-byte vector of each input row of a strip of output rows
and keeps its outputs' windows in registers, so each input element is read once with few
instructions per output (pool_strip.c)."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.pooling.problem import MODES, PoolProblem
from kdbkit.runtime.primitives.pooling.solvers.common import fits_int_arguments
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import Solution, Solver, aligned16, launcher_1d, not_applicable, vector_elements

GEOMETRIES = ((3, 2, 1), (3, 2, 0), (2, 2, 0), (3, 1, 1))  # (window, stride, left/right pad), pool_strip.c's
STRIP_ROWS = 4  # pool_strip.c's POOL_STRIP_ROWS
THREADS = 128  # pool_strip.c's POOL_STRIP_THREADS: its kernels are compiled for blocks of at most this many


def program(problem: PoolProblem) -> ProgramRequest:
    return ProgramRequest("pool_strip.c", problem.dtype.options)


def kernel_name(problem: PoolProblem) -> str | None:
    """pool_strip.c's kernel for the problem's geometry and mode (None: none takes it)."""
    (kh, kw), (sh, sw), (_, pw) = problem.window, problem.stride, problem.pad
    if (kh, sh) != (kw, sw) or (kw, sw, pw) not in GEOMETRIES:
        return None
    variant = "avg" if problem.mode != "max" else "argmax" if problem.indices else "max"
    return f"pool_strip_k{kw}s{sw}p{pw}_{variant}"


class PoolStrip(Solver):
    id = 18
    name = "PoolStrip"
    primitive = "pool"

    def is_applicable(self, problem: PoolProblem, device):
        if problem.direction != "fwd":
            return not_applicable("it computes the forward pass only")
        if kernel_name(problem) is None:
            shapes = ", ".join(f"{k}x{k}/{s} pad {p}" for k, s, p in GEOMETRIES)
            return not_applicable(f"window {problem.window}, stride {problem.stride}, width pad {problem.pad[1]} "
                                  f"is none of its geometries ({shapes})")
        return fits_int_arguments(problem)

    def programs(self, problem: PoolProblem):
        return [program(problem)]

    def solution(self, problem: PoolProblem, device):
        def invoker_factory(programs, context):
            kernel = programs[0].function(kernel_name(problem))
            n, c, h, w = problem.shape
            ho, wo = problem.out_hw
            per, xs, ys = vector_elements(problem.dtype), problem.x_strides, problem.y_strides
            outs = per // problem.stride[1]
            jobs = n * c * -(-ho // STRIP_ROWS) * -(-wo // outs)
            args = [np.int32(v) for v in (n, c, h, w, ho, wo, problem.pad[0], *xs, *ys, outs,
                                          MODES.index(problem.mode))]
            rows_whole = xs[3] == 1 and all(s % per == 0 for s in xs[:3])
            rows_packed = ys[3] == 1 and all(s % outs == 0 for s in ys[:3])
            store_bytes = outs * problem.dtype.itemsize
            launchers = [launcher_1d(context, kernel, jobs, [None, None, None, *args, np.int32(vec)], block=THREADS)
                         for vec in range(4)]

            def forward(x, y, indices):
                # Bit 0: 16-byte reads of x; bit 1: one store per thread and row of y (pool_strip.c).
                reads = rows_whole and aligned16(x)
                stores = rows_packed and int(getattr(y, "ptr", 0)) % store_bytes == 0
                launchers[int(reads) + 2 * int(stores)](x, y, indices)

            return forward

        return Solution(self.programs(problem), invoker_factory)
