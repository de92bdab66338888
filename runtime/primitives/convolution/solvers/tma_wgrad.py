"""ConvTmaBwdWeights (ids 42-44): backward weights of fp16/bf16 tensors on Hopper through tensor
copies (TMA) and wgmma (kernels/conv_wgrad_tma.cu, on tma_wgmma.h's pipeline, as ConvTma's
forward): dw = dy^T im2col(x), the N Ho Wo output pixels the reduction. x's pixels come
through TMA's im2col mode (padding, strides and dilation walked by the copy engine; tile copies
where a 1 x 1 filter at stride 1 makes x a plain matrix), dy through tile copies, both as
MN-major tiles that wgmma reads transposed.

The output (K by the taps' channels) is small and the reduction long, so the reduction is
split into slices, one work item per tile and slice, walked by one persistent block per
multiprocessor; each item writes its fp32 sums to its own slab of a workspace and
conv_wgrad_reduce adds the slabs in a fixed order into dw (either layout, through its strides):
deterministic, where atomic adds would make the last bits depend on the order blocks finish.
:func:`plan` picks the GEMM's orientation (dw or its transpose on the 128-row tiles) and the
slice count from a cost model of the waves of items, the epilogue's fp32 stores and the
reduction's pass (its rates fitted to the card's timings of every plan); immediate mode takes
the tile width (256, 128 or 64, one solver each so that find times them all) whose plan costs
least.

Channels-last tensors go as they are. An NCHW 1 x 1 convolution at stride 1 without padding
reads NCHW x and dy in place (dw = sum over n of dy[n] x[n]^T, K-major tiles of 64 pixels of
one image; H W a multiple of 8 for the copies' 16-byte rows); other NCHW ones are staged
channels-last (conv_gemm.c's transposes, as the forward stages them). dy's channels must be
a multiple of 8 (16-byte copies). Where x's are not (a first layer's 3), 64-channel chunks per
tap would be mostly zeros: conv_wgrad_columns writes x's receptive fields packed channels-last
instead (the taps' channels side by side, padded to a multiple of 8) and the kernel computes
that 1 x 1 convolution's backward weights, whose columns the reduction maps back to dw's taps.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers import tma
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX
from kdbkit.runtime.primitives.convolution.solvers.igemm_tc import transposer
from kdbkit.runtime.primitives.gemm.solvers import tma as gemm_tma
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, aligned16, fallback_invoker, launcher_1d, not_applicable
from kdbkit.runtime.tensor import DataType

TILE_M, STEP, THREADS = tma.TILE_M, tma.STEP, tma.THREADS
STAGES = tma.STAGES  # the forward's stages per tile width: the same shared-memory layout
PIXELS = 64  # the im2col copy's pixels: one reduction step
# The cost model's rates (fitted to scripts/sweep_wgrad.py's timings of every plan of
# ResNet-50's layers, docs/performance.md names the card; only the comparison between plans
# matters): a multiprocessor's sustained wgmma rate, the bytes its copies bring in a second,
# L2's bandwidth shared by the busy multiprocessors, the bytes of its epilogue's fp32 stores a
# second, and the device memory's bandwidth that the reduction's pass reads the slabs at.
SM_FLOPS, SM_BYTES, L2_BYTES, STORE_BYTES, MEMORY_BYTES = 3.0e12, 40e9, 8e12, 80e9, 3.0e12
ITEM_START = 0.5e-6  # an item's pipeline fill not hidden behind the previous item's epilogue
REDUCE_START = 2e-6  # a second launch
COLUMN_BYTES = 32 << 10  # conv_wgrad_columns's shared memory: a block's packed rows


@dataclasses.dataclass(frozen=True)
class Plan:
    """How conv_wgrad_tma computes a problem: ``direct`` (NCHW read in place), ``swap`` (the
    transpose of dw on the tiles), the GEMM's ``m`` x ``n``, the reduction's ``steps`` of 64
    pixels in ``slices``, and the model's ``cost`` (seconds, for comparisons)."""

    direct: bool
    swap: bool
    m: int
    n: int
    steps: int
    slices: int
    cost: float

    def items(self, tile_n: int) -> int:
        return -(-self.m // TILE_M) * -(-self.n // tile_n) * self.slices


def direct_nchw(problem: ConvProblem) -> bool:
    """An NCHW 1 x 1 convolution at stride 1 unpadded whose images' rows (H W values) are
    16-byte aligned: conv_wgrad_tma reads x and dy in place."""
    n, c, h, w = problem.x_shape
    return (problem.layout == "NCHW" and problem.filter == (1, 1) and problem.stride == (1, 1)
            and problem.pad == (0, 0) and (h * w) % 8 == 0)


def packed_taps(problem: ConvProblem) -> bool:
    """x's channels are not a multiple of 8 (and x is not read in place): its receptive fields
    go packed channels-last through conv_wgrad_columns."""
    return problem.x_shape[1] % 8 != 0 and not direct_nchw(problem)


def computed(problem: ConvProblem) -> ConvProblem:
    """The convolution conv_wgrad_tma computes: ``problem``, or where its taps are packed the
    1 x 1 one over x's receptive fields (N x R S C padded to 8 x Ho x Wo, channels-last)."""
    if not packed_taps(problem):
        return problem
    n, c = problem.x_shape[:2]
    width = -(-c * problem.filter[0] * problem.filter[1] // 8) * 8
    return dataclasses.replace(problem, layout="NHWC", x_shape=(n, width, *problem.out_hw), filter=(1, 1),
                               pad=(0, 0), stride=(1, 1), dilation=(1, 1))


def plain_x(problem: ConvProblem) -> bool:
    """The computed convolution is 1 x 1 at stride 1 unpadded on channels-last x: x is the
    matrix N H W x C, read by tile copies (faster than im2col boxes)."""
    q = computed(problem)
    return not direct_nchw(problem) and q.filter == (1, 1) and q.stride == (1, 1) and q.pad == (0, 0)


def chunks(problem: ConvProblem) -> int:
    """x's channels (of the computed convolution) in 64-channel chunks: each tap's columns of the GEMM."""
    return -(-computed(problem).x_shape[1] // STEP)


def gemm_sides(problem: ConvProblem) -> tuple[int, int, int]:
    """(K, columns, steps): dw's rows, the GEMM's columns (each tap's chunks of 64 channels),
    and the reduction's steps of 64 pixels (per image where x is read NCHW)."""
    n, _, h, w = problem.x_shape
    (ho, wo), (fy, fx) = problem.out_hw, computed(problem).filter
    steps = n * -(-h * w // STEP) if direct_nchw(problem) else -(-n * ho * wo // STEP)
    return problem.out_channels, fy * fx * chunks(problem) * STEP, steps


def item_seconds(tile_n: int, steps: int, active: int) -> float:
    """The model's time of one work item of ``steps`` steps on a 128 x ``tile_n`` tile while
    ``active`` multiprocessors share L2's bandwidth."""
    multiply = TILE_M * tile_n * STEP * 2 / SM_FLOPS
    load = (TILE_M + tile_n) * STEP * 2 / min(SM_BYTES, L2_BYTES / active)
    store = TILE_M * tile_n * 4 / STORE_BYTES
    return steps * max(multiply, load) + store + ITEM_START


@functools.lru_cache(maxsize=1024)
def plan(problem: ConvProblem, tile_n: int, units: int) -> Plan:
    """The orientation and slice count with the least modelled time on ``units`` multiprocessors:
    the waves of work items (an item: one tile, one slice's steps), each wave as long as its
    longest item, then the reduction's pass over the slabs."""
    k, cols, steps = gemm_sides(problem)
    weights = problem.w_shape[0] * problem.w_shape[1] * problem.filter[0] * problem.filter[1]
    best = None
    for swap in (False, True):
        m, n = (cols, k) if swap else (k, cols)
        tiles = -(-m // TILE_M) * -(-n // tile_n)
        # enough slices to give every multiprocessor four items, never an empty slice
        for slices in range(1, min(steps, -(-4 * units // tiles)) + 1):
            waves = -(-tiles * slices // units)
            active = min(tiles * slices, units)
            seconds = waves * item_seconds(tile_n, -(-steps // slices), active) + REDUCE_START \
                + (4 * slices * m * n + 2 * weights) / MEMORY_BYTES
            if best is None or seconds < best.cost * (1 - 1e-9):
                best = Plan(direct_nchw(problem), swap, m, n, steps, slices, seconds)
    return best


def device_units(device) -> int:
    return tma.device_units(device)


def kernel_request(dtype: DataType, tile_n: int, direct: bool) -> ProgramRequest:
    """conv_wgrad_tma.cu for ``dtype``, a 128 x ``tile_n`` tile, NCHW read in place or not."""
    return ProgramRequest("conv_wgrad_tma.cu", (*dtype.options, f"-DWG_BN={tile_n}", f"-DWG_STAGES={STAGES[tile_n]}",
                                                f"-DWG_NCHW={int(direct)}", tma.ARCH_OPTION))


def scalars(problem: ConvProblem, p: Plan) -> list:
    """conv_wgrad_tma's int arguments after ws: M, N, steps, slices, swap, x's chunks, S, the
    output plane Ho Wo, Wo, the pads, strides and dilations (H, W), each image's steps, and
    whether x is read as a matrix (:func:`plain_x`)."""
    q = computed(problem)
    n, _, h, w = q.x_shape
    (ho, wo), fx = q.out_hw, q.filter[1]
    return [np.int32(v) for v in (p.m, p.n, p.steps, p.slices, p.swap, chunks(problem), fx, ho * wo, wo,
                                  *q.pad, *q.stride, *q.dilation, -(-h * w // STEP), plain_x(problem))]


def operand_maps(problem: ConvProblem, p: Plan, tile_n: int) -> tuple[tuple, tuple]:
    """The arguments after the address and element size of dy's map (tensor_map) and x's
    (tensor_map_im2col channels-last; tensor_map where NCHW is read in place or x is a matrix)."""
    plain, problem = plain_x(problem), computed(problem)
    n, c, h, w = problem.x_shape
    k, (ho, wo) = problem.out_channels, problem.out_hw
    if p.direct:
        rows_dy, rows_x = (tile_n, TILE_M) if p.swap else (TILE_M, tile_n)
        return (((h * w, k, n), (2 * h * w, 2 * k * h * w), (STEP, rows_dy, 1)),
                ((h * w, c, n), (2 * h * w, 2 * c * h * w), (STEP, rows_x, 1)))
    pixels = n * ho * wo
    if plain:
        return (((k, pixels, 1), (2 * k, 2 * k * pixels), (STEP, PIXELS, 1)),
                ((c, pixels, 1), (2 * c, 2 * c * pixels), (STEP, PIXELS, 1)))
    lower, upper = tma.corners(problem)
    sh, sw = problem.stride
    return (((k, pixels, 1), (2 * k, 2 * k * pixels), (STEP, PIXELS, 1)),
            ((c, w, h, n), (2 * c, 2 * w * c, 2 * h * w * c), lower, upper, STEP, PIXELS, (1, sw, sh, 1)))


def reduce_arguments(problem: ConvProblem, p: Plan, vec: bool = False) -> list:
    """conv_wgrad_reduce's int arguments after dw: K, C, Y, X, a tap's columns (C packed, else
    its chunks' 64 each), the GEMM's columns, slices, swap, dw's strides, and ``vec`` (8
    channels a thread: only where :func:`reduces_in_vectors`)."""
    (k, c, fy, fx), strides = problem.w_shape, problem.descs()["w"].strides
    col_tap = c if packed_taps(problem) else chunks(problem) * STEP
    return [np.int32(v) for v in (k, c, fy, fx, col_tap, p.m if p.swap else p.n, p.slices, p.swap, *strides, vec)]


def reduces_in_vectors(problem: ConvProblem, p: Plan) -> bool:
    """conv_wgrad_reduce can take 8 channels a thread (given a 16-byte aligned dw): dw's rows in
    its GEMM's rows (swap 0), channels contiguous in dw (channels-last weights, or a 1 x 1
    filter), the channel count and the other strides multiples of 8."""
    (_, c, fy, fx), (s0, s1, s2, s3) = problem.w_shape, problem.descs()["w"].strides
    col_tap = c if packed_taps(problem) else chunks(problem) * STEP
    steps = (s2 if fy > 1 else 0, s3 if fx > 1 else 0)  # a stride never stepped along needs no alignment
    return not p.swap and s1 == 1 and all(v % 8 == 0 for v in (c, col_tap, s0, *steps))


def column_pixels(problem: ConvProblem) -> int:
    """The output pixels whose packed rows a block of conv_wgrad_columns builds at a time: at
    most 64, their rows within 32 KiB of shared memory."""
    return max(1, min(64, COLUMN_BYTES // (2 * computed(problem).x_shape[1])))


def columns_arguments(problem: ConvProblem) -> list:
    """conv_wgrad_columns's int arguments after x and col: N, C, H, W, Ho, Wo, Y, X, the pads,
    strides and dilations (H, W), x's strides, the packed row's width and the pixels a block
    builds at a time."""
    return [np.int32(v) for v in (*problem.x_shape, *problem.out_hw, *problem.filter, *problem.pad, *problem.stride,
                                  *problem.dilation, *problem.descs()["x"].strides, computed(problem).x_shape[1],
                                  column_pixels(problem))]


class ConvTmaBwdWeights(tma.TmaConvSolver):
    """The 128 x 256 tile; subclasses set ``tile_n``."""

    id = 42
    name = "ConvTmaBwdWeights128x256"
    tile_n = 256
    direction, computes = "W", "backward weights only"

    def is_applicable(self, problem: ConvProblem, device):
        refused = self.shared_gate(problem, device)
        if refused is not None:
            return refused
        n, c, h, w = problem.x_shape
        k = problem.out_channels
        if k % 8:
            return not_applicable(f"dy's {k} channels are not a multiple of 8 (tensor copies step in 16 bytes)")
        packed = packed_taps(problem)
        if max(problem.stride) > 8 and not packed:
            return not_applicable(f"stride {problem.stride}: the im2col copy steps at most 8 pixels")
        lower, upper = tma.corners(problem)
        if not direct_nchw(problem) and not packed and any(v not in tma.CORNER for v in (*lower, *upper)):
            return not_applicable(f"pad {problem.pad} with a {problem.filter} filter dilated {problem.dilation} "
                                  "puts the im2col window's corners beyond -128..127")
        ho, wo = problem.out_hw
        _, cols, _ = gemm_sides(problem)
        if max(n * h * w * c, n * ho * wo * k, k * cols, n * ho * wo * computed(problem).x_shape[1]) > INT_MAX:
            return not_applicable("sizes exceed the kernel's int arguments")
        if problem.layout == "NCHW" and not direct_nchw(problem) and max(n, k, c) > 65535:
            return not_applicable("NCHW staging transposes one matrix per image, at most 65535")
        return APPLIES

    def suits(self, problem: ConvProblem, device):
        units = device_units(device)
        costs = {n: plan(problem, n, units).cost for n in STAGES}
        best = min(costs, key=lambda n: (round(costs[n] / costs[self.tile_n], 3), -n))
        if best == self.tile_n:
            return APPLIES
        return not_applicable(f"128 x {best} tiles fit this shape better on {units} multiprocessors (modelled "
                              f"{costs[best] * 1e6:.0f} us against {costs[self.tile_n] * 1e6:.0f} us)")

    def workspace(self, problem: ConvProblem) -> int:
        """The slabs; NCHW staged: x and dy channels-last too; x's packed receptive fields."""
        p = plan(problem, self.tile_n, 132)
        d = problem.descs()
        staged = d["y"].numel if problem.layout == "NCHW" and not p.direct else 0
        if packed_taps(problem):
            staged += computed(problem).descs()["x"].numel
        elif problem.layout == "NCHW" and not p.direct:
            staged += d["x"].numel
        return 4 * p.slices * p.m * p.n + staged * problem.dtype.itemsize

    def programs(self, problem: ConvProblem):
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return []
        direct = direct_nchw(problem)
        request = kernel_request(problem.dtype, self.tile_n, direct)
        # conv_gemm.c: the NCHW staging
        return [request] if direct or problem.layout == "NHWC" else [
            request, ProgramRequest("conv_gemm.c", problem.dtype.options)]

    def solution(self, problem: ConvProblem, device):
        tile_n = self.tile_n

        def invoker_factory(programs, context):
            pr, backend = problem, context.backend
            units = device_units(context.device)
            p = plan(pr, tile_n, units)
            kernel, moves = programs[0], (programs[1] if len(programs) > 1 else None)
            ws = context.alloc(4 * p.slices * p.m * p.n)
            grid = (min(p.items(tile_n), units), 1, 1)
            args = scalars(pr, p)
            map_dy, map_x = operand_maps(pr, p, tile_n)
            x_map = backend.tensor_map if p.direct or plain_x(pr) else backend.tensor_map_im2col
            wgrad = kernel.function("conv_wgrad_tma")
            launches = gemm_tma.OperandLaunches(
                lambda dy, x: (backend.tensor_map(dy, 2, *map_dy), x_map(x, 2, *map_x)),
                lambda maps: backend.launcher(wgrad, grid, (THREADS, 1, 1), [*maps, ws, *args],
                                              tma.shared_bytes(tile_n)))
            weights = pr.w_shape[0] * pr.w_shape[1] * pr.filter[0] * pr.filter[1]
            reduce_any = launcher_1d(context, kernel.function("conv_wgrad_reduce"), weights,
                                     [ws, None, *reduce_arguments(pr, p)], max_groups=1 << 16)
            reduce_vec = launcher_1d(context, kernel.function("conv_wgrad_reduce"), weights // 8,
                                     [ws, None, *reduce_arguments(pr, p, True)], max_groups=1 << 16) \
                if reduces_in_vectors(pr, p) else None

            def reduce(dw):
                (reduce_vec if reduce_vec is not None and aligned16(dw) else reduce_any)(dw)

            unaligned = fallback_invoker(context, problem, "ConvWrwImplicitGemmTensorCore")

            # What the kernel reads where it cannot read x or dy as they are: x's packed receptive
            # fields, or NCHW x and dy moved channels-last.
            (n, c, h, w_), k, (ho, wo) = pr.x_shape, pr.out_channels, pr.out_hw
            d, item = pr.descs(), pr.dtype.itemsize
            x_in = dy_in = x_staged = dy_staged = None
            if packed_taps(pr):
                x_staged = context.alloc(computed(pr).descs()["x"].numel * item)
                pixels = column_pixels(pr)
                blocks = min(-(-n * ho * wo // pixels), 1 << 16)
                x_in = backend.launcher(kernel.function("conv_wgrad_columns"), (blocks, 1, 1), (256, 1, 1),
                                        [None, None, *columns_arguments(pr)],
                                        shared_bytes=pixels * computed(pr).x_shape[1] * 2)
            if moves is not None:
                transpose = transposer(context, moves, pr.dtype)
                dy_in, dy_staged = transpose(n, k, ho * wo), context.alloc(d["y"].numel * item)
                if x_in is None:
                    x_in, x_staged = transpose(n, c, h * w_), context.alloc(d["x"].numel * item)

            def backward_weights(dy, x, dw):
                # tensor maps need 16-byte aligned tensors (the staging reads any)
                if not aligned16(*(t for t, moved in ((dy, dy_in), (x, x_in)) if moved is None)):
                    unaligned(dy, x, dw)
                    return
                if x_in is not None:
                    x_in(x, x_staged)
                    x = x_staged
                if dy_in is not None:
                    dy_in(dy, dy_staged)
                    dy = dy_staged
                launches.get(dy, x)()
                reduce(dw)

            return backward_weights

        return Solution(self.programs(problem), invoker_factory)


class ConvTmaBwdWeights128x128(ConvTmaBwdWeights):
    id = 43
    name = "ConvTmaBwdWeights128x128"
    tile_n = 128


class ConvTmaBwdWeights128x64(ConvTmaBwdWeights):
    id = 44
    name = "ConvTmaBwdWeights128x64"
    tile_n = 64
