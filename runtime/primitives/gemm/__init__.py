"""Matrix multiply: transposes, batched and strided, fp16/bf16 with fp32 accumulation, tensor cores on CUDA;
and with its epilogue (a bias per column, a residual addition and an activation) fused."""

from kdbkit.runtime.primitives.gemm import solvers  # noqa: F401  (registers the solvers)
from kdbkit.runtime.primitives.gemm.api import gemm
from kdbkit.runtime.primitives.gemm.fused import gemm_fused
from kdbkit.runtime.primitives.gemm.problem import GemmProblem

__all__ = ["GemmProblem", "gemm", "gemm_fused"]
