"""The layer-norm solvers; importing this package registers them. Ids: 7 LayerNormBlock,
15 LayerNormLanes. Immediate mode tries the lanes kernel (forward, rows of whole 16-byte
vectors) first, then a group per row."""

from kdbkit.runtime.primitives.layernorm.solvers import lanes, block  # noqa: F401,I001  (registers, in this order)
