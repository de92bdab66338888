"""ConvDepthwise (id 24): depthwise convolution (groups = C = K, one filter per channel),
forward and backward data, memory-bound (conv_depthwise.c): a thread per element written, in
the layout's memory order, its index found once, then the filter's taps."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import fits_int_arguments, shape_args
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import Solver, launcher_1d, not_applicable, register


def program(problem: ConvProblem) -> ProgramRequest:
    return ProgramRequest("conv_depthwise.c", problem.dtype.options)


@register
class ConvDepthwise(Solver):
    id = 24
    name = "ConvDepthwise"
    primitive = "conv"

    def is_applicable(self, problem: ConvProblem, device):
        c = problem.x_shape[1]
        if not (problem.groups == c == problem.out_channels):
            return not_applicable(f"it takes depthwise convolutions (groups = input = output channels), not "
                                  f"{problem.groups} groups of {c} to {problem.out_channels} channels")
        if problem.direction == "W":
            return not_applicable("it computes forward and backward data, not backward weights")
        return fits_int_arguments(problem)

    def programs(self, problem: ConvProblem):
        return [program(problem)]

    def invoker(self, handle, problem: ConvProblem):
        request = program(problem)
        prog = handle.program(request.kernel_file, request.options)
        order = np.int32(problem.layout == "NHWC")
        if problem.direction == "F":
            n, k, ho, wo = problem.y_shape
            fast = launcher_1d(handle, prog.function("conv_dw_fwd"), n * k * ho * wo,
                               [None, None, None, *shape_args(problem), order], max_groups=1 << 16)
            return lambda x, w, y: fast(x, w, y)
        fast = launcher_1d(handle, prog.function("conv_dw_bwd_data"), int(np.prod(problem.x_shape)),
                           [None, None, None, *shape_args(problem), order], max_groups=1 << 16)
        return lambda dy, w, dx: fast(dy, w, dx)
