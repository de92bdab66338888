"""BatchNormSplit (id 13): spatial training over contiguous planes in three launches (partial sums
per chunk of planes, a finalize per channel, the normalisation per plane), for the few channels
and many elements per channel where one group per channel leaves the GPU idle."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.batchnorm.problem import BatchNormProblem
from kdbkit.runtime.primitives.batchnorm.solvers.common import BLOCK, INT_MAX, MAX_GROUPS, program
from kdbkit.runtime.solver import (
    APPLIES,
    Solution,
    Solver,
    aligned16,
    launch_1d,
    launcher_1d,
    not_applicable,
    vector_elements,
)

TARGET_GROUPS = 2048  # partial-sum groups to aim for: many per SM on any current GPU


def chunks_for(problem: BatchNormProblem) -> int:
    n, c = problem.shape[:2]
    return max(1, min(n, TARGET_GROUPS // max(c, 1), MAX_GROUPS))


class BatchNormSplit(Solver):
    id = 13
    name = "BatchNormSplit"
    primitive = "bnorm"

    def is_applicable(self, problem: BatchNormProblem, device):
        if problem.direction != "train" or problem.mode != "spatial":
            return not_applicable("it computes spatial training only")
        n, c, h, w = problem.shape
        if not all(s[2:] == (w, 1) or h * w == 1 for s in (problem.x_strides, problem.y_strides)):
            return not_applicable("its H x W planes are not contiguous")
        if c > MAX_GROUPS or n * c * h * w > INT_MAX or max(problem.x_strides + problem.y_strides) > INT_MAX:
            return not_applicable("sizes or strides exceed the kernels' int arguments")
        return APPLIES

    def workspace(self, problem: BatchNormProblem) -> int:
        return 4 * problem.shape[1] * (2 * chunks_for(problem) + 1)

    def programs(self, problem: BatchNormProblem):
        return [program(problem)]

    def solution(self, problem: BatchNormProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            partial_k, finalize_k = prog.function("bn_train_partial"), prog.function("bn_train_finalize")
            planes_k = prog.function("bn_fwd_infer_planes")
            n, c, h, w = problem.shape
            chunks = chunks_for(problem)
            xs0, xs1 = problem.x_strides[:2]
            # The invoker's own workspace, allocated once: partial sums, then the batch variance.
            partial = context.alloc(4 * c * 2 * chunks)
            var = context.alloc(4 * c)
            launch, i32 = context.backend.launch, np.int32
            eps = np.float32(problem.eps)

            per, ys0, ys1 = vector_elements(problem.dtype), *problem.y_strides[:2]
            # Planes of whole 16-byte vectors, each starting on one: the vector kernels, given aligned tensors.
            whole = all(v % per == 0 for v in (h * w, xs0, xs1, ys0, ys1))
            partial_v, infer_v = prog.function("bn_train_partial_vec"), prog.function("bn_fwd_infer_vec")

            # The vector path's three launches, made once (Backend.launcher): only buffers vary.
            fast_partial = context.backend.launcher(
                partial_v, (chunks, c, 1), (BLOCK, 1, 1),
                [None, partial, i32(n), i32(c), *(i32(v // per) for v in (h * w, xs0, xs1)), i32(chunks)])
            fast_finalize = launcher_1d(context, finalize_k, c, [
                None, partial, None, None, None, None, var, i32(c), i32(xs1), i32(chunks), i32(n * h * w), eps,
                np.float32(problem.factor), i32(problem.running)], block=64)
            fast_infer = launcher_1d(context, infer_v, n * c * h * w // per, [
                None, None, None, None, None, var, i32(n), i32(c),
                *(i32(v // per) for v in (h * w, xs0, xs1, ys0, ys1)), eps]) if whole else None

            def train(x, y, scale, bias, running_mean, running_var, saved_mean, saved_invstd):
                vec = whole and aligned16(x, y)
                if vec:
                    fast_partial(x)
                    fast_finalize(x, running_mean, running_var, saved_mean, saved_invstd)
                    fast_infer(x, y, scale, bias, saved_mean)
                    return
                launch(partial_k, (chunks, c, 1), (BLOCK, 1, 1),
                       [x, partial, i32(n), i32(c), i32(h * w), i32(xs0), i32(xs1), i32(chunks)])
                launch_1d(context, finalize_k, c, [x, partial, running_mean, running_var, saved_mean, saved_invstd, var,
                                                   i32(c), i32(xs1), i32(chunks), i32(n * h * w), eps,
                                                   np.float32(problem.factor), i32(problem.running)], block=64)
                launch(planes_k, (min(n * c, MAX_GROUPS), 1, 1), (BLOCK, 1, 1),
                       [x, y, scale, bias, saved_mean, var, i32(n), i32(c), i32(h * w), i32(xs0), i32(xs1),
                        i32(ys0), i32(ys1), eps])

            return train

        return Solution(self.programs(problem), invoker_factory)
