"""Batch normalisation: inference; training forward (running statistics, saved mean and inverse std); backward."""

from kdbkit.runtime.primitives.batchnorm import solvers  # noqa: F401  (registers the solvers)
from kdbkit.runtime.primitives.batchnorm.api import batchnorm_backward, batchnorm_inference, batchnorm_training
from kdbkit.runtime.primitives.batchnorm.problem import BatchNormProblem

__all__ = ["BatchNormProblem", "batchnorm_backward", "batchnorm_inference", "batchnorm_training"]
