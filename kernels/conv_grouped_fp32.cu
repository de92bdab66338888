/* conv_grouped_fp32.cu: forward grouped convolution of fp32 tensors on the CUDA cores, for
 * groups of few output channels (ResNeXt's 4 and 8 a group), any layout: x, w and y are read
 * and written through their element strides, so NCHW and NHWC need no staging.
 *
 * Groups that narrow make a GEMM of a handful of columns per group, which the implicit GEMM's
 * tiles mostly waste; here a block takes an output tile of one image, TH x TW positions by SGB
 * whole groups, and copies the tile's input window (the halo: every pixel its filters touch,
 * zeros outside the image) of the groups' channels and their weights into shared memory once.
 * Each thread then computes all KT = kg outputs of one group at GF_PY output rows of one
 * column: per input channel and tap GF_PY halo reads and KT weights (the same for the lanes of
 * a group: a broadcast) feed GF_PY KT fused multiply-adds, in fp32 throughout.
 *
 * The halo is kept one plane per channel ([c][hh][ww], the plane's stride odd so that a
 * channels-fastest copy's lanes fall in different banks); lanes take neighbouring columns, so
 * the reads along a row are conflict-free at stride 1. Outputs go straight to y where its
 * columns are contiguous (NCHW); where its channels are (NHWC) they pass through a shared
 * tile ([position][channel], over the halo) so that the stores run along the channels.
 *
 * Arguments: x, w (K x cg x Y x X through its strides), y, conv_shape.h's CONV_SHAPE_ARGS,
 *   then TH (a multiple of GF_PY), TW, SGB.
 * Kernels: conv_grouped_f32_k2/k4/k8, by kg (KT).
 * Launch: TW (TH / GF_PY) SGB threads (at most GF_THREADS), grid (ceil(Ho / TH) ceil(Wo / TW),
 *   G / SGB, N), dynamic shared memory as grouped_fp32.py's shared_bytes.
 */
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "conv_grouped_fp32.cu is CUDA only (cp.async)"
#endif

#include "conv_shape.h"

#define GF_THREADS 256
#define GF_PY 4 /* output rows a thread */

/* 4 bytes from global to shared, or a zero where !valid (nothing is read then). */
__device__ __forceinline__ void gf_copy4(float* shared, const float* global, bool valid)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"((unsigned int)__cvta_generic_to_shared(shared)),
                 "l"(global), "r"(valid ? 4 : 0));
}

