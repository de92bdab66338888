"""The tensor-operation problem: c = op(alpha1 * a, alpha2 * b) + beta * c, b broadcast to a's shape.

Config string (keys in this order)::

    tensorop,op=add,type=fp32,shape=2x3x4,as=12x4x1,bshape=1x3x1,bs=3x1x1,cs=12x4x1,a1=1.0,a2=1.0,b=0.0

``shape`` is a's and c's; b's shape has the same rank (leading 1s added) and each of its sizes
is 1 (broadcast) or a's. Ops as MIOpen's miopenTensorOp_t: add, mul, min, max.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.problem import Problem, parse_float, require
from kdbkit.runtime.tensor import DataType, TensorDesc, format_dims, parse_dims

OPS = ("add", "mul", "min", "max")


def broadcast_strides(a_shape: tuple[int, ...], b_shape: tuple[int, ...], b_strides: tuple[int, ...]) -> tuple[int, ...]:
    """b's strides over a's shape: 0 where b broadcasts.

    Raises:
        ProblemError: b has more dimensions than a, or a size that is neither 1 nor a's.
    """
    if len(b_shape) > len(a_shape):
        raise ProblemError(f"b ({format_dims(b_shape)}) has more dimensions than a ({format_dims(a_shape)})",
                           "b must broadcast to a's shape")
    pad = len(a_shape) - len(b_shape)
    shape, strides = (1,) * pad + tuple(b_shape), (0,) * pad + tuple(b_strides)
    for i, (sa, sb) in enumerate(zip(a_shape, shape)):
        if sb not in (1, sa):
            raise ProblemError(f"b's size {sb} in dimension {i} neither is 1 nor matches a's {sa} "
                               f"(a {format_dims(a_shape)}, b {format_dims(b_shape)})",
                               "b must broadcast to a's shape: each of its sizes 1 or a's")
    return tuple(0 if sb == 1 and sa != 1 else st for sa, sb, st in zip(a_shape, shape, strides))


@dataclass(frozen=True)
class TensorOpProblem(Problem):
    primitive = "tensorop"

    op: str
    dtype: DataType
    shape: tuple[int, ...]
    a_strides: tuple[int, ...]
    b_shape: tuple[int, ...]
    b_strides: tuple[int, ...]
    c_strides: tuple[int, ...]
    alpha1: float = 1.0
    alpha2: float = 1.0
    beta: float = 0.0

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ProblemError(f"tensor op {self.op!r}", f"use one of {', '.join(OPS)}")
        TensorDesc(self.dtype, self.shape, self.a_strides), TensorDesc(self.dtype, self.shape, self.c_strides)
        TensorDesc(self.dtype, self.b_shape, self.b_strides)
        broadcast_strides(self.shape, self.b_shape, self.b_strides)

    @property
    def b_over_a(self) -> tuple[int, ...]:
        return broadcast_strides(self.shape, self.b_shape, self.b_strides)

    def tensors(self) -> dict[str, TensorDesc]:
        return {"a": TensorDesc(self.dtype, self.shape, self.a_strides),
                "b": TensorDesc(self.dtype, self.b_shape, self.b_strides),
                "c": TensorDesc(self.dtype, self.shape, self.c_strides)}

    def fields(self) -> list[tuple[str, str]]:
        return [("op", self.op), ("type", self.dtype.label), ("shape", format_dims(self.shape)),
                ("as", format_dims(self.a_strides)), ("bshape", format_dims(self.b_shape)),
                ("bs", format_dims(self.b_strides)), ("cs", format_dims(self.c_strides)), ("a1", repr(self.alpha1)),
                ("a2", repr(self.alpha2)), ("b", repr(self.beta))]

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> "TensorOpProblem":
        text = ",".join(f"{k}={v}" for k, v in f.items())
        dims = {k: parse_dims(require(f, k, text), k) for k in ("shape", "as", "bshape", "bs", "cs")}
        return cls(require(f, "op", text), DataType.parse(require(f, "type", text)), dims["shape"], dims["as"],
                   dims["bshape"], dims["bs"], dims["cs"], parse_float(f.get("a1", "1"), "a1"),
                   parse_float(f.get("a2", "1"), "a2"), parse_float(f.get("b", "0"), "b"))


def catalogue() -> list[TensorOpProblem]:
    """One problem per compile-time specialisation (the type)."""
    return [TensorOpProblem("add", t, (4,), (1,), (4,), (1,), (1,)) for t in DataType]
