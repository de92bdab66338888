"""ConvTmaBwdDataStrided (ids 39-41): backward data of fp16/bf16 tensors at a stride above 1 on
Hopper through the TMA forward kernel (kernels/conv_tma.cu), one stride-1 forward convolution
of dy per output phase. Along an axis of stride s, pad p and filter Y (dilation 1), dx's rows h
= s i + a (phase a < s) receive dy only through the taps r = r0 + s t, r0 = (a + p) mod s, t < T
= ceil((Y - r0) / s):

    dx[s i + a] = sum over t < T of dy[i + q - t] w[r0 + s t],   q = (a + p - r0) / s

that is the correlation of dy with the phase's sub-filter flipped, w'[u] = w[r0 + s (T-1-u)],
padded by p' = T - 1 - q before and by whatever makes its output Hp = ceil((H - a) / s) rows
after (the im2col map's upper corner; dy's rows past Ho arrive as zeros). Each call:
conv_gemm.c's conv_phase_weights writes every phase's sub-filter, one block after another, as
the KYXC weights of its forward convolution (C x Th x Tw x K; one pass over w through its
strides: either layout); conv_fwd_tma computes each phase with taps into its own packed N x Hp
x Wp x C part of a workspace (dy as it is: the kernel's epilogue writes rows of a packed
matrix, so it cannot write dx's pixels s apart); conv_phase_scatter writes all of dx in one
pass from those parts, zeros for a phase with no tap (a 1 x 1 filter's every phase but (0, 0)
when unpadded). So 2 + (phases with taps) launches. A 1 x 1 unpadded filter at stride s
(ResNet's downsamples) is one phase: dx[s p, s q] = w^T dy[p, q], the GEMM over dy's pixels,
then the scatter; bytes moved beyond the GEMM's own: the phase's output written and read once
(dx's size / s^2 each way) and dx written once, zeros included. A k x k filter's phases
together write and read dx's size once more than a kernel writing dx directly would, and each
reads dy (from L2 where it fits).

Channels-last tensors go as they are; NCHW dy is staged channels-last and dx scattered
channels-last then moved back (conv_gemm.c's transposes, as ConvTmaBwdData stages them).
Dilation above 1 is not taken: the phase's taps would be those with d r = a + p mod s, which
need not step evenly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers import tma
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX
from kdbkit.runtime.primitives.convolution.solvers.igemm_tc import transposer
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, aligned16, fallback_invoker, launcher_1d, not_applicable
from kdbkit.runtime.tensor import DataType


@dataclass(frozen=True)
class AxisPhase:
    """One axis's phase ``a``: dx's ``rows`` rows a, a + s, ...; the taps ``r0`` + s t for t <
    ``taps``; dy padded by ``pad`` before it (meaningless where ``taps`` is 0)."""

    a: int
    rows: int
    r0: int
    taps: int
    pad: int


def axis_phases(size: int, filt: int, pad: int, stride: int) -> list[AxisPhase]:
    """The phases of an axis of dx ``size`` long (those with rows: a < size)."""
    out = []
    for a in range(min(stride, size)):
        r0 = (a + pad) % stride
        taps = max(0, -(-(filt - r0) // stride))
        q = (a + pad - r0) // stride
        out.append(AxisPhase(a, -(-(size - a) // stride), r0, taps, taps - 1 - q))
    return out


@dataclass(frozen=True)
class Phase:
    h: AxisPhase
    w: AxisPhase

    @property
    def live(self) -> bool:
        """Its sub-filter has a tap: else its pixels of dx are zeros."""
        return self.h.taps > 0 and self.w.taps > 0


def phases(problem: ConvProblem) -> list[Phase]:
    """Every phase (a, b) of dx with pixels, H's phase outer."""
    (_, _, h, w), (fy, fx), (ph, pw), (sh, sw) = problem.x_shape, problem.filter, problem.pad, problem.stride
    return [Phase(a, b) for a in axis_phases(h, fy, ph, sh) for b in axis_phases(w, fx, pw, sw)]


