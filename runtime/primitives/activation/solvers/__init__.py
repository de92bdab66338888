"""The activation solvers, one per module, registered from :data:`SOLVERS` in priority order.

Ids are stable: 1 ActivPacked, 2 ActivStrided. New solvers take the next free id.
"""

from kdbkit.runtime.primitives.activation.solvers.packed import ActivPacked
from kdbkit.runtime.primitives.activation.solvers.strided import ActivStrided
from kdbkit.runtime.solver import REGISTRY

SOLVERS = (ActivPacked, ActivStrided)  # the order immediate mode's heuristic tries them in
REGISTRY.register_all(SOLVERS)
