"""ConvImplicitGemm (id 28): every direction as an implicit GEMM on the general cores
(conv_igemm.c): fp32 FMAs in 128 x 128 tiles, 8 x 8 per thread, the operands gathered straight
from the tensors through their strides, so no im2col and no staging, any layout, type, group
count, stride, dilation and padding. Forward: output positions by output channels over the
taps and input channels; backward data: input positions by input channels over the taps and
output channels (taps between strides read zero); backward weights: output channels by taps
and input channels over the positions, split in slices whose fp32 sums a finish kernel adds
in a fixed order (deterministic). The fast path for fp32, and for groups on every type."""

from __future__ import annotations

import math

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX, fits_int_arguments, shape_args
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, Solver, launcher_1d, not_applicable
from kdbkit.runtime.tensor import DataType

TILE, THREADS, STEP = 128, 256, 8  # conv_igemm.c's default IG_BM = IG_BN, IG_THREADS, IG_BK
MAX_GRID_YZ = 65535
WORKSPACE_LIMIT = 256 << 20  # backward weights' partial sums


def tile(problem: ConvProblem) -> tuple[int, int]:
    """The kernel's tile (IG_BM, IG_BN): 128 x 128, or, where one side of the product is 64 or
    less (64 channels: ResNet's first stage), 256 x 64 or 64 x 256, the same work a block with
    none of it on empty rows or columns. Forward and backward data have many rows (positions):
    only their columns are narrowed; backward weights' either side may be."""
    if problem.dtype != DataType.FP32:
        # measured for fp32 only (16-bit convolutions on GPUs go to the matrix units' solvers):
        # 16-bit bundles carry the one tile
        return TILE, TILE
    rows, cols, _ = product(problem)
    if cols <= 64 and (problem.direction != "W" or rows > 64):
        return 2 * TILE, 64
    if rows <= 64:
        return 64, 2 * TILE
    return TILE, TILE


def program(problem: ConvProblem, shape: tuple[int, int] | None = None) -> ProgramRequest:
    bm, bn = shape or tile(problem)
    sized = () if (bm, bn) == (TILE, TILE) else (f"-DIG_BM={bm}", f"-DIG_BN={bn}")
    return ProgramRequest("conv_igemm.c", (*problem.dtype.options, *sized))


