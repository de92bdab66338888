"""The tensor-operation solvers; importing this package registers them. Ids: 5 OpTensorPacked, 6 OpTensorStrided."""

from kdbkit.runtime.primitives.tensorop.solvers import packed, strided  # noqa: F401  (registers, in this order)
