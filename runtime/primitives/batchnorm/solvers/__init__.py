"""The batch-norm solvers; importing this package registers them.

Ids: 9 BatchNormBlock (every direction and mode), 13 BatchNormSplit (spatial training over
contiguous planes), 19 BatchNormPersistent (the same on CUDA in one launch reading x once).
Immediate mode tries them in the reverse order.
"""

from kdbkit.runtime.primitives.batchnorm.solvers import persistent, split, block  # noqa: F401,I001  (registers, in this order)
