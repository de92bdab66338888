"""A convolution's bias (MIOpen's ConvolutionForwardBias and ConvolutionBackwardBias): forward
adds bias[c] to every element of y's channel c in place, backward sums dy over N, H and W
into db. Its own small problem (config ``convbias,dir=fwd,type=fp16,shape=NxCxHxW,ys=...``),
one solver, ConvBias (conv_bias.c), any layout through the strides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.invoke import invoke
from kdbkit.runtime.primitives.operands import Operands, device_default
from kdbkit.runtime.problem import Problem, require
from kdbkit.runtime.program_key import ProgramRequest
from kdbkit.runtime.primitives.convolution.solvers.common import fits_int_arguments
from kdbkit.runtime.solver import REGISTRY, Solution, Solver, launcher_1d
from kdbkit.runtime.tensor import DataType, TensorDesc, format_dims, parse_dims

BLOCK = 256  # conv_bias.c's CONV_BIAS_BLOCK


@dataclass(frozen=True)
class ConvBiasProblem(Problem):
    primitive = "convbias"

    direction: str  # fwd: y += bias; bwd: db = sum of dy
    dtype: DataType
    shape: tuple[int, int, int, int]
    strides: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.direction not in ("fwd", "bwd"):
            raise ProblemError(f"convolution bias direction {self.direction!r}", "use fwd or bwd")
        if len(self.shape) != 4:
            raise ProblemError(f"a convolution bias takes N x C x H x W tensors, not {format_dims(self.shape)}",
                               "reshape it to 4-D")
        TensorDesc(self.dtype, self.shape, self.strides)

    def tensors(self) -> dict[str, TensorDesc]:
        y = TensorDesc(self.dtype, self.shape, self.strides)
        bias = TensorDesc.packed(self.dtype, (self.shape[1],))
        return {"y": y, "bias": bias} if self.direction == "fwd" else {"dy": y, "db": bias}

    def fields(self) -> list[tuple[str, str]]:
        return [("dir", self.direction), ("type", self.dtype.label), ("shape", format_dims(self.shape)),
                ("ys", format_dims(self.strides))]

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> "ConvBiasProblem":
        text = ",".join(f"{k}={v}" for k, v in f.items())
        return cls(require(f, "dir", text), DataType.parse(require(f, "type", text)),
                   parse_dims(require(f, "shape", text), "shape"), parse_dims(require(f, "ys", text), "ys"))


def catalogue() -> list[ConvBiasProblem]:
    return [ConvBiasProblem(d, t, (1, 2, 2, 2), (8, 4, 2, 1)) for t in DataType for d in ("fwd", "bwd")]


def program(problem: ConvBiasProblem) -> ProgramRequest:
    return ProgramRequest("conv_bias.c", problem.dtype.options)


class ConvBias(Solver):
    """ConvBias (id 26): conv_bias.c, forward a thread per element, backward a group per channel."""

    id = 26
    name = "ConvBias"
    primitive = "convbias"

    def is_applicable(self, problem: ConvBiasProblem, device):
        return fits_int_arguments(problem)

    def programs(self, problem: ConvBiasProblem):
        return [program(problem)]

    def solution(self, problem: ConvBiasProblem, device):
        def invoker_factory(programs, context):
            prog = programs[0]
            args = [np.int32(v) for v in (*problem.shape, *problem.strides)]
            if problem.direction == "fwd":
                fast = launcher_1d(context, prog.function("conv_bias_fwd"), int(np.prod(problem.shape)),
                                   [None, None, *args], max_groups=1 << 16)
                return lambda y, bias: fast(y, bias)
            groups = min(problem.shape[1], 65535)
            fast = context.backend.launcher(prog.function("conv_bias_bwd"), (groups, 1, 1), (BLOCK, 1, 1),
                                            [None, None, *args])
            return lambda dy, db: fast(dy, db)

        return Solution(self.programs(problem), invoker_factory)


SOLVERS = (ConvBias,)  # the convbias primitive's one solver
REGISTRY.register_all(SOLVERS)


def _four_d(desc: TensorDesc, what: str) -> None:
    if len(desc.shape) != 4:
        raise ProblemError(f"{what} is {len(desc.shape)}-D; a convolution's bias takes N x C x H x W",
                           "reshape it to 4-D")


def convolution_bias_forward(handle, y: Any, bias: Any, *, dtype: str | None = None,
                             solver: int | str | None = None) -> Any:
    """y[n, c, h, w] += bias[c], in place (NumPy arrays are updated in place too); returns y.

    Raises:
        ProblemError: bad arguments (named), before any launch.
    """
    with Operands(handle.backend) as ops:
        bb, bd = ops.input(bias, dtype, "bias")
        # y's type and shape: a device tensor's own descriptor, a NumPy array's packed one
        like = ops.input(y, dtype, "y")[1] if not isinstance(y, np.ndarray) else \
            TensorDesc.packed(bd.dtype, y.shape)
        _four_d(like, "y")
        if bd.shape != (like.shape[1],):
            raise ProblemError(f"bias has shape {bd.shape} for {like.shape[1]} channels", "give one bias per channel")
        yb, yd, result = ops.output(y, like, "y", read=True)
        problem = ConvBiasProblem("fwd", yd.dtype, yd.shape, yd.strides)
        invoke(handle, problem, solver, {"bias": (bb, bd)}, {"y": (yb, yd)})
    return result


def convolution_bias_backward(handle, dy: Any, *, db: Any = None, dtype: str | None = None,
                              solver: int | str | None = None) -> Any:
    """db[c] = the sum of dy[:, c, :, :]; returns db (of C elements).

    Raises:
        ProblemError: bad arguments (named), before any launch.
    """
    with Operands(handle.backend) as ops:
        dyb, dyd = ops.input(dy, dtype, "dy")
        _four_d(dyd, "dy")
        out = TensorDesc.packed(dyd.dtype, (dyd.shape[1],))
        dbb, dbd, result = ops.output(device_default(handle, db, dy, out), out, "db")
        problem = ConvBiasProblem("bwd", dyd.dtype, dyd.shape, dyd.strides)
        invoke(handle, problem, solver, {"dy": (dyb, dyd)}, {"db": (dbb, dbd)})
    return result


