"""ConvTmaBwdData (ids 36-38): backward data of fp16/bf16 tensors at stride 1 on Hopper through
the TMA forward kernel (kernels/conv_tma.cu, ConvTma's pipeline). At stride 1, dx is the
forward convolution of dy with the weights transposed and flipped, padded by dilation x
(filter - 1) - pad on each side:

    dx[n, c, i, j] = sum over k, a, b of dy[n, k, i - p'_h + d_h a, j - p'_w + d_w b] w'[c, k, a, b],
    w'[c, k, a, b] = w[k, c, Y-1-a, X-1-b],  p' = d (filter - 1) - p

(substituting a = Y-1-r gives dy[n, k, i + p_h - d_h r, ...] w[k, c, r, ...], the gradient of
y[n, k, i', j'] = sum x[n, c, i' - p_h + d_h r, ...] w[k, c, r, ...]; the output is H x W since
Ho + 2 p' - d (Y - 1) = H + 2 p - d (Y - 1) + d (Y - 1) - 2 p). That is
:func:`igemm_tc.as_forward` (p' is :func:`igemm_tc.flipped_pad`), which the mma.sync solver
computes too. Each call moves w into the workspace as that forward's KYXC weights (C x Y x X x
K, conv_gemm.c's conv_flip_weights, read through w's strides: either layout), then runs
conv_fwd_tma with dy as its input: output pixels by dx's channels, 128 x 256, 128 x 128 or 128
x 64 tiles (one solver each, the forward's choice of tile on that forward problem).

Channels-last tensors go as they are; an NCHW dy is staged channels-last as the forward
solver stages x, and the kernel writes dx's planes itself, as the forward's y. An NCHW 1 x 1
one without padding is the batched GEMM dx[n] (C x HW) = w^T (C x K) dy[n] (K x HW): it runs
through GemmTma's invoker (A transposed, on the tensors as they are) where H W and C are
multiples of 8 and the tile is 256 or 128 wide, as the forward's 1 x 1 convolutions do. A
stride above 1 is ConvTmaBwdDataStrided's (tma_sdgrad: one forward convolution per output
phase).
"""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers import tma
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX
from kdbkit.runtime.primitives.convolution.solvers.igemm_tc import as_forward, flipped_pad, transposer
from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.gemm.solvers import tma as gemm_tma
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, aligned16, fallback_invoker, launcher_1d, not_applicable
from kdbkit.runtime.tensor import DataType


def as_gemm(problem: ConvProblem) -> GemmProblem | None:
    """A 1 x 1, stride 1, unpadded NCHW backward data as the batched GEMM dx[n] = w^T dy[n] (C x
    K by K x HW; w, stored K x C, shared by every image), or None where it is not one or the
    rows of w (C values) or of dy and dx (H W values) are not 16-byte aligned for the tensor
    copies."""
    n, c, h, w = problem.x_shape
    k, hw = problem.out_channels, h * w
    if problem.layout != "NCHW" or problem.filter != (1, 1) or problem.stride != (1, 1) or problem.pad != (0, 0) \
            or problem.groups != 1 or hw % 8 or c % 8 or k % 8:
        return None
    return GemmProblem(problem.dtype, c, hw, k, True, False, n, c, hw, hw, 0, k * hw, c * hw)


def flip_arguments(problem: ConvProblem) -> list:
    """conv_flip_weights's int arguments: K, C, Y, X and w's strides (K, C, Y, X order)."""
    (k, c, fy, fx), strides = problem.w_shape, problem.descs()["w"].strides
    return [np.int32(v) for v in (k, c, fy, fx, *strides)]


