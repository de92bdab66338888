"""BatchNormPersistent (id 19): spatial training forward on CUDA in one cooperative launch that
reads x from device memory once (batchnorm_persistent.cu): teams of groups take a channel at a
time, each group staging its chunk of the channel in shared memory while summing it; the team
meets once per channel for the statistics, then normalises from shared memory."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.batchnorm.problem import BatchNormProblem
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import (
    APPLIES,
    Solver,
    aligned16,
    fallback_invoker,
    not_applicable,
    register,
    vector_elements,
)

BLOCK = 256  # batchnorm_persistent.cu's BN_BLOCK
MAX_CHUNK = 2048  # 16-byte vectors a group stages: batchnorm_persistent.cu's BN_BLOCK * BN_REGS (32 KiB)
ROUND_COST = 4096  # a team's meeting per channel, counted as this many vectors (scripts/compare_bn_teams.py)
INT_MAX = 2**31 - 1


def program(problem: BatchNormProblem) -> ProgramRequest:
    return ProgramRequest("batchnorm_persistent.cu", problem.dtype.options)


def team_plan(vectors: int, channels: int, resident: int) -> tuple[int, int, int] | None:
    """(members per team, vectors per member, teams) that finish soonest with at most
    ``resident`` groups: every round of channels costs its chunk plus one meeting."""
    fewest = -(-vectors // MAX_CHUNK)
    best = None
    for members in range(fewest, resident + 1):
        teams = min(channels, resident // members)
        rounds = -(-channels // teams)
        chunk = -(-vectors // members)
        cost = rounds * (chunk + ROUND_COST)
        if best is None or cost < best[0]:
            best = (cost, members, chunk, -(-channels // rounds))
    return None if best is None else best[1:]


def _whole_vector_planes(problem: BatchNormProblem) -> bool:
    per, (h, w) = vector_elements(problem.dtype), problem.shape[2:]
    return all(v % per == 0 for v in (h * w, *problem.x_strides[:2], *problem.y_strides[:2]))


@register
class BatchNormPersistent(Solver):
    id = 19
    name = "BatchNormPersistent"
    primitive = "bnorm"
    backends = ("cuda",)

    def is_applicable(self, problem: BatchNormProblem, device):
        target = device.target
        if device.backend != "cuda" or int(target.arch[3:]) < 70:
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
        if -(-vectors // MAX_CHUNK) > (target.cu or 1):
            return not_applicable(f"a channel of {vectors} vectors needs more groups than the GPU has "
                                  f"multiprocessors at {MAX_CHUNK} vectors each")
        return APPLIES

    def workspace(self, problem: BatchNormProblem) -> int:
        return 0  # the invoker's own, sized once the grid is known

    def programs(self, problem: BatchNormProblem):
        return [program(problem)] if problem.direction == "train" else []

    def invoker(self, handle, problem: BatchNormProblem):
        request = program(problem)
        kernel = handle.program(request.kernel_file, request.options).function("bn_train_persistent")
        backend, i32 = handle.backend, np.int32
        n, c, h, w = problem.shape
        per = vector_elements(problem.dtype)
        vectors = n * h * w // per
        resident = backend.resident_groups(kernel, BLOCK, MAX_CHUNK * 16) * (handle.device.target.cu or 1)
        members, chunk, teams = team_plan(vectors, c, resident)
        groups = members * teams
        # The invoker's own workspace: each group's two sums, the per-channel counters (zero
        # between launches) and the per-channel affine pair.
        partial = backend.alloc(4 * 2 * groups)
        sync = backend.to_device(np.zeros(2 * c, np.uint32))
        stats = backend.alloc(4 * 2 * c)
        strides = (*problem.x_strides[:2], *problem.y_strides[:2])
        fast = backend.launcher(kernel, (groups, 1, 1), (BLOCK, 1, 1), [
            *(None,) * 8, partial, sync, stats, i32(n), i32(c), i32(h * w // per), *(i32(s // per) for s in strides),
            i32(members), i32(chunk), i32(n * h * w), np.float32(problem.eps), np.float32(problem.factor),
            i32(problem.running)], shared_bytes=chunk * 16, cooperative=True)
        unaligned = fallback_invoker(handle, problem, "BatchNormSplit")

        def train(x, y, scale, bias, running_mean, running_var, saved_mean, saved_invstd):
            if aligned16(x, y):
                fast(x, y, scale, bias, running_mean, running_var, saved_mean, saved_invstd)
            else:
                unaligned(x, y, scale, bias, running_mean, running_var, saved_mean, saved_invstd)

        train.workspace = (partial, sync, stats)  # kept alive with the invoker
        train.grid = (members, chunk, teams)
        return train
