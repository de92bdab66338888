"""ConvTma (ids 33-35): forward convolution of fp16/bf16 tensors on Hopper as an implicit GEMM
fed by tensor copies (kernels/conv_tma.cu): x's pixels through TMA's im2col mode (padding,
strides and dilation walked by the copy engine, zeros where a window leaves the image), the
filter through a tile copy, both into the ring of shared-memory stages that wgmma reads, one
producer and two consumer warpgroups, one persistent block per multiprocessor: gemm_tma.cu's
pipeline (kernels/tma_wgmma.h). Output pixels by output channels, 128 x 256, 128 x 128 or 128 x
64 tiles, one solver each so that find times them all; immediate mode takes the one whose tiles
waste least over the waves (as GemmTma does).

Channels-last tensors go as they are. An NCHW 1 x 1 convolution at stride 1 without padding
is a batched GEMM, y[n] (K x HW) = w (K x C) x[n] (C x HW): it runs through the TMA GEMM's
kernel (gemm_tma.cu, GemmTma's invoker) on the tensors as they are, where H W is a multiple of
8 (x's rows 16-byte aligned) and the solver's tile is 256 or 128 wide. Other NCHW ones are
staged: x and the weights moved channels-last into a workspace (conv_gemm.c's transposes), and
the kernel writes y's planes itself (conv_tma.cu's y_vec 2: no channels-last copy of y moved
back, one launch and a round trip of y fewer). x's channels must be a multiple of 8 (the
copies step in 16 bytes); a first layer's 3 go to the mma.sync kernel
(ConvImplicitGemmTensorCore).

A stage holds 64 of x's channels (a 128-byte row a pixel); where x has 32 or fewer, 32 or 16
(:func:`step_for`: rows of 64 or 32 bytes, swizzled as wide), so that a 1 x 1 expansion from 16
or 24 channels, or a 3 x 3 over 32, does not multiply zeros for most of each step. Each step is
its own program of each tile width (-DCONV_BK), chosen from C: no solver of its own.

The tensor maps hold the tensors' addresses, so they are encoded on the host for each pair of x
and w buffers an invoker meets (the most recent 32 pairs, with their launches).
"""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.gemm.solvers import tma as gemm_tma
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX
from kdbkit.runtime.primitives.convolution.solvers.igemm_tc import transposer, widener
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, Solver, aligned16, fallback_invoker, not_applicable
from kdbkit.runtime.tensor import DataType

# The pipeline's shape is tma_wgmma.h's, which the GEMM shares: its tile height, K step, threads
# and arch option.
TILE_M, STEP, THREADS, ARCH_OPTION = gemm_tma.TILE_M, gemm_tma.STEP, gemm_tma.THREADS, gemm_tma.ARCH_OPTION
PIXELS = 128  # the im2col copy's pixels a stage: the tile's rows
# tile N -> shared-memory stages: as many as fit 227 KiB beside the epilogue's staging
STAGES = {256: 4, 128: 6, 64: 8}
# the channels a stage can hold (-DCONV_BK): 64 (STEP), and narrower steps for few channels
STEPS = (64, 32, 16)
# A multiprocessor's throughput on each tile shape relative to 128 x 256 when every one has
# work: narrower tiles read more bytes of A per multiply-add (guesses until find's rankings say more).
TILE_SPEED = {256: 1.0, 128: 0.92, 64: 0.7}
# The same where the filter is dilated: each narrower tile reads x's pixels again, and a dilated
# filter's taps lie rows apart, so that those reads come from memory rather than L2 (find
# ranked the wider tiles first on DeepLab's ASPP layers where the waves alone said otherwise:
# docs/performance.md).
DILATED_TILE_SPEED = {256: 1.0, 128: 0.75, 64: 0.5}
# What a multiprocessor's first tile fill and last tile's epilogue cost beyond the tiles'
# k-loops (hidden behind the next tile for every tile but those), in elements of the reduction a
# tile of the same width would have gone through meanwhile. One figure fitted to the H200's tuned
# rankings of ResNet-50's channels-last forward convolutions (docs/performance.md): any value
# from 192 to 384 picks the same tiles there.
FILL_AND_DRAIN = 256
CORNER = range(-128, 128)  # a 4-D im2col map's bounding-box corners


