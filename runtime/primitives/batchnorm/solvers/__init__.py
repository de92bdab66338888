"""The batch-norm solvers, registered from :data:`SOLVERS` in priority order.

Ids: 9 BatchNormBlock (every direction and mode), 13 BatchNormSplit (spatial training over
contiguous planes), 19 BatchNormPersistent (the same on CUDA in one launch reading x once).
Immediate mode tries them in the reverse order.
"""

from kdbkit.runtime.primitives.batchnorm.solvers.block import BatchNormBlock
from kdbkit.runtime.primitives.batchnorm.solvers.persistent import BatchNormPersistent
from kdbkit.runtime.primitives.batchnorm.solvers.split import BatchNormSplit
from kdbkit.runtime.solver import REGISTRY

SOLVERS = (BatchNormPersistent, BatchNormSplit, BatchNormBlock)
REGISTRY.register_all(SOLVERS)
