"""ConvDirect (id 20): every direction straight from its definition (conv_direct.c): forward a
thread per output, backward data a thread per input element (gathering, no atomics), backward
weights a group per weight element reducing over the batch and the output plane. Any layout,
group count, stride, dilation and padding; no workspace."""

from __future__ import annotations

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import fits_int_arguments, shape_args
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import Solution, Solver, launcher_1d

WRW_BLOCK = 256  # conv_direct.c's CONV_WRW_BLOCK
MAX_GROUPS = 65535


def program(problem: ConvProblem) -> ProgramRequest:
    return ProgramRequest("conv_direct.c", problem.dtype.options)


class ConvDirect(Solver):
    id = 20
    name = "ConvDirect"
    primitive = "conv"

    def is_applicable(self, problem: ConvProblem, device):
        return fits_int_arguments(problem)

    def programs(self, problem: ConvProblem):
        return [program(problem)]

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            args = shape_args(problem)
            d = problem.descs()
            if problem.direction == "F":
                fast = launcher_1d(context, prog.function("conv_fwd_direct"), d["y"].numel, [None, None, None, *args],
                                   max_groups=1 << 16)
                return lambda x, w, y: fast(x, w, y)
            if problem.direction == "B":
                fast = launcher_1d(context, prog.function("conv_bwd_data_direct"), d["x"].numel,
                                   [None, None, None, *args], max_groups=1 << 16)
                return lambda dy, w, dx: fast(dy, w, dx)
            groups = min(d["w"].numel, MAX_GROUPS)
            fast = context.backend.launcher(prog.function("conv_bwd_weights_direct"), (groups, 1, 1), (WRW_BLOCK, 1, 1),
                                            [None, None, None, *args])
            return lambda dy, x, dw: fast(dy, x, dw)

        return Solution(self.programs(problem), invoker_factory)
