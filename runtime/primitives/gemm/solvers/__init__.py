"""The GEMM solvers, registered from :data:`SOLVERS` in priority order.

Ids: 10 GemmTiled (every backend), 11 GemmTensorCore (CUDA sm_80+, fp16/bf16, mma.sync),
16 GemmWgmma (sm_90 only, wgmma fed by cp.async), 29 GemmBlocked (every backend,
register-blocked), 30-32 GemmTma128x256/128x192/128x128 (sm_90 only: TMA, wgmma, warp-specialised
and persistent). Immediate mode tries them fastest first: the TMA kernels (the tile shape that
suits the problem's size), then wgmma, then mma.sync, then the blocked kernel (unless its tiles
would be mostly empty), then the portable tiled kernel.
"""

from kdbkit.runtime.primitives.gemm.solvers.blocked import GemmBlocked
from kdbkit.runtime.primitives.gemm.solvers.tensor_core import GemmTensorCore
from kdbkit.runtime.primitives.gemm.solvers.tiled import GemmTiled
from kdbkit.runtime.primitives.gemm.solvers.tma import GemmTma, GemmTma128x128, GemmTma128x192
from kdbkit.runtime.primitives.gemm.solvers.wgmma import GemmWgmma
from kdbkit.runtime.solver import REGISTRY

SOLVERS = (GemmTma, GemmTma128x192, GemmTma128x128, GemmWgmma, GemmTensorCore, GemmBlocked, GemmTiled)
REGISTRY.register_all(SOLVERS)