def shared_bytes(tile_n: int) -> int:
    """Dynamic shared memory of a launch: stages, the epilogue's staging, 2 KiB to align them
    to 1024 bytes and hold the barriers. A narrower step has as many more stages
    (:func:`stages`): the same bytes."""
    return gemm_tma.shared_bytes(tile_n, STAGES)


def step_for(problem: ConvProblem) -> int:
    """The channels a stage holds for ``problem``: 16 for at most 16 of x's channels, 32 for at
    most 32, else 64."""
    c = problem.x_shape[1]
    return 16 if c <= 16 else 32 if c <= 32 else STEP


def stages(tile_n: int, step: int = STEP) -> int:
    """The ring's stages for a tile width and step: the bytes of :data:`STAGES`' ring, in
    narrower stages where the step is (so that as many pixels are in flight)."""
    return STAGES[tile_n] * STEP // step


def gemm_shape(problem: ConvProblem) -> tuple[int, int]:
    """(M, N) of the implicit GEMM: output pixels, output channels."""
    n, (ho, wo) = problem.x_shape[0], problem.out_hw
    return n * ho * wo, problem.out_channels


def tiles(problem: ConvProblem, tile_n: int) -> int:
    m, n = gemm_shape(problem)
    return -(-m // TILE_M) * -(-n // tile_n)


def tile_efficiency(problem: ConvProblem, tile_n: int, units: int) -> float:
    """The share of the tile slots over the waves that hold y's own elements, times the tile
    shape's relative speed."""
    m, n = gemm_shape(problem)
    slots = -(-tiles(problem, tile_n) // units) * units
    return m * n / (slots * TILE_M * tile_n) * TILE_SPEED[tile_n]


def tile_n_for(problem: ConvProblem, units: int) -> int:
    """The tile width immediate mode takes for the backward directions' forward-shaped problems:
    the best :func:`tile_efficiency`, wider on a tie."""
    return max(STAGES, key=lambda n: (round(tile_efficiency(problem, n, units), 3), n))


def tile_time(problem: ConvProblem, tile_n: int, units: int) -> float:
    """A launch's time with 128 x ``tile_n`` tiles, relative: the waves of tiles, each its
    k-loop at the tile shape's :data:`TILE_SPEED` (:data:`DILATED_TILE_SPEED`), plus one :data:`FILL_AND_DRAIN` a
    multiprocessor. A wide tile's epilogue is long, and a shape of few waves and a short
    reduction (a 1 x 1 convolution of a few hundred channels) spends much of its time there:
    the H200's rankings had 128 x 256 tiles slower than 128 x 128 ones where the tiles' share
    of useful work said the wider ones would win (docs/performance.md)."""
    waves = -(-tiles(problem, tile_n) // units)
    reduction = problem.w_shape[1] * problem.filter[0] * problem.filter[1]
    speed = (DILATED_TILE_SPEED if max(problem.dilation) > 1 else TILE_SPEED)[tile_n]
    return tile_n * (waves * reduction / speed + FILL_AND_DRAIN)


def forward_tile_n(problem: ConvProblem, units: int) -> int:
    """The tile width immediate mode takes for a forward convolution: the least
    :func:`tile_time`, wider on a tie."""
    return min(STAGES, key=lambda n: (tile_time(problem, n, units), -n))


def corners(problem: ConvProblem) -> tuple[tuple[int, int], tuple[int, int]]:
    """The im2col map's bounding-box corners, (W, H): -pad, and pad - dilation x (filter - 1)."""
    (ph, pw), (fy, fx), (dh, dw) = problem.pad, problem.filter, problem.dilation
    return (-pw, -ph), (pw - dw * (fx - 1), ph - dh * (fy - 1))


def input_map(problem: ConvProblem, step: int = STEP) -> tuple:
    """tensor_map_im2col's arguments after the address and element size, for x channels-last
    copied ``step`` channels at a time."""
    n, c, h, w = problem.x_shape
    lower, upper = corners(problem)
    sh, sw = problem.stride
    return (c, w, h, n), (2 * c, 2 * w * c, 2 * h * w * c), lower, upper, step, PIXELS, (1, sw, sh, 1)


def filter_map(problem: ConvProblem, tile_n: int, step: int = STEP) -> tuple:
    """tensor_map's (dims, byte strides, box) for the KYXC weights as (C, Y X, K)."""
    c, (fy, fx), k = problem.x_shape[1], problem.filter, problem.out_channels
    return (c, fy * fx, k), (2 * c, 2 * fy * fx * c), (step, 1, tile_n)


def device_units(device) -> int:
    return device.target.cu or 132


def kernel_request(dtype: DataType, tile_n: int, step: int = STEP) -> ProgramRequest:
    """conv_tma.cu for ``dtype``, a 128 x ``tile_n`` tile and ``step`` channels a stage (the
    64-channel program's options name no step, as before the narrower ones)."""
    narrow = () if step == STEP else (f"-DCONV_BK={step}",)
    return ProgramRequest("conv_tma.cu", (*dtype.options, f"-DCONV_BN={tile_n}",
                                          f"-DCONV_STAGES={stages(tile_n, step)}", *narrow, ARCH_OPTION))


# conv_fwd_tma's y_vec where y is written in planes (NCHW) rather than channels-last
Y_PLANES = 2


def scalars(problem: ConvProblem, planes: bool = False) -> list:
    """conv_fwd_tma's int arguments after y for the forward ``problem`` (x channels-last): M,
    K, C, Ho, Wo, S, the pads, strides and dilations (H, W), the taps, and y_vec: y channels-last
    in 16-byte stores where K is a multiple of 8, or (``planes``) y written NCHW."""
    (n, c), k, (ho, wo), (fy, fx) = problem.x_shape[:2], problem.out_channels, problem.out_hw, problem.filter
    y_vec = Y_PLANES if planes else int(k % 8 == 0)
    return [np.int32(v) for v in (n * ho * wo, k, c, ho, wo, fx, *problem.pad, *problem.stride, *problem.dilation,
                                  fy * fx, y_vec)]


# conv_fwd_tma's epilogue arguments when it has none: null scale, shift and residual, no ReLU
NO_EPILOGUE = (np.uint64(0), np.uint64(0), np.uint64(0), np.int32(0))
# The activations conv_fwd_tma's epilogue applies (tma_wgmma.h's TmEpilogue: ReLU or none), by
# code (convolution/epilogue.py's ACTIVATION_CODES); any other runs as the separate pass.
KERNEL_ACTIVATIONS = (0, 1)


def multiplier(context, program, problem: ConvProblem, tile_n: int, step: int = STEP,
               epilogue: tuple[bool, int] | None = None, planes: bool = False):
    """``multiply(x, w, y)``: conv_fwd_tma (from the loaded conv_tma.cu ``program``, built for
    ``step`` channels a stage) computing the forward ``problem`` on 16-byte aligned
    channels-last x, KYXC w and channels-last y (``planes``: NCHW y, any alignment). The tensor
    maps hold the addresses: they are encoded with a launch for each (x, w) pair met, the
    :data:`~kdbkit.runtime.primitives.gemm.solvers.tma.CACHED_PAIRS` met most recently kept. ``epilogue``:
    (residual, activation code) for ``multiply(x, w, y, scale, shift[, residual])`` with the
    kernel's epilogue (tma_wgmma.h's TmEpilogue)."""
    return map_multiplier(context, program, tiles(problem, tile_n), tile_n, scalars(problem, planes),
                          input_map(problem, step), filter_map(problem, tile_n, step), step, epilogue)


def map_multiplier(context, program, tile_count: int, tile_n: int, args: list, x_map: tuple, w_map: tuple,
                   step: int = STEP, epilogue: tuple[bool, int] | None = None):
    """:func:`multiplier` from conv_fwd_tma's arguments themselves (its scalars, the
    :func:`input_map` and :func:`filter_map` tuples, its ``tile_count`` tiles): for a forward
    convolution that no ConvProblem describes, as a stride phase's of backward data, padded
    differently before and after. The maps' rows are ``step`` channels, swizzled as wide."""
    backend, kernel = context.backend, program.function("conv_fwd_tma")
    grid = (min(tile_count, device_units(context.device)), 1, 1)
    if epilogue is None:
        tail = list(NO_EPILOGUE)
    else:  # scale and shift at run time, the residual too where there is one
        residual, act = epilogue
        tail = [None, None, None if residual else np.uint64(0), np.int32(act)]
    launches = gemm_tma.OperandLaunches(
        lambda x, w: (backend.tensor_map_im2col(x, 2, *x_map, swizzle=2 * step),
                      backend.tensor_map(w, 2, *w_map, swizzle=2 * step)),
        lambda maps: backend.launcher(kernel, grid, (THREADS, 1, 1), [*maps, None, *args, *tail], shared_bytes(tile_n)))

    def multiply(x, w, y, *epilogue_buffers):
        launches.get(x, w)(y, *epilogue_buffers)

    return multiply


def fuser(context, program, problem: ConvProblem, tile_n: int):
    """``fuse(residual, act)``: an invoker ``(x, w, y, scale, shift[, residual])`` that runs the
    channels-last forward ``problem`` with its epilogue in the kernel (each kind made once).
    Its tensors must be 16-byte aligned (the residual is read 16 bytes at a time, as y is written)."""
    made = {}

    def fuse(residual: bool, act: int):
        """``act``: the activation's code (convolution/epilogue.py's ACTIVATION_CODES); None
        where the kernel does not apply it."""
        if act not in KERNEL_ACTIVATIONS:
            return None
        key = (bool(residual), int(act))
        if key not in made:
            made[key] = multiplier(context, program, problem, tile_n, step_for(problem), key)
        return made[key]

    return fuse


# The TMA GEMM solver that runs a 1 x 1 NCHW convolution for each conv tile width that has one.
GEMMS = {256: gemm_tma.GemmTma(), 128: gemm_tma.GemmTma128x128()}


def as_gemm(problem: ConvProblem) -> GemmProblem | None:
    """A 1 x 1, stride 1, unpadded NCHW convolution as the batched GEMM y[n] = w x[n] (K x C by
    C x HW, w shared by every image), or None where it is not one or x's rows (H W values) are
    not 16-byte aligned for the tensor copies."""
    n, c, h, w = problem.x_shape
    if problem.layout != "NCHW" or problem.filter != (1, 1) or problem.stride != (1, 1) or problem.pad != (0, 0) \
            or problem.groups != 1 or (h * w) % 8 or c % 8:
        return None
    k, hw = problem.out_channels, h * w
    return GemmProblem(problem.dtype, k, hw, c, False, False, n, c, hw, hw, 0, c * hw, k * hw)


class TmaConvSolver(Solver):
    """What every convolution on conv_fwd_tma shares: sm_90 only, fp16/bf16, one direction
    (``direction``, named in ``computes`` when refused), one group."""

    primitive = "conv"
    backends = ("cuda",)
    direction = "F"
    computes = "the forward direction only"

    def builds_for(self, target) -> bool:
        return target.arch_facts.has("wgmma")

    def shared_gate(self, problem: ConvProblem, device):
        """The refusal the gates above give ``problem``, or None where they pass."""
        if not device.target.arch_facts.has("wgmma"):
            return not_applicable(f"wgmma and TMA need an sm_90 GPU (this is {device.target.arch})")
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return not_applicable(f"{problem.dtype.label} is not fp16 or bf16")
        if problem.direction != self.direction:
            return not_applicable(f"it computes {self.computes}")
        if problem.groups != 1:
            return not_applicable(f"it takes one group, not {problem.groups}")
        return None


class ConvTma(TmaConvSolver):
    """The 128 x 256 tile; subclasses set ``tile_n``."""

    id = 33
    name = "ConvTma128x256"
    tile_n = 256

    def is_applicable(self, problem: ConvProblem, device):
        refused = self.shared_gate(problem, device)
        if refused is not None:
            return refused
        n, c, h, w = problem.x_shape
        k = problem.out_channels
        if c % 8:
            return not_applicable(f"x's {c} channels are not a multiple of 8 (tensor copies step in 16 bytes)")
        if max(problem.stride) > 8:
            return not_applicable(f"stride {problem.stride}: the im2col copy steps at most 8 pixels")
        lower, upper = corners(problem)
        if any(v not in CORNER for v in (*lower, *upper)):
            return not_applicable(f"pad {problem.pad} with a {problem.filter} filter dilated {problem.dilation} "
                                  "puts the im2col window's corners beyond -128..127")
        m, _ = gemm_shape(problem)
        if max(n * h * w * c, m * k, k * c * problem.filter[0] * problem.filter[1]) > INT_MAX:
            return not_applicable("sizes exceed the kernel's int arguments")
        gemm = as_gemm(problem) if self.tile_n in GEMMS else None
        if gemm is not None:
            return GEMMS[self.tile_n].is_applicable(gemm, device)
        if problem.layout == "NCHW" and max(n, k) > 65535:
            return not_applicable("NCHW staging transposes one matrix per image, at most 65535")
        return APPLIES

    def suits(self, problem: ConvProblem, device):
        units = device_units(device)
        gemm = as_gemm(problem)
        if gemm is not None:  # the GEMM's tiles: output channels by pixels
            if self.tile_n not in GEMMS:
                return not_applicable(f"a 1 x 1 NCHW convolution runs as a GEMM of 128 x 256 or 128 x 128 tiles "
                                      f"(ConvTma128x{self.tile_n} stages it channels-last instead)")
            best = max(GEMMS, key=lambda n: (round(gemm_tma.tile_efficiency(gemm, n, units), 3), n))
            if best == self.tile_n:
                return APPLIES
            return not_applicable(f"the GEMM's 128 x {best} tiles fit this 1 x 1 convolution better on {units} "
                                  "multiprocessors")
        best = forward_tile_n(problem, units)
        if best == self.tile_n:
            return APPLIES
        return not_applicable(f"128 x {best} tiles fit this shape better on {units} multiprocessors "
                              f"(by the model, {tile_time(problem, best, units) / tile_time(problem, self.tile_n, units):.0%} "
                              "of these tiles' time)")

    def fuses_epilogue(self, problem: ConvProblem) -> bool:
        """Channels-last: the kernel applies a fused convolution's epilogue (convolution/fused.py)."""
        return problem.layout == "NHWC"

    def workspace(self, problem: ConvProblem) -> int:
        if problem.layout == "NHWC" or (self.tile_n in GEMMS and as_gemm(problem) is not None):
            return 0
        d = problem.descs()
        moved_w = d["w"].numel if problem.filter != (1, 1) else 0
        return (d["x"].numel + moved_w) * problem.dtype.itemsize

    def programs(self, problem: ConvProblem):
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return []
        gemm = as_gemm(problem) if self.tile_n in GEMMS else None
        if gemm is not None:
            return GEMMS[self.tile_n].programs(gemm)
        return [kernel_request(problem.dtype, self.tile_n, step_for(problem)),
                ProgramRequest("conv_gemm.c", problem.dtype.options)]

    def solution(self, problem: ConvProblem, device):
        tile_n = self.tile_n
        gemm = as_gemm(problem) if tile_n in GEMMS else None
        if gemm is not None:
            gemm_solution = GEMMS[tile_n].solution(gemm, device)

            def gemm_invoker_factory(programs, context):
                multiply = gemm_solution.invoker_factory(programs, context)

                def forward_gemm(x, w, y):
                    multiply(w, x, y)  # y[n] = w x[n]

                return forward_gemm

            return Solution(self.programs(problem), gemm_invoker_factory)

        def invoker_factory(programs, context):
            p = problem
            (n, c, h, w_), k, (fy, fx) = p.x_shape, p.out_channels, p.filter
            unaligned = fallback_invoker(context, problem, "ConvImplicitGemmTensorCore")

            if p.layout == "NHWC":
                multiply = multiplier(context, programs[0], p, tile_n, step_for(p))

                def forward(x, w, y):
                    if not aligned16(x, w, y):  # tensor maps and 16-byte stores need aligned tensors
                        unaligned(x, w, y)
                        return
                    multiply(x, w, y)

                forward.fuse = fuser(context, programs[0], p, tile_n)
                return forward

            # NCHW: x and w moved channels-last; the kernel writes y's planes itself
            moves, d, item = programs[1], p.descs(), p.dtype.itemsize
            to_planes = multiplier(context, programs[0], p, tile_n, step_for(p), planes=True)
            x_in = transposer(context, moves, p.dtype)(n, c, h * w_)
            x_nhwc = context.alloc(d["x"].numel * item)
            w_in = widener(context, moves, (k, c, fy, fx), c, d["w"].strides, p.dtype) if (fy, fx) != (1, 1) else None
            w_kyxc = context.alloc(d["w"].numel * item) if w_in is not None else None

            def forward_nchw(x, w, y):
                if w_in is None and not aligned16(w):  # the weights' tensor map reads w itself
                    unaligned(x, w, y)
                    return
                x_in(x, x_nhwc)
                if w_in is not None:
                    w_in(w, w_kyxc)
                to_planes(x_nhwc, w if w_kyxc is None else w_kyxc, y)

            return forward_nchw

        return Solution(self.programs(problem), invoker_factory)


class ConvTma128x128(ConvTma):
    id = 34
    name = "ConvTma128x128"
    tile_n = 128


class ConvTma128x64(ConvTma):
    id = 35
    name = "ConvTma128x64"
    tile_n = 64
