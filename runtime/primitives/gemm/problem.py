"""The matrix-multiply problem: C = alpha * op(A) op(B) + beta * C, batched and strided, row-major.

Config string (keys in this order)::

    gemm,type=fp16,m=4096,n=4096,k=4096,ta=0,tb=0,batch=1,lda=4096,ldb=4096,ldc=4096,sa=0,sb=0,sc=0,a=1.0,b=0.0

``ta``/``tb``: op(A) is A transposed (A stored K x M); ``lda`` etc. are the row strides in
elements (the last dimension is contiguous); ``sa``/``sb``/``sc`` the strides between batches.
fp16 and bf16 accumulate in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdbkit.runtime.errors import ProblemError
from kdbkit.runtime.problem import Problem, parse_float, require
from kdbkit.runtime.tensor import DataType, TensorDesc, parse_int


@dataclass(frozen=True)
class GemmProblem(Problem):
    primitive = "gemm"

    dtype: DataType
    m: int
    n: int
    k: int
    trans_a: bool = False
    trans_b: bool = False
    batch: int = 1
    lda: int = 0
    ldb: int = 0
    ldc: int = 0
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0
    alpha: float = 1.0
    beta: float = 0.0

    def __post_init__(self) -> None:
        if min(self.m, self.n, self.k, self.batch) < 1:
            raise ProblemError(f"gemm sizes m={self.m} n={self.n} k={self.k} batch={self.batch}",
                               "every size must be >= 1")
        a_cols, b_cols = (self.m if self.trans_a else self.k), (self.k if self.trans_b else self.n)
        for name, ld, cols in (("lda", self.lda, a_cols), ("ldb", self.ldb, b_cols), ("ldc", self.ldc, self.n)):
            if ld < cols:
                raise ProblemError(f"gemm {name}={ld} is smaller than the {cols} columns it strides over",
                                   f"{name} must be >= {cols} (row-major, the last dimension contiguous)")
        if min(self.stride_a, self.stride_b, self.stride_c) < 0:
            raise ProblemError("gemm batch strides are negative", "give strides >= 0")

    @property
    def a_rows(self) -> int:
        return self.k if self.trans_a else self.m

    @property
    def b_rows(self) -> int:
        return self.n if self.trans_b else self.k

    def _desc(self, rows: int, cols: int, ld: int, stride: int) -> TensorDesc:
        if self.batch > 1:
            return TensorDesc(self.dtype, (self.batch, rows, cols), (stride, ld, 1))
        return TensorDesc(self.dtype, (rows, cols), (ld, 1))

    def tensors(self) -> dict[str, TensorDesc]:
        return {"a": self._desc(self.a_rows, self.k if not self.trans_a else self.m, self.lda, self.stride_a),
                "b": self._desc(self.b_rows, self.n if not self.trans_b else self.k, self.ldb, self.stride_b),
                "c": self._desc(self.m, self.n, self.ldc, self.stride_c)}

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    def fields(self) -> list[tuple[str, str]]:
        return [("type", self.dtype.label), ("m", str(self.m)), ("n", str(self.n)), ("k", str(self.k)),
                ("ta", str(int(self.trans_a))), ("tb", str(int(self.trans_b))), ("batch", str(self.batch)),
                ("lda", str(self.lda)), ("ldb", str(self.ldb)), ("ldc", str(self.ldc)), ("sa", str(self.stride_a)),
                ("sb", str(self.stride_b)), ("sc", str(self.stride_c)), ("a", repr(self.alpha)),
                ("b", repr(self.beta))]

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> "GemmProblem":
        text = ",".join(f"{k}={v}" for k, v in f.items())
        ints = {k: _parse_int(f, k, text) for k in ("m", "n", "k", "batch", "lda", "ldb", "ldc", "sa", "sb", "sc")}
        return cls(DataType.parse(require(f, "type", text)), ints["m"], ints["n"], ints["k"],
                   require(f, "ta", text) == "1", require(f, "tb", text) == "1", ints["batch"], ints["lda"],
                   ints["ldb"], ints["ldc"], ints["sa"], ints["sb"], ints["sc"], parse_float(f.get("a", "1"), "a"),
                   parse_float(f.get("b", "0"), "b"))


def _parse_int(f: dict[str, str], key: str, text: str) -> int:
    """A config's integer field, checked as it is read: a missing key, a value that is no
    integer and a size below 1 are each named (ProblemError being a ValueError, the missing key
    is read outside the ``try``)."""
    value = require(f, key, text)
    try:
        number = parse_int(value, key)
    except ProblemError:
        raise ProblemError(f"gemm config {text[:200]!r}: {key}={value[:40]!r} is not an integer",
                           f"write {key} as a whole number (below 2**62)") from None
    if key in ("m", "n", "k", "batch") and number < 1:
        raise ProblemError(f"gemm config {text!r}: {key}={number}", f"{key} is a size: it must be positive (1 or more)")
    return number


def catalogue() -> list[GemmProblem]:
    """One problem per compile-time specialisation: the type, and the transpositions (the TMA
    kernels are built for each pair; the other kernels take them as launch arguments)."""
    return [GemmProblem(t, 16, 16, 16, ta, tb, lda=16, ldb=16, ldc=16) for t in DataType
            for ta in (False, True) for tb in (False, True)]