class ConvTmaBwdData(tma.TmaConvSolver):
    """The 128 x 256 tile; subclasses set ``tile_n``."""

    id = 36
    name = "ConvTmaBwdData128x256"
    tile_n = 256
    direction, computes = "B", "backward data only"

    def is_applicable(self, problem: ConvProblem, device):
        refused = self.shared_gate(problem, device)
        if refused is not None:
            return refused
        if problem.stride != (1, 1):
            return not_applicable(f"stride {problem.stride} is ConvTmaBwdDataStrided's (one forward convolution of "
                                  "dy per output phase): only at stride 1 is it one forward convolution of dy")
        pad = flipped_pad(problem)
        if min(pad) < 0:
            return not_applicable(f"pad {problem.pad} is wider than dilation x (filter - 1): the forward convolution "
                                  f"of dy would need a negative pad {pad}")
        n, c, h, w = problem.x_shape
        k = problem.out_channels
        if k % 8:
            return not_applicable(f"dy's {k} channels are not a multiple of 8 (tensor copies step in 16 bytes)")
        if c % 2:
            return not_applicable(f"dx's {c} channels are odd (dx is written two channels at a time)")
        lower, upper = tma.corners(as_forward(problem))
        if any(v not in tma.CORNER for v in (*lower, *upper)):
            return not_applicable(f"pad {problem.pad} with a {problem.filter} filter dilated {problem.dilation} "
                                  f"pads dy by {pad}: the im2col window's corners (W, H) {lower} and {upper} "
                                  "leave -128..127")
        ho, wo = problem.out_hw
        if max(n * h * w * c, n * ho * wo * k, k * c * problem.filter[0] * problem.filter[1]) > INT_MAX:
            return not_applicable("sizes exceed the kernel's int arguments")
        gemm = as_gemm(problem) if self.tile_n in tma.GEMMS else None
        if gemm is not None:
            return tma.GEMMS[self.tile_n].is_applicable(gemm, device)
        if problem.layout == "NCHW" and max(n, k) > 65535:
            return not_applicable("NCHW staging transposes one matrix per image, at most 65535")
        return APPLIES

    def suits(self, problem: ConvProblem, device):
        units, computed = tma.device_units(device), as_forward(problem)
        gemm = as_gemm(problem)
        if gemm is not None:  # the GEMM's tiles: dx's channels by pixels
            if self.tile_n not in tma.GEMMS:
                return not_applicable(f"a 1 x 1 NCHW backward data runs as a GEMM of 128 x 256 or 128 x 128 tiles "
                                      f"(ConvTmaBwdData128x{self.tile_n} stages it channels-last instead)")
            best = max(tma.GEMMS, key=lambda n: (round(gemm_tma.tile_efficiency(gemm, n, units), 3), n))
            if best == self.tile_n:
                return APPLIES
            return not_applicable(f"the GEMM's 128 x {best} tiles fit this 1 x 1 backward data better on {units} "
                                  "multiprocessors")
        best = tma.tile_n_for(computed, units)
        if best == self.tile_n:
            return APPLIES
        return not_applicable(f"128 x {best} tiles fit this shape better on {units} multiprocessors "
                              f"({tma.tile_efficiency(computed, best, units):.0%} against "
                              f"{tma.tile_efficiency(computed, self.tile_n, units):.0%})")

    def workspace(self, problem: ConvProblem) -> int:
        """The flipped weights; NCHW: dy channels-last too; nothing for the GEMM."""
        if self.tile_n in tma.GEMMS and as_gemm(problem) is not None:
            return 0
        d = problem.descs()
        staged = d["y"].numel if problem.layout == "NCHW" else 0
        return (d["w"].numel + staged) * problem.dtype.itemsize

    def programs(self, problem: ConvProblem):
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return []
        gemm = as_gemm(problem) if self.tile_n in tma.GEMMS else None
        if gemm is not None:
            return tma.GEMMS[self.tile_n].programs(gemm)
        # conv_gemm.c: the weights' flip and the NCHW staging
        return [tma.kernel_request(problem.dtype, self.tile_n), ProgramRequest("conv_gemm.c", problem.dtype.options)]

    def solution(self, problem: ConvProblem, device):
        tile_n = self.tile_n
        gemm = as_gemm(problem) if tile_n in tma.GEMMS else None
        if gemm is not None:
            gemm_solution = tma.GEMMS[tile_n].solution(gemm, device)

            def gemm_invoker_factory(programs, context):
                multiply = gemm_solution.invoker_factory(programs, context)

                def backward_data_gemm(dy, w, dx):
                    multiply(w, dy, dx)  # dx[n] = w^T dy[n]

                return backward_data_gemm

            return Solution(self.programs(problem), gemm_invoker_factory)

        def invoker_factory(programs, context):
            p, computed = problem, as_forward(problem)
            n, k, (ho, wo) = p.x_shape[0], p.out_channels, p.out_hw
            d, item, moves = p.descs(), p.dtype.itemsize, programs[1]
            flip = launcher_1d(context, moves.function("conv_flip_weights"), d["w"].numel,
                               [None, None, *flip_arguments(p)], max_groups=1 << 16)
            flipped = context.alloc(d["w"].numel * item)  # C x Y x X x K: the forward's KYXC
            unaligned = fallback_invoker(context, problem, "ConvImplicitGemmTensorCore")

            if p.layout == "NHWC":
                multiply = tma.multiplier(context, programs[0], computed, tile_n)

                def backward_data(dy, w, dx):
                    if not aligned16(dy, dx):  # dy's tensor map and dx's 16-byte stores (w is read by the flip)
                        unaligned(dy, w, dx)
                        return
                    flip(w, flipped)
                    multiply(dy, flipped, dx)

                return backward_data

            # NCHW: dy moved channels-last; the kernel writes dx's planes itself
            to_planes = tma.multiplier(context, programs[0], computed, tile_n, planes=True)
            dy_in = transposer(context, moves, p.dtype)(n, k, ho * wo)
            dy_nhwc = context.alloc(d["y"].numel * item)

            def backward_data_nchw(dy, w, dx):
                flip(w, flipped)
                dy_in(dy, dy_nhwc)
                to_planes(dy_nhwc, flipped, dx)

            return backward_data_nchw

        return Solution(self.programs(problem), invoker_factory)


class ConvTmaBwdData128x128(ConvTmaBwdData):
    id = 37
    name = "ConvTmaBwdData128x128"
    tile_n = 128


class ConvTmaBwdData128x64(ConvTmaBwdData):
    id = 38
    name = "ConvTmaBwdData128x64"
    tile_n = 64
