"""The convolution solvers; importing this package registers them. Ids: 20 ConvDirect,
21 ConvIm2colGemm, 22 ConvImplicitGemmTensorCore. Immediate mode tries the tensor-core
implicit GEMM first (CUDA, fp16/bf16 NHWC forward), then the matrix multiply over im2col (one
group), then the direct solver, which takes every convolution."""

from kdbkit.runtime.primitives.convolution.solvers import igemm_tc, im2col, direct  # noqa: F401,I001  (registers, in this order)
