"""ConvTmaBwdWeights (ids 42-44): backward weights of fp16/bf16 tensors on Hopper through tensor
copies (TMA) and wgmma (kernels/conv_wgrad_tma.cu, on tma_wgmma.h's pipeline, as ConvTma's
forward): dw = dy^T im2col(x), the N Ho Wo output pixels the reduction. x's pixels come
through TMA's im2col mode (padding, strides and dilation walked by the copy engine), dy through
tile copies, both as MN-major tiles that wgmma reads transposed.

The output (K by the taps' channels) is small and the reduction long, so the reduction is
split into slices, one work item per tile and slice, walked by one persistent block per
multiprocessor; each item writes its fp32 sums to its own slab of a workspace and
conv_wgrad_reduce adds the slabs in a fixed order into dw (either layout, through its strides):
deterministic, where atomic adds would make the last bits depend on the order blocks finish.
:func:`plan` picks the GEMM's orientation (dw or its transpose on the 128-row tiles: the larger
side there) and the slice count from a cost model of the waves of items, the epilogue's fp32
stores and the reduction's pass; immediate mode takes the tile width (256, 128 or 64, one
solver each so that find times them all) whose plan costs least.

Channels-last tensors go as they are. An NCHW 1 x 1 convolution at stride 1 without padding
reads NCHW x and dy in place (dw = sum over n of dy[n] x[n]^T, K-major tiles of 64 pixels of
one image; H W a multiple of 8 for the copies' 16-byte rows); other NCHW ones are staged
channels-last (conv_gemm.c's transposes, as the forward stages them). x's channels and dy's
must be multiples of 8 (16-byte copies); a first layer's 3 go to ConvWrwImplicitGemmTensorCore.
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
# The cost model's rates for one multiprocessor (an H100's or H200's, roughly; only the
# comparison between plans matters): wgmma's sustained multiply-add rate, the bytes a
# multiprocessor's copies and stores move through L2, and the device memory's bandwidth that
# the reduction's pass reads the slabs at.
SM_FLOPS, SM_BYTES, MEMORY_BYTES = 5.0e12, 80e9, 3.0e12
ITEM_START = 0.5e-6  # an item's pipeline fill not hidden behind the previous item's epilogue
REDUCE_START = 2e-6  # a second launch


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


def chunks(problem: ConvProblem) -> int:
    """x's channels in 64-channel chunks: each tap's columns of the GEMM."""
    return -(-problem.x_shape[1] // STEP)


def gemm_sides(problem: ConvProblem) -> tuple[int, int, int]:
    """(K, columns, steps): dw's rows, the GEMM's columns (each tap's chunks of 64 channels),
    and the reduction's steps of 64 pixels (per image where x is read NCHW)."""
    n, _, h, w = problem.x_shape
    (ho, wo), (fy, fx) = problem.out_hw, problem.filter
    steps = n * -(-h * w // STEP) if direct_nchw(problem) else -(-n * ho * wo // STEP)
    return problem.out_channels, fy * fx * chunks(problem) * STEP, steps


def item_seconds(tile_n: int, steps: int) -> float:
    """The model's time of one work item of ``steps`` steps on a 128 x ``tile_n`` tile."""
    multiply = TILE_M * tile_n * STEP * 2 / SM_FLOPS
    load = (TILE_M + tile_n) * STEP * 2 / SM_BYTES
    store = TILE_M * tile_n * 4 / SM_BYTES
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
            seconds = waves * item_seconds(tile_n, -(-steps // slices)) + REDUCE_START \
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
    output plane Ho Wo, Wo, the pads, strides and dilations (H, W), and each image's steps."""
    n, _, h, w = problem.x_shape
    (ho, wo), fx = problem.out_hw, problem.filter[1]
    return [np.int32(v) for v in (p.m, p.n, p.steps, p.slices, p.swap, chunks(problem), fx, ho * wo, wo,
                                  *problem.pad, *problem.stride, *problem.dilation, -(-h * w // STEP))]


def operand_maps(problem: ConvProblem, p: Plan, tile_n: int) -> tuple[tuple, tuple]:
    """The arguments after the address and element size of dy's map (tensor_map) and x's
    (tensor_map_im2col channels-last; tensor_map where NCHW is read in place)."""
    n, c, h, w = problem.x_shape
    k, (ho, wo) = problem.out_channels, problem.out_hw
    if p.direct:
        rows_dy, rows_x = (tile_n, TILE_M) if p.swap else (TILE_M, tile_n)
        return (((h * w, k, n), (2 * h * w, 2 * k * h * w), (STEP, rows_dy, 1)),
                ((h * w, c, n), (2 * h * w, 2 * c * h * w), (STEP, rows_x, 1)))
    pixels = n * ho * wo
    lower, upper = tma.corners(problem)
    sh, sw = problem.stride
    return (((k, pixels, 1), (2 * k, 2 * k * pixels), (STEP, PIXELS, 1)),
            ((c, w, h, n), (2 * c, 2 * w * c, 2 * h * w * c), lower, upper, STEP, PIXELS, (1, sw, sh, 1)))


def reduce_arguments(problem: ConvProblem, p: Plan) -> list:
    """conv_wgrad_reduce's int arguments after dw: K, C, Y, X, x's chunks, slices, swap, dw's strides."""
    (k, c, fy, fx), strides = problem.w_shape, problem.descs()["w"].strides
    return [np.int32(v) for v in (k, c, fy, fx, chunks(problem), p.slices, p.swap, *strides)]


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
        if c % 8:
            return not_applicable(f"x's {c} channels are not a multiple of 8 (tensor copies step in 16 bytes)")
        if k % 8:
            return not_applicable(f"dy's {k} channels are not a multiple of 8 (tensor copies step in 16 bytes)")
        if max(problem.stride) > 8:
            return not_applicable(f"stride {problem.stride}: the im2col copy steps at most 8 pixels")
        lower, upper = tma.corners(problem)
        if not direct_nchw(problem) and any(v not in tma.CORNER for v in (*lower, *upper)):
            return not_applicable(f"pad {problem.pad} with a {problem.filter} filter dilated {problem.dilation} "
                                  "puts the im2col window's corners beyond -128..127")
        ho, wo = problem.out_hw
        _, cols, _ = gemm_sides(problem)
        if max(n * h * w * c, n * ho * wo * k, k * cols) > INT_MAX:
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
        """The slabs; NCHW staged: x and dy channels-last too."""
        p = plan(problem, self.tile_n, 132)
        d = problem.descs()
        staged = d["x"].numel + d["y"].numel if problem.layout == "NCHW" and not p.direct else 0
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
            ws = backend.alloc(4 * p.slices * p.m * p.n)
            grid = (min(p.items(tile_n), units), 1, 1)
            args = scalars(pr, p)
            map_dy, map_x = operand_maps(pr, p, tile_n)
            x_map = backend.tensor_map if p.direct else backend.tensor_map_im2col
            launches = gemm_tma.OperandLaunches(lambda dy, x: backend.launcher(
                kernel.function("conv_wgrad_tma"), grid, (THREADS, 1, 1),
                [backend.tensor_map(dy, 2, *map_dy), x_map(x, 2, *map_x), ws, *args], tma.shared_bytes(tile_n)))
            weights = pr.w_shape[0] * pr.w_shape[1] * pr.filter[0] * pr.filter[1]
            reduce = launcher_1d(context, kernel.function("conv_wgrad_reduce"), weights,
                                 [ws, None, *reduce_arguments(pr, p)], max_groups=1 << 16)
            unaligned = fallback_invoker(context, problem, "ConvWrwImplicitGemmTensorCore")

            if moves is None:  # channels-last, or NCHW read in place
                def backward_weights(dy, x, dw):
                    if not aligned16(dy, x):  # tensor maps need 16-byte aligned tensors
                        unaligned(dy, x, dw)
                        return
                    launches.get(dy, x)()
                    reduce(dw)

                backward_weights.workspace = (ws,)
                return backward_weights

            # NCHW staged: x and dy moved channels-last
            (n, c, h, w_), k, (ho, wo) = pr.x_shape, pr.out_channels, pr.out_hw
            d, item = pr.descs(), pr.dtype.itemsize
            transpose = transposer(context, moves, pr.dtype)
            x_in, dy_in = transpose(n, c, h * w_), transpose(n, k, ho * wo)
            x_nhwc, dy_nhwc = backend.alloc(d["x"].numel * item), backend.alloc(d["y"].numel * item)

            def backward_weights_nchw(dy, x, dw):
                x_in(x, x_nhwc)
                dy_in(dy, dy_nhwc)
                launches.get(dy_nhwc, x_nhwc)()
                reduce(dw)

            backward_weights_nchw.workspace = (ws, x_nhwc, dy_nhwc)
            return backward_weights_nchw

        return Solution(self.programs(problem), invoker_factory)


class ConvTmaBwdWeights128x128(ConvTmaBwdWeights):
    id = 43
    name = "ConvTmaBwdWeights128x128"
    tile_n = 128


class ConvTmaBwdWeights128x64(ConvTmaBwdWeights):
    id = 44
    name = "ConvTmaBwdWeights128x64"
    tile_n = 64
