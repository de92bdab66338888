"""What the GEMM solvers share: the launch arguments after the matrices, and the int limits."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.gemm.problem import GemmProblem
from kdbkit.runtime.solver import APPLIES, not_applicable

INT_MAX, MAX_GRID_Z = 2**31 - 1, 65535


def gemm_arguments(problem: GemmProblem) -> list:
    return [*(np.int32(v) for v in (problem.m, problem.n, problem.k, problem.lda, problem.ldb, problem.ldc)),
            *(np.int64(v) for v in (problem.stride_a, problem.stride_b, problem.stride_c)),
            np.int32(problem.trans_a), np.int32(problem.trans_b), np.float32(problem.alpha), np.float32(problem.beta)]


def fits(problem: GemmProblem):
    if max(problem.m, problem.n, problem.k, problem.lda, problem.ldb, problem.ldc) > INT_MAX:
        return not_applicable("a size or leading dimension exceeds the kernel's int arguments")
    if problem.batch > MAX_GRID_Z:
        return not_applicable(f"batch {problem.batch} exceeds the grid's {MAX_GRID_Z}")
    return APPLIES
