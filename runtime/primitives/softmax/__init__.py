"""Softmax and log-softmax forward and backward, instance and channel modes, fast and accurate."""

from kdbkit.runtime.primitives.softmax import solvers  # noqa: F401  (registers the solvers)
from kdbkit.runtime.primitives.softmax.api import softmax_backward, softmax_forward
from kdbkit.runtime.primitives.softmax.problem import SoftmaxProblem

__all__ = ["SoftmaxProblem", "softmax_backward", "softmax_forward"]
