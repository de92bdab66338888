"""The activation problem: direction, mode with its alpha/beta/gamma, type, shape and strides.

Config string (keys in this order)::

    activ,dir=fwd,mode=relu,type=fp32,shape=2x3x4x5,xs=60x20x5x1,ys=60x20x5x1,a=0,b=0,g=0

``xs`` are the element strides of x (and, backward, of y and dy, which share them); ``ys``
those of the output (y forward, dx backward). Modes keep MIOpen's numbers
(``miopenActivationMode_t``) and add the two gelu forms.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.problem import Problem, parse_float, require
from kdbkit.runtime.tensor import DataType, TensorDesc, format_dims, parse_dims


class ActivationMode(enum.IntEnum):
    """What the activation computes; alpha, beta and gamma as MIOpen's activation descriptor."""

    PASTHRU = 0  # x
    LOGISTIC = 1  # 1 / (1 + e^-x)
    TANH = 2  # beta * tanh(alpha * x)
    RELU = 3  # max(0, x)
    SOFTRELU = 4  # log(1 + e^x)
    ABS = 5  # |x|
    POWER = 6  # (alpha + beta * x)^gamma, 0 where the base is <= 1e-6
    CLIPPEDRELU = 7  # min(alpha, max(0, x))
    LEAKYRELU = 8  # x > 0 ? x : alpha * x
    ELU = 9  # x > 0 ? x : alpha * (e^x - 1)
    GELU_ERF = 10  # x * Phi(x)
    GELU_TANH = 11  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", "-")

    @classmethod
    def parse(cls, value: "int | str | ActivationMode") -> "ActivationMode":
        """A mode from its number, its name (``relu``, ``gelu-tanh``; dashes and underscores
        optional: ``leaky_relu``) or ``sigmoid``/``gelu``.

        Raises:
            ProblemError: no such mode.
        """
        if isinstance(value, ActivationMode):
            return value
        aliases = {"sigmoid": cls.LOGISTIC, "gelu": cls.GELU_ERF, "passthrough": cls.PASTHRU}
        try:
            if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
                return cls(int(value))
            text = value.strip().lower().replace("_", "-")
            # Dashes optional: leaky-relu, leaky_relu (PyTorch's name) and leakyrelu are one mode.
            bare = text.replace("-", "")
            return aliases.get(text) or next(m for m in cls if m.label.replace("-", "") == bare)
        except (ValueError, StopIteration, AttributeError):
            names = ", ".join(m.label for m in cls)
            raise ProblemError(f"unknown activation mode {value!r}", f"use one of {names} (or 0-11)") from None


DIRECTIONS = ("fwd", "bwd")


@dataclass(frozen=True)
class ActivationProblem(Problem):
    primitive = "activ"

    direction: str
    mode: ActivationMode
    dtype: DataType
    shape: tuple[int, ...]
    x_strides: tuple[int, ...]
    y_strides: tuple[int, ...]
    alpha: float = 0.0
    beta: float = 0.0
    gamma: float = 0.0

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ProblemError(f"activation direction {self.direction!r}", "use fwd or bwd")
        self.x_desc, self.y_desc  # validates shape and strides

    @property
    def x_desc(self) -> TensorDesc:
        return TensorDesc(self.dtype, self.shape, self.x_strides)

    @property
    def y_desc(self) -> TensorDesc:
        return TensorDesc(self.dtype, self.shape, self.y_strides)

    @property
    def numel(self) -> int:
        return self.x_desc.numel

    def tensors(self) -> dict[str, TensorDesc]:
        if self.direction == "fwd":
            return {"x": self.x_desc, "y": self.y_desc}
        return {"x": self.x_desc, "y": self.x_desc, "dy": self.x_desc, "dx": self.y_desc}

    def fields(self) -> list[tuple[str, str]]:
        return [("dir", self.direction), ("mode", self.mode.label), ("type", self.dtype.label),
                ("shape", format_dims(self.shape)), ("xs", format_dims(self.x_strides)),
                ("ys", format_dims(self.y_strides)), ("a", repr(self.alpha)), ("b", repr(self.beta)),
                ("g", repr(self.gamma))]  # fmt: skip

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> "ActivationProblem":
        text = ",".join(f"{k}={v}" for k, v in f.items())
        shape = parse_dims(require(f, "shape", text), "shape")
        return cls(
            direction=require(f, "dir", text), mode=ActivationMode.parse(require(f, "mode", text)),
            dtype=DataType.parse(require(f, "type", text)), shape=shape,
            x_strides=parse_dims(require(f, "xs", text), "xs"), y_strides=parse_dims(require(f, "ys", text), "ys"),
            alpha=parse_float(f.get("a", "0"), "a"), beta=parse_float(f.get("b", "0"), "b"),
            gamma=parse_float(f.get("g", "0"), "g"),
        )  # fmt: skip


def catalogue() -> list[ActivationProblem]:
    """One problem per compile-time specialisation (the type: mode, direction and shape are arguments)."""
    return [ActivationProblem(d, ActivationMode.RELU, t, (8,), (1,), (1,)) for t in DataType for d in DIRECTIONS]
