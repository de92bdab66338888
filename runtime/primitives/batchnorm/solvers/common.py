"""What the batch-norm solvers share: the program and the launch limits."""

from __future__ import annotations

from kdbkit.runtime.primitives.batchnorm.problem import BatchNormProblem
from kdbkit.runtime.program_key import ProgramRequest

BLOCK, MAX_GROUPS, INT_MAX = 256, 65535, 2**31 - 1


def program(problem: BatchNormProblem) -> ProgramRequest:
    return ProgramRequest("batchnorm.c", problem.dtype.options)
