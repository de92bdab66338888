"""What the activation solvers share: the kernel program and the limits of its int arguments."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.activation.problem import ActivationProblem
from kdbkit.runtime.program_key import ProgramRequest

KERNEL_FILE = "activ.c"
INT_MAX = 2**31 - 1  # element counts and strides travel as int


def program(problem: ActivationProblem) -> ProgramRequest:
    """One program per element type holds every activation kernel (mode and shape are arguments)."""
    return ProgramRequest(KERNEL_FILE, problem.dtype.options)


def mode_args(problem: ActivationProblem) -> list:
    return [np.int32(int(problem.mode)), np.float32(problem.alpha), np.float32(problem.beta),
            np.float32(problem.gamma)]
