"""GemmWgmma (id 16): Hopper's warpgroup matrix instructions (wgmma, sm_90a), fp16/bf16 with
fp32 accumulation, for aligned, untransposed-A problems whose sizes are whole 128 x 128 tiles
(K whole steps of 64). B not transposed is transposed first into the invoker's workspace, so
that both operands are K-major in shared memory (kernels/gemm_wgmma.cu)."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.gemm.solvers.common import fits
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import Solution, Solver, aligned16, fallback_invoker, not_applicable
from kdbkit.runtime.tensor import DataType

TILE, STEP, THREADS, STAGES = 128, 64, 256, 6
SHARED = STAGES * 2 * TILE * 128 + 1024  # the stages of A's and Bt's swizzled tiles, and 1 KiB to align them
ARCH_OPTION = "--gpu-architecture=sm_90a"  # wgmma exists only in the arch-specific sm_90a code


class GemmWgmma(Solver):
    id = 16
    name = "GemmWgmma"
    primitive = "gemm"
    backends = ("cuda",)

    def builds_for(self, target) -> bool:
        return target.arch_facts.has("wgmma")  # Hopper's alone (sm_90, built as sm_90a)

    def is_applicable(self, problem: GemmProblem, device):
        if not device.target.arch_facts.has("wgmma"):
            return not_applicable(f"wgmma needs an sm_90 GPU (this is {device.target.arch})")
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return not_applicable(f"{problem.dtype.label} is not fp16 or bf16")
        p = problem
        if p.trans_a:
            return not_applicable("A is transposed")
        if p.m % TILE or p.n % TILE or p.k % STEP:
            return not_applicable(f"M, N are not multiples of {TILE} or K of {STEP}")
        if any(v % 8 for v in (p.lda, p.ldb, p.ldc, p.stride_a, p.stride_b, p.stride_c)):
            return not_applicable("a leading dimension or batch stride is not a multiple of 8 elements")
        return fits(problem)

    def workspace(self, problem: GemmProblem) -> int:
        copies = problem.batch if problem.stride_b else 1
        return 0 if problem.trans_b else 2 * problem.n * problem.k * copies

    def programs(self, problem: GemmProblem):
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return []
        return [ProgramRequest("gemm_wgmma.cu", (*problem.dtype.options, ARCH_OPTION))]

    def solution(self, problem: GemmProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            p, i32, i64 = problem, np.int32, np.int64
            copies = p.batch if p.stride_b else 1
            grid = (p.n // TILE, p.m // TILE, p.batch)
            if p.trans_b:  # B is already N x K
                ldbt, stride_bt, transpose, bt = p.ldb, p.stride_b, None, None
            else:
                bt = context.alloc(self.workspace(problem))  # the invoker's own, allocated once
                ldbt, stride_bt = p.k, p.n * p.k if p.stride_b else 0
                transpose = context.backend.launcher(prog.function("gemm_transpose"), (p.n // 32, p.k // 32, copies),
                                                     (32, 8, 1), [None, bt, i32(p.k), i32(p.n), i32(p.ldb),
                                                                  i64(p.stride_b)])
            main = context.backend.launcher(
                prog.function("gemm_wgmma"), grid, (THREADS, 1, 1),
                [None, None if bt is None else bt, None, *(i32(v) for v in (p.m, p.n, p.k, p.lda, ldbt, p.ldc)),
                 i64(p.stride_a), i64(stride_bt), i64(p.stride_c), np.float32(p.alpha), np.float32(p.beta)], SHARED)
            fallback = fallback_invoker(context, problem, "GemmTensorCore")  # the mma.sync kernels

            def run(a, b, c):
                if not aligned16(a, b, c):  # 16-byte copies need aligned matrices
                    fallback(a, b, c)
                    return
                if transpose is None:
                    main(a, b, c)
                else:
                    transpose(b)
                    main(a, c)

            return run

        return Solution(self.programs(problem), invoker_factory)
