"""ConvImplicitGemmMfma (id 25): forward convolution of NHWC fp16/bf16 tensors as an implicit
GEMM on AMD matrix cores (conv_igemm_mfma.hip: one wavefront per 32 x 32 tile of y,
v_mfma_f32_32x32x8 steps), gfx90a and gfx942. Untested on hardware (no AMD GPU here): built
offline by clang and its disassembly checked for the matrix instructions."""

from __future__ import annotations

from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX, shape_args
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, Solver, not_applicable
from kdbkit.runtime.tensor import DataType

ARCHS = ("gfx90a", "gfx942")  # the processors conv_igemm_mfma.hip has an MFMA 32x32x8 path for (its #if)
TILE, LANES = 32, 64


def program(problem: ConvProblem) -> ProgramRequest | None:
    if problem.dtype not in (DataType.FP16, DataType.BF16):
        return None
    return ProgramRequest("conv_igemm_mfma.hip", problem.dtype.options)


class ConvImplicitGemmMfma(Solver):
    id = 25
    name = "ConvImplicitGemmMfma"
    primitive = "conv"
    backends = ("hip",)

    def is_applicable(self, problem: ConvProblem, device):
        arch = device.target.arch_facts
        if not arch.has("mfma"):
            return not_applicable(f"it needs an AMD GPU with MFMA 32x32x8 ({' or '.join(ARCHS)}; this is {arch})")
        if arch.name not in ARCHS:  # gfx908 lacks bf16_1k; gfx950 waits for a clang that builds it
            return not_applicable(f"its kernel has an MFMA path for {' and '.join(ARCHS)} only (this is {arch})")
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return not_applicable(f"{problem.dtype.label} is not fp16 or bf16")
        if problem.direction != "F":
            return not_applicable("it computes the forward direction only")
        if problem.layout != "NHWC":
            return not_applicable("it takes NHWC (channels-last) tensors only")
        if problem.groups != 1:
            return not_applicable(f"it takes one group, not {problem.groups}")
        n, c, h, w = problem.x_shape
        k, (ho, wo) = problem.out_channels, problem.out_hw
        if max(n * h * w * c, n * ho * wo * k, k * c * problem.filter[0] * problem.filter[1]) > INT_MAX:
            return not_applicable("sizes exceed the kernel's int arguments")
        return APPLIES

    def programs(self, problem: ConvProblem):
        request = program(problem)
        return [request] if request else []

    def solution(self, problem: ConvProblem, device):
        def invoker_factory(programs, context):
            kernel = programs[0].function("conv_igemm_mfma_fwd_nhwc")
            n, (ho, wo) = problem.x_shape[0], problem.out_hw
            grid = (-(-problem.out_channels // TILE), -(-(n * ho * wo) // TILE), 1)
            fast = context.backend.launcher(kernel, grid, (LANES, 1, 1), [None, None, None, *shape_args(problem)])
            return lambda x, w, y: fast(x, w, y)

        return Solution(self.programs(problem), invoker_factory)
