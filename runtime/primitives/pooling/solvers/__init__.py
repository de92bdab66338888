"""The pooling solvers; importing this package registers them. Ids: 8 PoolDirect, 17 PoolBand,
18 PoolStrip. Immediate mode tries PoolStrip first (forward, for its window geometries), then
PoolBand (forward, when a band of input rows fits its stage)."""

from kdbkit.runtime.primitives.pooling.solvers import strip, band, direct  # noqa: F401,I001  (registers, in this order)
