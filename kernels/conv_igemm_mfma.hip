/* conv_igemm_mfma.hip: forward convolution of NHWC fp16/bf16 tensors as an implicit GEMM on
 * AMD matrix cores (MFMA: v_mfma_f32_32x32x8f16 / _32x32x8bf16_1k, gfx90a and gfx942), fp32
 * accumulation. UNTESTED ON HARDWARE: no AMD GPU is available to this project; it is compiled
 * offline by clang for gfx90a and gfx942 and its disassembly checked for the matrix
 * instructions (tests/packager/test_mfma_conv.py). On other targets the kernel compiles to
 * nothing and its solver does not apply.
 *
 * The GEMM as conv_igemm_tc.cu's: rows the output positions (n, i, j), columns the output
 * channels, the reduction r = (a, b, c) over the taps and input channels (KYXC weights). A
 * workgroup of one 64-lane wavefront computes a 32 x 32 tile of y, 8 reductions a step: lane
 * l holds A[l % 32][4 (l / 32) + 0..3] (gathered from x, zeros in the padding) and
 * B[4 (l / 32) + 0..3][l % 32] (from w), and after the steps its 16 sums
 * D[8 (t / 4) + 4 (l / 32) + t % 4][l % 32], t = 0..15 (AMD's layout for 32x32x8).
 *
 * Options: -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16 (required).
 * Arguments: x, w, y, then conv_shape.h's CONV_SHAPE_ARGS (strides not read: packed NHWC).
 * Launch: workgroups of 64, grid (ceil(K / 32), ceil(N Ho Wo / 32)).
 */
#if !defined(__HIP__)
#error "conv_igemm_mfma.hip is for AMD GPUs (clang in HIP mode)"
#endif

#include "conv_shape.h"

#define MFMA_DEVICE static __attribute__((device)) inline __attribute__((always_inline))

#if defined(__gfx90a__) || defined(__gfx942__)
#define MFMA_AVAILABLE 1
typedef float mfma_acc __attribute__((ext_vector_type(16)));
#if defined(KDB_TYPE_FP16)
typedef _Float16 mfma_in __attribute__((ext_vector_type(4)));
#define MFMA_STEP(a, b, c) __builtin_amdgcn_mfma_f32_32x32x8f16((a), (b), (c), 0, 0, 0)
MFMA_DEVICE _Float16 mfma_element(unsigned short bits) { return __builtin_bit_cast(_Float16, bits); }
MFMA_DEVICE unsigned short mfma_store(float v) { return __builtin_bit_cast(unsigned short, (_Float16)v); }
#elif defined(KDB_TYPE_BF16)
typedef short mfma_in __attribute__((ext_vector_type(4)));
#define MFMA_STEP(a, b, c) __builtin_amdgcn_mfma_f32_32x32x8bf16_1k((a), (b), (c), 0, 0, 0)
MFMA_DEVICE short mfma_element(unsigned short bits) { return (short)bits; }
MFMA_DEVICE unsigned short mfma_store(float v)
{
    const unsigned int u = __builtin_bit_cast(unsigned int, v); /* round to nearest even */
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
#else
#error "conv_igemm_mfma.hip needs -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16"
#endif
#endif

extern "C" __attribute__((global)) __attribute__((amdgpu_flat_work_group_size(64, 64))) void
conv_igemm_mfma_fwd_nhwc(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,
                         unsigned short* __restrict__ y, CONV_SHAPE_ARGS)
{
#if defined(MFMA_AVAILABLE)
    const int lane = (int)__builtin_amdgcn_workitem_id_x();
    const int m0 = (int)__builtin_amdgcn_workgroup_id_y() * 32, n0 = (int)__builtin_amdgcn_workgroup_id_x() * 32;
    const int M = N * Ho * Wo, R = Y * X * C;
    const int m = m0 + lane % 32, n = n0 + lane % 32, kb = 4 * (lane / 32);
    const bool m_ok = m < M, n_ok = n < K;
    const int mm = m_ok ? m : 0, j = mm % Wo, i = mm / Wo % Ho, image = mm / (Wo * Ho);
    mfma_acc acc = {};
    for (int r0 = 0; r0 < R; r0 += 8) {
        mfma_in a, b;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int r = r0 + kb + q, tap = r / C, c = r - tap * C, fa = tap / X, fb = tap - fa * X;
            const int h = i * sh - ph + fa * dlh, v = j * sw - pw + fb * dlw;
            const bool inside = r < R && m_ok && h >= 0 && h < H && v >= 0 && v < W;
            a[q] = mfma_element(inside ? x[(((long)image * H + h) * W + v) * C + c] : (unsigned short)0);
            b[q] = mfma_element(r < R && n_ok ? w[(long)n * R + r] : (unsigned short)0);
        }
        acc = MFMA_STEP(a, b, acc);
    }
#pragma unroll
    for (int t = 0; t < 16; ++t) {
        const int row = m0 + 8 * (t / 4) + 4 * (lane / 32) + t % 4, col = n0 + lane % 32;
        if (row < M && col < K)
            y[(long)row * K + col] = mfma_store(acc[t]);
    }
#endif
}
