/* tc_types.h: the 16-bit element type of the CUDA tensor-core kernels (gemm_tc.cu,
 * gemm_wgmma.cu), chosen by -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16: its PTX name for the matrix
 * instructions (TC_TYPE), and conversions between its bits and float through PTX (so NVRTC
 * needs no CUDA header). */
#ifndef TC_TYPES_H
#define TC_TYPES_H

#if defined(KDB_TYPE_FP16)
#define TC_TYPE "f16"
__device__ __forceinline__ float tc_to_float(unsigned short b)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
    return f;
}
__device__ __forceinline__ unsigned short tc_from_float(float f)
{
    unsigned short b;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(f));
    return b;
}
#elif defined(KDB_TYPE_BF16)
#define TC_TYPE "bf16"
__device__ __forceinline__ float tc_to_float(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short tc_from_float(float f)
{
    unsigned short b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
    return b;
}
#else
#error "the tensor-core kernels need -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16"
#endif

#endif /* TC_TYPES_H */
