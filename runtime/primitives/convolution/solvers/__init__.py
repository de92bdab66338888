"""The convolution solvers, registered from :data:`SOLVERS` in priority order. Ids: 20
ConvDirect, 21 ConvIm2colGemm, 22 ConvImplicitGemmTensorCore, 23 ConvWrwImplicitGemmTensorCore
(both in igemm_tc), 24 ConvDepthwise, 25 ConvImplicitGemmMfma, 27 ConvWinogradF2x3, 28
ConvImplicitGemm (26 is the bias's, ConvBias; 52 the fused epilogue's pass, ConvEpilogue),
33-35 ConvTma128x256/128x128/128x64 (tma), 36-38 ConvTmaBwdData128x256/128x128/128x64
(tma_dgrad), 39-41 ConvTmaBwdDataStrided128x256/128x128/128x64 (tma_sdgrad), 42-44
ConvTmaBwdWeights128x256/128x128/128x64 (tma_wgrad), 45 ConvImplicitGemmTf32 (igemm_tf32:
fp32 on the tensor cores in TF32, only with KDB_CONV_ALLOW_TF32=1), 48 ConvGroupedTensorCore
(grouped_tc), 50 ConvGroupedFp32 (grouped_fp32), 54 ConvStem (stem).
Immediate mode tries the grouped tensor-core kernel first (forward, fp16/bf16, more than one
group: ResNeXt's grouped convolutions on sm_80+, MobileNet's depthwise ones only on NCHW planes
of 56 x 56 or more: other strided or at most 3 wide ones it passes to the next), then the
depthwise kernels (depthwise forward and backward data, every type), then the grouped fp32
kernel on the CUDA cores (forward, 2 to 8 output channels a group: ResNeXt's narrow groups,
sm_80+), then a first layer's few input channels through a short filter on the general cores
(forward, every type and backend), then
Hopper's TMA + wgmma kernels (sm_90, fp16/bf16, the tile that wastes least: forward, then
backward data at stride 1, then at a larger stride, one forward convolution per output phase,
then backward weights, the reduction over the pixels split into fp32 slabs summed in order),
then the matrix-unit implicit GEMMs (CUDA tensor cores, fp16/bf16: forward and backward data
at stride 1, backward weights; AMD MFMA on gfx90a/gfx942: NHWC
forward; TF32 for fp32, only where KDB_CONV_ALLOW_TF32=1 allows it), then Winograd
F(2 x 2, 3 x 3) (fp32 3 x 3 at stride 1, forward and backward data, where its cost model says
it beats the implicit GEMM; else it applies for find), then the implicit GEMM on the general
cores (every direction, layout, type and group count; forward and backward data split their
reduction when their tiles would not fill the GPU), then the matrix
multiply over im2col (one group), then the direct solver, which takes every convolution."""

from kdbkit.runtime.primitives.convolution.solvers.depthwise import ConvDepthwise
from kdbkit.runtime.primitives.convolution.solvers.direct import ConvDirect
from kdbkit.runtime.primitives.convolution.solvers.grouped_fp32 import ConvGroupedFp32
from kdbkit.runtime.primitives.convolution.solvers.grouped_tc import ConvGroupedTensorCore
from kdbkit.runtime.primitives.convolution.solvers.igemm import ConvImplicitGemm
from kdbkit.runtime.primitives.convolution.solvers.igemm_mfma import ConvImplicitGemmMfma
from kdbkit.runtime.primitives.convolution.solvers.igemm_tc import (ConvImplicitGemmTensorCore,
                                                                    ConvWrwImplicitGemmTensorCore)
from kdbkit.runtime.primitives.convolution.solvers.igemm_tf32 import ConvImplicitGemmTf32
from kdbkit.runtime.primitives.convolution.solvers.im2col import ConvIm2colGemm
from kdbkit.runtime.primitives.convolution.solvers.stem import ConvStem
from kdbkit.runtime.primitives.convolution.solvers.tma import ConvTma, ConvTma128x64, ConvTma128x128
from kdbkit.runtime.primitives.convolution.solvers.tma_dgrad import (ConvTmaBwdData, ConvTmaBwdData128x64,
                                                                     ConvTmaBwdData128x128)
from kdbkit.runtime.primitives.convolution.solvers.tma_sdgrad import (ConvTmaBwdDataStrided,
                                                                      ConvTmaBwdDataStrided128x64,
                                                                      ConvTmaBwdDataStrided128x128)
from kdbkit.runtime.primitives.convolution.solvers.tma_wgrad import (ConvTmaBwdWeights, ConvTmaBwdWeights128x64,
                                                                     ConvTmaBwdWeights128x128)
from kdbkit.runtime.primitives.convolution.solvers.winograd import ConvWinogradF2x3
from kdbkit.runtime.solver import REGISTRY

SOLVERS = (ConvGroupedTensorCore, ConvDepthwise, ConvGroupedFp32, ConvStem, ConvTma, ConvTma128x128, ConvTma128x64,
           ConvTmaBwdData, ConvTmaBwdData128x128, ConvTmaBwdData128x64, ConvTmaBwdDataStrided,
           ConvTmaBwdDataStrided128x128, ConvTmaBwdDataStrided128x64,
           ConvTmaBwdWeights, ConvTmaBwdWeights128x128, ConvTmaBwdWeights128x64,
           ConvImplicitGemmTensorCore, ConvWrwImplicitGemmTensorCore, ConvImplicitGemmMfma, ConvImplicitGemmTf32,
           ConvWinogradF2x3, ConvImplicitGemm, ConvIm2colGemm, ConvDirect)
REGISTRY.register_all(SOLVERS)
