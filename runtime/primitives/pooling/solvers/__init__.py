"""The pooling solvers; importing this package registers them. Ids: 8 PoolDirect, 17 PoolBand.
Immediate mode tries PoolBand first (forward, when a band of input rows fits its stage)."""

from kdbkit.runtime.primitives.pooling.solvers import band, direct  # noqa: F401,I001  (registers, in this order)
