"""GemmTma (ids 30-32): Hopper's GEMM as the vendor libraries build it (kernels/gemm_tma.cu):
tensor copies (TMA) into a ring of shared-memory stages, wgmma reading both operands from there,
one producer warpgroup and two consumers, one persistent block per multiprocessor, whole tiles
written through shared memory as 16-byte stores. fp16/bf16 with fp32 accumulation, every
transposition (wgmma reads M- or N-major tiles transposed), any M, N, K (the copies zero-fill
past the edges), batched and strided, alpha and beta (docs/bench_gemm.md has its speed beside
cuBLAS's).

Three tile shapes, one solver each so that find times them all: 128 x 256, 128 x 192 and
128 x 128. Immediate mode takes the one :func:`tile_n_for` picks from the problem's shape and
the multiprocessor count (each of the others says why it is passed over). Shapes are launch
arguments; the programs differ only by type, tile shape and the two transpositions.

The tensor maps hold the operands' addresses, so they are encoded on the host for each pair of
A and B buffers an invoker meets (``cuTensorMapEncodeTiled``, through the backend's
``tensor_map``) and the launch made with them is kept, the most recent 32 pairs.
"""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.primitives.gemm.solvers.common import fits
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, Solution, Solver, aligned16, fallback_invoker, not_applicable
from kdbkit.runtime.tensor import DataType

TILE_M, STEP, THREADS = 128, 64, 384
# tile N -> shared-memory stages: as many as fit 227 KiB with the epilogue's staging (stages of
# (128 + N) x 64 16-bit values)
STAGES = {256: 4, 192: 5, 128: 6}
STAGING = 8 * 2048  # the consumer warps' epilogue staging: 16 rows x 64 values each
# Throughput of a multiprocessor working on a tile of each shape, relative to 128 x 256, when
# every multiprocessor has work (smaller tiles read more bytes per multiply-add).
TILE_SPEED = {256: 1.0, 192: 0.97, 128: 0.9}
ARCH_OPTION = "--gpu-architecture=sm_90a"  # wgmma and setmaxnreg exist only in the arch-specific code
# (A, B) buffer pairs whose tensor maps and launch an invoker keeps (two 128-byte maps and the
# launch's slots each). A network calls one shape with every layer's weights in turn, each
# forward: BERT-base runs its 768 x 768 projections with 48 weight matrices. An invoker keeping
# fewer pairs than that cycle drops each pair just before it is met again and encodes every launch
# anew, every forward.
CACHED_PAIRS = 512


def shared_bytes(tile_n: int, stages: dict[int, int] = STAGES) -> int:
    """Dynamic shared memory of a launch of a kernel on tma_wgmma.h's pipeline (``stages``: its
    stages per tile width): the stages, the epilogue's staging, then 2 KiB to align them to
    1024 bytes and hold the barriers."""
    return stages[tile_n] * (TILE_M + tile_n) * STEP * 2 + STAGING + 2048


class OperandLaunches:
    """An invoker's launches by the addresses of its two TMA operands (a tensor map holds its
    tensor's address): ``maps(a, b)`` encodes the pair's tensor maps, ``make(maps)`` the launch
    taking them, for the first pair; a later pair's launch is the first one rebound to its maps
    (its other arguments copied, not packed again: a network's first forward meets each layer's
    pair once). The :data:`CACHED_PAIRS` pairs met most recently are kept, the least recently
    met dropped first."""

    def __init__(self, maps, make):
        self._maps, self._make = maps, make
        self._first = None
        self._launches: dict = {}

    def get(self, a, b):
        """The launch for the buffers ``a`` and ``b``, made the first time their pair is met."""
        key = (int(a.ptr), int(b.ptr))
        launch = self._launches.pop(key, None)  # popped and put back: the dict's order is the pairs' last use
        if launch is None:
            if len(self._launches) >= CACHED_PAIRS:
                del self._launches[next(iter(self._launches))]  # the pair met least recently
            maps = self._maps(*key)
            if self._first is None:
                launch = self._first = self._make(maps)
            else:
                launch = self._first.rebound(*maps)
        self._launches[key] = launch
        return launch


