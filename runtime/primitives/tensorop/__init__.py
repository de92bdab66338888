"""Tensor operations add, mul, min and max with broadcasting and alpha/beta scaling (MIOpen's OpTensor)."""

from kdbkit.runtime.primitives.tensorop import solvers  # noqa: F401  (registers the solvers)
from kdbkit.runtime.primitives.tensorop.api import op_tensor
from kdbkit.runtime.primitives.tensorop.problem import TensorOpProblem

__all__ = ["TensorOpProblem", "op_tensor"]
