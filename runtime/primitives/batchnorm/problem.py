"""The batch-normalisation problem: inference, training forward or backward; spatial or per-activation.

Config string (keys in this order)::

    bnorm,dir=train,mode=spatial,type=fp16,shape=32x64x28x28,xs=...,ys=...,eps=1e-05,f=0.1,running=1,saved=1

``dir``: ``infer``, ``train`` or ``bwd``; ``mode``: ``spatial`` (one mean and variance per
channel, over N*H*W) or ``per_act`` (one per (c, h, w), over N). ``xs`` are x's strides (and
dy's backward), ``ys`` the output's (y, or dx backward). ``f`` is the running-average factor,
``running`` whether training updates running statistics, ``saved`` whether backward uses the
mean and inverse std training saved (else computes them again). Per-channel parameters and
statistics are float32, whatever the type.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.problem import Problem, parse_float, require
from kdbkit.runtime.tensor import DataType, TensorDesc, format_dims, parse_dims

DIRECTIONS = ("infer", "train", "bwd")
MODES = ("spatial", "per_act")


@dataclass(frozen=True)
class BatchNormProblem(Problem):
    primitive = "bnorm"

    direction: str
    mode: str
    dtype: DataType
    shape: tuple[int, int, int, int]
    x_strides: tuple[int, ...]
    y_strides: tuple[int, ...]
    eps: float = 1e-5
    factor: float = 0.1
    running: bool = True
    saved: bool = True

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ProblemError(f"batch norm direction {self.direction!r}", f"use one of {', '.join(DIRECTIONS)}")
        if self.mode not in MODES:
            raise ProblemError(f"batch norm mode {self.mode!r}", f"use one of {', '.join(MODES)}")
        if len(self.shape) != 4:
            raise ProblemError(f"batch norm takes N x C x H x W tensors, not {format_dims(self.shape)}",
                               "reshape it to 4-D")
        if not self.eps > 0:
            raise ProblemError(f"batch norm eps {self.eps}", "give a positive epsilon, e.g. 1e-5")
        TensorDesc(self.dtype, self.shape, self.x_strides), TensorDesc(self.dtype, self.shape, self.y_strides)

    @property
    def channels(self) -> int:
        n, c, h, w = self.shape
        return c if self.mode == "spatial" else c * h * w

    @property
    def members(self) -> int:
        n, c, h, w = self.shape
        return n * h * w if self.mode == "spatial" else n

    def tensors(self) -> dict[str, TensorDesc]:
        x = TensorDesc(self.dtype, self.shape, self.x_strides)
        y = TensorDesc(self.dtype, self.shape, self.y_strides)
        p = TensorDesc.packed(DataType.FP32, (self.channels,))
        if self.direction == "infer":
            return {"x": x, "y": y, "scale": p, "bias": p, "mean": p, "var": p}
        if self.direction == "train":
            return {"x": x, "y": y, "scale": p, "bias": p, "running_mean": p, "running_var": p, "saved_mean": p,
                    "saved_invstd": p}
        return {"x": x, "dy": x, "dx": y, "scale": p, "dscale": p, "dbias": p, "saved_mean": p, "saved_invstd": p}

    def fields(self) -> list[tuple[str, str]]:
        return [("dir", self.direction), ("mode", self.mode), ("type", self.dtype.label),
                ("shape", format_dims(self.shape)), ("xs", format_dims(self.x_strides)),
                ("ys", format_dims(self.y_strides)), ("eps", repr(self.eps)), ("f", repr(self.factor)),
                ("running", str(int(self.running))), ("saved", str(int(self.saved)))]

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> "BatchNormProblem":
        text = ",".join(f"{k}={v}" for k, v in f.items())
        return cls(require(f, "dir", text), require(f, "mode", text), DataType.parse(require(f, "type", text)),
                   parse_dims(require(f, "shape", text), "shape"), parse_dims(require(f, "xs", text), "xs"),
                   parse_dims(require(f, "ys", text), "ys"), parse_float(f.get("eps", "1e-5"), "eps"),
                   parse_float(f.get("f", "0.1"), "f"), f.get("running", "1") == "1", f.get("saved", "1") == "1")


def catalogue() -> list[BatchNormProblem]:
    """One problem per compile-time specialisation (the type)."""
    s = (4, 4, 2, 1)
    return [BatchNormProblem(d, "spatial", t, (1, 1, 2, 2), s, s) for t in DataType for d in DIRECTIONS]
