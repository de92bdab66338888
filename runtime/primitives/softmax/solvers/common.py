"""What the softmax solvers share: the program, and the launch arguments after the tensors."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.softmax.problem import ALGORITHMS, SoftmaxProblem
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, not_applicable

KERNEL_FILE = "softmax.c"
INT_MAX = 2**31 - 1


def program(problem: SoftmaxProblem) -> ProgramRequest:
    return ProgramRequest(KERNEL_FILE, problem.dtype.options)


def fits_int_arguments(problem: SoftmaxProblem):
    n, c, h, w = problem.shape
    if n * c * h * w > INT_MAX or max(problem.x_strides + problem.y_strides) > INT_MAX:
        return not_applicable("sizes or strides exceed the kernel's int arguments")
    return APPLIES


def arguments(problem: SoftmaxProblem) -> list:
    """Geometry, both stride sets, algorithm, alpha and beta, in the kernels' order."""
    n, c, h, w = problem.shape
    return [*(np.int32(v) for v in (n, c, h, w, problem.mode == "channel")),
            *(np.int32(s) for s in problem.x_strides), *(np.int32(s) for s in problem.y_strides),
            np.int32(ALGORITHMS.index(problem.algorithm)), np.float32(problem.alpha), np.float32(problem.beta)]


def kernel_and_buffers(problem: SoftmaxProblem, prog, suffix: str):
    """The kernel for the direction, and the order its tensors come in."""
    if problem.direction == "fwd" or suffix in ("rows", "block_even"):
        return prog.function(f"softmax_fwd_{suffix}"), ("x", "y")
    return prog.function(f"softmax_bwd_{suffix}"), ("y", "dy", "dx")


def evenly_spaced(problem: SoftmaxProblem) -> bool:
    """Each row's elements one stride apart in x and y (the kernels' ``sm_step`` != 0): channel
    mode always, instance mode when C x H x W is packed within each row."""
    if problem.mode == "channel":
        return True
    n, c, h, w = problem.shape
    return all(s[2] == w * s[3] and s[1] == h * s[2] for s in (problem.x_strides, problem.y_strides))
