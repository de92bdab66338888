"""GemmTensorCore (id 11): NVIDIA tensor cores (mma.sync m16n8k16), fp16/bf16 with fp32 accumulation."""

from __future__ import annotations

from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.gemm.solvers.common import fits, gemm_arguments
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import Solution, Solver, fast_when_aligned, not_applicable
from kdbkit.runtime.tensor import DataType

BLOCK_TILE, THREADS = 128, 256


def _shared(tile_n: int, stages: int, tile_k: int = 32) -> int:
    """Dynamic shared memory of the fast kernels: stages of padded A (128 x (tile_k + 8)) and
    B (tile_k x (tile_n + 8)) tiles."""
    return stages * (128 * (tile_k + 8) + tile_k * (tile_n + 8)) * 2


# The fast kernels: name -> (tile N, threads, shared bytes, K step); all tiles are 128 rows of M.
FAST = {"gemm_tc_nn": (128, 128, _shared(128, 4), 32), "gemm_tc_nn_k64": (128, 128, _shared(128, 3, 64), 64),
        "gemm_tc_nn_wide": (256, 256, _shared(256, 4), 32), "gemm_tc_nn_wide_k64": (256, 256, _shared(256, 3, 64), 64),
        "gemm_tc_nn_wide_deep": (256, 256, _shared(256, 6), 32)}


class GemmTensorCore(Solver):
    id = 11
    name = "GemmTensorCore"
    primitive = "gemm"
    backends = ("cuda",)

    def builds_for(self, target) -> bool:
        return target.arch_facts.has("mma.sync")  # for fp16/bf16

    def is_applicable(self, problem: GemmProblem, device):
        if device.backend != "cuda":
            return not_applicable(f"tensor cores through mma.sync are CUDA only (this is {device.backend})")
        if not device.target.arch_facts.has("mma.sync"):
            return not_applicable(f"{device.target.arch} has no mma.sync for fp16/bf16 (needs sm_80 or later)")
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return not_applicable(f"{problem.dtype.label} is not fp16 or bf16")
        return fits(problem)

    def programs(self, problem: GemmProblem):
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return []
        return [ProgramRequest("gemm_tc.cu", problem.dtype.options)]

    def solution(self, problem: GemmProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            kernel = prog.function("gemm_tc")
            grid = (-(-problem.n // BLOCK_TILE), -(-problem.m // BLOCK_TILE), problem.batch)
            tail = gemm_arguments(problem)
            general = context.backend.launcher(kernel, grid, (THREADS, 1, 1), [None, None, None, *tail])
            if not _fast_path(problem):
                return lambda a, b, c: general(a, b, c)
            name = fast_kernel(problem, device_units(context.device))
            tile_n, threads, shared, _ = FAST[name]
            fast_grid = (problem.n // tile_n, problem.m // BLOCK_TILE, problem.batch)
            fast = context.backend.launcher(prog.function(name), fast_grid, (threads, 1, 1),
                                            [None, None, None, *tail[:9], *tail[11:]], shared)  # no transpose flags
            return fast_when_aligned(fast, general)

        return Solution(self.programs(problem), invoker_factory)


def device_units(device) -> int:
    """The GPU's multiprocessor count (its target's CU count; 132, an H100's, when unknown)."""
    return device.target.cu or 132


def fast_kernel(problem: GemmProblem, units: int) -> str:
    """The fast kernel for the problem: K steps of 64 where K allows (half the barriers), else 32.
    The 128 x 256 kernels stay for comparison: they measured slower (docs/performance.md, "GEMM")."""
    return "gemm_tc_nn_k64" if problem.k % 64 == 0 else "gemm_tc_nn"


def _fast_path(problem: GemmProblem) -> bool:
    """gemm_tc_nn's conditions that the problem fixes (the pointers' alignment is checked per call)."""
    p = problem
    return (not p.trans_a and not p.trans_b and p.m % BLOCK_TILE == 0 and p.n % BLOCK_TILE == 0 and p.k % 32 == 0
            and p.lda % 8 == 0 and p.ldb % 8 == 0 and p.ldc % 8 == 0 and all(s % 8 == 0 for s in (p.stride_a, p.stride_b, p.stride_c)))
