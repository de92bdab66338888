"""What the pooling solvers share: the program, the int-argument check, the geometry arguments,
the choice between a forward kernel's vector and element reads."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.pooling.problem import PoolProblem
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import APPLIES, aligned16, not_applicable

INT_MAX = 2**31 - 1


def program(problem: PoolProblem) -> ProgramRequest:
    return ProgramRequest("pooling.c", problem.dtype.options)


def fits_int_arguments(problem: PoolProblem):
    if int(np.prod(problem.shape)) > INT_MAX or max(problem.x_strides + problem.y_strides) > INT_MAX:
        return not_applicable("sizes or strides exceed the kernel's int arguments")
    return APPLIES


def geometry(problem: PoolProblem) -> list:
    """POOL_GEOMETRY and both stride sets, in the kernels' order."""
    return [np.int32(v) for v in (*problem.shape, *problem.out_hw, *problem.window, *problem.stride, *problem.pad,
                                  *problem.x_strides, *problem.y_strides)]


def vector_or_element(make_launcher, rows_whole: bool):
    """A forward invoker over two launches made once by ``make_launcher(vec)`` (vec the kernel's
    last argument): 16-byte reads where x's rows start on whole vectors (``rows_whole``) and x
    starts aligned, element reads otherwise."""
    element, vector = make_launcher(np.int32(0)), make_launcher(np.int32(1))

    def forward(x, y, indices):
        (vector if rows_whole and aligned16(x) else element)(x, y, indices)

    return forward
