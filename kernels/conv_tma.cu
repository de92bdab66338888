/* conv_tma.cu: forward convolution on Hopper as an implicit GEMM fed by tensor copies (TMA),
 * warp-specialised and persistent like gemm_tma.cu, whose pieces it shares (tma_wgmma.h).
 *
 * y (N x Ho x Wo x K, channels-last) = x (N x H x W x C, channels-last) convolved with w (K x R x
 * S x C), fp16 or bf16 in, fp32 accumulation. The GEMM: M = N Ho Wo output pixels, N = K output
 * channels, the reduction over the R S filter taps and C channels, CONV_BK channels a step (64;
 * 32 or 16 where x has that few, so that a step is not mostly zeros):
 *   - A, 128 pixels x CONV_BK channels of one tap: one im2col tensor copy. Its map walks the output
 *     pixels in order (W, then H, then N) over the bounding box of the filter's top-left corner
 *     (from -pad to the far edge + pad - dilation x (filter - 1)) in steps of the stride; the
 *     copy starts at a tile's first pixel's corner (stride x (ho, wo) - pad) and each pixel
 *     moves by the tap's offset (dilation x (r, s)). Pixels in the padding, channels past C
 *     and pixels past the last image arrive as zeros.
 *   - B, TM_BN output channels x CONV_BK channels of one tap: a tile copy of w seen as a 3-D
 *     tensor (C, R S, K), so that channels past C are zeros here too and no step spans two taps.
 * Both land as K-major tiles (one row of CONV_BK channels per pixel or output channel, 2 CONV_BK
 * bytes, swizzled as wide as the row), the layout wgmma reads untransposed; the rest (barriers, the ring of
 * stages, the consumers' loop, the epilogue writing y as a row-major M x K matrix) is the
 * GEMM's.
 *
 * Options: -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16, -DCONV_BN=64|128|256, -DCONV_STAGES=<n>,
 * -DCONV_BK=64|32|16 (64 unless given), --gpu-architecture=sm_90a.
 * Launch (conv_fwd_tma): blocks of 384 threads, grid (min(tiles, multiprocessors), 1, 1),
 * dynamic shared memory CONV_STAGES * (128 + CONV_BN) * 2 CONV_BK + 16 KiB (staging) + 2 KiB.
 * map_x: 4-D im2col map (cuTensorMapEncodeIm2col) over (C, W, H, N), CONV_BK channels by 128
 * pixels, element strides (1, stride_w, stride_h, 1), corners (-pad_w, -pad_h) and (pad_w - dil_w
 * (S - 1), pad_h - dil_h (R - 1)); map_w: 3-D tile map over (C, R S, K), box (CONV_BK, 1,
 * CONV_BN); both 16-bit elements, the swizzle 2 CONV_BK bytes wide, zero fill. y_vec, how y is
 * written: 1 channels-last, 16-byte aligned, K a multiple of 8 (16-byte stores through the
 * staging, edge tiles too); 0 channels-last element stores (K odd too); 2 y in planes, N x K x
 * Ho x Wo (NCHW), any alignment, transposed through the staging (conv_store_planes), so that an
 * NCHW convolution's output needs no channels-last copy moved back. Sizes, strides, padding and dilation are arguments.
 * The epilogue (tma_wgmma.h's TmEpilogue): scale and shift, K floats each (or both null), res,
 * a tensor laid out as y (or null), relu 0 or 1: a batch norm, residual addition and ReLU fused.
 */
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "conv_tma.cu is CUDA only"
#endif

#if !defined(CONV_BN) || !defined(CONV_STAGES)
#error "conv_tma.cu needs -DCONV_BN (64, 128 or 256) and -DCONV_STAGES"
#endif

#ifndef CONV_BK
#define CONV_BK 64
#endif
#define TM_BN CONV_BN
#define TM_STAGES CONV_STAGES
#define TM_BK CONV_BK
#define TM_TA 0 /* both tiles K-major: channels contiguous */
#define TM_TB 0
#include "tma_wgmma.h"

