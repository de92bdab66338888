"""ConvWinogradF2x3 (id 27): forward 3 x 3 convolution at stride 1 by Winograd's F(2 x 2, 3 x 3)
(conv_winograd.c): the filters and each 4 x 4 input patch transformed in fp32 into a workspace,
16 matrix multiplies (K x C by C x tiles) by whichever fp32 GEMM solver immediate mode picks,
the 2 x 2 output tiles transformed back. 2.25 times fewer multiplies than direct; any layout,
any padding, every type (fp32 inside)."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX
from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, Solver, launcher_1d, not_applicable
from kdbkit.runtime.tensor import DataType

WORKSPACE_LIMIT = 4 << 30


def program(problem: ConvProblem) -> ProgramRequest:
    return ProgramRequest("conv_winograd.c", problem.dtype.options)


def _tiles(problem: ConvProblem) -> tuple[int, int, int]:
    """(tiles down, tiles across, tiles in all: P)."""
    ho, wo = problem.out_hw
    th, tw = -(-ho // 2), -(-wo // 2)
    return th, tw, problem.x_shape[0] * th * tw


class ConvWinogradF2x3(Solver):
    id = 27
    name = "ConvWinogradF2x3"
    primitive = "conv"

    def is_applicable(self, problem: ConvProblem, device):
        if problem.direction != "F":
            return not_applicable("it computes the forward direction only")
        if problem.filter != (3, 3) or problem.stride != (1, 1) or problem.dilation != (1, 1):
            return not_applicable(f"it takes 3 x 3 filters at stride 1 without dilation, not {problem.filter} at "
                                  f"{problem.stride}, dilation {problem.dilation}")
        if problem.groups != 1:
            return not_applicable(f"it takes one group, not {problem.groups}")
        c, k, p = problem.x_shape[1], problem.out_channels, _tiles(problem)[2]
        if 16 * max(k * c, c * p, k * p) > INT_MAX:
            return not_applicable("its transformed tensors exceed the kernels' int arguments")
        if self.workspace(problem) > WORKSPACE_LIMIT:
            return not_applicable(f"its workspace of {self.workspace(problem) / 2**30:.1f} GiB exceeds "
                                  f"{WORKSPACE_LIMIT >> 30} GiB")
        return APPLIES

    def workspace(self, problem: ConvProblem) -> int:
        c, k, p = problem.x_shape[1], problem.out_channels, _tiles(problem)[2]
        return 16 * (k * c + c * p + k * p) * 4

    def programs(self, problem: ConvProblem):
        # The multiplies' programs are the GEMM catalogue's (fp32): a bundle holds them already.
        return [program(problem)] if problem.direction == "F" else []

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            backend, d = context.backend, problem.descs()
            (n, c, h, w), k, (ho, wo) = problem.x_shape, problem.out_channels, problem.out_hw
            th, tw, p = _tiles(problem)
            u, v, m = (backend.alloc(16 * size * 4) for size in (k * c, c * p, k * p))
            gemm = GemmProblem(DataType.FP32, k, p, c, batch=16, lda=c, ldb=p, ldc=p, stride_a=k * c, stride_b=c * p,
                               stride_c=k * p)
            multiply = context.invoker(gemm)  # immediate mode's choice of GEMM solver
            i32 = np.int32

            def kernel_1d(name: str, items: int, tail: list):
                return launcher_1d(context, prog.function(name), items, [None, None, *tail], max_groups=1 << 16)

            filters = kernel_1d("wino_filter", k * c, [i32(k), i32(c), *(i32(s) for s in d["w"].strides)])
            patches = kernel_1d("wino_input", c * p, [*(i32(s) for s in (n, c, h, w, *problem.pad, th, tw)),
                                                      *(i32(s) for s in d["x"].strides)])
            tiles = kernel_1d("wino_output", k * p, [*(i32(s) for s in (n, k, ho, wo, th, tw)),
                                                     *(i32(s) for s in d["y"].strides)])

            def forward(x, w, y):
                filters(w, u)
                patches(x, v)
                multiply(a=u, b=v, c=m)
                tiles(m, y)

            forward.workspace = (u, v, m)
            return forward

        return Solution(self.programs(problem), invoker_factory)
