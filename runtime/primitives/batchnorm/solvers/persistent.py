"""BatchNormPersistent (id 19): spatial training forward on CUDA in one cooperative launch that
reads x from device memory once (batchnorm_persistent.cu): teams of groups take a channel at a
time, each group staging its chunk of the channel in shared memory while summing it; the team
publishes its sums with a tag and, a channel later (its next channel's reads in flight), reads
the team's sums of the channel before and normalises that one from shared memory."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kdbkit.runtime.primitives.batchnorm.problem import BatchNormProblem
from kdbkit.runtime.primitives.streaming import unit_bytes_per_ns
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.tensor import DataType
from kdbkit.runtime.solver import (
    APPLIES,
    Solution,
    Solver,
    aligned16,
    fallback_invoker,
    not_applicable,
    vector_elements,
)

BLOCK = 256  # batchnorm_persistent.cu's BN_BLOCK
MAX_CHUNK = 2048  # 16-byte vectors a group stages: batchnorm_persistent.cu's BN_BLOCK * BN_REGS (32 KiB)
STAGES = 2  # a group holds two chunks in shared memory: one being normalised, the next being summed
# A team's meeting per channel, counted as the vectors a member could have streamed meanwhile:
# ROUND_COST where the bandwidth is unknown; else MEETING_NS at the card's bandwidth per compute
# unit, which gives ROUND_COST on the H100, where it was measured (docs/performance.md,
# "Batch-norm training"): a faster memory makes the same meeting cost more vectors.
ROUND_COST = 4096
MEETING_NS = 2580
INT_MAX = 2**31 - 1
# Per type, (vectors in flight per thread, groups a multiprocessor must hold): the kernel's
# BN_REGS and BN_MIN_GROUPS where not (8, None). Each build was compared on the same buffers:
# bf16 and fp32 ran faster at (4, 6) than at 8 vectors in flight; fp16 did not, so it stays at 8
# (docs/performance.md, "Batch-norm training (BatchNormPersistent, CUDA)", has the figures).
BUILDS = {DataType.BF16: (4, 6), DataType.FP32: (4, 6)}


def build(dtype: DataType) -> tuple[int, int | None]:
    return BUILDS.get(dtype, (8, None))


def max_chunk(dtype: DataType) -> int:
    """The most vectors a group stages: BN_BLOCK * BN_REGS."""
    return BLOCK * build(dtype)[0]


def program(problem: BatchNormProblem) -> ProgramRequest:
    regs, groups = build(problem.dtype)
    extra = () if (regs, groups) == (8, None) else (f"-DBN_REGS={regs}",) + (
        () if groups is None else (f"-DBN_MIN_GROUPS={groups}",))
    return ProgramRequest("batchnorm_persistent.cu", (*problem.dtype.options, *extra))


def shared_bytes(chunk: int, members: int) -> int:
    """A group's dynamic shared memory: STAGES chunks of 16-byte vectors, then a 16-byte copy
    of each member's pair of sums."""
    return (STAGES * chunk + members) * 16


def round_cost(device) -> int:
    """A team's meeting on ``device``, in vectors (see MEETING_NS)."""
    rate = unit_bytes_per_ns(device)
    return ROUND_COST if rate <= 0 else max(1, round(MEETING_NS * rate / 16))


