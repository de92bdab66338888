"""GemmTensorCore (id 11): NVIDIA tensor cores (mma.sync m16n8k16), fp16/bf16 with fp32 accumulation."""

from __future__ import annotations

from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.gemm.solvers.common import fits, gemm_arguments
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import Solver, not_applicable, register
from kdbkit.runtime.tensor import DataType

BLOCK_TILE, THREADS, FAST_THREADS = 128, 256, 128
FAST_SHARED = 4 * (128 * 40 + 32 * 136) * 2  # gemm_tc_nn's 4 stages of padded A and B tiles (bytes)


@register
class GemmTensorCore(Solver):
    id = 11
    name = "GemmTensorCore"
    primitive = "gemm"
    backends = ("cuda",)

    def is_applicable(self, problem: GemmProblem, device):
        if device.backend != "cuda":
            return not_applicable(f"tensor cores through mma.sync are CUDA only (this is {device.backend})")
        arch = device.target.arch
        if not (arch.startswith("sm_") and arch[3:].rstrip("afs").isdigit() and int(arch[3:].rstrip("afs")) >= 80):
            return not_applicable(f"{arch} has no mma.sync for fp16/bf16 (needs sm_80 or later)")
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return not_applicable(f"{problem.dtype.label} is not fp16 or bf16")
        return fits(problem)

    def programs(self, problem: GemmProblem):
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return []
        return [ProgramRequest("gemm_tc.cu", problem.dtype.options)]

    def invoker(self, handle, problem: GemmProblem):
        request = self.programs(problem)[0]
        prog = handle.program(request.kernel_file, request.options)
        kernel = prog.function("gemm_tc")
        grid = (-(-problem.n // BLOCK_TILE), -(-problem.m // BLOCK_TILE), problem.batch)
        tail, launch = gemm_arguments(problem), handle.backend.launch
        if not _fast_path(problem):
            return lambda a, b, c: launch(kernel, grid, (THREADS, 1, 1), [a, b, c, *tail])
        fast = prog.function("gemm_tc_nn")
        fast_tail = [*tail[:9], *tail[11:]]  # gemm_tc_nn takes no transpose flags

        def run(a, b, c):
            # 16-byte copies need 16-byte aligned matrices; a view at an odd offset takes the general kernel.
            if all(int(getattr(t, "ptr", 1)) % 16 == 0 for t in (a, b, c)):
                launch(fast, grid, (FAST_THREADS, 1, 1), [a, b, c, *fast_tail], FAST_SHARED)
            else:
                launch(kernel, grid, (THREADS, 1, 1), [a, b, c, *tail])

        return run


def _fast_path(problem: GemmProblem) -> bool:
    """gemm_tc_nn's conditions that the problem fixes (the pointers' alignment is checked per call)."""
    p = problem
    return (not p.trans_a and not p.trans_b and p.m % BLOCK_TILE == 0 and p.n % BLOCK_TILE == 0 and p.k % 32 == 0
            and p.lda % 8 == 0 and p.ldb % 8 == 0 and all(s % 8 == 0 for s in (p.stride_a, p.stride_b, p.stride_c)))
