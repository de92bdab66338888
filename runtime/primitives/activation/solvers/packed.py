"""ActivPacked (id 1): packed tensors as one flat array, a grid-stride loop over 16-byte vectors."""

from __future__ import annotations

import numpy as np

from kdbkit.runtime.primitives.activation.problem import ActivationMode, ActivationProblem
from kdbkit.runtime.primitives.activation.solvers.common import INT_MAX, mode_args, program
from kdbkit.runtime.primitives.streaming import VECTOR_BYTES, groups_in_flight
from kdbkit.runtime.solver import (
    APPLIES,
    Solution,
    Solver,
    aligned16,
    launcher_1d,
    not_applicable,
    vector_elements,
)
from kdbkit.runtime.tensor import DataType

# activ.c's activ_fwd_vec and activ_fwd_vec_light: threads per group and vectors per thread and
# step (ACTIV_UNROLL, ACTIV_LIGHT_UNROLL); the grid gives each thread one step.
BLOCK, UNROLL = 256, 4
LIGHT_BLOCK, LIGHT_UNROLL = 128, 1
# activ_fwd_vec_light holds just enough groups per compute unit to keep the unit's share of the
# memory bandwidth in flight (kdbkit.runtime.primitives.streaming): a little below full
# occupancy streams faster where that is enough, much further below it loses (docs/performance.md,
# "Memory-bound kernels on every card"). A group moves LIGHT_BLOCK threads x LIGHT_UNROLL vectors
# read and written; its bytes stay in flight about LIGHT_STEP_NS.
LIGHT_STEP_NS = 2200
# Modes whose function is a few instructions: activ_fwd_vec_light's (docs/performance.md,
# "Element-wise kernels: threads, vectors and grids").
LIGHT_MODES = frozenset({ActivationMode.PASTHRU, ActivationMode.RELU, ActivationMode.ABS, ActivationMode.CLIPPEDRELU,
                         ActivationMode.LEAKYRELU})
# Modes of a log and an exponential, or an erf, per element: the four-vector kernel even in fp32
# (for gelu's erf one vector a thread held only on the card of lower bandwidth, and lost on the
# faster one: docs/performance.md has both cards' figures).
HEAVY_MODES = frozenset({ActivationMode.SOFTRELU, ActivationMode.POWER, ActivationMode.GELU_ERF})


def light_groups_per_unit(device) -> int | None:
    """activ_fwd_vec_light's groups per compute unit on ``device`` (None: as many as fit)."""
    return groups_in_flight(device, LIGHT_BLOCK * LIGHT_UNROLL * 2 * VECTOR_BYTES, LIGHT_STEP_NS)


def light_kernel(problem: ActivationProblem) -> bool:
    """Whether the forward pass takes activ_fwd_vec_light. fp32 vectors hold half the elements
    of 16-bit ones, so there every mode but the heaviest is light enough: in fp32 one vector a
    thread beat four for sigmoid, tanh and elu, while softplus (a log and an exponential), gelu
    (an erf) on the faster memory and 16-bit gelu lost with it (docs/performance.md has the figures)."""
    if problem.direction != "fwd":
        return False
    return problem.mode in LIGHT_MODES or (problem.dtype is DataType.FP32 and problem.mode not in HEAVY_MODES)


class ActivPacked(Solver):
    id = 1
    name = "ActivPacked"
    primitive = "activ"

    def is_applicable(self, problem: ActivationProblem, device):
        if not (problem.x_desc.is_packed and problem.y_desc.is_packed):
            return not_applicable("the tensors are not packed")
        if problem.numel > INT_MAX:
            return not_applicable(f"{problem.numel} elements exceed the kernel's int count")
        return APPLIES

    def programs(self, problem: ActivationProblem):
        return [program(problem)]

    def solution(self, problem: ActivationProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            n, tail = np.int32(problem.numel), mode_args(problem)
            name = "activ_fwd" if problem.direction == "fwd" else "activ_bwd"
            light = light_kernel(problem)
            scalar = prog.function(f"{name}_packed")
            vector = prog.function(f"{name}_vec_light" if light else f"{name}_vec")
            vectors = problem.numel // vector_elements(problem.dtype)

            order = ("x", "y") if problem.direction == "fwd" else ("x", "y", "dy", "dx")

            # A group per block x unroll vectors: each thread one step, no tail wave.
            block, unroll, per_unit = ((LIGHT_BLOCK, LIGHT_UNROLL, light_groups_per_unit(context.device)) if light
                                       else (BLOCK, UNROLL, None))
            fast = launcher_1d(context, vector, max(-(-vectors // unroll), 1), [*(None for _ in order), n, *tail],
                               block=block, max_groups=1 << 20, groups_per_unit=per_unit)
            slow = launcher_1d(context, scalar, problem.numel, [*(None for _ in order), n, *tail])

            def run(**named):
                # 16 bytes per access where every tensor starts 16-byte aligned; the scalar kernel otherwise.
                tensors = [named[name] for name in order]
                if aligned16(*tensors):
                    fast(*tensors)
                else:
                    slow(*tensors)

            return run

        return Solution(self.programs(problem), invoker_factory)
