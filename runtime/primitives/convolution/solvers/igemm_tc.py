"""ConvImplicitGemmTensorCore (id 22): forward convolution, and backward data at stride 1, of
fp16/bf16 tensors as an implicit GEMM on NVIDIA tensor cores (conv_igemm_tc.cu, mma.sync,
sm_80+): output positions by output channels, the reduction over the filter taps and 32 input
channels at a time, x's pixels staged straight from memory (zeros in the padding): no im2col.
Input channels not a multiple of 32 take 16-byte pieces of 8 channels (an NCHW first
layer's 3 widened to 8 with zeros as it is staged); other channel counts, element by
element. NHWC tensors go as they are; NCHW inputs (x, w) are staged channels-last in a
workspace by conv_gemm.c's tiled transposes, and the kernel writes an NCHW output itself (its
tile transposed on the way out). Too few output tiles to fill the GPU split the reduction
(fp32 slabs, summed in order). Backward data at stride 1 is the forward convolution of dy with
the weights flipped and transposed (conv_gemm.c's conv_flip_weights), padded by dilation x
(filter - 1) - pad."""

from __future__ import annotations

import dataclasses

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX, shape_args
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import (APPLIES, Context, Solution, Solver, aligned16, fallback_invoker, launcher_1d,
                                   not_applicable, vector_elements)
from kdbkit.runtime.tensor import DataType

TILE, THREADS, STAGES, STEP, PAD = 128, 128, 4, 32, 8  # conv_igemm_tc.cu's IG_BM = IG_BN, IG_THREADS, ...
SHARED = STAGES * 2 * TILE * (STEP + PAD) * 2  # A's and B's padded tiles per stage, 2-byte elements


def program(problem: ConvProblem) -> ProgramRequest | None:
    if problem.dtype not in (DataType.FP16, DataType.BF16):
        return None
    return ProgramRequest("conv_igemm_tc.cu", problem.dtype.options)


def flipped_pad(problem: ConvProblem) -> tuple[int, int]:
    """p' (H, W) = dilation x (filter - 1) - pad: dy's padding in the forward convolution that
    computes backward data at stride 1, negative where the pad is wider than the dilated
    filter (no such forward convolution: a gate checks this before :func:`as_forward`)."""
    (fy, fx), (dh, dw), (ph, pw) = problem.filter, problem.dilation, problem.pad
    return dh * (fy - 1) - ph, dw * (fx - 1) - pw


def as_forward(problem: ConvProblem) -> ConvProblem:
    """The NHWC forward convolution the tensor-core kernel computes for ``problem``: itself
    (forward), or (backward data at stride 1) dy convolved with the flipped weights, K input
    channels to C, padded by :func:`flipped_pad`.

    Raises:
        ProblemError: backward data whose flipped pad is negative.
    """
    forward = dataclasses.replace(problem, direction="F", layout="NHWC")
    if problem.direction == "F":
        return forward
    c = problem.x_shape[1]
    return dataclasses.replace(forward, x_shape=problem.y_shape, out_channels=c, pad=flipped_pad(problem))


