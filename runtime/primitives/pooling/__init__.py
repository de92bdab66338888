"""2-D pooling forward and backward: max (with indices) and average, padding included or excluded."""

from kdbkit.runtime.primitives.pooling import solvers  # noqa: F401  (registers the solvers)
from kdbkit.runtime.primitives.pooling.api import pooling_backward, pooling_forward
from kdbkit.runtime.primitives.pooling.problem import PoolProblem

__all__ = ["PoolProblem", "pooling_backward", "pooling_forward"]
