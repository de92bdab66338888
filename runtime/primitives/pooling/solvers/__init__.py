"""The pooling solvers; importing this package registers them. Ids: 8 PoolDirect."""

from kdbkit.runtime.primitives.pooling.solvers import direct  # noqa: F401  (registers)
