"""The convolution solvers; importing this package registers them. Ids: 20 ConvDirect,
21 ConvIm2colGemm. Immediate mode tries the matrix multiply first (one group), then the
direct solver, which takes every convolution."""

from kdbkit.runtime.primitives.convolution.solvers import im2col, direct  # noqa: F401,I001  (registers, in this order)