def product(problem: ConvProblem) -> tuple[int, int, int]:
    """The GEMM per group (backward data: per stride phase, its largest): (rows, columns, reduction)."""
    (n, c, h, w), k, (ho, wo), (fy, fx) = problem.x_shape, problem.out_channels, problem.out_hw, problem.filter
    cg, kg, (sh, sw) = c // problem.groups, k // problem.groups, problem.stride
    # a phase's taps along an axis: every s / gcd(s, dilation)-th (conv_igemm.c's IG_PHASE)
    ty, tx = (-(-f // (s // math.gcd(s, d))) for f, s, d in zip((fy, fx), problem.stride, problem.dilation))
    return {"F": (n * ho * wo, kg, cg * fy * fx), "B": (n * -(-h // sh) * -(-w // sw), cg, kg * ty * tx),
            "W": (kg, cg * fy * fx, n * ho * wo)}[problem.direction]


# The slice-count model's rates, an H100's (only their ratio matters): the FMAs a
# multiprocessor sustains in this kernel, and the memory speed the partial sums move at.
SM_FLOPS, BANDWIDTH = 30e12 / 132, 2.5e12
FIXED_STEPS = 8  # a block's start and its results' way out, in reduction steps


def best_slices(problem: ConvProblem, units: int, most: int, shape: tuple[int, int],
                groups: int | None = None) -> tuple[int, int]:
    """(slices, slice length) of the reduction that finish soonest by a model: the blocks run
    in waves of two a multiprocessor (the kernel's occupancy), each wave as long as a block's
    slice and its fixed cost, plus the partial sums written and read again; at most ``most`` slices, each at
    least 32 steps long. Few tiles then take many slices; a count that would leave a last
    wave nearly empty loses to one that fills its waves. ``groups``: the GEMMs (default: the
    problem's groups)."""
    rows, cols, r = product(problem)
    groups = groups or problem.groups
    tiles, slots = -(-rows // shape[0]) * -(-cols // shape[1]) * groups, 2 * units
    step = 2 * 2 * TILE * TILE * STEP / SM_FLOPS  # a wave's step: two blocks a multiprocessor, every tile shape TILE x TILE
    slab = 4 * rows * cols * groups / BANDWIDTH * 2
    best, cost = 1, None
    for s in range(1, max(1, min(most, -(-r // (32 * STEP)))) + 1):
        length = -(-(-(-r // s)) // STEP) * STEP
        if s > 1 and -(-r // length) < s:
            continue
        t = -(-tiles * s // slots) * (length // STEP + FIXED_STEPS) * step + (s * slab if s > 1 else 0.0)
        if cost is None or t < cost:
            best, cost = s, t
    length = -(-(-(-r // best)) // STEP) * STEP
    return -(-r // length), length


def split_slices(problem: ConvProblem, units: int, shape: tuple[int, int] | None = None) -> tuple[int, int]:
    """(slices, slice length) for forward and backward data (its stride phases each a GEMM as
    long as the largest): split only where the tiles take less than one wave."""
    rows, cols, r = product(problem)
    shape, groups = shape or tile(problem), problem.groups * phases(problem)
    whole = -(-r // STEP) * STEP
    if -(-rows // shape[0]) * -(-cols // shape[1]) * groups >= 2 * units:
        return 1, whole
    most = min(8, WORKSPACE_LIMIT // (4 * rows * cols * groups), MAX_GRID_YZ // groups)
    return best_slices(problem, units, most, shape, groups)


def phases(problem: ConvProblem) -> int:
    """The GEMMs per group: backward data's stride phases, else one."""
    return problem.stride[0] * problem.stride[1] if problem.direction == "B" else 1


def wrw_slices(problem: ConvProblem, units: int, shape: tuple[int, int] | None = None) -> tuple[int, int]:
    """(slices, slice length) for backward weights: :func:`best_slices`, the partial sums
    within WORKSPACE_LIMIT."""
    rows, cols, r = product(problem)
    most = max(1, min(WORKSPACE_LIMIT // (4 * rows * cols * problem.groups), MAX_GRID_YZ // problem.groups))
    return best_slices(problem, units, most, shape or tile(problem))


class ConvImplicitGemm(Solver):
    id = 28
    name = "ConvImplicitGemm"
    primitive = "conv"

    def tile(self, problem: ConvProblem) -> tuple[int, int]:
        return tile(problem)

    def is_applicable(self, problem: ConvProblem, device):
        refusal = fits_int_arguments(problem)
        if refusal is not APPLIES:
            return refusal
        d = problem.descs()
        n = problem.x_shape[0]
        if max(d["x"].numel, d["y"].numel) // n > INT_MAX or d["w"].numel > INT_MAX:
            return not_applicable("one image's offsets or the weights' exceed the kernel's int arguments")
        rows, cols, r = product(problem)
        if problem.direction == "W":
            if 4 * rows * cols * problem.groups > WORKSPACE_LIMIT:
                return not_applicable(f"its partial sums ({4 * rows * cols * problem.groups >> 20} MiB) exceed "
                                      f"{WORKSPACE_LIMIT >> 20} MiB")
        elif problem.groups * problem.stride[0] * problem.stride[1] > MAX_GRID_YZ:
            return not_applicable(f"it launches a grid layer per group and stride phase, at most {MAX_GRID_YZ}")
        if max(rows, r + 4 * TILE) > INT_MAX or -(-cols // 64) > MAX_GRID_YZ:
            return not_applicable("the product's sizes exceed the kernel's grid or int arguments")
        return APPLIES

    def suits(self, problem: ConvProblem, device):
        if problem.direction == "W":  # its slices fill the GPU whatever the tile; the others' GEMMs do not
            return APPLIES
        rows, cols, _ = product(problem)
        bm, bn = self.tile(problem)
        used = min(rows, bm) * min(cols, bn) / (bm * bn)
        if used < 1 / 8:
            return not_applicable(f"its {bm} x {bn} tiles would be {100 * (1 - used):.0f}% empty (a {rows} x {cols} "
                                  "product per group)")
        return APPLIES

    def workspace(self, problem: ConvProblem) -> int:
        rows, cols, _ = product(problem)
        slices = (wrw_slices if problem.direction == "W" else split_slices)(problem, 132, self.tile(problem))[0]
        return 0 if slices == 1 else 4 * rows * cols * problem.groups * phases(problem) * slices

    def programs(self, problem: ConvProblem):
        return [program(problem, self.tile(problem))]

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            rows, cols, _ = product(problem)
            cfast = np.int32(problem.layout == "NHWC")
            args = [None, None, None, *shape_args(problem), cfast]
            shape = self.tile(problem)
            tiles = (-(-rows // shape[0]), -(-cols // shape[1]))
            units = context.device.target.cu or 132
            if problem.direction in "FB":
                slices, length = split_slices(problem, units, shape)
                layers = problem.groups * phases(problem)
                name = "conv_fwd_igemm" if problem.direction == "F" else "conv_bwd_data_igemm"
                fast = context.backend.launcher(prog.function(name), (*tiles, layers * slices),
                                                (THREADS, 1, 1), [*args, None, np.int32(length), np.int32(slices)])
                if slices == 1:  # partial is not read: the output stands in for it
                    if problem.direction == "F":
                        return lambda x, w, y: fast(x, w, y, y)
                    return lambda dy, w, dx: fast(dy, w, dx, dx)
                partial = context.alloc(4 * rows * cols * layers * slices)
                # the output's positions, the stride phases' steps (the forward's: one), channels
                (n, c, h, w), k = problem.x_shape, problem.out_channels
                forward = problem.direction == "F"
                sizes = (n, *problem.out_hw, 1, 1, k // problem.groups) if forward \
                    else (n, h, w, *problem.stride, c // problem.groups)
                strides = problem.descs()["y" if forward else "x"].strides
                finish = launcher_1d(context, prog.function("conv_igemm_split_finish"),
                                     sizes[0] * sizes[1] * sizes[2] * sizes[5] * problem.groups,
                                     [partial, None, *(np.int32(v) for v in (*sizes, problem.groups, slices,
                                                                             *strides))],
                                     max_groups=1 << 16)

                def split(a, b, out):
                    fast(a, b, out, partial)
                    finish(out)

                if problem.direction == "F":
                    def split_forward(x, w, y):
                        split(x, w, y)

                    return split_forward

                def split_backward_data(dy, w, dx):
                    split(dy, w, dx)

                return split_backward_data
            slices, length = wrw_slices(problem, units, shape)
            partial = context.alloc(4 * rows * cols * problem.groups * slices)
            multiply = context.backend.launcher(prog.function("conv_wrw_igemm"), (*tiles, problem.groups * slices),
                                                (THREADS, 1, 1), [*args, np.int32(length), np.int32(slices)])
            (k, cg, fy, fx), ws = problem.w_shape, problem.descs()["w"].strides
            finish = launcher_1d(context, prog.function("conv_igemm_wrw_finish"), k * cg * fy * fx,
                                 [partial, None, *(np.int32(v) for v in (k, cg, fy, fx, problem.groups, slices, cfast,
                                                                         *ws))], max_groups=1 << 16)

            def backward_weights(dy, x, dw):
                multiply(dy, x, partial)
                finish(dw)

            return backward_weights

        return Solution(self.programs(problem), invoker_factory)
