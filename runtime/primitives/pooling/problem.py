"""The pooling problem: 2-D max or average pooling of an N x C x H x W tensor, either direction.

Config string (keys in this order)::

    pool,dir=fwd,mode=max,type=fp32,shape=2x3x8x8,win=2x2,stride=2x2,pad=0x0,xs=192x64x8x1,ys=48x16x4x1,idx=1

``shape`` and ``xs`` are the input's (x forward, dx backward); ``ys`` the output's strides (y
forward, dy backward). Modes as MIOpenDriver's ``-m``: ``max``, ``avg`` (padding excluded from
the count) and ``avg_in`` (padding included). Each output is (in + 2 pad - win) / stride + 1.
``idx=1``: forward max pooling also writes each output's argmax, which backward needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.primitives.arguments import int_pair
from kdbkit.runtime.problem import Problem, require
from kdbkit.runtime.tensor import DataType, TensorDesc, format_dims, packed_strides, parse_dims

MODES = ("max", "avg", "avg_in")


def _pair(values, what: str) -> tuple[int, int]:
    return int_pair(values, what, "pooling")


@dataclass(frozen=True)
class PoolProblem(Problem):
    primitive = "pool"

    direction: str
    mode: str
    dtype: DataType
    shape: tuple[int, int, int, int]
    window: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]
    x_strides: tuple[int, ...]
    y_strides: tuple[int, ...]
    indices: bool = True  # forward max pooling writes each output's argmax (int32)

    def __post_init__(self) -> None:
        if self.direction not in ("fwd", "bwd"):
            raise ProblemError(f"pooling direction {self.direction!r}", "use fwd or bwd")
        if self.mode not in MODES:
            raise ProblemError(f"pooling mode {self.mode!r}", f"use one of {', '.join(MODES)}")
        if len(self.shape) != 4:
            raise ProblemError(f"pooling takes N x C x H x W tensors, not {format_dims(self.shape)}",
                               "reshape it to 4-D")
        if min(self.window) < 1 or min(self.stride) < 1 or min(self.pad) < 0:
            raise ProblemError(f"pooling window {self.window}, stride {self.stride}, pad {self.pad}",
                               "window and stride must be >= 1, padding >= 0")
        if any(p >= k for p, k in zip(self.pad, self.window)):
            raise ProblemError(f"pooling pad {self.pad} is not smaller than the window {self.window}",
                               "pad each side by less than the window")
        if min(self.out_hw) < 1:
            raise ProblemError(f"pooling a {self.shape[2]}x{self.shape[3]} plane with window {self.window}, stride "
                               f"{self.stride}, pad {self.pad} leaves no output", "use a smaller window or more padding")
        TensorDesc(self.dtype, self.shape, self.x_strides), TensorDesc(self.dtype, self.out_shape, self.y_strides)

    @property
    def out_hw(self) -> tuple[int, int]:
        return tuple((size + 2 * p - k) // s + 1 for size, k, s, p in
                     zip(self.shape[2:], self.window, self.stride, self.pad))  # type: ignore[return-value]

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        return (*self.shape[:2], *self.out_hw)

    def tensors(self) -> dict[str, TensorDesc]:
        x = TensorDesc(self.dtype, self.shape, self.x_strides)
        y = TensorDesc(self.dtype, self.out_shape, self.y_strides)
        # int32 indices, one per output: scratch of that size (fp32 has the same width) for find
        indices = TensorDesc(DataType.FP32, self.out_shape, packed_strides(self.out_shape))
        if self.direction == "fwd":
            return {"x": x, "y": y, "indices": indices}
        return {"dy": y, "indices": indices, "dx": x}

    def fields(self) -> list[tuple[str, str]]:
        return [("dir", self.direction), ("mode", self.mode), ("type", self.dtype.label),
                ("shape", format_dims(self.shape)), ("win", format_dims(self.window)),
                ("stride", format_dims(self.stride)), ("pad", format_dims(self.pad)),
                ("xs", format_dims(self.x_strides)), ("ys", format_dims(self.y_strides)),
                ("idx", str(int(self.indices)))]

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> "PoolProblem":
        text = ",".join(f"{k}={v}" for k, v in f.items())
        dims = {k: parse_dims(require(f, k, text), k) for k in ("shape", "win", "stride", "pad", "xs", "ys")}
        return cls(require(f, "dir", text), require(f, "mode", text), DataType.parse(require(f, "type", text)),
                   dims["shape"], _pair(dims["win"], "win"), _pair(dims["stride"], "stride"),
                   _pair(dims["pad"], "pad"), dims["xs"], dims["ys"], f.get("idx", "1") == "1")


def catalogue() -> list[PoolProblem]:
    """One problem per compile-time specialisation (the type)."""
    s = (16, 16, 4, 1)
    return [PoolProblem(d, "max", t, (1, 1, 4, 4), (2, 2), (2, 2), (0, 0), s, (4, 4, 2, 1))
            for t in DataType for d in ("fwd", "bwd")]
