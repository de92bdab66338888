"""ConvWinogradF2x3 (id 27): 3 x 3 convolution at stride 1 by Winograd's F(2 x 2, 3 x 3)
(conv_winograd.c), forward and backward data (a forward convolution of dy by the filters
turned half a turn, input and output channels swapped, padding 2 - pad): the filters and each
4 x 4 input patch transformed in fp32 into a workspace, 16 matrix multiplies (out channels x in
channels by in channels x tiles) by whichever fp32 GEMM solver immediate mode picks, the 2 x 2
output tiles transformed back. 2.25 times fewer multiplies than direct, for four passes over
the transformed tensors; any layout, every type (fp32 inside).

Immediate mode ranks it before the implicit GEMM, for fp32 only (the other types have the
matrix units), where a cost model says it is the faster: its multiplies against the implicit
GEMM's 2.25 times as many, each at its kernel's rate and over the tiles each covers, plus the
transformed tensors' bytes at the speed the transforms move them in the layout; it wins when
both channel counts are large (the multiply's rows fill its 128-row tiles, and the transforms'
bytes per multiply-add are few): from 128 channels in ResNet-50, not at 64."""

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


# The cost model's rates, an H200's (only their ratios matter): the batched blocked GEMM's fp32
# multiply-adds, the implicit GEMM's (its gathers cost it more), and the transformed tensors'
# bytes, which the transform kernels move along the tiles: at memory speed when a plane's
# positions are contiguous (NCHW), strided over channels-last tensors.
GEMM_FLOPS, IGEMM_FLOPS = 40e12, 25e12
TRANSFORM_BYTES = {"NCHW": 2.5e12, "NHWC": 1.2e12}
GEMM_TILE = 128  # GemmBlocked's tile rows


def _tiles(problem: ConvProblem) -> tuple[int, int, int]:
    """(tiles down, tiles across, tiles in all: P) of the output (backward data: of dx)."""
    ho, wo = problem.out_hw if problem.direction == "F" else problem.x_shape[2:]
    th, tw = -(-ho // 2), -(-wo // 2)
    return th, tw, problem.x_shape[0] * th * tw


def _channels(problem: ConvProblem) -> tuple[int, int]:
    """(output channels, input channels) of the forward convolution computed."""
    c, k = problem.x_shape[1], problem.out_channels
    return (k, c) if problem.direction == "F" else (c, k)


class ConvWinogradF2x3(Solver):
    id = 27
    name = "ConvWinogradF2x3"
    primitive = "conv"

    def is_applicable(self, problem: ConvProblem, device):
        if problem.direction == "W":
            return not_applicable("it computes the forward and backward-data directions only")
        if problem.filter != (3, 3) or problem.stride != (1, 1) or problem.dilation != (1, 1):
            return not_applicable(f"it takes 3 x 3 filters at stride 1 without dilation, not {problem.filter} at "
                                  f"{problem.stride}, dilation {problem.dilation}")
        if problem.groups != 1:
            return not_applicable(f"it takes one group, not {problem.groups}")
        if problem.direction == "B" and max(problem.pad) > 2:
            return not_applicable(f"its backward data takes padding 0 to 2, not {problem.pad}")
        (k, c), p = _channels(problem), _tiles(problem)[2]
        if 16 * max(k * c, c * p, k * p) > INT_MAX:
            return not_applicable("its transformed tensors exceed the kernels' int arguments")
        if self.workspace(problem) > WORKSPACE_LIMIT:
            return not_applicable(f"its workspace of {self.workspace(problem) / 2**30:.1f} GiB exceeds "
                                  f"{WORKSPACE_LIMIT >> 30} GiB")
        return APPLIES

    def suits(self, problem: ConvProblem, device):
        if problem.dtype != DataType.FP32:
            return not_applicable("the matrix units' solvers serve 16-bit types")
        (k, c), p = _channels(problem), _tiles(problem)[2]
        rows = -(-k // GEMM_TILE) * GEMM_TILE  # output channels as the multiply's 128-row tiles cover them
        winograd = 32 * rows * c * p / GEMM_FLOPS + 128 * p * (c + k) / TRANSFORM_BYTES.get(problem.layout, 1.2e12)
        columns = -(-k // 64) * 64 if k <= 64 else -(-k // 128) * 128  # the implicit GEMM's tile columns
        direct = 72 * columns * c * p / IGEMM_FLOPS
        if winograd >= direct:
            return not_applicable(f"a cost model puts it at {winograd / direct:.2f}x the implicit GEMM's time "
                                  f"({k} x {c} channels, {p} tiles)")
        return APPLIES

    def workspace(self, problem: ConvProblem) -> int:
        (k, c), p = _channels(problem), _tiles(problem)[2]
        return 16 * (k * c + c * p + k * p) * 4

    def programs(self, problem: ConvProblem):
        # The multiplies' programs are the GEMM catalogue's (fp32): a bundle holds them already.
        return [program(problem)] if problem.direction in "FB" else []

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            d = problem.descs()
            (k, c), (th, tw, p) = _channels(problem), _tiles(problem)
            forward = problem.direction == "F"
            # The forward convolution computed: its input, output and filter axes (backward data:
            # dy in, dx out, w's first two axes swapped and the filter flipped, padding 2 - pad).
            n, _, h, w = problem.x_shape if forward else problem.y_shape
            _, _, ho, wo = problem.y_shape if forward else problem.x_shape
            pad = problem.pad if forward else tuple(2 - q for q in problem.pad)
            into, out = (d["x"], d["y"]) if forward else (d["y"], d["x"])
            s0, s1, s2, s3 = d["w"].strides
            wstrides = (s0, s1, s2, s3) if forward else (s1, s0, s2, s3)
            u, v, m = (context.alloc(16 * size * 4) for size in (k * c, c * p, k * p))
            gemm = GemmProblem(DataType.FP32, k, p, c, batch=16, lda=c, ldb=p, ldc=p, stride_a=k * c, stride_b=c * p,
                               stride_c=k * p)
            multiply = context.invoker(gemm)  # immediate mode's choice of GEMM solver
            i32 = np.int32

            def kernel_1d(name: str, items: int, tail: list):
                return launcher_1d(context, prog.function(name), items, [None, None, *tail], max_groups=1 << 16)

            filters = kernel_1d("wino_filter", k * c, [i32(k), i32(c), *(i32(s) for s in wstrides), i32(not forward)])
            patches = kernel_1d("wino_input", c * p, [*(i32(s) for s in (n, c, h, w, *pad, th, tw)),
                                                      *(i32(s) for s in into.strides)])
            tiles = kernel_1d("wino_output", k * p, [*(i32(s) for s in (n, k, ho, wo, th, tw)),
                                                     *(i32(s) for s in out.strides)])

            def convolve(source, w, result):
                filters(w, u)
                patches(source, v)
                multiply(a=u, b=v, c=m)
                tiles(m, result)

            if forward:
                def run(x, w, y):
                    convolve(x, w, y)
            else:
                def run(dy, w, dx):
                    convolve(dy, w, dx)

            return run

        return Solution(self.programs(problem), invoker_factory)