def team_plan(vectors: int, channels: int, resident: Callable[[int, int], int],
              most: int = MAX_CHUNK, meeting: int = ROUND_COST) -> tuple[int, int, int] | None:
    """(members per team, vectors per member, teams) that finish soonest, where
    ``resident(chunk, members)`` groups of teams of ``members`` staging ``chunk`` vectors each
    fit the GPU at once and a chunk holds at most ``most`` vectors: every round of channels
    costs its chunk plus one meeting (``meeting`` vectors, :func:`round_cost`), and the
    pipeline one chunk more (the first reads, the last writes)."""
    best, members = None, -(-vectors // most)
    while members <= resident(1, members):
        chunk = -(-vectors // members)
        fit = resident(chunk, members)
        if members <= fit:
            teams = min(channels, fit // members)
            rounds = -(-channels // teams)
            cost = (rounds + 1) * chunk + rounds * meeting
            if best is None or cost < best[0]:
                best = (cost, members, chunk, -(-channels // rounds))
        members += 1
    return None if best is None else best[1:]


def resident_for(backend, kernel, multiprocessors: int) -> Callable[[int, int], int]:
    """``resident(chunk, members)`` for :func:`team_plan`: groups of the kernel the GPU holds at
    once with :func:`shared_bytes` each (asked per KiB, rounding up)."""
    asked: dict[int, int] = {}

    def resident(chunk: int, members: int) -> int:
        kib = -(-shared_bytes(chunk, members) // 1024)
        if kib not in asked:
            asked[kib] = backend.resident_groups(kernel, BLOCK, kib * 1024) * multiprocessors
        return asked[kib]

    return resident


def kernel_args(n: int, c: int, plane: int, strides: tuple[int, ...], members: int, chunk: int, count: int,
                eps: float, factor: float, running: bool) -> list:
    """bn_train_persistent's arguments after its buffers (the eight tensors, pairs and gen):
    ``plane`` vectors per H x W plane, x's and y's strides of n and c in vectors, the team
    plan, ``count`` elements per channel, and the scalars."""
    i32 = np.int32
    return [i32(n), i32(c), i32(plane), *(i32(s) for s in strides), i32(members), i32(chunk), i32(count),
            np.float32(eps), np.float32(factor), i32(running)]


def _whole_vector_planes(problem: BatchNormProblem) -> bool:
    per, (h, w) = vector_elements(problem.dtype), problem.shape[2:]
    return all(v % per == 0 for v in (h * w, *problem.x_strides[:2], *problem.y_strides[:2]))


class BatchNormPersistent(Solver):
    id = 19
    name = "BatchNormPersistent"
    primitive = "bnorm"
    backends = ("cuda",)

    def is_applicable(self, problem: BatchNormProblem, device):
        target = device.target
        if not target.arch_facts.at_least("sm_70"):
            return not_applicable(f"it needs CUDA sm_70 or later (this is {target.arch})")
        if problem.direction != "train" or problem.mode != "spatial":
            return not_applicable("it computes spatial training only")
        n, c, h, w = problem.shape
        if not all(s[2:] == (w, 1) or h * w == 1 for s in (problem.x_strides, problem.y_strides)):
            return not_applicable("its H x W planes are not contiguous")
        if not _whole_vector_planes(problem):
            return not_applicable("its planes are not whole 16-byte vectors each starting on one")
        if n * c * h * w > INT_MAX or max(problem.x_strides + problem.y_strides) > INT_MAX:
            return not_applicable("sizes or strides exceed the kernel's int arguments")
        vectors = n * h * w // vector_elements(problem.dtype)
        most = max_chunk(problem.dtype)
        if -(-vectors // most) > (target.cu or 1):
            return not_applicable(f"a channel of {vectors} vectors needs more groups than the GPU has "
                                  f"multiprocessors at {most} vectors each")
        return APPLIES

    def workspace(self, problem: BatchNormProblem) -> int:
        return 0  # the invoker's own, sized once the grid is known

    def programs(self, problem: BatchNormProblem):
        return [program(problem)] if problem.direction == "train" else []

    def solution(self, problem: BatchNormProblem, device):
        def invoker_factory(programs, context):
            kernel = programs[0].function("bn_train_persistent")
            backend = context.backend
            n, c, h, w = problem.shape
            per = vector_elements(problem.dtype)
            vectors = n * h * w // per
            resident = resident_for(backend, kernel, context.device.target.cu or 1)
            members, chunk, teams = team_plan(vectors, c, resident, max_chunk(problem.dtype),
                                              round_cost(context.device))
            groups = members * teams
            # The invoker's own workspace, zero before the first launch: each member's tagged pair of
            # sums per channel, and each channel's generation.
            pairs = context.to_device(np.zeros(2 * c * members, np.uint64))
            gen = context.to_device(np.zeros(c, np.uint32))
            strides = tuple(s // per for s in (*problem.x_strides[:2], *problem.y_strides[:2]))
            fast = backend.launcher(kernel, (groups, 1, 1), (BLOCK, 1, 1), [
                *(None,) * 8, pairs, gen, *kernel_args(n, c, h * w // per, strides, members, chunk, n * h * w,
                                                       problem.eps, problem.factor, problem.running)],
                shared_bytes=shared_bytes(chunk, members), cooperative=True)
            unaligned = fallback_invoker(context, problem, "BatchNormSplit")

            def train(x, y, scale, bias, running_mean, running_var, saved_mean, saved_invstd):
                if aligned16(x, y):
                    fast(x, y, scale, bias, running_mean, running_var, saved_mean, saved_invstd)
                else:
                    unaligned(x, y, scale, bias, running_mean, running_var, saved_mean, saved_invstd)

            train.grid = (members, chunk, teams)
            return train

        return Solution(self.programs(problem), invoker_factory)
