"""PoolChannelsLast (id 53): forward over channels-last tensors, an item per output pixel and
16-byte vector of channels (or one channel), neighbouring items on neighbouring channels
(pooling.c's pool_fwd_nhwc): a warp's reads of each window element are contiguous. The other
forward solvers walk a plane of each channel, whose elements lie a row of channels apart here.
Each item loads its window's elements four at a time before it uses them (a global pool's
threads wait on memory once a batch); dealing a window out to several threads of a block, their
partial results met in shared memory, was slower on the H200 in every case measured
(docs/performance.md)."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.pooling.problem import MODES, PoolProblem
from kdbkit.runtime.primitives.pooling.solvers.common import INT_MAX, fits_int_arguments, geometry, program
from kdbkit.runtime.solver import Solution, Solver, aligned16, launcher_1d, not_applicable, vector_elements


class PoolChannelsLast(Solver):
    id = 53
    name = "PoolChannelsLast"
    primitive = "pool"

    def is_applicable(self, problem: PoolProblem, device):
        if problem.direction != "fwd":
            return not_applicable("it computes the forward pass only")
        if problem.x_strides[1] != 1 or problem.y_strides[1] != 1:
            return not_applicable("x's or y's channels are not contiguous (it reads channels-last tensors)")
        if problem.shape[1] == 1:
            return not_applicable("one channel: nothing lies beside it to read together")
        n, c = problem.shape[:2]
        if n * c * problem.out_hw[0] * problem.out_hw[1] > INT_MAX:
            return not_applicable("the output's size exceeds the kernel's int arguments")
        return fits_int_arguments(problem)

    def programs(self, problem: PoolProblem):
        return [program(problem)]

    def solution(self, problem: PoolProblem, device):
        def invoker_factory(programs, context):
            kernel = programs[0].function("pool_fwd_nhwc")
            n, c = problem.shape[:2]
            ho, wo = problem.out_hw
            per, xs, ys = vector_elements(problem.dtype), problem.x_strides, problem.y_strides
            whole = c % per == 0 and all(s % per == 0 for s in (xs[0], xs[2], xs[3], ys[0], ys[2], ys[3]))
            tail = [np.int32(MODES.index(problem.mode)), np.int32(problem.indices and problem.mode == "max")]

            def make(lanes: int):
                return launcher_1d(context, kernel, n * ho * wo * (c // lanes),
                                   [None, None, None, *geometry(problem), *tail, np.int32(lanes > 1)])

            element = make(1)
            vector = make(per) if whole else None

            def forward(x, y, indices):
                (vector if vector is not None and aligned16(x, y) else element)(x, y, indices)

            return forward

        return Solution(self.programs(problem), invoker_factory)
