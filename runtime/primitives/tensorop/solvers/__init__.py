"""The tensor-operation solvers, registered from :data:`SOLVERS` in priority order. Ids: 5
OpTensorPacked, 6 OpTensorStrided."""

from kdbkit.runtime.primitives.tensorop.solvers.packed import OpTensorPacked
from kdbkit.runtime.primitives.tensorop.solvers.strided import OpTensorStrided
from kdbkit.runtime.solver import REGISTRY

SOLVERS = (OpTensorPacked, OpTensorStrided)
REGISTRY.register_all(SOLVERS)
