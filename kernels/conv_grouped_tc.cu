/* conv_grouped_tc.cu: forward grouped convolution (depthwise included) of NHWC tensors on the
 * tensor cores (mma.sync m16n8k16, sm_80+), fp16 or bf16 in, fp32 accumulation.
 *
 * Groups of cg input and kg output channels are too narrow for a GEMM tile, so `f` neighbouring
 * groups are taken as one "supergroup" of CG = f cg inputs and KG = f kg outputs, both multiples
 * of 8, whose weights are block-diagonal (zeros across groups): f = 2 for ResNeXt's 4 channels a
 * group, 8 for a depthwise convolution. The zeros cost multiplies, never memory traffic, and the
 * tensor cores are not what bounds these layers.
 *
 * A block takes an output tile of one image: TH x TW positions by SGB supergroups (KS = SGB KG
 * output channels). It copies the tile's input window (the halo: every pixel the tile's filters
 * touch, its CS = SGB CG channels, zeros outside the image) and the supergroups' weights,
 * expanded to [k][tap][CG], into shared memory once; each input element is read once per tile.
 * Then each warp takes units of MU m16 tiles of positions by one supergroup: for each 16 of
 * the reduction (two taps' 8 channels where CG = 8), A's 16 x 16 fragment comes straight out
 * of the halo by ldmatrix (each lane names its position's pixel and tap: no im2col), B's
 * KG x 16 out of the weights, MU x NT mma.sync each. The sums go through a shared output tile
 * to y: 16-byte stores along the channels (NHWC), or along the rows of each output channel
 * (out_nchw).
 *
 * Options: -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16 (required).
 * Arguments: x (NHWC, 16-byte aligned, C a multiple of 8), w (packed K x Y X x CG rows, 16-byte
 *   aligned: the user's KYXC weights where f = 1, else conv_grouped_weights's expansion), y,
 *   conv_shape.h's CONV_SHAPE_ARGS (the strides are not read), then out_nchw (y packed NCHW,
 *   else NHWC), f, TH, TW (TH TW <= GC_THREADS), SGB.
 * Kernels: conv_grouped_fwd_k8/k16/k32/k64, by KG; conv_grouped_weights (1-D, any grid).
 * Launch: GC_THREADS (256) threads, grid (ceil(Ho / TH) ceil(Wo / TW), G / (f SGB), N), dynamic
 *   shared memory as grouped_tc.py's shared_bytes (the halo, the weights, the output tile and
 *   8 zeros).
 */
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "conv_grouped_tc.cu is CUDA only (tensor cores through mma.sync)"
#endif

#include "tc_types.h"
#include "conv_shape.h"

#define GC_THREADS 256
#define GC_WARPS (GC_THREADS / 32)
#define GC_MMA "mma.sync.aligned.m16n8k16.row.col.f32." TC_TYPE "." TC_TYPE ".f32"

__device__ __forceinline__ unsigned int gc_smem(const void* p)
{
    return (unsigned int)__cvta_generic_to_shared(p);
}

/* 16 bytes from global to shared, or 16 zeros where !valid (nothing is read then). */
__device__ __forceinline__ void gc_copy16(void* shared, const void* global, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(gc_smem(shared)), "l"(global),
                 "r"(valid ? 16 : 0));
}

/* Rows of shared memory padded by 16 bytes where their count of 16-byte pieces is even, so that
 * the 8 rows an ldmatrix reads fall in different banks. */
__device__ __forceinline__ int gc_padded(int halves)
{
    return halves + ((halves / 8) % 2 == 0 ? 8 : 0);
}