template <int KT>
__device__ __forceinline__ void conv_grouped_f32_body(const float* __restrict__ x, const float* __restrict__ w,
                                                      float* __restrict__ y, int N, int C, int H, int W, int K, int Ho,
                                                      int Wo, int Y, int X, int ph, int pw, int sh, int sw, int dlh,
                                                      int dlw, int G, int xs0, int xs1, int xs2, int xs3, int ws0,
                                                      int ws1, int ws2, int ws3, int ys0, int ys1, int ys2, int ys3,
                                                      int TH, int TW, int SGB)
{
    extern __shared__ __align__(16) float gf_tiles[];
    const int cg = C / G, CS = SGB * cg, KS = SGB * KT, TAPS = Y * X, RB = TH / GF_PY;
    const int HH = (TH - 1) * sh + (Y - 1) * dlh + 1, WW = (TW - 1) * sw + (X - 1) * dlw + 1;
    const int PL = (HH * WW) | 1;  /* a channel's plane: odd, so that channels fall in different banks */
    const int OROW = KS + 1;       /* the NHWC output tile's rows: odd likewise */
    const int FRONT = (max(CS * PL, TH * TW * OROW) + 3) / 4 * 4; /* the halo, later the output tile */
    float* halo = gf_tiles;
    float* wts = gf_tiles + FRONT; /* [group][c][tap][KT] */

    const int tiles_w = (Wo + TW - 1) / TW;
    const int i0 = (int)(blockIdx.x / tiles_w) * TH, j0 = (int)(blockIdx.x % tiles_w) * TW;
    const int c0 = blockIdx.y * CS, k0 = blockIdx.y * KS, n = blockIdx.z;
    const int h0 = i0 * sh - ph, v0 = j0 * sw - pw;
    const int t = threadIdx.x, threads = blockDim.x;
    const float* xn = x + (long)n * xs0 + (long)c0 * xs1;

    if (xs1 == 1) {
        /* channels fastest (NHWC): thread t copies channel t % CS of pixels t / CS + s (threads / CS) */
        const int step = threads / CS, c = t % CS, step_h = step / WW, step_w = step - step_h * WW;
        int pix = t / CS, hh = pix / WW, ww = pix - hh * WW;
        if (t < step * CS)
            for (; pix < HH * WW; pix += step) {
                const int h = h0 + hh, v = v0 + ww;
                const bool inside = h >= 0 && h < H && v >= 0 && v < W;
                gf_copy4(halo + c * PL + pix, inside ? xn + (long)c * xs1 + (long)h * xs2 + (long)v * xs3 : x, inside);
                hh += step_h;
                ww += step_w;
                if (ww >= WW) {
                    ww -= WW;
                    ++hh;
                }
            }
    } else {
        /* rows fastest (NCHW): thread t copies column t % WW of rows (channel, hh) t / WW + s (threads / WW) */
        const int step = threads / WW, ww = t % WW, step_c = step / HH, step_h = step - step_c * HH;
        int row = t / WW, c = row / HH, hh = row - c * HH;
        const int v = v0 + ww;
        if (t < step * WW)
            for (; row < CS * HH; row += step) {
                const int h = h0 + hh;
                const bool inside = h >= 0 && h < H && v >= 0 && v < W;
                gf_copy4(halo + c * PL + hh * WW + ww, inside ? xn + (long)c * xs1 + (long)h * xs2 + (long)v * xs3 : x,
                         inside);
                c += step_c;
                hh += step_h;
                if (hh >= HH) {
                    hh -= HH;
                    ++c;
                }
            }
    }
    /* The weights of the block's KS outputs, [group][c][tap][KT]: element e of that order. */
    for (int e = t; e < KS * cg * TAPS; e += threads) {
        const int kk = e % KT, tap = e / KT % TAPS, ci = e / (KT * TAPS) % cg, gl = e / (KT * TAPS * cg);
        const int a = tap / X, b = tap - a * X;
        gf_copy4(wts + e, w + (long)(k0 + gl * KT + kk) * ws0 + (long)ci * ws1 + (long)a * ws2 + (long)b * ws3, true);
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();

    /* This thread: column j, rows rb GF_PY + q of the tile, the KT outputs of group sgi. */
    const int j = t % TW, rb = t / TW % RB, sgi = t / (TW * RB);
    float acc[GF_PY][KT];
#pragma unroll
    for (int q = 0; q < GF_PY; ++q)
#pragma unroll
        for (int kk = 0; kk < KT; ++kk)
            acc[q][kk] = 0.0f;
    if (sgi < SGB) {
        const float* xg = halo + sgi * cg * PL + rb * GF_PY * sh * WW + j * sw;
        const float* wg = wts + sgi * cg * TAPS * KT;
        const int row = sh * WW;
        for (int c = 0; c < cg; ++c)
            for (int a = 0; a < Y; ++a) {
                const float* xr = xg + c * PL + a * dlh * WW;
                const float* wr = wg + (c * TAPS + a * X) * KT;
#pragma unroll 3
                for (int b = 0; b < X; ++b) {
                    float v[GF_PY], wv[KT];
#pragma unroll
                    for (int q = 0; q < GF_PY; ++q)
                        v[q] = xr[q * row + b * dlw];
                    if (KT == 2) {
                        const float2 p = *(const float2*)(wr + b * KT);
                        wv[0] = p.x;
                        wv[1 % KT] = p.y;
                    } else {
#pragma unroll
                        for (int kk = 0; kk < KT; kk += 4) {
                            const float4 p = *(const float4*)(wr + b * KT + kk);
                            wv[kk] = p.x;
                            wv[(kk + 1) % KT] = p.y;
                            wv[(kk + 2) % KT] = p.z;
                            wv[(kk + 3) % KT] = p.w;
                        }
                    }
#pragma unroll
                    for (int q = 0; q < GF_PY; ++q)
#pragma unroll
                        for (int kk = 0; kk < KT; ++kk)
                            acc[q][kk] = fmaf(v[q], wv[kk], acc[q][kk]);
                }
            }
    }

    const int k = k0 + sgi * KT;
    if (ys1 != 1) {
        /* columns contiguous (NCHW): lanes store neighbouring columns */
        const int jo = j0 + j;
        if (sgi < SGB && jo < Wo)
#pragma unroll
            for (int q = 0; q < GF_PY; ++q) {
                const int i = i0 + rb * GF_PY + q;
                if (i < Ho)
#pragma unroll
                    for (int kk = 0; kk < KT; ++kk)
                        y[(long)n * ys0 + (long)(k + kk) * ys1 + (long)i * ys2 + (long)jo * ys3] = acc[q][kk];
            }
        return;
    }
    /* channels contiguous (NHWC): through the output tile [position][channel] over the halo */
    __syncthreads();
    float* out = gf_tiles;
    if (sgi < SGB)
#pragma unroll
        for (int q = 0; q < GF_PY; ++q)
#pragma unroll
            for (int kk = 0; kk < KT; ++kk)
                out[((rb * GF_PY + q) * TW + j) * OROW + sgi * KT + kk] = acc[q][kk];
    __syncthreads();
    /* thread t stores channel t % KS of positions t / KS + s (threads / KS) */
    const int step = threads / KS, kc = t % KS, step_i = step / TW, step_j = step - step_i * TW;
    if (t >= step * KS)
        return;
    int p = t / KS, ti = p / TW, tj = p - ti * TW;
    float* yk = y + (long)n * ys0 + k0 + kc;
    for (; p < TH * TW; p += step) {
        const int i = i0 + ti, jo = j0 + tj;
        if (i < Ho && jo < Wo)
            yk[(long)i * ys2 + (long)jo * ys3] = out[p * OROW + kc];
        ti += step_i;
        tj += step_j;
        if (tj >= TW) {
            tj -= TW;
            ++ti;
        }
    }
}

#define GF_KERNEL(NAME, KT)                                                                                    \
    extern "C" __global__ void __launch_bounds__(GF_THREADS)                                                   \
    NAME(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, CONV_SHAPE_ARGS,     \
         int TH, int TW, int SGB)                                                                              \
    {                                                                                                          \
        conv_grouped_f32_body<KT>(x, w, y, N, C, H, W, K, Ho, Wo, Y, X, ph, pw, sh, sw, dlh, dlw, G, xs0, xs1, xs2, \
                                  xs3, ws0, ws1, ws2, ws3, ys0, ys1, ys2, ys3, TH, TW, SGB);                    \
    }

GF_KERNEL(conv_grouped_f32_k2, 2)
GF_KERNEL(conv_grouped_f32_k4, 4)
GF_KERNEL(conv_grouped_f32_k8, 8)
