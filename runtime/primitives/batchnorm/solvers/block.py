"""BatchNormBlock (id 9): one group per channel for training and backward; a thread per element for inference."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.batchnorm.problem import BatchNormProblem
from kdbkit.runtime.primitives.batchnorm.solvers.common import BLOCK, INT_MAX, MAX_GROUPS, program
from kdbkit.runtime.solver import (
    APPLIES,
    Context,
    Solution,
    Solver,
    aligned16,
    launch_1d,
    launcher_1d,
    not_applicable,
    vector_elements,
)


ROW_THREADS = 1 << 18  # enough threads in flight for any GPU; each keeps one channel slot
# Planes of at least PLANE_VECTORS 16-byte vectors go to bn_fwd_infer_plane_vec: blocks of
# PLANE_BLOCK threads, PLANE_VECS vectors each (batchnorm.c's BN_PLANE_VECS), a block within
# one plane; smaller planes would leave most of such a block idle.
PLANE_BLOCK, PLANE_VECS, PLANE_VECTORS = 256, 4, 256


def _infer_rows(context: Context, prog, problem: BatchNormProblem, eps):
    """Channels-last inference: rows of C contiguous channels, each thread one channel slot
    (its scale and shift computed once), 16 bytes at a time where C and the buffers allow."""
    n, c, h, w = problem.shape
    rows, per = n * h * w, vector_elements(problem.dtype)

    def run(kernel, width):  # arguments packed once: a launch only writes the six addresses
        step = max(1, min(rows, ROW_THREADS // width))
        grid = ((width * step + 255) // 256, 1, 1)
        return context.backend.launcher(kernel, grid, (256, 1, 1),
                                        [*(None,) * 6, np.int32(rows), np.int32(width), np.int32(step), eps])

    scalar = run(prog.function("bn_fwd_infer_rows"), c)
    vec = run(prog.function("bn_fwd_infer_rows_vec"), c // per) if c % per == 0 else None

    def infer(x, y, scale, bias, mean, var):
        (vec if vec is not None and aligned16(x, y) else scalar)(x, y, scale, bias, mean, var)

    return infer


class BatchNormBlock(Solver):
    id = 9
    name = "BatchNormBlock"
    primitive = "bnorm"

    def is_applicable(self, problem: BatchNormProblem, device):
        if int(np.prod(problem.shape)) > INT_MAX or max(problem.x_strides + problem.y_strides) > INT_MAX:
            return not_applicable("sizes or strides exceed the kernel's int arguments")
        return APPLIES

    def programs(self, problem: BatchNormProblem):
        return [program(problem)]

    def solution(self, problem: BatchNormProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            geometry = [np.int32(v) for v in (*problem.shape, problem.mode == "spatial", *problem.x_strides,
                                              *problem.y_strides)]
            eps, launch = np.float32(problem.eps), context.backend.launch
            groups = (min(problem.channels, MAX_GROUPS), 1, 1)
            if problem.direction == "infer":
                n, c, h, w = problem.shape
                channels_last = (h * w * c, 1, w * c, c)
                if problem.mode == "spatial" and problem.x_strides == problem.y_strides == channels_last:
                    return _infer_rows(context, prog, problem, eps)
                if problem.mode == "spatial" and all(s[2:] == (w, 1) or h * w == 1 for s in (problem.x_strides,
                                                                                            problem.y_strides)):
                    planes = prog.function("bn_fwd_infer_planes")
                    args = [np.int32(v) for v in (n, c, h * w, *problem.x_strides[:2], *problem.y_strides[:2])]
                    per = vector_elements(problem.dtype)
                    if all(v % per == 0 for v in (h * w, *problem.x_strides[:2], *problem.y_strides[:2])):
                        # Every plane starts on a 16-byte vector (given aligned tensors): 16 bytes per access.
                        vargs = [np.int32(v // per) for v in args[2:]]
                        plane = h * w // per
                        chunks = -(-plane // (PLANE_BLOCK * PLANE_VECS))
                        if plane >= PLANE_VECTORS and chunks <= 65535:  # a grid's y: at most 65535 on CUDA
                            fast = context.backend.launcher(prog.function("bn_fwd_infer_plane_vec"), (n * c, chunks, 1),
                                                            (PLANE_BLOCK, 1, 1), [*(None,) * 6, args[1], *vargs, eps])
                        else:
                            fast = launcher_1d(context, prog.function("bn_fwd_infer_vec"), n * c * plane,
                                               [*(None,) * 6, *args[:2], *vargs, eps])

                        def infer(x, y, scale, bias, mean, var):
                            if aligned16(x, y):
                                fast(x, y, scale, bias, mean, var)
                            else:
                                launch(planes, (min(n * c, MAX_GROUPS), 1, 1), (BLOCK, 1, 1),
                                       [x, y, scale, bias, mean, var, *args, eps])

                        return infer
                    return lambda x, y, scale, bias, mean, var: launch(
                        planes, (min(n * c, MAX_GROUPS), 1, 1), (BLOCK, 1, 1),
                        [x, y, scale, bias, mean, var, *args, eps])
                kernel, total = prog.function("bn_fwd_infer"), int(np.prod(problem.shape))
                return lambda x, y, scale, bias, mean, var: launch_1d(
                    context, kernel, total, [x, y, scale, bias, mean, var, *geometry, eps])
            if problem.direction == "train":
                kernel = prog.function("bn_fwd_train")
                tail = [eps, np.float32(problem.factor), np.int32(problem.running)]
                return lambda x, y, scale, bias, running_mean, running_var, saved_mean, saved_invstd: launch(
                    kernel, groups, (BLOCK, 1, 1),
                    [x, y, scale, bias, running_mean, running_var, saved_mean, saved_invstd, *geometry, *tail])
            kernel, tail = prog.function("bn_bwd"), [eps, np.int32(problem.saved)]
            return lambda x, dy, dx, scale, dscale, dbias, saved_mean, saved_invstd: launch(
                kernel, groups, (BLOCK, 1, 1),
                [x, dy, dx, scale, dscale, dbias, saved_mean, saved_invstd, *geometry, *tail])

        return Solution(self.programs(problem), invoker_factory)
