"""The convolution solvers; importing this package registers them. Ids: 20 ConvDirect,
21 ConvIm2colGemm, 22 ConvImplicitGemmTensorCore, 23 ConvWrwImplicitGemmTensorCore (both in
igemm_tc), 24 ConvDepthwise, 25 ConvImplicitGemmMfma, 27 ConvWinogradF2x3, 28 ConvImplicitGemm (26 is
the bias's, ConvBias). Immediate mode tries the depthwise
kernels first (depthwise forward and backward data), then the matrix-unit implicit GEMMs
(CUDA tensor cores, fp16/bf16: forward and backward data at stride 1, backward weights; AMD
MFMA on gfx90a/gfx942: NHWC forward), then the implicit GEMM on the general cores (every
direction, layout, type and group count), then the matrix multiply over im2col (one group), then
Winograd F(2 x 2, 3 x 3) (3 x 3 forward at stride 1: find ranks it where it is faster), then the
direct solver, which takes every convolution."""

from kdbkit.runtime.primitives.convolution.solvers import depthwise, igemm_tc, igemm_mfma, igemm, im2col, winograd, direct  # noqa: F401,I001,E501  (registers, in this order)
