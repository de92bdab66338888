"""The GEMM solvers; importing this package registers them.

Ids: 10 GemmTiled (every backend), 11 GemmTensorCore (CUDA sm_80+, fp16/bf16). The tensor-core
solver registers first, so immediate mode prefers it wherever it applies.
"""

from kdbkit.runtime.primitives.gemm.solvers import tensor_core, tiled  # noqa: F401,I001  (registers, in this order)