/* NT: KG / 8, the supergroup's n8 tiles (1, 2, 4 or 8). */
template <int NT>
__device__ __forceinline__ void conv_grouped_body(const unsigned short* __restrict__ x,
                                                  const unsigned short* __restrict__ w,
                                                  unsigned short* __restrict__ y, int N, int C, int H, int W, int K,
                                                  int Ho, int Wo, int Y, int X, int ph, int pw, int sh, int sw,
                                                  int dlh, int dlw, int G, int ws0, int ws1, int ws2, int ws3,
                                                  int out_nchw, int f, int TH, int TW, int SGB)
{
    constexpr int MU = NT >= 8 ? 1 : NT == 4 ? 2 : 4; /* m16 tiles a unit: A's fragments serve NT mma, B's MU */
    constexpr int KG = 8 * NT;
    extern __shared__ __align__(16) unsigned short gc_tiles[];
    const int cg = C / G, CG = f * cg;
    const int CS = SGB * CG, KS = SGB * KG, TAPS = Y * X, P = TH * TW, MROWS = (P + 15) / 16 * 16;
    const int HH = (TH - 1) * sh + (Y - 1) * dlh + 1, WW = (TW - 1) * sw + (X - 1) * dlw + 1;
    /* weight rows: the reduction rounded up to whole k16 steps (zeros), then 16 bytes of padding */
    const int PIX = gc_padded(CS), WLEN = (TAPS * CG + 15) / 16 * 16, WROW = WLEN + 8;
    const int OROW = out_nchw ? MROWS + 8 : KS + 8; /* the output tile's rows: [k][p] or [p][k] */
    unsigned short* halo = gc_tiles;
    unsigned short* wts = halo + HH * WW * PIX;
    unsigned short* out = wts + KS * WROW;
    unsigned short* zero = out + (out_nchw ? KS : MROWS) * OROW; /* 8 zeros: A's rows past the last tap */

    const int tiles_w = (Wo + TW - 1) / TW;
    const int i0 = (int)(blockIdx.x / tiles_w) * TH, j0 = (int)(blockIdx.x % tiles_w) * TW;
    const int c0 = blockIdx.y * CS, k0 = blockIdx.y * KS, n = blockIdx.z;
    const int h0 = i0 * sh - ph, v0 = j0 * sw - pw;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;

    /* The halo: HH x WW pixels of CS channels, 16 bytes a copy: thread t copies piece t % pieces
     * of pixels t / pieces + s (GC_THREADS / pieces), walked without a division per copy. */
    {
        const int pieces = CS / 8, step = GC_THREADS / pieces, q = t % pieces;
        const unsigned short* xn = x + (long)n * H * W * C + c0 + 8 * q;
        int pix = t / pieces, hh = pix / WW, ww = pix - hh * WW;
        const int step_h = step / WW, step_w = step - step_h * WW;
        if (t < step * pieces)
            for (; pix < HH * WW; pix += step) {
                const int h = h0 + hh, v = v0 + ww;
                const bool inside = h >= 0 && h < H && v >= 0 && v < W;
                gc_copy16(halo + pix * PIX + 8 * q, inside ? xn + ((long)h * W + v) * C : x, inside);
                hh += step_h;
                ww += step_w;
                if (ww >= WW) {
                    ww -= WW;
                    ++hh;
                }
            }
    }
    /* The weights, packed [k][tap][CG] rows (the user's KYXC where f = 1, else
     * conv_grouped_weights's), 16 bytes a copy. */
    {
        const int pieces = TAPS * CG / 8;
        const unsigned short* wk = w + (long)k0 * TAPS * CG;
        for (int e = t; e < KS * pieces; e += GC_THREADS) {
            const int k = e / pieces, q = e - k * pieces;
            gc_copy16(wts + k * WROW + 8 * q, wk + (long)e * 8, true);
        }
    }
    if (t < 8)
        zero[t] = 0;
    if (WLEN != TAPS * CG)
        for (int k = t; k < KS; k += GC_THREADS)
            *(uint4*)(wts + k * WROW + TAPS * CG) = make_uint4(0, 0, 0, 0);
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();

    const int group = lane >> 2, tig = lane & 3;
    /* The reduction r = tap CG + channel (w's KYXC order) 16 at a time: m16n8k16 steps, A's
     * matrices 0-1 (lanes 0-15) at r, 2-3 (lanes 16-31) at r + 8: 8 channels of one tap, so a
     * step takes two taps where CG = 8; past the last tap A reads zeros (B's weights there are
     * whatever follows the row, times zero). This lane's first (tap row, tap column, channel). */
    const int steps = (TAPS * CG + 15) / 16, r_lane = 8 * (lane / 16);
    const int first_tap = r_lane / CG, first_c = r_lane - first_tap * CG;
    const int mgroups = (MROWS / 16 + MU - 1) / MU, units = mgroups * SGB;
    const unsigned int zero_row = gc_smem(zero);
    int row_mg = -1;
    unsigned int a_row[MU];
    for (int u = warp; u < units; u += GC_WARPS) {
        const int sg = u % SGB, mg = u / SGB;
        /* This lane's A row for each of the unit's m16 tiles (lanes 0-15 and 16-31 both name rows
         * 0-15): its position's pixel at tap (0, 0), found again only where the tiles change. Rows
         * past the tile repeat its last position (their sums are never stored). */
        if (mg != row_mg) {
            row_mg = mg;
#pragma unroll
            for (int mu = 0; mu < MU; ++mu) {
                const int p = min((mg * MU + mu) * 16 + lane % 16, P - 1), ti = p / TW, tj = p - ti * TW;
                a_row[mu] = gc_smem(halo + (ti * sh * WW + tj * sw) * PIX);
            }
        }
        const unsigned int a_sg = 2 * sg * CG;
        /* B: lanes 8 q .. 8 q + 7 name rows of n8 tile q / 2 at r + 8 (q % 2): one x2 load per
         * tile for NT = 1, one x4 load per pair of tiles else. */
        const unsigned int b_row =
            gc_smem(wts + (sg * KG + (NT == 1 ? 0 : lane / 16) * 8 + lane % 8) * WROW + 8 * ((lane / 8) % 2));
        float acc[MU][NT][4];
#pragma unroll
        for (int mu = 0; mu < MU; ++mu)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    acc[mu][j][e] = 0.0f;
        int ta = first_tap / X, tb = first_tap - (first_tap / X) * X, c = first_c;
        for (int step = 0; step < steps; ++step) {
            const bool live = ta < Y;
            const unsigned int a_off = a_sg + 2 * ((ta * dlh * WW + tb * dlw) * PIX + c);
            unsigned int fa[MU][4], fb[NT][2];
#pragma unroll
            for (int mu = 0; mu < MU; ++mu)
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(fa[mu][0]), "=r"(fa[mu][1]), "=r"(fa[mu][2]), "=r"(fa[mu][3])
                             : "r"(live ? a_row[mu] + a_off : zero_row));
            if (NT == 1) {
                asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
                             : "=r"(fb[0][0]), "=r"(fb[0][1])
                             : "r"(b_row + 32 * step));
            } else {
#pragma unroll
                for (int j = 0; j < NT; j += 2)
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                                 : "=r"(fb[j][0]), "=r"(fb[j][1]), "=r"(fb[(j + 1) % NT][0]), "=r"(fb[(j + 1) % NT][1])
                                 : "r"(b_row + 32 * step + 2 * 8 * j * WROW));
            }