def widened_channels(problem: ConvProblem) -> int:
    """The input channels the forward kernel reads: an NCHW forward convolution's C not a
    multiple of 8 (a first layer's 3) widened with zeros to the next multiple while x is staged
    anyway, so that 16-byte copies work; else as_forward's. (A channels-last x is read in
    place, element by element: for ResNet-50's first layer that measured faster than staging
    and widening it.)"""
    c = as_forward(problem).x_shape[1]
    return -(-c // 8) * 8 if problem.direction == "F" and problem.layout == "NCHW" else c


def split_slices(problem: ConvProblem, units: int) -> int:
    """How many slices the forward kernel splits the reduction into: 1 where the output's tiles
    fill the GPU (two blocks per multiprocessor), else enough to fill it, each slice at least 8
    of the reduction's 32-wide tiles, at most 8 slices."""
    computed = as_forward(problem)
    rows = computed.x_shape[0] * computed.out_hw[0] * computed.out_hw[1]
    blocks = -(-rows // TILE) * -(-computed.out_channels // TILE)
    tiles = -(-computed.x_shape[1] * computed.filter[0] * computed.filter[1] // STEP)
    if blocks >= units:
        return 1
    return max(1, min(2 * units // blocks, tiles // 8, 8))


def widener(context: Context, moves, shape: tuple[int, int, int, int], wide: int, strides, dtype: DataType):
    """A launcher of conv_gemm.c's conv_pad_channels (from the loaded program ``moves``) taking
    (source, destination): a tensor of ``shape`` (N C H W, or K C Y X) read through its
    ``strides`` and written packed channels-last with its channels widened by zeros to ``wide``
    (or not widened: ``wide`` = C, a plain move to NHWC / KYXC). Where ``wide`` is a multiple
    of the 16-byte vector and the vectors fit an int, conv_pad_channels_vec writes a vector an
    item (the destination is the solvers' own 16-byte aligned workspace)."""
    n, c, h, w = shape
    sizes = [np.int32(v) for v in (n, c, h, w, wide, *strides)]
    per = vector_elements(dtype)
    if wide % per == 0 and n * h * w * wide // per <= INT_MAX:
        return launcher_1d(context, moves.function("conv_pad_channels_vec"), n * h * w * wide // per,
                           [None, None, *sizes], max_groups=1 << 16)
    return launcher_1d(context, moves.function("conv_pad_channels"), n * h * w * wide, [None, None, *sizes],
                       max_groups=1 << 16)


def transposer(context: Context, moves, dtype: DataType):
    """``transpose(matrices, rows, cols)``: a launcher of conv_gemm.c's conv_transpose (from the
    loaded program ``moves``) for that batch of matrices, taking (source, destination): the
    tensor-core solvers' staging of NCHW tensors channels-last. 16-bit elements with rows and
    cols even go two at a time (conv_transpose_pairs, 64 x 64 tiles)."""

    def transpose(matrices: int, rows: int, cols: int):
        pairs = dtype.itemsize == 2 and rows % 2 == 0 and cols % 2 == 0
        tile = 64 if pairs else 32
        grid = (-(-cols // tile), -(-rows // tile), matrices)
        return context.backend.launcher(moves.function("conv_transpose_pairs" if pairs else "conv_transpose"), grid,
                                        (32, 8, 1), [None, None, np.int32(rows), np.int32(cols)])

    return transpose


def tensor_core_refusal(problem: ConvProblem, device):
    """Why the tensor-core solvers cannot run ``problem`` on ``device`` (the GPU or the type),
    or None."""
    if not device.target.arch_facts.has("mma.sync"):
        arch = device.target.arch
        return not_applicable(f"it needs CUDA tensor cores with mma.sync (sm_80 or later; this is {arch})")
    if problem.dtype not in (DataType.FP16, DataType.BF16):
        return not_applicable(f"{problem.dtype.label} is not fp16 or bf16")
    return None


class ConvImplicitGemmTensorCore(Solver):
    id = 22
    name = "ConvImplicitGemmTensorCore"
    primitive = "conv"
    backends = ("cuda",)

    def builds_for(self, target) -> bool:
        return target.arch_facts.has("mma.sync")  # for fp16/bf16

    def is_applicable(self, problem: ConvProblem, device):
        refusal = tensor_core_refusal(problem, device)
        if refusal is not None:
            return refusal
        if problem.direction == "W":
            return not_applicable("it computes forward and backward data, not backward weights")
        if problem.groups != 1:
            return not_applicable(f"it takes one group, not {problem.groups}")
        if problem.direction == "B":
            if problem.stride != (1, 1):
                return not_applicable(f"it computes backward data at stride 1 only, not {problem.stride}")
            if min(flipped_pad(problem)) < 0:  # before as_forward, which refuses a negative pad
                return not_applicable(f"backward data with a pad {problem.pad} beyond dilation x (filter - 1)")
        computed = as_forward(problem)
        if computed.out_channels % 2:
            return not_applicable(f"the channels it writes ({computed.out_channels}) must be even")
        n, c, h, w = problem.x_shape
        k = problem.out_channels
        if max(n * h * w * c, n * problem.out_hw[0] * problem.out_hw[1] * k, k * c * problem.filter[0]
               * problem.filter[1]) > INT_MAX:
            return not_applicable("sizes exceed the kernel's int arguments")
        if problem.layout == "NCHW" and max(n, k) > 65535:
            return not_applicable("NCHW staging transposes one matrix per image and per output channel, at most "
                                  "65535 of each")
        return APPLIES

    def workspace(self, problem: ConvProblem) -> int:
        d, cin = problem.descs(), widened_channels(problem)
        widen = cin != as_forward(problem).x_shape[1]
        source = d["x"] if problem.direction == "F" else d["y"]
        staged = source.numel // source.shape[1] * cin if problem.layout == "NCHW" or widen else 0
        (fy, fx), kout = problem.filter, as_forward(problem).out_channels  # the forward's KYXC weights
        moved = widen or problem.direction == "B" or (problem.layout == "NCHW" and fy * fx > 1)
        weights = kout * fy * fx * cin if moved else 0
        slices = split_slices(problem, 132)
        written = d["y"].numel if problem.direction == "F" else d["x"].numel
        return (staged + weights) * problem.dtype.itemsize + (4 * slices * written if slices > 1 else 0)

    def programs(self, problem: ConvProblem):
        request = program(problem)
        return [request, ProgramRequest("conv_gemm.c", problem.dtype.options)] if request else []

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            computed, cin = as_forward(problem), widened_channels(problem)
            widen = cin != computed.x_shape[1]
            computed = dataclasses.replace(computed, x_shape=(computed.x_shape[0], cin, *computed.x_shape[2:]))
            # 32 channels a step from one tap with cp.async, 8 channels of a tap per copy, or element by element
            name = {0: "conv_igemm_fwd_nhwc", 8: "conv_igemm_fwd_nhwc_c8"}.get(cin % STEP if cin % 8 == 0 else -1,
                                                                               "conv_igemm_fwd_nhwc_any")
            prog = programs[0]
            n = computed.x_shape[0]
            positions = n * computed.out_hw[0] * computed.out_hw[1]
            backend, d, item = context.backend, problem.descs(), problem.dtype.itemsize
            # Too few output tiles to fill the GPU: the reduction split, fp32 slabs summed after.
            slices = split_slices(problem, context.device.target.cu or 132)
            partial = context.alloc(4 * slices * positions * computed.out_channels if slices > 1 else 16)
            grid = (-(-computed.out_channels // TILE), -(-positions // TILE), slices)
            nchw = problem.layout == "NCHW"  # the kernel writes NCHW itself; only its input is staged
            fast = backend.launcher(prog.function(name), grid, (THREADS, 1, 1),
                                    [None, None, None, partial, *shape_args(computed), np.int32(nchw)],
                                    shared_bytes=SHARED)
            if slices > 1:
                multiply = fast
                plane = computed.out_hw[0] * computed.out_hw[1]
                finish = launcher_1d(context, prog.function("conv_igemm_split_finish"),
                                     positions * computed.out_channels // 2,
                                     [partial, None, *(np.int32(v) for v in (positions, computed.out_channels, slices,
                                                                             plane, nchw))], max_groups=1 << 16)

                def fast(inp, w, out):
                    multiply(inp, w, out)
                    finish(out)
            moves = programs[1]  # conv_gemm.c
            (n, c, h, w_), (k, _, fy, fx), (ho, wo) = problem.x_shape, problem.w_shape, problem.out_hw

            transpose = transposer(context, moves, problem.dtype)
            # The input the kernel reads (x forward, dy backward), staged NHWC where it is not.
            source = "x" if problem.direction == "F" else "y"
            staged = {}
            if nchw or widen:
                staged[source] = context.alloc(d[source].numel // d[source].shape[1] * cin * item)
            shapes = {"x": (n, c, h * w_), "y": (n, k, ho * wo)}  # matrices, channels, positions
            if widen:
                into = widener(context, moves, (n, c, h, w_), cin, d["x"].strides, problem.dtype)
            else:
                into = transpose(*shapes[source]) if nchw else None
            if problem.direction == "B":
                prepare = launcher_1d(context, moves.function("conv_flip_weights"), d["w"].numel,
                                      [None, None, *(np.int32(v) for v in (k, c // problem.groups, fy, fx,
                                                                           *d["w"].strides))], max_groups=1 << 16)
            elif widen or (nchw and fy * fx > 1):
                # KCYX -> KYXC, C widened if need be
                prepare = widener(context, moves, (k, c, fy, fx), cin, d["w"].strides, problem.dtype)
            else:
                prepare = None  # KYXC already, or a 1 x 1 filter, whose KCYX is KYXC
            weights = context.alloc(computed.out_channels * fy * fx * cin * item) if prepare is not None else None
            unaligned = fallback_invoker(context, problem, "ConvIm2colGemm")  # a tensor not 16-byte aligned

            def run(inp, w, out):
                """Stage what needs staging, then the kernel on 16-byte aligned tensors (a user's
                tensor that is not goes to ConvIm2colGemm)."""
                src, weights_used = staged.get(source, inp), weights or w
                if not aligned16(*(b for b, ours in ((src, into), (weights_used, prepare)) if ours is None), out):
                    unaligned(inp, w, out)
                    return
                if prepare is not None:
                    prepare(w, weights)
                if into is not None:
                    into(inp, src)
                fast(src, weights_used, out)

            if problem.direction == "F":
                def forward(x, w, y):
                    run(x, w, y)

                return forward

            def backward_data(dy, w, dx):
                run(dy, w, dx)

            return backward_data

        return Solution(self.programs(problem), invoker_factory)


WRW_SHARED = STAGES * 2 * STEP * (TILE + PAD) * 2  # conv_igemm_tc.cu's 4 stages of WG_STAGE halves


def wrw_slices(problem: ConvProblem, units: int) -> int:
    """How many slices of the output positions the blocks split: about four blocks per
    multiprocessor over dw's tiles, each slice at least 256 positions."""
    n, k, (ho, wo) = problem.x_shape[0], problem.out_channels, problem.out_hw
    r = problem.w_shape[1] * problem.filter[0] * problem.filter[1]
    tiles = -(-k // TILE) * -(-r // TILE)
    return max(1, min(-(-4 * units // tiles), -(-n * ho * wo // 256)))


class ConvWrwImplicitGemmTensorCore(Solver):
    """ConvWrwImplicitGemmTensorCore (id 23): backward weights of fp16/bf16 tensors on NVIDIA
    tensor cores (conv_igemm_tc.cu's conv_wrw_igemm_nhwc): dw = dy^T im2col(x) with the output
    positions the reduction, split in slices whose fp32 sums meet by atomic adds in a workspace
    that conv_wrw_finish rounds into dw (and zeros). NCHW dy and x are staged channels-last, x
    widened with zero channels to a multiple of 8 where it is not (a first layer's 3); dw is
    written through its strides."""

    id = 23
    name = "ConvWrwImplicitGemmTensorCore"
    primitive = "conv"
    backends = ("cuda",)

    def builds_for(self, target) -> bool:
        return target.arch_facts.has("mma.sync")  # for fp16/bf16

    def is_applicable(self, problem: ConvProblem, device):
        refusal = tensor_core_refusal(problem, device)
        if refusal is not None:
            return refusal
        if problem.direction != "W":
            return not_applicable("it computes backward weights only")
        if problem.groups != 1:
            return not_applicable(f"it takes one group, not {problem.groups}")
        c, k = problem.x_shape[1], problem.out_channels
        if k % 8:
            return not_applicable(f"its output channels ({k}) must be a multiple of 8")
        n, _, h, w = problem.x_shape
        if max(n * h * w * c, n * problem.out_hw[0] * problem.out_hw[1] * k) > INT_MAX:
            return not_applicable("sizes exceed the kernel's int arguments")
        if problem.layout == "NCHW" and n > 65535:
            return not_applicable("NCHW staging transposes one matrix per image, at most 65535")
        return APPLIES

    def workspace(self, problem: ConvProblem) -> int:
        d, padded = problem.descs(), wide_channels(problem)
        n, _, h, w = problem.x_shape
        x_staged = n * h * w * padded if problem.layout == "NCHW" or padded != problem.x_shape[1] else 0
        dy_staged = d["y"].numel if problem.layout == "NCHW" else 0
        return (x_staged + dy_staged) * problem.dtype.itemsize + 4 * d["w"].numel // problem.x_shape[1] * padded

    def programs(self, problem: ConvProblem):
        request = program(problem)
        return [request, ProgramRequest("conv_gemm.c", problem.dtype.options)] if request else []

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            backend, d, item = context.backend, problem.descs(), problem.dtype.itemsize
            (n, c, h, w_), (k, _, fy, fx), (ho, wo) = problem.x_shape, problem.w_shape, problem.out_hw
            cp = wide_channels(problem)
            r = cp * fy * fx
            slices = wrw_slices(problem, context.device.target.cu or 132)
            partial = context.to_device(np.zeros(k * r, np.float32))  # zero again after every call (finish)
            staged = dataclasses.replace(problem, layout="NHWC", x_shape=(n, cp, h, w_))
            multiply = backend.launcher(prog.function("conv_wrw_igemm_nhwc"), (-(-r // TILE), -(-k // TILE), slices),
                                        (THREADS, 1, 1), [None, None, partial, *shape_args(staged)],
                                        shared_bytes=WRW_SHARED)
            finish = launcher_1d(context, prog.function("conv_wrw_finish"), k * r,
                                 [partial, None, *(np.int32(v) for v in (k, cp, fy, fx, c, *d["w"].strides))],
                                 max_groups=1 << 16)
            moves = programs[1]  # conv_gemm.c
            transpose = transposer(context, moves, problem.dtype)
            nchw = problem.layout == "NCHW"
            x_in = x_nhwc = None
            if cp != c:  # widened with zero channels (through x's strides: either layout)
                x_in = widener(context, moves, (n, c, h, w_), cp, d["x"].strides, problem.dtype)
            elif nchw:
                x_in = transpose(n, c, h * w_)
            if x_in is not None:
                x_nhwc = context.alloc(n * h * w_ * cp * item)
            dy_in = transpose(n, k, ho * wo) if nchw else None
            dy_nhwc = context.alloc(d["y"].numel * item) if nchw else None
            unaligned = fallback_invoker(context, problem, "ConvIm2colGemm")

            def backward_weights(dy, x, dw):
                if x_in is not None:
                    x_in(x, x_nhwc)
                    x = x_nhwc
                if dy_in is not None:
                    dy_in(dy, dy_nhwc)
                    dy = dy_nhwc
                if not aligned16(dy, x):
                    unaligned(dy, x, dw)
                    return
                multiply(dy, x)
                finish(dw)

            return backward_weights

        return Solution(self.programs(problem), invoker_factory)


def wide_channels(problem: ConvProblem) -> int:
    """x's channels as the backward-weights kernel reads them: a multiple of 8 (16-byte pieces)."""
    return -(-problem.x_shape[1] // 8) * 8
