"""ConvDepthwise (id 24): depthwise convolution (groups = C = K, one filter per channel),
memory-bound (conv_depthwise.c). Forward (:func:`forward_kernel`): NHWC, a thread a 16-byte
vector of channels by a run of 4 outputs of a row (conv_dw_fwd_nhwc_vec; :func:`vector_lanes`,
:func:`vec_grid`); NCHW, a thread a run of 4 outputs of a row (conv_dw_fwd_rows), both reading
each input of a window row once for filters up to 3 wide at column stride 1 or 2; or tiles of
output positions by channels, each copying its input window and weights into shared memory
first (conv_dw_fwd_tiled; :func:`tile`); or a thread per element (conv_dw_fwd). Backward data:
a thread per element written, in the layout's memory order, its index found once, then the
filter's taps. Backward weights (filters up to 25 taps): blocks of channels by slices of the
output positions, every tap of a channel summed from one read of dy, the slices' sums added in
a fixed order by conv_igemm.c's finish kernel."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import fits_int_arguments, shape_args
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import Solution, Solver, aligned16, launcher_1d, not_applicable

THREADS, MAX_TAPS, TILE_FLOATS = 256, 25, 8192  # conv_depthwise.c's CONV_DW_THREADS, _MAX_TAPS, _TILE_FLOATS


def _even(size: int, most: int) -> int:
    """The largest piece at most ``most`` that cuts ``size`` into equal-count pieces."""
    return -(-size // -(-size // most))


# The forward kernel each layout prefers: "direct" (NHWC: conv_dw_fwd_nhwc_vec, a 16-byte vector
# of channels by a run of outputs; NCHW: conv_dw_fwd_rows, a run of a row) or "tiled"
# (conv_dw_fwd_tiled); docs/performance.md has the measurements that chose them.
PREFERRED = {"NHWC": "direct", "NCHW": "direct"}
RUN = 4  # conv_depthwise.c's CONV_DW_RUN


def forward_kernel(problem: ConvProblem) -> str:
    """The forward's kernel: "vec" (NHWC, C a multiple of the 16-byte vector's elements, their
    weights within TILE_FLOATS), "rows", "tiled" (where :func:`tile` finds a tile) or "plain"."""
    if PREFERRED[problem.layout] == "direct":
        if problem.layout == "NCHW":
            return "rows"
        vec = 16 // problem.dtype.itemsize
        c = problem.x_shape[1]
        if c % vec == 0 and problem.filter[0] * problem.filter[1] * min(c, 32 * vec) <= TILE_FLOATS \
                and -(-c // (32 * vec)) <= 65535:
            return "vec"
    return "tiled" if tile(problem) is not None else "plain"


def vector_lanes(vectors: int) -> int:
    """Channel vectors a group of conv_dw_fwd_nhwc_vec takes: at most 32 (a warp's reads of a
    pixel), the most that split the channels evenly, so that no group's threads idle on a cut
    slab; up to 32 where only a few would (a warp reading fewer than 8 vectors of a pixel)."""
    if vectors <= 32:
        return vectors
    even = max(d for d in range(1, 33) if vectors % d == 0)
    return even if even >= 8 else 32


def vec_grid(problem: ConvProblem, lanes: int, units: int) -> tuple[int, int, int]:
    """conv_dw_fwd_nhwc_vec's grid: channel slabs in y; in x, groups of THREADS // lanes runs,
    at most 16 groups a multiprocessor over the slabs (past that, each group strides over
    several passes of runs, its weights copied once)."""
    n, _, ho, wo = problem.y_shape
    slabs = -(-problem.x_shape[1] // (16 // problem.dtype.itemsize) // lanes)
    groups = -(-n * ho * -(-wo // RUN) // (THREADS // lanes))
    return min(groups, max(1, 16 * units // slabs)), slabs, 1


def tile(problem: ConvProblem) -> tuple[int, int, int] | None:
    """(TH, TW, CB) of conv_dw_fwd_tiled: NHWC, 32 channels (fewer for fewer, a power of two) by
    about 64 positions in rows of at most 16; NCHW, up to 256 positions in rows of at most 32 by
    enough channels for about 8 outputs a thread. Smaller where the halo and the weights would
    exceed TILE_FLOATS; None where even one position of one channel does."""
    (ho, wo), (fy, fx), (sh, sw), (dh, dw) = problem.out_hw, problem.filter, problem.stride, problem.dilation
    c = problem.x_shape[1]
    if problem.x_shape[0] > 65535:  # the grid's third dimension
        return None

    def floats(th, tw, cb):
        return cb * (((th - 1) * sh + (fy - 1) * dh + 1) * ((tw - 1) * sw + (fx - 1) * dw + 1) + fy * fx)

    if problem.layout == "NHWC":
        cb = min(32, 1 << (c - 1).bit_length())
        tw = _even(wo, 16)
        th = _even(ho, max(1, 64 // tw))
    else:
        tw = _even(wo, 32)
        th = _even(ho, max(1, THREADS // tw))
        cb = max(1, min(c, 8 * THREADS // (th * tw)))
    while floats(th, tw, cb) > TILE_FLOATS:
        if th > 1:
            th = _even(ho, th // 2)
        elif tw > 1:
            tw = _even(wo, tw // 2)
        elif cb > 1 and problem.layout == "NCHW":
            cb //= 2
        else:
            return None
    return th, tw, cb


def program(problem: ConvProblem) -> ProgramRequest:
    return ProgramRequest("conv_depthwise.c", problem.dtype.options)


def wrw_split(problem: ConvProblem, units: int) -> tuple[int, int, int]:
    """(channels a block takes, slices, positions a slice) for backward weights: about four
    blocks per multiprocessor, at least 1024 positions a slice."""
    lanes = 32 if problem.layout == "NHWC" else 1
    positions = problem.x_shape[0] * problem.out_hw[0] * problem.out_hw[1]
    blocks = -(-problem.out_channels // lanes)
    slices = max(1, min(-(-4 * units // blocks), -(-positions // 1024), 65535))
    length = -(-positions // slices)
    return lanes, -(-positions // length), length


class ConvDepthwise(Solver):
    id = 24
    name = "ConvDepthwise"
    primitive = "conv"

    def is_applicable(self, problem: ConvProblem, device):
        c = problem.x_shape[1]
        if not (problem.groups == c == problem.out_channels):
            return not_applicable(f"it takes depthwise convolutions (groups = input = output channels), not "
                                  f"{problem.groups} groups of {c} to {problem.out_channels} channels")
        if problem.direction == "W" and problem.filter[0] * problem.filter[1] > MAX_TAPS:
            return not_applicable(f"its backward weights keep at most {MAX_TAPS} taps in registers, not "
                                  f"{problem.filter[0]} x {problem.filter[1]}")
        return fits_int_arguments(problem)

    def workspace(self, problem: ConvProblem) -> int:
        if problem.direction != "W":
            return 0
        return 4 * problem.out_channels * wrw_split(problem, 132)[1] * problem.filter[0] * problem.filter[1]

    def programs(self, problem: ConvProblem):
        finish = [ProgramRequest("conv_igemm.c", problem.dtype.options)] if problem.direction == "W" else []
        return [program(problem), *finish]

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            order = np.int32(problem.layout == "NHWC")
            kernel = forward_kernel(problem) if problem.direction == "F" else None
            n, k, ho, wo = problem.y_shape
            tiled = None
            if kernel in ("vec", "tiled") and tile(problem) is not None:
                th, tw, cb = tile(problem)
                grid = (-(-ho // th) * -(-wo // tw), -(-k // cb), n)
                tiled = context.backend.launcher(prog.function("conv_dw_fwd_tiled"), grid, (THREADS, 1, 1),
                                                 [None, None, None, *shape_args(problem), order,
                                                  *(np.int32(v) for v in (th, tw, cb))])
            if kernel == "vec":
                cv = problem.x_shape[1] // (16 // problem.dtype.itemsize)
                lanes = vector_lanes(cv)
                grid = vec_grid(problem, lanes, context.device.target.cu or 132)
                vec = context.backend.launcher(prog.function("conv_dw_fwd_nhwc_vec"), grid, (THREADS, 1, 1),
                                               [None, None, None, *shape_args(problem), np.int32(lanes)])
                general = tiled or launcher_1d(context, prog.function("conv_dw_fwd"), n * k * ho * wo,
                                               [None, None, None, *shape_args(problem), order], max_groups=1 << 16)

                def forward(x, w, y):
                    (vec if aligned16(x, y) else general)(x, w, y)

                return forward
            if kernel == "rows":
                rows = launcher_1d(context, prog.function("conv_dw_fwd_rows"), n * k * ho * -(-wo // RUN),
                                   [None, None, None, *shape_args(problem)], max_groups=1 << 16)
                return lambda x, w, y: rows(x, w, y)
            if kernel == "tiled":
                return lambda x, w, y: tiled(x, w, y)
            if problem.direction == "F":
                n, k, ho, wo = problem.y_shape
                fast = launcher_1d(context, prog.function("conv_dw_fwd"), n * k * ho * wo,
                                   [None, None, None, *shape_args(problem), order], max_groups=1 << 16)
                return lambda x, w, y: fast(x, w, y)
            if problem.direction == "B":
                fast = launcher_1d(context, prog.function("conv_dw_bwd_data"), int(np.prod(problem.x_shape)),
                                   [None, None, None, *shape_args(problem), order], max_groups=1 << 16)
                return lambda dy, w, dx: fast(dy, w, dx)
            lanes, slices, length = wrw_split(problem, context.device.target.cu or 132)
            k, (fy, fx) = problem.out_channels, problem.filter
            partial = context.alloc(4 * k * slices * fy * fx)
            sums = context.backend.launcher(prog.function("conv_dw_bwd_weights"), (-(-k // lanes), slices, 1),
                                            (THREADS, 1, 1), [None, None, partial, *shape_args(problem), order,
                                                              np.int32(length)])
            finisher = programs[1].function("conv_igemm_wrw_finish")  # conv_igemm.c
            finish = launcher_1d(context, finisher, k * fy * fx, [partial, None, *(np.int32(v) for v in (
                k, 1, fy, fx, k, slices, 0, *problem.descs()["w"].strides))], max_groups=1 << 16)

            def backward_weights(dy, x, dw):
                sums(dy, x)
                finish(dw)

            return backward_weights

        return Solution(self.programs(problem), invoker_factory)
