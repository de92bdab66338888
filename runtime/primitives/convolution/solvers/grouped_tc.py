"""ConvGroupedTensorCore (id 48): forward grouped convolution, depthwise included, of fp16/bf16
tensors on NVIDIA tensor cores (conv_grouped_tc.cu, mma.sync m16n8k16, sm_80+): ResNeXt's
3 x 3 convolutions of 32 groups, MobileNet's depthwise ones. Groups narrower than 8 channels
are merged into supergroups of 8 (block-diagonal weights, zeros across the groups); a block
reads its output tile's input window once into shared memory and every warp's fragments come
out of it by ldmatrix. NHWC tensors go as they are; an NCHW x is staged channels-last in a
workspace by conv_gemm.c's tiled transpose and the kernel writes the NCHW output itself. The
weights are copied as 16-byte rows: the user's packed KYXC ones where no groups merge, else
expanded (zeros across the groups) into a workspace by conv_grouped_weights on each call.
Groups of 64 channels keep the whole output tile: their weights fill most of a block, so a
smaller tile would copy them again for a few positions on one warp."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX, shape_args
from kdbkit.runtime.primitives.convolution.solvers.igemm_tc import tensor_core_refusal, transposer
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import (APPLIES, Solution, Solver, aligned16, fallback_invoker, launcher_1d,
                                   not_applicable)
from kdbkit.runtime.tensor import DataType

THREADS = 256  # conv_grouped_tc.cu's GC_THREADS
SHARED_MAX = 163 * 1024  # a block's dynamic shared memory on sm_80 (sm_90 allows 227 KiB)
SHARED_BUDGET = 72 * 1024  # three blocks a multiprocessor where the tile allows
WIDTHS = (8, 16, 32, 64)  # the supergroups' output channels, one kernel each
KERNELS = {kg: f"conv_grouped_fwd_k{kg}" for kg in WIDTHS}


def merge(problem: ConvProblem) -> int | None:
    """f, the groups a supergroup takes: the fewest whose input and output channels are both
    multiples of 8, at most 64 of each; None where no f divides the groups."""
    g = problem.groups
    cg, kg = problem.x_shape[1] // g, problem.out_channels // g
    for f in (1, 2, 4, 8):
        if (f * cg) % 8 == 0 and (f * kg) % 8 == 0:
            return f if g % f == 0 and f * cg <= 64 and f * kg in WIDTHS else None
    return None


def _padded(halves: int) -> int:
    return halves + (8 if (halves // 8) % 2 == 0 else 0)  # conv_grouped_tc.cu's gc_padded


@dataclass(frozen=True)
class Plan:
    f: int  # groups a supergroup
    th: int  # output tile: rows
    tw: int  # and columns
    sgb: int  # supergroups a block
    shared: int  # bytes of dynamic shared memory

    def grid(self, problem: ConvProblem) -> tuple[int, int, int]:
        ho, wo = problem.out_hw
        return (-(-ho // self.th) * -(-wo // self.tw), problem.groups // (self.f * self.sgb), problem.x_shape[0])


def shared_bytes(problem: ConvProblem, f: int, th: int, tw: int, sgb: int) -> int:
    """The halo, the weights and the output tile, as conv_grouped_tc.cu lays them out."""
    g, (fy, fx), (sh, sw), (dh, dw) = problem.groups, problem.filter, problem.stride, problem.dilation
    cs, ks = sgb * f * problem.x_shape[1] // g, sgb * f * problem.out_channels // g
    hh, ww = (th - 1) * sh + (fy - 1) * dh + 1, (tw - 1) * sw + (fx - 1) * dw + 1
    rows = -(-th * tw // 16) * 16
    out = ks * (rows + 8) if problem.layout == "NCHW" else rows * (ks + 8)
    weights = ks * (-(-fy * fx * cs // sgb // 16) * 16 + 8)  # rows of whole k16 steps, then 16 bytes
    return 2 * (hh * ww * _padded(cs) + weights + out + 8)  # and 8 zeros


def expanded_weights(problem: ConvProblem) -> int:
    """The elements of the weights conv_grouped_weights writes (K x Y X x f cg), or 0 where the
    kernel reads the user's: packed KYXC rows already (NHWC, f = 1)."""
    f = merge(problem)
    if f == 1 and problem.layout == "NHWC":
        return 0
    return problem.out_channels * problem.filter[0] * problem.filter[1] * f * problem.x_shape[1] // problem.groups


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan(problem: ConvProblem, units: int = 132) -> Plan | None:
    """The tile: about 128 output positions (64 strided) in rows of at most 16, cut evenly; then
    as many supergroups a block as keep it within SHARED_BUDGET (at most 128 channels) while the
    grid still gives each of the ``units`` multiprocessors two blocks; smaller tiles where none
    fits, unless one supergroup's weights take over half the budget (then the first tile, up to
    SHARED_MAX). None where even one row of one supergroup exceeds a block's shared memory."""
    f = merge(problem)
    if f is None:
        return None
    n, (ho, wo), (fy, fx) = problem.x_shape[0], problem.out_hw, problem.filter
    g = problem.groups // f
    cg, kg = f * problem.x_shape[1] // problem.groups, f * problem.out_channels // problem.groups
    tw = -(-wo // -(-wo // 16))
    target = 128 if problem.stride == (1, 1) else 64
    th0 = max(1, min(ho, target // tw))
    whole = True
    while True:
        th = -(-ho // -(-ho // th0))
        tiles = -(-ho // th) * -(-wo // tw) * n
        fits = [d for d in _divisors(g) if d * cg <= 128 and d * kg <= 128
                and shared_bytes(problem, f, th, tw, d) <= SHARED_BUDGET]
        if fits:
            filled = [d for d in fits if tiles * (g // d) >= 2 * units]
            d = max(filled) if filled else min(fits)
            return Plan(f, th, tw, d, shared_bytes(problem, f, th, tw, d))
        weights = 2 * kg * (-(-fy * fx * cg // 16) * 16 + 8)
        if whole and 2 * weights > SHARED_BUDGET and shared_bytes(problem, f, th, tw, 1) <= SHARED_MAX:
            # one supergroup's weights fill most of a block (64 channels a group, 3 x 3): a smaller
            # tile would copy them again for fewer positions, so the whole tile takes more memory
            return Plan(f, th, tw, 1, shared_bytes(problem, f, th, tw, 1))
        whole = False
        if th0 == 1:
            break
        th0 = max(1, th0 // 2)
    if shared_bytes(problem, f, 1, tw, 1) <= SHARED_MAX:
        return Plan(f, 1, tw, 1, shared_bytes(problem, f, 1, tw, 1))
    return None


class ConvGroupedTensorCore(Solver):
    id = 48
    name = "ConvGroupedTensorCore"
    primitive = "conv"
    backends = ("cuda",)

    def builds_for(self, target) -> bool:
        return target.arch_facts.has("mma.sync")  # for fp16/bf16

    def is_applicable(self, problem: ConvProblem, device):
        refusal = tensor_core_refusal(problem, device)
        if refusal is not None:
            return refusal
        if problem.direction != "F":
            return not_applicable("it computes the forward direction only")
        g = problem.groups
        if g == 1:
            return not_applicable("it takes grouped convolutions, not one group")
        cg, kg = problem.x_shape[1] // g, problem.out_channels // g
        if merge(problem) is None:
            return not_applicable(f"groups of {cg} input and {kg} output channels ({g} groups) merge into no "
                                  "supergroup of 8, 16, 32 or 64 output and at most 64 input channels")
        if plan(problem) is None:
            return not_applicable(f"a {problem.filter[0]} x {problem.filter[1]} filter's window and weights exceed "
                                  "a block's shared memory")
        n, c, h, w = problem.x_shape
        if max(n * h * w * c, n * problem.out_hw[0] * problem.out_hw[1] * problem.out_channels,
               problem.out_channels * problem.filter[0] * problem.filter[1] * 64) > INT_MAX:
            return not_applicable("sizes exceed the kernel's int arguments")
        if n > 65535 or problem.groups > 65535:
            return not_applicable(f"its grid takes at most 65535 images and groups, not {n} and {g}")
        return APPLIES

    def suits(self, problem: ConvProblem, device):
        depthwise = problem.groups == problem.x_shape[1] == problem.out_channels
        if depthwise and problem.stride != (1, 1):
            # a strided depthwise convolution reads 4 inputs an output: ConvDepthwise's direct kernels
            # measured faster there (docs/performance.md)
            return not_applicable("ConvDepthwise's direct kernels are faster on strided depthwise convolutions")
        large_nchw = problem.layout == "NCHW" and problem.x_shape[2] * problem.x_shape[3] >= 56 * 56
        if depthwise and problem.filter[1] <= 3 and problem.dilation[1] == 1 and not large_nchw:
            # MobileNet's 3 x 3 at stride 1: an 8-channel supergroup multiplies 7 zeros a weight, and NCHW
            # costs a transpose; ConvDepthwise's register path reads each input once a window row, one
            # launch. On NCHW planes of 56 x 56 and more this kernel measured faster still
            # (docs/bench_conv_mobilenet.md)
            return not_applicable("ConvDepthwise's direct kernels are faster on depthwise filters up to 3 wide")
        return APPLIES

    def workspace(self, problem: ConvProblem) -> int:
        staged = problem.descs()["x"].numel if problem.layout == "NCHW" else 0
        return (staged + expanded_weights(problem)) * problem.dtype.itemsize

    def programs(self, problem: ConvProblem):
        if problem.dtype not in (DataType.FP16, DataType.BF16) or problem.groups == 1:
            return []  # no fp32 build of the tensor-core kernel (tc_types.h); one group is not its job
        return [ProgramRequest("conv_grouped_tc.cu", problem.dtype.options),
                ProgramRequest("conv_gemm.c", problem.dtype.options)]

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            chosen = plan(problem, context.device.target.cu or 132)
            kg = chosen.f * problem.out_channels // problem.groups
            nchw = problem.layout == "NCHW"
            backend, prog, item = context.backend, programs[0], problem.dtype.itemsize
            fast = backend.launcher(prog.function(KERNELS[kg]), chosen.grid(problem), (THREADS, 1, 1),
                                    [None, None, None, *shape_args(problem),
                                     *(np.int32(v) for v in (nchw, chosen.f, chosen.th, chosen.tw, chosen.sgb))],
                                    shared_bytes=chosen.shared)
            n, c, h, w = problem.x_shape
            wide = expanded_weights(problem)
            weights = context.alloc(wide * item) if wide else None
            expand = launcher_1d(context, prog.function("conv_grouped_weights"), wide, [None, None, *(
                np.int32(v) for v in (problem.out_channels, problem.groups, c // problem.groups, chosen.f,
                                      *problem.filter, *problem.descs()["w"].strides))]) if wide else None
            staged = context.alloc(problem.descs()["x"].numel * item) if nchw else None
            into = transposer(context, programs[1], problem.dtype)(n, c, h * w) if nchw else None
            unaligned = fallback_invoker(context, problem, "ConvImplicitGemm")

            def forward(x, w, y):
                if not aligned16(*([] if nchw else [x, y]), *([] if expand else [w])):
                    unaligned(x, w, y)
                    return
                if expand is not None:
                    expand(w, weights)
                    w = weights
                if into is not None:
                    into(x, staged)
                    x = staged
                fast(x, w, y)

            return forward

        return Solution(self.programs(problem), invoker_factory)
