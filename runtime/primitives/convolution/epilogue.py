"""A convolution's epilogue as a pass of its own: y = act(y scale[c] + shift[c] (+ res)), in
place, for a fused convolution (:mod:`~kdbkit.runtime.primitives.convolution.fused`) or gemm
(:mod:`~kdbkit.runtime.primitives.gemm.fused`: its columns are the channels) whose solver's
kernel does not take the epilogue itself. Its own small problem (config
``convepi,type=fp16,shape=NxCxHxW,ys=...,res=1,act=relu``, ``scale=0`` added where there is no
scale), one solver, ConvEpilogue
(conv_bias.c's conv_epilogue_fwd), any layout through the strides; scale and shift are float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.convolution.problem import layout_strides
from kdbkit.runtime.problem import Problem, require
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.primitives.convolution.solvers.common import INT_MAX, fits_int_arguments
from kdbkit.runtime.solver import REGISTRY, Solution, Solver, launcher_1d
from kdbkit.runtime.tensor import DataType, TensorDesc, format_dims, parse_dims

# An epilogue's activations, by name, and the code its kernels take (conv_bias.c's CONV_ACT_*,
# tma_wgmma.h's TM_ACT_*).
ACTIVATION_CODES = {"none": 0, "relu": 1, "gelu_erf": 2}
ACTIVATIONS = tuple(ACTIVATION_CODES)


@dataclass(frozen=True)
class ConvEpilogueProblem(Problem):
    primitive = "convepi"

    dtype: DataType
    shape: tuple[int, int, int, int]
    strides: tuple[int, ...]
    residual: bool
    activation: str  # one of ACTIVATIONS
    scaled: bool = True  # False: y + shift alone (a gemm's bias), no scale given

    def __post_init__(self) -> None:
        if len(self.shape) != 4:
            raise ProblemError(f"a convolution's epilogue takes N x C x H x W tensors, not {format_dims(self.shape)}",
                               "reshape it to 4-D")
        if self.activation not in ACTIVATIONS:
            raise ProblemError(f"epilogue activation {self.activation!r}", f"use one of {', '.join(ACTIVATIONS)}")
        TensorDesc(self.dtype, self.shape, self.strides)

    def tensors(self) -> dict[str, TensorDesc]:
        y = TensorDesc(self.dtype, self.shape, self.strides)
        per_channel = TensorDesc.packed(DataType.FP32, (self.shape[1],))
        made = {"y": y, "scale": per_channel, "shift": per_channel} if self.scaled else \
            {"y": y, "shift": per_channel}
        if self.residual:
            made["residual"] = y
        return made

    def fields(self) -> list[tuple[str, str]]:
        fields = [("type", self.dtype.label), ("shape", format_dims(self.shape)), ("ys", format_dims(self.strides)),
                  ("res", str(int(self.residual))), ("act", self.activation)]
        return fields if self.scaled else [*fields, ("scale", "0")]  # a scaled one's key as before

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> "ConvEpilogueProblem":
        text = ",".join(f"{k}={v}" for k, v in f.items())
        residual, scaled = require(f, "res", text), f.get("scale", "1")
        for name, flag in (("res", residual), ("scale", scaled)):
            if flag not in ("0", "1"):
                raise ProblemError(f"epilogue key {text!r}: {name}={flag}", f"write {name}=0 or {name}=1")
        return cls(DataType.parse(require(f, "type", text)), parse_dims(require(f, "shape", text), "shape"),
                   parse_dims(require(f, "ys", text), "ys"), residual == "1", require(f, "act", text), scaled == "1")


def catalogue() -> list[ConvEpilogueProblem]:
    return [ConvEpilogueProblem(t, (1, 2, 2, 2), (8, 4, 2, 1), True, "relu") for t in DataType]


class ConvEpilogue(Solver):
    """ConvEpilogue (id 52): conv_bias.c's conv_epilogue_dense on packed NCHW or NHWC tensors,
    else conv_epilogue_fwd through the strides; a thread per element."""

    id = 52
    name = "ConvEpilogue"
    primitive = "convepi"

    def is_applicable(self, problem: ConvEpilogueProblem, device):
        return fits_int_arguments(problem)

    def programs(self, problem: ConvEpilogueProblem):
        return [ProgramRequest("conv_bias.c", problem.dtype.options)]

    def solution(self, problem: ConvEpilogueProblem, device):
        def invoker_factory(programs, context):
            flags = [np.int32(int(problem.scaled)), np.int32(int(problem.residual)),
                     np.int32(ACTIVATION_CODES[problem.activation])]
            total = math.prod(problem.shape)
            inner = dense_inner(problem)
            if inner is not None:
                kernel = programs[0].function("conv_epilogue_dense")
                args = [*flags, *(np.int32(v) for v in (total, problem.shape[1], inner))]
            else:
                kernel = programs[0].function("conv_epilogue_fwd")
                args = [*flags, *(np.int32(v) for v in (*problem.shape, *problem.strides))]
            fast = launcher_1d(context, kernel, total, [None, None, None, None, *args], max_groups=1 << 16)

            def run(y, shift, scale=None, residual=None):
                # shift stands in for a scale not given, y for a residual: the flags say neither is read
                fast(y, shift if scale is None else scale, shift, y if residual is None else residual)

            return run

        return Solution(self.programs(problem), invoker_factory)


def dense_inner(problem: ConvEpilogueProblem) -> int | None:
    """Elements between one channel and the next where y is packed NCHW (H W) or NHWC (1) with
    fewer than 2^31 elements (conv_epilogue_dense's case), else None."""
    if math.prod(problem.shape) > INT_MAX:
        return None
    if problem.strides == layout_strides("NCHW", problem.shape):
        return problem.shape[2] * problem.shape[3]
    return 1 if problem.strides == layout_strides("NHWC", problem.shape) else None


SOLVERS = (ConvEpilogue,)  # the convepi primitive's one solver
REGISTRY.register_all(SOLVERS)
