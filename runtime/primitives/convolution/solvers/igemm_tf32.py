"""ConvImplicitGemmTf32 (id 45): ConvImplicitGemm's kernels (conv_igemm.c, every direction,
layout, group count, stride, dilation and padding, the same split reductions) with the multiply
on the tensor cores in TF32 (igemm_core.h's -DIG_TF32: mma.sync m16n8k8, fp32 sums): fp32
tensors whose operands are rounded to TF32's 10-bit mantissa on the way in, so its results
differ from fp32's at about 1e-3 relative. Only when asked for: it applies only with
KDB_CONV_ALLOW_TF32=1 set (asked for by name too), fp32 tensors and a CUDA GPU with mma.sync
(sm_80 or later); then immediate mode ranks it first among the fp32 solvers."""

from __future__ import annotations

from kdbkit.runtime import env
from kdbkit.runtime.primitives.convolution.problem import ConvProblem
from kdbkit.runtime.primitives.convolution.solvers.igemm import TILE, ConvImplicitGemm
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import not_applicable
from kdbkit.runtime.tensor import DataType

ALLOW = "KDB_CONV_ALLOW_TF32"


def program(problem: ConvProblem) -> ProgramRequest:  # the 128 x 128 tile: its mma warps' layout
    return ProgramRequest("conv_igemm.c", (*problem.dtype.options, "-DIG_TF32"))


def tf32_refusal(problem: ConvProblem, device):
    """Why the TF32 solver does not take ``problem`` (not fp32, no mma.sync), or None."""
    if problem.dtype != DataType.FP32:
        return not_applicable(f"it computes fp32 tensors in TF32, not {problem.dtype.label}")
    if device is not None and not device.target.arch_facts.has("mma.sync"):
        return not_applicable(f"it needs CUDA tensor cores with mma.sync (sm_80 or later; this is "
                              f"{device.target.arch})")
    return None


class ConvImplicitGemmTf32(ConvImplicitGemm):
    id = 45
    name = "ConvImplicitGemmTf32"
    primitive = "conv"
    backends = ("cuda",)

    def tile(self, problem: ConvProblem) -> tuple[int, int]:
        return TILE, TILE

    def builds_for(self, target) -> bool:
        return target.arch_facts.has("mma.sync")

    def is_applicable(self, problem: ConvProblem, device):
        # Refused outright without the flag (not merely passed over): find would otherwise time
        # it, rank it first and hand TF32 results to a caller who asked for fp32.
        if not env.get_bool(ALLOW):
            return not_applicable(f"TF32 rounds fp32 operands: set {ALLOW}=1 to allow it")
        refusal = tf32_refusal(problem, device)
        if refusal is not None:
            return refusal
        return super().is_applicable(problem, device)

    def programs(self, problem: ConvProblem):
        # fp32 only: a bundle carries no TF32 build of the 16-bit kernels, which never run
        return [program(problem)] if problem.dtype == DataType.FP32 else []
