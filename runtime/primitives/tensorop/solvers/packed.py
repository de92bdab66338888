"""OpTensorPacked (id 5): three packed tensors of one shape, as flat arrays of 16-byte vectors."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.streaming import VECTOR_BYTES, groups_in_flight
from kdbkit.runtime.primitives.tensorop.problem import OPS, TensorOpProblem
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.solver import (
    APPLIES,
    Solution,
    Solver,
    fast_when_aligned,
    launcher_1d,
    not_applicable,
    vector_elements,
)
from kdbkit.runtime.tensor import TensorDesc

INT_MAX = 2**31 - 1


def program(problem: TensorOpProblem) -> ProgramRequest:
    return ProgramRequest("tensorop.c", problem.dtype.options)


def scalars(problem: TensorOpProblem) -> list:
    return [np.int32(OPS.index(problem.op)), np.float32(problem.alpha1), np.float32(problem.alpha2),
            np.float32(problem.beta)]


UNROLL = 1  # tensorop.c's OP_UNROLL: vectors per thread and step
# Groups of 256 per compute unit: just enough to keep the unit's share of the bandwidth in flight
# (kdbkit.runtime.primitives.streaming); a little below full occupancy streams faster where
# that is enough (docs/performance.md, "Memory-bound kernels on every card"). A group reads two
# vectors and writes one per thread; its bytes stay in flight about STEP_NS.
STEP_NS = 2800


def groups_per_unit(device) -> int | None:
    """op_tensor_vec's groups of 256 per compute unit on ``device`` (None: as many as fit)."""
    return groups_in_flight(device, 256 * UNROLL * 3 * VECTOR_BYTES, STEP_NS)


class OpTensorPacked(Solver):
    id = 5
    name = "OpTensorPacked"
    primitive = "tensorop"

    def is_applicable(self, problem: TensorOpProblem, device):
        if problem.b_shape != problem.shape:
            return not_applicable("b broadcasts")
        if not all(TensorDesc(problem.dtype, problem.shape, s).is_packed
                   for s in (problem.a_strides, problem.b_strides, problem.c_strides)):
            return not_applicable("the tensors are not packed")
        if TensorDesc(problem.dtype, problem.shape, problem.a_strides).numel > INT_MAX:
            return not_applicable("more elements than the kernel's int count")
        return APPLIES

    def programs(self, problem: TensorOpProblem):
        return [program(problem)]

    def solution(self, problem: TensorOpProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            scalar, vector = prog.function("op_tensor_packed"), prog.function("op_tensor_vec")
            n = int(np.prod(problem.shape))
            vectors, tail = n // vector_elements(problem.dtype), [np.int32(n), *scalars(problem)]

            # A group per 256 x UNROLL vectors: each thread one step, no tail wave.
            fast = launcher_1d(context, vector, max(-(-vectors // UNROLL), 1), [None, None, None, *tail],
                               max_groups=1 << 20, groups_per_unit=groups_per_unit(context.device))
            slow = launcher_1d(context, scalar, n, [None, None, None, *tail])
            return fast_when_aligned(fast, slow)

        return Solution(self.programs(problem), invoker_factory)
