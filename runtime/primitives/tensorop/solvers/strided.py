"""OpTensorStrided (id 6): any strides and broadcasting, up to 5-D."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.tensorop.problem import TensorOpProblem
from kdbkit.runtime.primitives.tensorop.solvers.packed import INT_MAX, program, scalars
from kdbkit.runtime.solver import APPLIES, Solver, launcher_1d, not_applicable, padded_ints, register

MAX_DIMS = 5


@register
class OpTensorStrided(Solver):
    id = 6
    name = "OpTensorStrided"
    primitive = "tensorop"

    def is_applicable(self, problem: TensorOpProblem, device):
        if len(problem.shape) > MAX_DIMS:
            return not_applicable(f"{len(problem.shape)} dimensions; it handles up to {MAX_DIMS}")
        if int(np.prod(problem.shape)) > INT_MAX or max(problem.a_strides + problem.b_strides + problem.c_strides) > INT_MAX:
            return not_applicable("sizes or strides exceed the kernel's int arguments")
        return APPLIES

    def programs(self, problem: TensorOpProblem):
        return [program(problem)]

    def invoker(self, handle, problem: TensorOpProblem):
        request = program(problem)
        kernel = handle.program(request.kernel_file, request.options).function("op_tensor_strided")
        n = int(np.prod(problem.shape))
        geometry = [np.int32(n), *padded_ints(problem.shape, 1, MAX_DIMS)[1:], *padded_ints(problem.a_strides, 0, MAX_DIMS),
                    *padded_ints(problem.b_over_a, 0, MAX_DIMS), *padded_ints(problem.c_strides, 0, MAX_DIMS)]
        tail = scalars(problem)
        run = launcher_1d(handle, kernel, n, [None, None, None, *geometry, *tail])
        return lambda a, b, c: run(a, b, c)