def phase_scalars(problem: ConvProblem, phase: Phase) -> list:
    """conv_fwd_tma's int arguments (:func:`tma.scalars`'s order) for the phase's forward
    convolution of dy (K channels) into its N x Hp x Wp x C output."""
    n, c = problem.x_shape[:2]
    h, w = phase.h, phase.w
    return [np.int32(v) for v in (n * h.rows * w.rows, c, problem.out_channels, h.rows, w.rows, w.taps, h.pad,
                                  w.pad, 1, 1, 1, 1, h.taps * w.taps, c % 8 == 0)]


def phase_input_map(problem: ConvProblem, phase: Phase) -> tuple:
    """:func:`tma.input_map`'s tuple over dy channels-last: corners -p' and (Wp - Wo - p'_w,
    Hp - Ho - p'_h), so that the walk covers Wp x Hp window corners at stride 1."""
    n, k, (ho, wo) = problem.x_shape[0], problem.out_channels, problem.out_hw
    h, w = phase.h, phase.w
    return ((k, wo, ho, n), (2 * k, 2 * wo * k, 2 * ho * wo * k), (-w.pad, -h.pad),
            (w.rows - wo - w.pad, h.rows - ho - h.pad), tma.STEP, tma.PIXELS, (1, 1, 1, 1))


def phase_filter_map(problem: ConvProblem, phase: Phase, tile_n: int) -> tuple:
    """:func:`tma.filter_map`'s tuple for the phase's KYXC weights as (K, Th Tw, C)."""
    k, c, taps = problem.out_channels, problem.x_shape[1], phase.h.taps * phase.w.taps
    return (k, taps, c), (2 * k, 2 * taps * k), (tma.STEP, 1, tile_n)