def tiles(problem: GemmProblem, tile_n: int) -> int:
    return -(-problem.m // TILE_M) * -(-problem.n // tile_n) * problem.batch


def tile_efficiency(problem: GemmProblem, tile_n: int, units: int) -> float:
    """The share of the multiprocessors' tile slots, over the waves the tiles take, that hold
    C's own elements (edges and a last partial wave waste the rest), times the tile shape's
    relative speed."""
    slots = -(-tiles(problem, tile_n) // units) * units
    return problem.m * problem.n * problem.batch / (slots * TILE_M * tile_n) * TILE_SPEED[tile_n]


def tile_n_for(problem: GemmProblem, units: int) -> int:
    """The tile width immediate mode takes: the best :func:`tile_efficiency`, wider on a tie."""
    return max(STAGES, key=lambda n: (round(tile_efficiency(problem, n, units), 3), n))


def device_units(device) -> int:
    """The GPU's multiprocessor count (its target's CU count; 132, an H100's, when unknown)."""
    return device.target.cu or 132


class GemmTma(Solver):
    """The 128 x 256 tile; subclasses set ``tile_n``."""

    id = 30
    name = "GemmTma128x256"
    primitive = "gemm"
    backends = ("cuda",)
    tile_n = 256

    def builds_for(self, target) -> bool:
        return target.arch_facts.has("wgmma")  # Hopper's alone (sm_90, built as sm_90a)

    def is_applicable(self, problem: GemmProblem, device):
        if not device.target.arch_facts.has("wgmma"):
            return not_applicable(f"wgmma and TMA need an sm_90 GPU (this is {device.target.arch})")
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return not_applicable(f"{problem.dtype.label} is not fp16 or bf16")
        p = problem
        if any(v % 8 for v in (p.lda, p.ldb, p.stride_a, p.stride_b)):
            return not_applicable("a leading dimension or batch stride of A or B is not a multiple of 8 elements "
                                  "(tensor copies step in 16 bytes)")
        if p.ldc % 2 or p.stride_c % 2:
            return not_applicable("ldc or C's batch stride is odd (C is written two elements at a time)")
        if p.batch > 1 and ((p.stride_a and p.stride_a < p.a_rows * p.lda)
                            or (p.stride_b and p.stride_b < p.b_rows * p.ldb)):
            return not_applicable("the batches of A or B overlap")
        if tiles(problem, min(STAGES)) >= 2**31:
            return not_applicable("more tiles than the kernel's int counts")
        return fits(problem)

    def suits(self, problem: GemmProblem, device):
        units = device_units(device)
        best = tile_n_for(problem, units)
        if best == self.tile_n:
            return APPLIES
        return not_applicable(f"128 x {best} tiles fit this shape better on {units} multiprocessors "
                              f"({tile_efficiency(problem, best, units):.0%} against "
                              f"{tile_efficiency(problem, self.tile_n, units):.0%})")

    def programs(self, problem: GemmProblem):
        if problem.dtype not in (DataType.FP16, DataType.BF16):
            return []
        return [ProgramRequest("gemm_tma.cu", (*problem.dtype.options, f"-DGEMM_BN={self.tile_n}",
                                               f"-DGEMM_STAGES={STAGES[self.tile_n]}",
                                               f"-DGEMM_TA={int(problem.trans_a)}", f"-DGEMM_TB={int(problem.trans_b)}",
                                               ARCH_OPTION))]

    def solution(self, problem: GemmProblem, device):
        tile_n = self.tile_n

        def invoker_factory(programs, context):
            p, backend = problem, context.backend
            kernel = programs[0].function("gemm_tma")
            grid = (min(tiles(p, tile_n), device_units(context.device)), 1, 1)
            c_vec = p.ldc % 8 == 0 and p.stride_c % 8 == 0  # C's rows in 16-byte stores
            scalars = [*(np.int32(v) for v in (p.m, p.n, p.k, p.ldc)), np.int64(p.stride_c),
                       *(np.int32(v) for v in (c_vec, p.batch, p.stride_a != 0, p.stride_b != 0)),
                       np.float32(p.alpha), np.float32(p.beta)]
            map_a, map_b = operand_maps(p, tile_n)
            launches = OperandLaunches(
                lambda a, b: (backend.tensor_map(a, 2, *map_a), backend.tensor_map(b, 2, *map_b)),
                lambda maps: backend.launcher(kernel, grid, (THREADS, 1, 1), [*maps, None, *scalars],
                                              shared_bytes(tile_n)))
            fallback = fallback_invoker(context, problem, "GemmTensorCore")  # the mma.sync kernels

            def run(a, b, c):
                if not aligned16(a, b, c):  # tensor maps need 16-byte aligned operands
                    fallback(a, b, c)
                    return
                launches.get(a, b)(c)

            return run

        return Solution(self.programs(problem), invoker_factory)


def operand_maps(p: GemmProblem, tile_n: int) -> tuple[tuple, tuple]:
    """(dims, byte strides, box) of A's and B's tensor maps: 3-D, (contiguous dimension, rows,
    batch), as gemm_tma.cu's header says. An operand that serves every batch (batch stride 0)
    has one matrix, with a nominal batch stride past its end (never stepped over)."""

    def one(cols: int, rows: int, ld: int, stride: int, box: tuple[int, int]):
        batches = p.batch if stride else 1
        step = stride if stride else -(-rows * ld // 8) * 8
        return (cols, rows, batches), (2 * ld, 2 * step), (*box, 1)

    a = one(p.m, p.k, p.lda, p.stride_a, (64, 64)) if p.trans_a else one(p.k, p.m, p.lda, p.stride_a, (64, TILE_M))
    b = one(p.k, p.n, p.ldb, p.stride_b, (64, tile_n)) if p.trans_b else one(p.n, p.k, p.ldb, p.stride_b, (64, 64))
    return a, b


class GemmTma128x192(GemmTma):
    id = 31
    name = "GemmTma128x192"
    tile_n = 192


class GemmTma128x128(GemmTma):
    id = 32
    name = "GemmTma128x128"
    tile_n = 128
