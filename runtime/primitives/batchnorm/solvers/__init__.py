"""The batch-norm solvers; importing this package registers them.

Ids: 9 BatchNormBlock (every direction and mode), 13 BatchNormSplit (spatial training over
contiguous planes, tried first where it applies).
"""

from kdbkit.runtime.primitives.batchnorm.solvers import split, block  # noqa: F401,I001  (registers, in this order)
