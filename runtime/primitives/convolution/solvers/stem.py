"""ConvStem (id 54): the forward convolution of a network's first layer (few input channels,
C x Y x X at most 192 taps: RGB through a 3 x 3, 5 x 5 or 7 x 7 filter) on the general cores in
fp32 (kernels/conv_stem.c): a block stages its tile's input window and 16 output channels'
weights in shared memory once, each thread then sums 4 pixels for 8 channels (written as 16-byte
vectors where y is channels-last in whole vectors). Any layout and
type; one group; no workspace. The tensor-core implicit GEMM pads such a layer's 3 channels to
8 and its 16 or 32 outputs to a 128-wide tile, and stages the input widened in a workspace:
immediate mode takes this kernel for stems of little work a pixel (:data:`MAX_WORK`), in either
layout, where that padding costs the most."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import fits_int_arguments, shape_args
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, Solver, aligned16, not_applicable, vector_elements

# conv_stem.c's tile, block and stages
ROWS, COLS, CHANNELS, THREADS = 16, 32, 16, 256
STAGE, TAPS = 7680, 192
MAX_C = 4  # a first layer's channels (RGB, RGBA, a mask): past it the tensor-core GEMM's padding costs little
# Immediate mode's bound on the multiply-adds a pixel (output channels x taps): on the H200 the
# kernel beat the tensor-core GEMM on most stems up to 864 a pixel, in both layouts (channels-
# last once y is written a pixel's vector at a time), and lost past it (a 7 x 7 filter's 147
# taps x 64 outputs): docs/performance.md.
MAX_WORK = 864


def taps(problem: ConvProblem) -> int:
    """The reduction a pixel's output channel sums: input channels x filter taps."""
    return problem.x_shape[1] * problem.filter[0] * problem.filter[1]


def stage_size(problem: ConvProblem) -> tuple[int, int]:
    """The rows and columns of input a block stages for its tile of outputs."""
    (fy, fx), (sh, sw), (dh, dw) = problem.filter, problem.stride, problem.dilation
    return (ROWS - 1) * sh + (fy - 1) * dh + 1, (COLS - 1) * sw + (fx - 1) * dw + 1


class ConvStem(Solver):
    id = 54
    name = "ConvStem"
    primitive = "conv"

    def is_applicable(self, problem: ConvProblem, device):
        if problem.direction != "F":
            return not_applicable("it computes the forward direction only")
        if problem.groups != 1:
            return not_applicable(f"it takes one group, not {problem.groups}")
        n, c = problem.x_shape[:2]
        if c > MAX_C:
            return not_applicable(f"x has {c} channels; it takes a first layer's few (at most {MAX_C})")
        if taps(problem) > TAPS:
            return not_applicable(f"{taps(problem)} taps (channels x filter) exceed its weights' stage of {TAPS}")
        rows, cols = stage_size(problem)
        if c * rows * cols > STAGE:
            return not_applicable(f"a tile's input window ({c} x {rows} x {cols}) exceeds its stage of {STAGE} "
                                  "(stride or dilation too large)")
        if n * -(-problem.out_channels // CHANNELS) > 65535:
            return not_applicable("images x blocks of 16 output channels exceed a grid's 65535")
        return fits_int_arguments(problem)

    def suits(self, problem: ConvProblem, device):
        work = problem.out_channels * taps(problem)
        if work > MAX_WORK:
            return not_applicable(f"{work} multiply-adds a pixel: past {MAX_WORK} the tensor-core GEMM is faster")
        return APPLIES

    def programs(self, problem: ConvProblem):
        return [ProgramRequest("conv_stem.c", problem.dtype.options)]

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            n, k, (ho, wo) = problem.x_shape[0], problem.out_channels, problem.out_hw
            grid = (-(-wo // COLS), -(-ho // ROWS), n * -(-k // CHANNELS))
            rows, cols = stage_size(problem)
            kernel, args = programs[0].function("conv_stem_fwd"), [*shape_args(problem), np.int32(rows), np.int32(cols)]
            per, ys = vector_elements(problem.dtype), problem.descs()["y"].strides
            elements = context.backend.launcher(kernel, grid, (THREADS, 1, 1), [None, None, None, *args, np.int32(0)])
            if not (ys[1] == 1 and k % per == 0 and all(s % per == 0 for s in (ys[0], ys[2], ys[3]))):
                return lambda x, w, y: elements(x, w, y)
            vectors = context.backend.launcher(kernel, grid, (THREADS, 1, 1), [None, None, None, *args, np.int32(1)])

            def forward(x, w, y):  # channels-last y in whole vectors: each pixel's channels as 16-byte stores
                (vectors if aligned16(y) else elements)(x, w, y)

            return forward

        return Solution(self.programs(problem), invoker_factory)
