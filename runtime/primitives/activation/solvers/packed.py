"""ActivPacked (id 1): packed tensors as one flat array, a grid-stride loop over the elements."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.activation.problem import ActivationProblem
from kdbkit.runtime.primitives.activation.solvers.common import INT_MAX, mode_args, program
from kdbkit.runtime.solver import APPLIES, Solver, launch_1d, not_applicable, register


@register
class ActivPacked(Solver):
    id = 1
    name = "ActivPacked"
    primitive = "activ"

    def is_applicable(self, problem: ActivationProblem, device):
        if not (problem.x_desc.is_packed and problem.y_desc.is_packed):
            return not_applicable("the tensors are not packed")
        if problem.numel > INT_MAX:
            return not_applicable(f"{problem.numel} elements exceed the kernel's int count")
        return APPLIES

    def programs(self, problem: ActivationProblem):
        return [program(problem)]

    def invoker(self, handle, problem: ActivationProblem):
        request = program(problem)
        prog = handle.program(request.kernel_file, request.options)
        n, tail = np.int32(problem.numel), mode_args(problem)
        if problem.direction == "fwd":
            kernel = prog.function("activ_fwd_packed")
            if problem.dtype.itemsize == 2 and problem.numel % 2 == 0:
                # Two 16-bit elements per 32-bit load and store (half the transactions), where
                # both tensors start 4-byte aligned; a tensor at an odd element offset takes the scalar kernel.
                pairs, half = prog.function("activ_fwd_pairs"), problem.numel // 2

                def forward(x, y):
                    if int(getattr(x, "ptr", 0)) % 4 == 0 and int(getattr(y, "ptr", 0)) % 4 == 0:  # OpenCL: whole buffers
                        launch_1d(handle, pairs, half, [x, y, np.int32(half), *tail])
                    else:
                        launch_1d(handle, kernel, problem.numel, [x, y, n, *tail])

                return forward
            return lambda x, y: launch_1d(handle, kernel, problem.numel, [x, y, n, *tail])
        kernel = prog.function("activ_bwd_packed")
        return lambda x, y, dy, dx: launch_1d(handle, kernel, problem.numel, [x, y, dy, dx, n, *tail])