/* y_vec 2: a consumer warpgroup's 64 rows (output pixels) of tile (tm, tn) into y's planes,
 * each value at its pixel's image, its channel's plane and its place in the plane (the
 * epilogue's residual read at the same place). 64 channels at a time go through the
 * warpgroup's staging (its four warps' areas, 8 KiB) transposed: stmatrix.trans puts each
 * channel's 64 pixels in one 128-byte row (16-byte chunks swizzled by channel), then each warp
 * writes 16 channels, a channel an instruction: 4 bytes a lane (two neighbouring pixels of one
 * image, at a 4-byte aligned address), else two 2-byte stores, so that an instruction writes up to 128
 * contiguous bytes of a plane rather than 16-byte pieces of four. d[4j + 0..1]: row r,
 * columns 8j + 2 (lane % 4) and the next; d[4j + 2..3]: row r + 8 (tma_wgmma.h's tm_store). */
__device__ __forceinline__ void conv_store_planes(const float* d, unsigned short* y, int tm, int tn, int M, int K,
                                                  int plane, unsigned int staging, int half, int warp, int lane,
                                                  const TmEpilogue& ep)
{
    const unsigned int block = staging + half * 4 * TM_STAGING_BYTES;
    const int first = tm * TM_BM + half * 64, cols_in = K - tn * TM_BN, quad = lane / 8;
    /* This lane's two pixels at the stores, and their places in their images' first planes. */
    const int row = first + 2 * lane, n0 = row / plane, n1 = (row + 1) / plane;
    const bool in0 = row < M, in1 = row + 1 < M, one_image = n0 == n1;
    const long at0 = (long)n0 * K * plane + (row - n0 * plane), at1 = (long)n1 * K * plane + (row + 1 - n1 * plane);
    /* y (and the residual) may start 2 bytes off 4: a pair is stored whole only where its address
     * is 4-byte aligned in both. */
    const int y_odd = (int)(((unsigned long long)y >> 1) & 1);
    const bool res_even = !ep.res || (int)(((unsigned long long)ep.res >> 1) & 1) == y_odd;
#pragma unroll
    for (int part = 0; part < TM_BN / 64; ++part) {
        if (part * 64 >= cols_in) /* the same for the whole warpgroup: its barriers stay matched */
            break;
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            /* matrices: columns 8j0.. rows 0-7 and 8-15, then columns 8j0 + 8.. the same; stored
             * transposed, lane 8m + i names matrix m's channel i */
            const int j0 = part * 8 + 2 * p, ch = 16 * p + 8 * (quad >> 1) + lane % 8;
            const unsigned int at = block + ch * 128 + (((2 * warp + (quad & 1)) ^ (ch & 7)) << 4);
            float e[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int col = tn * TM_BN + 8 * (j0 + q / 4) + 2 * (lane % 4) + (q & 1);
                e[q] = col < K ? tm_affine(d[4 * j0 + q], col, ep) : 0.0f; /* scale and shift end at K */
            }
            asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(at),
                         "r"(tm_pack(e[0], e[1])), "r"(tm_pack(e[2], e[3])), "r"(tm_pack(e[4], e[5])),
                         "r"(tm_pack(e[6], e[7]))
                         : "memory");
        }
        asm volatile("bar.sync %0, 128;" ::"r"(1 + half) : "memory");
#pragma unroll 4
        for (int c = 0; c < 16; ++c) {
            const int ch = 16 * warp + c, col = tn * TM_BN + part * 64 + ch;
            if (col >= K || !in0)
                continue;
            unsigned int v;
            asm volatile("ld.shared.u32 %0, [%1];"
                         : "=r"(v)
                         : "r"(block + ch * 128 + (((lane / 4) ^ (ch & 7)) << 4) + 4 * (lane % 4)));
            const long o0 = at0 + (long)col * plane, o1 = at1 + (long)col * plane;
            if (in1 && one_image && res_even && !((o0 + y_odd) & 1)) {
                if (ep.res)
                    v = tm_add_pair(v, *(const unsigned int*)(ep.res + o0), ep.relu);
                *(unsigned int*)(y + o0) = v;
                continue;
            }
            for (int i = 0; i < 2; ++i) {
                if (i == 1 && !in1)
                    break;
                const long o = i ? o1 : o0;
                unsigned short value = (unsigned short)(v >> (16 * i));
                if (ep.res) { /* the sum of two stored values, as the pairs' */
                    const float sum = tc_to_float(value) + tc_to_float(ep.res[o]);
                    value = tc_from_float(ep.relu ? fmaxf(sum, 0.0f) : sum);
                }
                y[o] = value;
            }
        }
        asm volatile("bar.sync %0, 128;" ::"r"(1 + half) : "memory"); /* read before the next part overwrites it */
    }
}

