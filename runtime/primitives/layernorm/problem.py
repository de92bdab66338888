"""The layer-normalisation problem: packed x normalised over its dimensions from ``dim`` on.

Config string (keys in this order)::

    layernorm,dir=fwd,type=fp32,shape=8x128x768,dim=2,affine=1,eps=1e-05

Rows are the product of the sizes before ``dim``, each normalised over the product of the
sizes from ``dim`` on; ``affine=1`` applies (forward) and differentiates (backward) a weight and
a bias of one row's shape. Mean and 1/std are kept per row in float32, whatever the type.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.problem import Problem, parse_float, require
from kdbkit.runtime.tensor import DataType, TensorDesc, format_dims, parse_dims, parse_int


@dataclass(frozen=True)
class LayerNormProblem(Problem):
    primitive = "layernorm"

    direction: str
    dtype: DataType
    shape: tuple[int, ...]
    dim: int
    affine: bool
    eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.direction not in ("fwd", "bwd"):
            raise ProblemError(f"layer norm direction {self.direction!r}", "use fwd or bwd")
        TensorDesc.packed(self.dtype, self.shape)
        if not 0 <= self.dim < len(self.shape):
            raise ProblemError(f"layer norm dim {self.dim} for a {len(self.shape)}-D tensor",
                               f"normalise from a dimension between 0 and {len(self.shape) - 1} (or -1 for the last)")
        if not self.eps > 0:
            raise ProblemError(f"layer norm eps {self.eps}", "give a positive epsilon, e.g. 1e-5")

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[: self.dim]))

    @property
    def inner(self) -> int:
        return int(np.prod(self.shape[self.dim :]))

    def tensors(self) -> dict[str, TensorDesc]:
        x = TensorDesc.packed(self.dtype, self.shape)
        row = TensorDesc.packed(self.dtype, self.shape[self.dim :])
        stats = TensorDesc.packed(DataType.FP32, self.shape[: self.dim] or (1,))
        if self.direction == "fwd":
            return {"x": x, "weight": row, "bias": row, "y": x, "mean": stats, "rstd": stats}
        return {"x": x, "dy": x, "weight": row, "mean": stats, "rstd": stats, "dx": x, "dweight": row, "dbias": row}

    def fields(self) -> list[tuple[str, str]]:
        return [("dir", self.direction), ("type", self.dtype.label), ("shape", format_dims(self.shape)),
                ("dim", str(self.dim)), ("affine", str(int(self.affine))), ("eps", repr(self.eps))]

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> "LayerNormProblem":
        text = ",".join(f"{k}={v}" for k, v in f.items())
        # Read before the ``try``: require's ProblemError is a ValueError, and would read "not an integer".
        dim_text, affine = require(f, "dim", text), require(f, "affine", text) in ("1", "true")
        try:
            dim = parse_int(dim_text, "dim")
        except ProblemError:
            raise ProblemError(f"layernorm config {text[:200]!r}: dim is not an integer", "write dim=<n>") from None
        return cls(require(f, "dir", text), DataType.parse(require(f, "type", text)),
                   parse_dims(require(f, "shape", text), "shape"), dim, affine, parse_float(f.get("eps", "1e-5"), "eps"))


def catalogue() -> list[LayerNormProblem]:
    """One problem per compile-time specialisation: the type, and the lanes kernel's tile for
    long rows (2048 vectors of 16 bytes)."""
    return [LayerNormProblem(d, t, (2, 8), 1, True) for t in DataType for d in ("fwd", "bwd")] + \
        [LayerNormProblem("fwd", t, (2, 2048 * 16 // t.itemsize), 1, True) for t in DataType]
