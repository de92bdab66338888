"""2-D convolution forward, backward data and backward weights (groups, padding, stride,
dilation; NCHW and NHWC), its bias forward and backward, and the forward with its epilogue
(a folded batch norm, a residual addition and ReLU) fused."""

from kdbkit.runtime.primitives.convolution import solvers  # noqa: F401  (registers the solvers)
from kdbkit.runtime.primitives.convolution.api import (
    convolution_backward_data,
    convolution_backward_weights,
    convolution_forward,
)
from kdbkit.runtime.primitives.convolution.bias import (
    ConvBiasProblem,
    convolution_bias_backward,
    convolution_bias_forward,
)
from kdbkit.runtime.primitives.convolution.epilogue import ConvEpilogueProblem
from kdbkit.runtime.primitives.convolution.fused import convolution_forward_fused
from kdbkit.runtime.primitives.convolution.problem import ConvProblem

__all__ = ["ConvBiasProblem", "ConvEpilogueProblem", "ConvProblem", "convolution_backward_data",
           "convolution_backward_weights", "convolution_bias_backward", "convolution_bias_forward",
           "convolution_forward", "convolution_forward_fused"]
