"""GemmTensorCore (id 11): NVIDIA tensor cores (mma.sync m16n8k16), fp16/bf16 with fp32 accumulation."""

from __future__ import annotations

from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.gemm.solvers.common import fits, gemm_arguments
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import Solver, not_applicable, register
from kdbkit.runtime.tensor import DataType

BLOCK_TILE, THREADS = 128, 256


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
        kernel = handle.program(request.kernel_file, request.options).function("gemm_tc")
        grid = (-(-problem.n // BLOCK_TILE), -(-problem.m // BLOCK_TILE), problem.batch)
        tail, launch = gemm_arguments(problem), handle.backend.launch
        return lambda a, b, c: launch(kernel, grid, (THREADS, 1, 1), [a, b, c, *tail])
