"""2-D convolution forward, backward data and backward weights (groups, padding, stride,
dilation; NCHW and NHWC)."""

from kdbkit.runtime.primitives.convolution import solvers  # noqa: F401  (registers the solvers)
from kdbkit.runtime.primitives.convolution.api import (
    convolution_backward_data,
    convolution_backward_weights,
    convolution_forward,
)
from kdbkit.runtime.primitives.convolution.problem import ConvProblem

__all__ = ["ConvProblem", "convolution_backward_data", "convolution_backward_weights", "convolution_forward"]