extern "C" __global__ void __launch_bounds__(384, 1)
conv_fwd_tma(const __grid_constant__ TmaMap map_x, const __grid_constant__ TmaMap map_w, unsigned short* y, int M,
             int K, int C, int Ho, int Wo, int S, int pad_h, int pad_w, int stride_h, int stride_w, int dil_h,
             int dil_w, int taps, int y_vec, const float* scale, const float* shift, const unsigned short* res,
             int relu)
{
    extern __shared__ __align__(16) unsigned char tm_raw[];
    const auto [base, staging, full, empty] = tm_layout(tm_raw);
    const int t = threadIdx.x, warpgroup = t / 128;
    const int tiles_m = (M + TM_BM - 1) / TM_BM, tiles_n = (K + CONV_BN - 1) / CONV_BN, tiles = tiles_m * tiles_n;
    const int c_steps = (C + TM_BK - 1) / TM_BK, k_steps = taps * c_steps;

    tm_init_barriers(full, empty);

    if (warpgroup == 0) {
        tm_producer_start();
        if (t == 0) {
            asm volatile("prefetch.tensormap [%0];" ::"l"((unsigned long long)&map_x) : "memory");
            asm volatile("prefetch.tensormap [%0];" ::"l"((unsigned long long)&map_w) : "memory");
            const int plane = Ho * Wo;
            unsigned int stage = 0, phase = 0;
            for (int id = blockIdx.x; id < tiles; id += gridDim.x) {
                int tm, tn, z;
                tm_tile(id, tiles_m, tiles_n, &tm, &tn, &z);
                /* The tile's first output pixel and the top-left corner of its filter window. */
                const int m0 = tm * TM_BM, n = m0 / plane, ho = (m0 - n * plane) / Wo, wo = m0 - n * plane - ho * Wo;
                const int h0 = ho * stride_h - pad_h, w0 = wo * stride_w - pad_w, k0 = tn * CONV_BN;
                int r = 0, s = 0, c0 = 0;
                for (int ks = 0; ks < k_steps; ++ks) {
                    const unsigned int bar = full + 8 * stage, as = base + stage * TM_STAGE_BYTES, bs = as + TM_A_BYTES;
                    tm_bar_wait(empty + 8 * stage, phase ^ 1); /* a fresh barrier passes parity 1 */
                    tm_bar_expect(bar, TM_STAGE_BYTES);        /* boxes past the edges count whole, zero-filled */
                    tm_load_im2col(as, &map_x, c0, w0, h0, n, (unsigned short)(s * dil_w), (unsigned short)(r * dil_h),
                                   bar);
                    tm_load(bs, &map_w, c0, r * S + s, k0, bar);
                    tm_next_stage(stage, phase);
                    /* the next step: CONV_BK channels on, or the next tap */
                    c0 += TM_BK;
                    if (c0 >= C) {
                        c0 = 0;
                        if (++s == S) {
                            s = 0;
                            ++r;
                        }
                    }
                }
            }
        }
    } else {
        tm_consumer_start();
        const int half = warpgroup - 1, wt = t % 128, warp = wt / 32, lane = t % 32;
        float d[TM_ACC];
#pragma unroll
        for (int i = 0; i < TM_ACC; ++i)
            d[i] = 0.0f;
        unsigned int stage = 0, phase = 0;
        for (int id = blockIdx.x; id < tiles; id += gridDim.x) {
            int tm, tn, z;
            tm_tile(id, tiles_m, tiles_n, &tm, &tn, &z);
            tm_consume(d, base, full, empty, stage, phase, k_steps, half, wt);
            if (y_vec == 2)
                conv_store_planes(d, y, tm, tn, M, K, Ho * Wo, staging, half, warp, lane,
                                  TmEpilogue{scale, shift, res, relu});
            else
                tm_store(d, y, tm, tn, M, K, K, y_vec, 1.0f, 0.0f, staging, half, warp, lane,
                         TmEpilogue{scale, shift, res, relu});
        }
    }
}
