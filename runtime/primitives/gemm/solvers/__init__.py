"""The GEMM solvers; importing this package registers them.

Ids: 10 GemmTiled (every backend), 11 GemmTensorCore (CUDA sm_80+, fp16/bf16, mma.sync),
16 GemmWgmma (sm_90 only, wgmma), 29 GemmBlocked (every backend, register-blocked). Immediate
mode tries them fastest first: wgmma, then mma.sync, then the blocked kernel (unless its tiles
would be mostly empty), then the portable tiled kernel.
"""

from kdbkit.runtime.primitives.gemm.solvers import wgmma, tensor_core, blocked, tiled  # noqa: F401,I001  (registers, in this order)