def phase_tiles(problem: ConvProblem, phase: Phase, tile_n: int) -> int:
    """conv_fwd_tma's tiles over the phase's N Hp Wp x C output."""
    m = problem.x_shape[0] * phase.h.rows * phase.w.rows
    return -(-m // tma.TILE_M) * -(-problem.x_shape[1] // tile_n)


# A phase's output starts on a multiple of this many elements of the workspace: its tensor
# map's and stores' 16-byte alignment, with room (conv_phase_scatter's `align`).
PHASE_ALIGN = 128


def weight_offset(problem: ConvProblem, phase: Phase) -> int:
    """Where conv_phase_weights puts the phase's block (elements): after the blocks of every
    earlier phase (a' < a: all their taps; a' = a, b' < b), phases past H or W included."""
    (fy, fx), (ph, pw), (sh, sw) = problem.filter, problem.pad, problem.stride
    k, c = problem.out_channels, problem.x_shape[1]
    taps_h = [a.taps for a in axis_phases(sh, fy, ph, sh)]  # every phase of the axis: size >= stride
    taps_w = [b.taps for b in axis_phases(sw, fx, pw, sw)]
    return c * k * (sum(taps_h[:phase.h.a]) * fx + phase.h.taps * sum(taps_w[:phase.w.a]))


def output_offsets(problem: ConvProblem) -> list[int | None]:
    """Where each of :func:`phases` writes its output in the workspace (elements, None for a
    phase without taps), and last the workspace's size: conv_phase_scatter's walk."""
    n, c = problem.x_shape[:2]
    offsets, at = [], 0
    for phase in phases(problem):
        if not phase.live:
            offsets.append(None)
            continue
        offsets.append(at)
        at += -(-n * phase.h.rows * phase.w.rows * c // PHASE_ALIGN) * PHASE_ALIGN
    return [*offsets, at]


def weight_arguments(problem: ConvProblem) -> list:
    """conv_phase_weights's int arguments: K, C, Y, X, w's strides (K, C, Y, X order), the pads,
    the strides."""
    k, c = problem.out_channels, problem.x_shape[1]
    return [np.int32(v) for v in (k, c, *problem.filter, *problem.descs()["w"].strides, *problem.pad,
                                  *problem.stride)]


def scatter_arguments(problem: ConvProblem, dx_strides) -> list:
    """conv_phase_scatter's int arguments: N, C, H, W, Y, X, the pads, the strides, dx's strides
    (N, C, H, W order), :data:`PHASE_ALIGN`."""
    return [np.int32(v) for v in (*problem.x_shape, *problem.filter, *problem.pad, *problem.stride, *dx_strides,
                                  PHASE_ALIGN)]


# conv_phase_scatter's block: CONV_SCATTER_X channels by CONV_SCATTER_Y pixels (conv_gemm.c)
SCATTER_BLOCK = (64, 4, 1)


def scatter_launcher(context, program, problem: ConvProblem, dx_strides):
    """``scatter(outputs, dx)``: conv_phase_scatter (from the loaded conv_gemm.c ``program``)
    writing all of dx from the phases' outputs, a row of each block per pixel (grid-stride)."""
    n, _, h, w = problem.x_shape
    rows = min(-(-n * h * w // SCATTER_BLOCK[1]), 65535)
    return context.backend.launcher(program.function("conv_phase_scatter"), (1, rows, 1), SCATTER_BLOCK,
                                    [None, None, *scatter_arguments(problem, dx_strides)])


def channels_last_strides(shape) -> tuple[int, int, int, int]:
    n, c, h, w = shape
    return h * w * c, 1, w * c, c


def representative(problem: ConvProblem) -> ConvProblem:
    """The phase (0, 0)'s shape (the largest) as a forward problem, for the tile choice."""
    n, c, h, w = problem.x_shape
    (sh, sw), k = problem.stride, problem.out_channels
    return ConvProblem("F", problem.dtype, "NHWC", (n, k, -(-h // sh), -(-w // sw)), c, (1, 1), (0, 0), (1, 1),
                       (1, 1), 1)


class ConvTmaBwdDataStrided(tma.TmaConvSolver):
    """The 128 x 256 tile; subclasses set ``tile_n``."""

    id = 39
    name = "ConvTmaBwdDataStrided128x256"
    tile_n = 256
    direction, computes = "B", "backward data only"

    def is_applicable(self, problem: ConvProblem, device):
        refused = self.shared_gate(problem, device)
        if refused is not None:
            return refused
        if problem.stride == (1, 1):
            return not_applicable("stride 1 is ConvTmaBwdData's (one forward convolution of dy, no phases)")
        if problem.dilation != (1, 1):
            return not_applicable(f"dilation {problem.dilation} at stride {problem.stride}: a stride phase's taps "
                                  "need not step evenly (only dilation 1 is split by phase)")
        n, c, h, w = problem.x_shape
        k, (ho, wo) = problem.out_channels, problem.out_hw
        if k % 8:
            return not_applicable(f"dy's {k} channels are not a multiple of 8 (tensor copies step in 16 bytes)")
        if c % 2:
            return not_applicable(f"dx's {c} channels are odd (dx is written two channels at a time)")
        for phase in phases(problem):
            if not phase.live:
                continue
            _, _, lower, upper, *_ = phase_input_map(problem, phase)
            if any(v not in tma.CORNER for v in (*lower, *upper)):
                return not_applicable(f"phase ({phase.h.a}, {phase.w.a})'s im2col window corners (W, H) {lower} and "
                                      f"{upper} leave -128..127")
        if max(n * h * w * c, n * ho * wo * k, k * c * problem.filter[0] * problem.filter[1],
               output_offsets(problem)[-1]) > INT_MAX:
            return not_applicable("sizes exceed the kernel's int arguments")
        if problem.layout == "NCHW" and max(n, k) > 65535:
            return not_applicable("NCHW staging transposes one matrix per image, at most 65535")
        return APPLIES

    def suits(self, problem: ConvProblem, device):
        units, shape = tma.device_units(device), representative(problem)
        best = tma.tile_n_for(shape, units)
        if best == self.tile_n:
            return APPLIES
        return not_applicable(f"128 x {best} tiles fit its largest phase better on {units} multiprocessors "
                              f"({tma.tile_efficiency(shape, best, units):.0%} against "
                              f"{tma.tile_efficiency(shape, self.tile_n, units):.0%})")

    def workspace(self, problem: ConvProblem) -> int:
        """The phases' sub-filters (w's size) and outputs; NCHW: dy and dx channels-last too."""
        d = problem.descs()
        elements = d["w"].numel + output_offsets(problem)[-1]
        if problem.layout == "NCHW":
            elements += d["y"].numel + d["x"].numel
        return elements * problem.dtype.itemsize

    def programs(self, problem: ConvProblem):
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return []
        # conv_gemm.c: the phases' weights and scatter, the NCHW staging
        return [tma.kernel_request(problem.dtype, self.tile_n), ProgramRequest("conv_gemm.c", problem.dtype.options)]

    def solution(self, problem: ConvProblem, device):
        tile_n = self.tile_n

        def invoker_factory(programs, context):
            p, backend = problem, context.backend
            (n, c, h, w_), k, (ho, wo) = p.x_shape, p.out_channels, p.out_hw
            d, item, moves = p.descs(), p.dtype.itemsize, programs[1]
            nhwc = p.layout == "NHWC"
            dx_strides = d["x"].strides if nhwc else channels_last_strides(p.x_shape)
            # two launches for every phase: its sub-filter (from w) and its output (into dx)
            flip = launcher_1d(context, moves.function("conv_phase_weights"), d["w"].numel,
                               [None, None, *weight_arguments(p)], max_groups=1 << 16)
            scatter = scatter_launcher(context, moves, p, dx_strides)
            subs, offsets = context.alloc(d["w"].numel * item), output_offsets(p)
            outs = context.alloc(offsets[-1] * item)
            steps = []  # per phase with taps: multiply, its sub-filter, its output (views of subs and outs)
            for phase, offset in zip(phases(p), offsets):
                if offset is None:
                    continue
                taps = phase.h.taps * phase.w.taps
                sub = backend.wrap(int(subs.ptr) + weight_offset(p, phase) * item, k * c * taps * item)
                out = backend.wrap(int(outs.ptr) + offset * item, n * phase.h.rows * phase.w.rows * c * item)
                multiply = tma.map_multiplier(context, programs[0], phase_tiles(p, phase, tile_n), tile_n,
                                              phase_scalars(p, phase), phase_input_map(p, phase),
                                              phase_filter_map(p, phase, tile_n))
                steps.append((multiply, sub, out))
            unaligned = fallback_invoker(context, problem, "ConvImplicitGemm")

            def run_phases(dy_nhwc, w, dx_nhwc):
                flip(w, subs)
                for multiply, sub, out in steps:
                    multiply(dy_nhwc, sub, out)
                scatter(outs, dx_nhwc)

            if nhwc:
                def backward_data(dy, w, dx):
                    if not aligned16(dy):  # dy's tensor map (w and dx are read and written elementwise)
                        unaligned(dy, w, dx)
                        return
                    run_phases(dy, w, dx)

                return backward_data

            # NCHW: dy moved channels-last, dx scattered channels-last and moved back
            transpose = transposer(context, moves, p.dtype)
            dy_in, dx_out = transpose(n, k, ho * wo), transpose(n, h * w_, c)
            dy_nhwc, dx_nhwc = context.alloc(d["y"].numel * item), context.alloc(d["x"].numel * item)

            def backward_data_nchw(dy, w, dx):
                dy_in(dy, dy_nhwc)
                run_phases(dy_nhwc, w, dx_nhwc)
                dx_out(dx_nhwc, dx)

            return backward_data_nchw

        return Solution(self.programs(problem), invoker_factory)


class ConvTmaBwdDataStrided128x128(ConvTmaBwdDataStrided):
    id = 40
    name = "ConvTmaBwdDataStrided128x128"
    tile_n = 128


class ConvTmaBwdDataStrided128x64(ConvTmaBwdDataStrided):
    id = 41
    name = "ConvTmaBwdDataStrided128x64"
    tile_n = 64