#pragma unroll
            for (int mu = 0; mu < MU; ++mu)
#pragma unroll
                for (int j = 0; j < NT; ++j)
                    asm(GC_MMA " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                        : "+f"(acc[mu][j][0]), "+f"(acc[mu][j][1]), "+f"(acc[mu][j][2]), "+f"(acc[mu][j][3])
                        : "r"(fa[mu][0]), "r"(fa[mu][1]), "r"(fa[mu][2]), "r"(fa[mu][3]), "r"(fb[j][0]),
                          "r"(fb[j][1]));
            for (c += 16; c >= CG; c -= CG)
                if (++tb == X) {
                    tb = 0;
                    ++ta;
                }
        }
        /* Into the output tile, rounded to the type. */
#pragma unroll
        for (int mu = 0; mu < MU; ++mu) {
            if ((mg * MU + mu) * 16 >= MROWS)
                continue;
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int r = (mg * MU + mu) * 16 + group + 8 * half, c = sg * KG + 8 * j + 2 * tig;
                    const unsigned short lo = tc_from_float(acc[mu][j][2 * half]);
                    const unsigned short hi = tc_from_float(acc[mu][j][2 * half + 1]);
                    if (out_nchw) {
                        out[c * OROW + r] = lo;
                        out[(c + 1) * OROW + r] = hi;
                    } else {
                        *(unsigned int*)(out + r * OROW + c) = (unsigned int)lo | ((unsigned int)hi << 16);
                    }
                }
        }
    }
    __syncthreads();
    if (out_nchw) {
        /* Each output channel's positions along y's rows: thread t takes position t % P of
         * channels t / P + s (GC_THREADS / P). */
        const int step = GC_THREADS / P, p = t % P, ti = p / TW, tj = p - ti * TW, i = i0 + ti, j = j0 + tj;
        if (t < step * P && i < Ho && j < Wo)
            for (int k = t / P; k < KS; k += step)
                y[(((long)n * K + k0 + k) * Ho + i) * Wo + j] = out[k * OROW + p];
        return;
    }
    /* Each position's KS channels, 16 bytes a store: thread t stores piece t % pieces of
     * positions t / pieces + s (GC_THREADS / pieces). */
    const int pieces = KS / 8, step = GC_THREADS / pieces, q = t % pieces;
    if (t >= step * pieces)
        return;
    int p = t / pieces, ti = p / TW, tj = p - ti * TW;
    const int step_i = step / TW, step_j = step - step_i * TW;
    for (; p < P; p += step) {
        const int i = i0 + ti, j = j0 + tj;
        if (i < Ho && j < Wo)
            *(uint4*)(y + (((long)n * Ho + i) * Wo + j) * K + k0 + 8 * q) = *(const uint4*)(out + p * OROW + 8 * q);
        ti += step_i;
        tj += step_j;
        if (tj >= TW) {
            tj -= TW;
            ++ti;
        }
    }
}

