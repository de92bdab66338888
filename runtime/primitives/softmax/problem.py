"""The softmax problem: direction, algorithm, mode, type, an N x C x H x W shape and strides.

Config string (keys in this order)::

    softmax,dir=fwd,algo=accurate,mode=channel,type=fp32,shape=2x3x4x5,xs=60x20x5x1,ys=60x20x5x1,a=1.0,b=0.0

Algorithms as MIOpen's (``fast`` subtracts no max, ``accurate`` does, ``log`` is log-softmax);
modes as MIOpen's (``instance`` over C*H*W per n, ``channel`` over C per (n, h, w)). ``xs``
are x's strides (backward: y's and dy's), ``ys`` the output's (y forward, dx backward).
Forward is ``y = a * softmax(x) + b * y``, backward ``dx = a * grad + b * dx``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.problem import Problem, parse_float, require
from kdbkit.runtime.tensor import DataType, TensorDesc, format_dims, parse_dims

ALGORITHMS = ("fast", "accurate", "log")
MODES = ("instance", "channel")


def as_nchw(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A 2-D (N, C) tensor as N x C x 1 x 1; a 4-D one as it is.

    Raises:
        ProblemError: another rank.
    """
    if len(shape) == 2:
        return (*shape, 1, 1), (*strides, 1, 1)
    if len(shape) == 4:
        return shape, strides
    raise ProblemError(f"softmax takes an N x C or N x C x H x W tensor, not {len(shape)}-D ({format_dims(shape)})",
                       "reshape it to 4-D (N, C, H, W)")


def _choice(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise ProblemError(f"softmax {what} {value!r}", f"use one of {', '.join(allowed)}")
    return value


@dataclass(frozen=True)
class SoftmaxProblem(Problem):
    primitive = "softmax"

    direction: str
    algorithm: str
    mode: str
    dtype: DataType
    shape: tuple[int, int, int, int]
    x_strides: tuple[int, ...]
    y_strides: tuple[int, ...]
    alpha: float = 1.0
    beta: float = 0.0

    def __post_init__(self) -> None:
        _choice(self.direction, ("fwd", "bwd"), "direction")
        _choice(self.algorithm, ALGORITHMS, "algorithm")
        _choice(self.mode, MODES, "mode")
        if len(self.shape) != 4:
            raise ProblemError(f"softmax shape {format_dims(self.shape)} is not N x C x H x W", "give 4 sizes")
        TensorDesc(self.dtype, self.shape, self.x_strides), TensorDesc(self.dtype, self.shape, self.y_strides)

    @property
    def rows(self) -> int:
        n, c, h, w = self.shape
        return n * h * w if self.mode == "channel" else n

    @property
    def row_length(self) -> int:
        n, c, h, w = self.shape
        return c if self.mode == "channel" else c * h * w

    def tensors(self) -> dict[str, TensorDesc]:
        x, y = TensorDesc(self.dtype, self.shape, self.x_strides), TensorDesc(self.dtype, self.shape, self.y_strides)
        return {"x": x, "y": y} if self.direction == "fwd" else {"y": x, "dy": x, "dx": y}

    def fields(self) -> list[tuple[str, str]]:
        return [("dir", self.direction), ("algo", self.algorithm), ("mode", self.mode), ("type", self.dtype.label),
                ("shape", format_dims(self.shape)), ("xs", format_dims(self.x_strides)),
                ("ys", format_dims(self.y_strides)), ("a", repr(self.alpha)), ("b", repr(self.beta))]

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> "SoftmaxProblem":
        text = ",".join(f"{k}={v}" for k, v in f.items())
        return cls(require(f, "dir", text), require(f, "algo", text), require(f, "mode", text),
                   DataType.parse(require(f, "type", text)), parse_dims(require(f, "shape", text), "shape"),
                   parse_dims(require(f, "xs", text), "xs"), parse_dims(require(f, "ys", text), "ys"),
                   parse_float(f.get("a", "1"), "a"), parse_float(f.get("b", "0"), "b"))


def catalogue() -> list[SoftmaxProblem]:
    """One problem per compile-time specialisation: the type, and the lanes kernel's tile for
    long rows (2048 vectors of 16 bytes); the rest are arguments."""
    s = (8, 8, 1, 1)
    short = [SoftmaxProblem(d, "accurate", "channel", t, (1, 8, 1, 1), s, s) for t in DataType for d in ("fwd", "bwd")]
    long_rows = [SoftmaxProblem(d, "accurate", "channel", t, (1, n, 1, 1), (n, 1, 1, 1), (n, 1, 1, 1))
                 for t in DataType for n in (2048 * 16 // t.itemsize,) for d in ("fwd", "bwd")]
    return short + long_rows
