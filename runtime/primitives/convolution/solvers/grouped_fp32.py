"""ConvGroupedFp32 (id 50): forward grouped convolution of fp32 tensors on the CUDA cores
(conv_grouped_fp32.cu, sm_80+ for cp.async), for groups of 2, 4 or 8 output channels:
ResNeXt's 3 x 3 convolutions of 32 groups at 4 and 8 channels a group, whose per-group GEMMs
are too narrow for the implicit GEMM's tiles. A block copies its output tile's input window
and its groups' weights into shared memory once; each thread sums all of one group's outputs
at four rows of one column. x, w and y go through their strides (NCHW and NHWC alike, no
staging); fp32 throughout (no TF32)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import fits_int_arguments, shape_args
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, Solver, not_applicable
from kdbkit.runtime.tensor import DataType

THREADS = 256  # conv_grouped_fp32.cu's GF_THREADS
PY = 4  # its GF_PY: output rows a thread
SHARED_LIMIT = 48 * 1024  # four blocks a multiprocessor
WIDTHS = (2, 4, 8)  # a group's output channels, one kernel each
KERNELS = {kg: f"conv_grouped_f32_k{kg}" for kg in WIDTHS}
MAX_CG = 16  # input channels a group: wider groups make GEMMs the implicit GEMM's tiles fill


def shared_bytes(problem: ConvProblem, th: int, tw: int, sgb: int) -> int:
    """The halo (its space then the NHWC output tile's) and the weights, as the kernel lays them out."""
    g, (fy, fx), (sh, sw), (dh, dw) = problem.groups, problem.filter, problem.stride, problem.dilation
    cg, kg = problem.x_shape[1] // g, problem.out_channels // g
    hh, ww = (th - 1) * sh + (fy - 1) * dh + 1, (tw - 1) * sw + (fx - 1) * dw + 1
    front = max(sgb * cg * ((hh * ww) | 1), th * tw * (sgb * kg + 1))
    return 4 * (-(-front // 4) * 4 + sgb * kg * cg * fy * fx)


@dataclass(frozen=True)
class Plan:
    th: int  # output tile: rows (a multiple of PY)
    tw: int  # and columns, a thread each
    sgb: int  # groups a block
    shared: int  # bytes of dynamic shared memory

    @property
    def threads(self) -> int:
        return self.tw * (self.th // PY) * self.sgb

    def grid(self, problem: ConvProblem) -> tuple[int, int, int]:
        ho, wo = problem.out_hw
        return (-(-ho // self.th) * -(-wo // self.tw), problem.groups // self.sgb, problem.x_shape[0])


def plan(problem: ConvProblem) -> Plan | None:
    """Columns: at most 32, cut evenly; rows: blocks of PY rows, as many a tile as waste fewest
    rows with at most 128 threads a group; then as many groups a block as keep it within
    THREADS and SHARED_LIMIT. Fewer rows where no group fits; None where one row block of one
    group does not, or where the input window's row is wider than the block's threads (the NCHW
    copy takes a row a pass: ResNeXt-50's strided layer2, left to the implicit GEMM)."""
    g, (ho, wo) = problem.groups, problem.out_hw
    cg = problem.x_shape[1] // g
    tw = -(-wo // -(-wo // 32))
    blocks = -(-ho // PY)
    most = max(1, min(blocks, 128 // tw))
    rb = min(range(1, most + 1), key=lambda r: (-(-blocks // r) * r - blocks, -r))
    divisors = [d for d in range(g, 0, -1) if g % d == 0]
    while True:
        for d in divisors:
            if tw * rb * d <= THREADS and d * cg <= THREADS and shared_bytes(problem, PY * rb, tw, d) <= SHARED_LIMIT:
                chosen = Plan(PY * rb, tw, d, shared_bytes(problem, PY * rb, tw, d))
                ww = (tw - 1) * problem.stride[1] + (problem.filter[1] - 1) * problem.dilation[1] + 1
                return chosen if ww <= chosen.threads else None
        if rb == 1:
            return None
        rb = max(1, rb // 2)


class ConvGroupedFp32(Solver):
    id = 50
    name = "ConvGroupedFp32"
    primitive = "conv"
    backends = ("cuda",)

    def builds_for(self, target) -> bool:
        return target.arch_facts.has("mma.sync")  # sm_80 and later: cp.async came with it

    def is_applicable(self, problem: ConvProblem, device):
        if not device.target.arch_facts.has("mma.sync"):
            return not_applicable(f"it needs cp.async (sm_80 or later; this is {device.target.arch})")
        if problem.dtype != DataType.FP32:
            return not_applicable(f"{problem.dtype.label} is not fp32")
        if problem.direction != "F":
            return not_applicable("it computes the forward direction only")
        g = problem.groups
        cg, kg = problem.x_shape[1] // g, problem.out_channels // g
        if g == 1:
            return not_applicable("it takes grouped convolutions, not one group")
        if kg not in WIDTHS or cg > MAX_CG:
            return not_applicable(f"groups of {cg} input and {kg} output channels: it takes 2, 4 or 8 outputs and "
                                  f"at most {MAX_CG} inputs a group")
        if plan(problem) is None:
            return not_applicable(f"its tile's input window ({problem.filter[0]} x {problem.filter[1]} filter, "
                                  f"stride {problem.stride[0]} x {problem.stride[1]}) exceeds a block's shared memory "
                                  "or its row a block's threads")
        if problem.x_shape[0] > 65535 or g > 65535:
            return not_applicable(f"its grid takes at most 65535 images and groups, not {problem.x_shape[0]} and {g}")
        return fits_int_arguments(problem)

    def suits(self, problem: ConvProblem, device):
        if problem.x_shape[1] // problem.groups == 1:
            return not_applicable("ConvDepthwise takes one input channel a group")
        return APPLIES

    def workspace(self, problem: ConvProblem) -> int:
        return 0

    def programs(self, problem: ConvProblem):
        if problem.dtype != DataType.FP32 or problem.groups == 1:
            return []  # fp32 grouped convolutions only
        return [ProgramRequest("conv_grouped_fp32.cu", problem.dtype.options)]

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            chosen = plan(problem)
            kg = problem.out_channels // problem.groups
            fast = context.backend.launcher(programs[0].function(KERNELS[kg]), chosen.grid(problem),
                                            (chosen.threads, 1, 1),
                                            [None, None, None, *shape_args(problem),
                                             *(np.int32(v) for v in (chosen.th, chosen.tw, chosen.sgb))],
                                            shared_bytes=chosen.shared)

            def forward(x, w, y):
                fast(x, w, y)

            return forward

        return Solution(self.programs(problem), invoker_factory)