/* wp (K x Y X x f cg, packed) = w's weights (read through its strides, K x cg x Y x X) placed
 * at their group's channels of the supergroup, zeros elsewhere: the rows conv_grouped_fwd_*
 * copies where f > 1 or w is not packed KYXC. One thread an element of wp. */
extern "C" __global__ void conv_grouped_weights(const unsigned short* __restrict__ w, unsigned short* __restrict__ wp,
                                                int K, int G, int cg, int f, int Y, int X, int ws0, int ws1, int ws2,
                                                int ws3)
{
    const int CG = f * cg, kg = K / G, KG = f * kg, taps = Y * X;
    const int total = K * taps * CG; /* small: the solver checks the weights' sizes */
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += blockDim.x * gridDim.x) {
        const int c = e % CG, tap = e / CG % taps, k = e / (CG * taps);
        const int a = tap / X, b = tap - a * X, ci = c - (k % KG) / kg * cg; /* the channel within k's group */
        wp[e] = ci >= 0 && ci < cg ? w[(long)k * ws0 + (long)ci * ws1 + (long)a * ws2 + (long)b * ws3] : 0;
    }
}

#define GC_KERNEL(NAME, NT)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GC_THREADS)                                                 \
    NAME(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w,                       \
         unsigned short* __restrict__ y, CONV_SHAPE_ARGS, int out_nchw, int f, int TH, int TW, int SGB)        \
    {                                                                                                        \
        conv_grouped_body<NT>(x, w, y, N, C, H, W, K, Ho, Wo, Y, X, ph, pw, sh, sw, dlh, dlw, G, ws0, ws1, ws2, \
                              ws3, out_nchw, f, TH, TW, SGB);                                         \
    }

GC_KERNEL(conv_grouped_fwd_k8, 1)
GC_KERNEL(conv_grouped_fwd_k16, 2)
GC_KERNEL(conv_grouped_fwd_k32, 4)
GC_KERNEL(conv_grouped_fwd_k64, 8)
