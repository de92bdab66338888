"""Activations forward and backward: MIOpen's ten modes with alpha/beta/gamma, and gelu (erf and tanh)."""

from kdbkit.runtime.primitives.activation import solvers  # noqa: F401  (registers the solvers)
from kdbkit.runtime.primitives.activation.api import activation_backward, activation_forward
from kdbkit.runtime.primitives.activation.problem import ActivationMode, ActivationProblem

__all__ = ["ActivationMode", "ActivationProblem", "activation_backward", "activation_forward"]
