"""OpTensorStrided (id 6): any strides and broadcasting, up to 5-D.

Where the last dimension allows it (contiguous in a, b and c, a whole number of 16-byte
vectors, every other stride a multiple of a vector), the invoker launches ``op_tensor_rows``,
16 bytes per thread, when the buffers are 16-byte aligned: a linear layer's bias and a split
or merge of attention heads run at memory speed instead of being bound by the element-wise
kernel's index arithmetic, as a BERT layer's large bias additions were element by element.
"""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.tensorop.problem import TensorOpProblem
from kdbkit.runtime.primitives.tensorop.solvers.packed import INT_MAX, groups_per_unit, program, scalars
from kdbkit.runtime.solver import (
    APPLIES,
    Solution,
    Solver,
    fast_when_aligned,
    launcher_1d,
    not_applicable,
    padded_ints,
    vector_elements,
)

MAX_DIMS = 5


def rows_geometry(problem: TensorOpProblem) -> list | None:
    """``op_tensor_rows``'s arguments after the buffers and before the scalars, or None where
    the layout does not allow 16-byte access (the element-wise kernel then runs)."""
    vec = vector_elements(problem.dtype)
    shape = problem.shape
    # a dimension of size 1 is never stepped along: its stride is whatever the caller wrote
    strides = [tuple(0 if size == 1 else s for size, s in zip(shape, t))
               for t in (problem.a_strides, problem.b_over_a, problem.c_strides)]
    if shape[-1] % vec or any(t[-1] != 1 for t in strides) or any(s % vec for t in strides for s in t[:-1]):
        return None
    vectors = int(np.prod(shape)) // vec
    if vectors > INT_MAX:
        return None
    outer = MAX_DIMS - 1
    sizes = padded_ints(shape[:-1], 1, outer)
    return [np.int32(vectors), np.int32(shape[-1] // vec), *sizes[1:],
            *(v for t in strides for v in padded_ints(tuple(s // vec for s in t[:-1]), 0, outer))]


class OpTensorStrided(Solver):
    id = 6
    name = "OpTensorStrided"
    primitive = "tensorop"

    def is_applicable(self, problem: TensorOpProblem, device):
        if len(problem.shape) > MAX_DIMS:
            return not_applicable(f"{len(problem.shape)} dimensions; it handles up to {MAX_DIMS}")
        if int(np.prod(problem.shape)) > INT_MAX or max(problem.a_strides + problem.b_strides + problem.c_strides) > INT_MAX:
            return not_applicable("sizes or strides exceed the kernel's int arguments")
        return APPLIES

    def programs(self, problem: TensorOpProblem):
        return [program(problem)]

    def solution(self, problem: TensorOpProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            n = int(np.prod(problem.shape))
            geometry = [np.int32(n), *padded_ints(problem.shape, 1, MAX_DIMS)[1:],
                        *padded_ints(problem.a_strides, 0, MAX_DIMS), *padded_ints(problem.b_over_a, 0, MAX_DIMS),
                        *padded_ints(problem.c_strides, 0, MAX_DIMS)]
            tail = scalars(problem)
            slow = launcher_1d(context, prog.function("op_tensor_strided"), n, [None, None, None, *geometry, *tail])
            rows = rows_geometry(problem)
            if rows is None:
                return lambda a, b, c: slow(a, b, c)
            # one vector a thread, no tail wave (as OpTensorPacked's vector kernel)
            fast = launcher_1d(context, prog.function("op_tensor_rows"), int(rows[0]), [None, None, None, *rows, *tail],
                               max_groups=1 << 20, groups_per_unit=groups_per_unit(context.device))
            return fast_when_aligned(fast, slow)

        return Solution(self.programs(problem), invoker_factory)
