"""Layer normalisation forward and backward, with or without weight and bias."""

from kdbkit.runtime.primitives.layernorm import solvers  # noqa: F401  (registers the solvers)
from kdbkit.runtime.primitives.layernorm.api import layernorm_backward, layernorm_forward
from kdbkit.runtime.primitives.layernorm.problem import LayerNormProblem

__all__ = ["LayerNormProblem", "layernorm_backward", "layernorm_forward"]
