/* conv_igemm_tc.cu: forward convolution of NHWC tensors as an implicit GEMM on the tensor
 * cores (mma.sync, sm_80+), fp16 or bf16 in, fp32 accumulation; no workspace, no im2col.
 *
 * The GEMM: rows m = (n, i, j) the output positions (M = N Ho Wo), columns the output
 * channels (K), the reduction r = (a, b, c) over the filter's taps and the input channels
 * (R = Y X C), in KYXC order as the weights hold it. y (M x K) is NHWC as it comes out. A
 * block computes a 128 x 128 tile of y with 4 warps (64 x 64 each, m16n8k16 steps), the
 * reduction 32 channels of one tap at a time (C a multiple of 32): each row of A's tile is
 * then 64 contiguous bytes of x at one input pixel, or zeros in the padding, copied with
 * 16-byte cp.async (a zero source size fills zeros) into 4 shared-memory stages, three in
 * flight while one computes; B's tile, 32 contiguous weights of each of 128 output channels,
 * the same way. Fragments come through ldmatrix (B stored [k_out][r]: no transpose).
 *
 * Options: -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16 (required).
 * Arguments: x, w, y, partial (fp32, gridDim.z x M x K: read only when split), then
 *   conv_shape.h's CONV_SHAPE_ARGS (the strides are not read: x and w are packed NHWC, 16-byte
 *   aligned), then out_nchw: y packed NHWC (0), or packed NCHW (1: the tile transposed on its
 *   way out, so that an NCHW convolution needs no staging of y).
 * Split reduction: with gridDim.z > 1 each z takes a run of the reduction's tiles and writes
 *   its fp32 sums to its slab of partial; conv_igemm_split_finish adds the slabs into y (for
 *   grids too small to fill the GPU: few output positions, a long reduction).
 * Kernels: conv_igemm_fwd_nhwc (C a multiple of 32), conv_igemm_fwd_nhwc_c8 (C a multiple of 8,
 *   as an NCHW first layer's 3 channels are once the solver stages them widened),
 *   conv_igemm_fwd_nhwc_any (any C: element loads).
 * Launch: blocks of 128 threads, grid (ceil(K / 128), ceil(N Ho Wo / 128), slices), 81,920 bytes of
 *   dynamic shared memory.
 */
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "conv_igemm_tc.cu is CUDA only (tensor cores through mma.sync)"
#endif

#include "tc_types.h"
#include "conv_shape.h"

#define IG_MMA "mma.sync.aligned.m16n8k16.row.col.f32." TC_TYPE "." TC_TYPE ".f32"
#define IG_BM 128
#define IG_BN 128
#define IG_BK 32
#define IG_PAD 8 /* halves per shared row: the ldmatrix rows spread over the banks */
#define IG_STAGES 4
#define IG_THREADS 128
#define IG_ROW (IG_BK + IG_PAD)
#define IG_STAGE (IG_BM * IG_ROW + IG_BN * IG_ROW)
#define IG_CHUNKS (IG_BM * IG_BK / 8 / IG_THREADS) /* 16-byte copies per thread and operand */
#define IG_OUT_ROW (IG_BN + 8) /* halves per row of the output tile in shared memory: no bank conflicts */

__device__ __forceinline__ unsigned int ig_smem(const void* p)
{
    return (unsigned int)__cvta_generic_to_shared(p);
}

/* A warp's 64 x 64 accumulators (4 x 8 mma tiles of 16 x 8, 4 floats a thread each): zeroed,
 * and one k16 step of every tile from A's 4 and B's 8 fragments. */
__device__ __forceinline__ void ig_zero(float (&acc)[4][8][4])
{
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                acc[i][j][e] = 0.0f;
}

__device__ __forceinline__ void ig_mma_step(float (&acc)[4][8][4], const unsigned int (&fa)[4][4],
                                            const unsigned int (&fb)[8][2])
{
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
            asm(IG_MMA " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                : "r"(fa[i][0]), "r"(fa[i][1]), "r"(fa[i][2]), "r"(fa[i][3]), "r"(fb[j][0]), "r"(fb[j][1]));
}

/* The block's output tile in shared memory (the stages are free once every warp is past them,
 * hence the barrier first): this warp's 64 x 64 sums rounded to the type, [position][channel]
 * with each pair of channels as one 32-bit store, or TRANSPOSED [channel][position] for an NCHW
 * output. Rows of IG_OUT_ROW halves keep both free of bank conflicts. Ends on a barrier. */
template <bool TRANSPOSED>
__device__ __forceinline__ void ig_tile_out(unsigned short* tile, const float (&acc)[4][8][4], int wm, int wn,
                                            int lane)
{
    const int group = lane >> 2, tig = lane & 3;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = wm + 16 * i + group + 8 * half, c = wn + 8 * j + 2 * tig;
                const unsigned short lo = tc_from_float(acc[i][j][2 * half]), hi = tc_from_float(acc[i][j][2 * half + 1]);
                if (TRANSPOSED) {
                    tile[c * IG_OUT_ROW + r] = lo;
                    tile[(c + 1) * IG_OUT_ROW + r] = hi;
                } else {
                    *(unsigned int*)(tile + r * IG_OUT_ROW + c) = (unsigned int)lo | ((unsigned int)hi << 16);
                }
            }
    __syncthreads();
}

/* 16 bytes from global to shared, or 16 zeros where !valid (nothing is read then). */
__device__ __forceinline__ void ig_copy16(void* shared, const void* global, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(ig_smem(shared)), "l"(global),
                 "r"(valid ? 16 : 0));
}

/* PIECE 32: C a multiple of 32 (a step's 32 reductions are one tap's contiguous channels, copied
 * with cp.async); 8: C a multiple of 8 (each 16-byte copy is 8 channels of its own tap); 0: any
 * C, each element of A's and B's tiles found and loaded on its own (the reduction padded to a
 * multiple of 32 with zeros). */
template <int PIECE>
__device__ __forceinline__ void conv_igemm_body(const unsigned short* __restrict__ x,
                                                const unsigned short* __restrict__ w, unsigned short* __restrict__ y,
                                                float* __restrict__ partial, int N, int C, int H, int W, int K, int Ho,
                                                int Wo, int Y, int X, int ph, int pw, int sh, int sw, int dlh, int dlw,
                                                int out_nchw)
{
    constexpr bool ALIGNED = PIECE != 0;
    extern __shared__ __align__(16) unsigned short ig_smem_tiles[];
    const int M = N * Ho * Wo, R = Y * X * C, all_tiles = (R + IG_BK - 1) / IG_BK;
    /* Split reduction (gridDim.z slices): this block's run of reduction tiles. */
    const int per_slice = (all_tiles + gridDim.z - 1) / gridDim.z, first_tile = blockIdx.z * per_slice;
    const int tiles = max(0, min(all_tiles - first_tile, per_slice));
    const int row0 = blockIdx.y * IG_BM, col0 = blockIdx.x * IG_BN;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int wm = (warp / 2) * 64, wn = (warp % 2) * 64;
    const int group = lane >> 2, tig = lane & 3;

    /* This thread's rows of A (output positions) and of B (output channels): rows t / 4 + 32 q,
     * the 8 channels at (t % 4) * 8 of each step's 32. */
    /* Any C: the block's rows as (pixel offset of the image, or -1 past the last position; top
     * row and left column of the window), found once. */
    __shared__ long row_base[ALIGNED ? 1 : IG_BM];
    __shared__ int row_top[ALIGNED ? 1 : IG_BM], row_left[ALIGNED ? 1 : IG_BM];
    if (!ALIGNED) {
        const int m = row0 + t, j = m % Wo, i = m / Wo % Ho, n = m / (Wo * Ho);
        row_base[t] = m < M ? (long)n * H * W * C : -1;
        row_top[t] = i * sh - ph;
        row_left[t] = j * sw - pw;
        __syncthreads();
    }
    const int part = (t % 4) * 8;
    long pixel_base[IG_CHUNKS];
    int top[IG_CHUNKS], left[IG_CHUNKS];
    bool row_ok[IG_CHUNKS], chan_ok[IG_CHUNKS];
#pragma unroll
    for (int q = 0; q < IG_CHUNKS; ++q) {
        const int m = row0 + t / 4 + 32 * q;
        row_ok[q] = m < M;
        const int mm = row_ok[q] ? m : 0, j = mm % Wo, i = mm / Wo % Ho, n = mm / (Wo * Ho);
        pixel_base[q] = (long)n * H * W * C;
        top[q] = i * sh - ph;
        left[q] = j * sw - pw;
        chan_ok[q] = col0 + t / 4 + 32 * q < K;
    }

    auto stage = [&](int buf, int tile) {
        unsigned short* as = ig_smem_tiles + buf * IG_STAGE;
        unsigned short* bs = as + IG_BM * IG_ROW;
        const int r0 = tile * IG_BK;
        if (!ALIGNED) {
            /* Thread t fills column t % 32 of rows t / 32 + 4 e: one reduction index, its tap and
             * channel found once for all of them; each row's pixel from the block's table; the
             * loads of 8 rows issued before their stores. */
            const int kc = t % 32, r = r0 + kc, tap = r / C, c = r - tap * C, a = tap / X, b = tap - (tap / X) * X;
            const bool live = r < R;
#pragma unroll
            for (int e0 = 0; e0 < IG_BM / 4; e0 += 8) {
                unsigned short value[8], weight[8];
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const int e = t / 32 + 4 * (e0 + u);
                    const int h = row_top[e] + a * dlh, v = row_left[e] + b * dlw;
                    const bool inside = live && row_base[e] >= 0 && h >= 0 && h < H && v >= 0 && v < W;
                    value[u] = inside ? x[row_base[e] + ((long)h * W + v) * C + c] : 0;
                    weight[u] = live && col0 + e < K ? w[(long)(col0 + e) * R + r] : 0;
                }
#pragma unroll
                for (int u = 0; u < 8; ++u) {
                    const int e = t / 32 + 4 * (e0 + u);
                    as[e * IG_ROW + kc] = value[u];
                    bs[e * IG_ROW + kc] = weight[u];
                }
            }
            return;
        }
        /* PIECE 32: the step's 32 reductions are one tap's channels; 8: each 16-byte piece is
         * 8 channels of its own tap (C a multiple of 8; the reduction's end may cut a step). */
        const int r = r0 + (PIECE == 32 ? 0 : part), tap = r / C, channel = r - tap * C + (PIECE == 32 ? part : 0);
        const int a = tap / X, b = tap - (tap / X) * X;
        const bool r_ok = PIECE == 32 || r < R;
#pragma unroll
        for (int q = 0; q < IG_CHUNKS; ++q) {
            const int row = t / 4 + 32 * q;
            const int h = top[q] + a * dlh, v = left[q] + b * dlw;
            const bool inside = r_ok && row_ok[q] && h >= 0 && h < H && v >= 0 && v < W;
            const unsigned short* src = inside ? x + pixel_base[q] + ((long)h * W + v) * C + channel : x;
            ig_copy16(as + row * IG_ROW + part, src, inside);
            const bool weight_ok = r_ok && chan_ok[q];
            const unsigned short* wsrc = weight_ok ? w + (long)(col0 + row) * R + r0 + part : w;
            ig_copy16(bs + row * IG_ROW + part, wsrc, weight_ok);
        }
    };

    float acc[4][8][4];
    ig_zero(acc);

    for (int s = 0; s < IG_STAGES - 1; ++s) {
        if (s < tiles)
            stage(s, first_tile + s);
        asm volatile("cp.async.commit_group;");
    }
    for (int tile = 0; tile < tiles; ++tile) {
        asm volatile("cp.async.wait_group %0;" ::"n"(IG_STAGES - 2));
        __syncthreads();
        const int next = tile + IG_STAGES - 1;
        if (next < tiles)
            stage(next % IG_STAGES, first_tile + next);
        asm volatile("cp.async.commit_group;");
        const unsigned short* as = ig_smem_tiles + (tile % IG_STAGES) * IG_STAGE;
        const unsigned short* bs = as + IG_BM * IG_ROW;
#pragma unroll
        for (int kk = 0; kk < IG_BK; kk += 16) {
            unsigned int fa[4][4], fb[8][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const unsigned short* p = as + (wm + 16 * i + (lane % 16)) * IG_ROW + kk + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(fa[i][0]), "=r"(fa[i][1]), "=r"(fa[i][2]), "=r"(fa[i][3])
                             : "r"(ig_smem(p)));
            }
            /* B's tile is [k_out][r]: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
             * (n 8-15, k 8-15) of each pair of n8 tiles, lanes 8 q .. 8 q + 7 addressing matrix q. */
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                const int quad = lane / 8;
                const unsigned short* p =
                    bs + (wn + 8 * j + 8 * (quad / 2) + (lane % 8)) * IG_ROW + kk + 8 * (quad % 2);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(fb[j][0]), "=r"(fb[j][1]), "=r"(fb[j + 1][0]), "=r"(fb[j + 1][1])
                             : "r"(ig_smem(p)));
            }
            ig_mma_step(acc, fa, fb);
        }
    }
    asm volatile("cp.async.wait_group 0;");
    const int P = Ho * Wo; /* y's plane: y NCHW (out_nchw) holds position m = n P + p at (n K + k) P + p */
    if (gridDim.z == 1 && out_nchw) {
        /* The tile transposed through shared memory ([channel][position]), then each channel's
         * positions along y's rows: 16-byte stores where P is a multiple of 8 (a run of 8 never
         * crosses an image then), else element by element, still along the rows. */
        unsigned short* tile = ig_smem_tiles; /* 128 channels of IG_OUT_ROW halves */
        ig_tile_out<true>(tile, acc, wm, wn, lane);
#pragma unroll 4
        for (int q = 0; q < IG_BM * IG_BN / 8 / IG_THREADS; ++q) {
            const int chunk = t + IG_THREADS * q, c = chunk / (IG_BM / 8), r = (chunk % (IG_BM / 8)) * 8;
            const int k = col0 + c, m = row0 + r;
            if (k >= K || m >= M)
                continue;
            const unsigned short* src = tile + c * IG_OUT_ROW + r;
            if (P % 8 == 0 && m + 8 <= M) {
                const int n = m / P;
                *(uint4*)(y + ((long)n * K + k) * P + m - n * P) = *(const uint4*)src;
            } else {
                for (int e = 0; e < 8 && m + e < M; ++e) {
                    const int n = (m + e) / P;
                    y[((long)n * K + k) * P + m + e - n * P] = src[e];
                }
            }
        }
        return;
    }
    if (gridDim.z == 1 && K % 8 == 0) {
        /* The tile through shared memory, then out in 16-byte stores: a warp writes two whole
         * 256-byte rows of y. */
        unsigned short* tile = ig_smem_tiles; /* 128 rows of IG_OUT_ROW halves */
        ig_tile_out<false>(tile, acc, wm, wn, lane);
#pragma unroll
        for (int q = 0; q < IG_BM * IG_BN / 8 / IG_THREADS; ++q) {
            const int chunk = t + IG_THREADS * q, row = chunk / (IG_BN / 8), col = (chunk % (IG_BN / 8)) * 8;
            if (row0 + row < M && col0 + col < K)
                *(uint4*)(y + (long)(row0 + row) * K + col0 + col) = *(const uint4*)(tile + row * IG_OUT_ROW + col);
        }
        return;
    }
    /* Each thread's two neighbouring output channels of a position as one 32-bit store (K even);
     * split, as one 8-byte store of fp32 sums into this slice's M x K slab of partial. */
    float* slab = partial + (long)blockIdx.z * M * K;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int m = row0 + wm + 16 * i + group + 8 * half, k = col0 + wn + 8 * j + 2 * tig;
                if (m >= M || k >= K)
                    continue;
                if (gridDim.z > 1)
                    *(float2*)(slab + (long)m * K + k) = make_float2(acc[i][j][2 * half], acc[i][j][2 * half + 1]);
                else
                    *(unsigned int*)(y + (long)m * K + k) = (unsigned int)tc_from_float(acc[i][j][2 * half]) |
                                                            ((unsigned int)tc_from_float(acc[i][j][2 * half + 1]) << 16);
                /* (out_nchw never reaches here unsplit: its tile path above takes every K) */
            }
}

/* y = the slabs' sums (M x K each), added in slab order (deterministic): the split forward's
 * second kernel. y NHWC: two channels at a time (K even); NCHW (out_nchw, P positions an
 * image): in y's order, one element at a time. */
extern "C" __global__ void conv_igemm_split_finish(const float* __restrict__ partial, unsigned short* __restrict__ y,
                                                   int M, int K, int slices, int P, int out_nchw)
{
    const long pairs = (long)M * K / 2, slab = (long)M * K;
    if (out_nchw) {
        for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < slab; e += (long)blockDim.x * gridDim.x) {
            const int p = (int)(e % P), k = (int)(e / P % K), n = (int)(e / ((long)P * K));
            const float* from = partial + ((long)n * P + p) * K + k;
            float sum = 0.0f;
            for (int s = 0; s < slices; ++s)
                sum += from[s * slab];
            y[e] = tc_from_float(sum);
        }
        return;
    }
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < pairs; e += (long)blockDim.x * gridDim.x) {
        float2 sum = make_float2(0.0f, 0.0f);
        for (int s = 0; s < slices; ++s) {
            const float2 v = *(const float2*)(partial + s * slab + 2 * e);
            sum.x += v.x;
            sum.y += v.y;
        }
        *(unsigned int*)(y + 2 * e) = (unsigned int)tc_from_float(sum.x) | ((unsigned int)tc_from_float(sum.y) << 16);
    }
}

#define IG_KERNEL(NAME, PIECE)                                                                             \
    extern "C" __global__ void __launch_bounds__(IG_THREADS)                                                  \
    NAME(const unsigned short* __restrict__ x, const unsigned short* __restrict__ w, unsigned short* __restrict__ y, \
         float* __restrict__ partial, CONV_SHAPE_ARGS, int out_nchw)                                           \
    {                                                                                                         \
        conv_igemm_body<PIECE>(x, w, y, partial, N, C, H, W, K, Ho, Wo, Y, X, ph, pw, sh, sw, dlh, dlw,       \
                               out_nchw);                                                                     \
    }

IG_KERNEL(conv_igemm_fwd_nhwc, 32)
IG_KERNEL(conv_igemm_fwd_nhwc_c8, 8)
IG_KERNEL(conv_igemm_fwd_nhwc_any, 0)

/* ---------------------------------------------------------------- backward weights */

/* dw (K x R, R = Y X C in KYXC order) = dy^T (K x M) im2col(x) (M x R), M = N Ho Wo the output
 * positions, NHWC tensors, C a multiple of 8. A block takes a 128 x 128 tile of dw and one of
 * gridDim.z slices of the positions, 32 at a time: dy's rows (128 output channels of a
 * position, contiguous) and x's receptive fields (128 reductions of a position, 8 channels of
 * one tap per 16-byte copy) staged [position][...] by zero-filling cp.async in 4 stages, both
 * fragments read transposed by ldmatrix. Each slice's sums are added in fp32 to `partial`
 * (K x R, zero at first), which conv_wrw_finish turns into dw (and zeros again).
 * Launch: blocks of 128 threads, grid (ceil(R / 128), ceil(K / 128), slices), 69,632 bytes of
 * dynamic shared memory. */
#define WG_ROW (128 + IG_PAD)
#define WG_STAGE (2 * IG_BK * WG_ROW)

template <int DUMMY>
__device__ __forceinline__ void conv_wrw_body(const unsigned short* __restrict__ dy,
                                              const unsigned short* __restrict__ x, float* __restrict__ partial,
                                              int N, int C, int H, int W, int K, int Ho, int Wo, int Y, int X, int ph,
                                              int pw, int sh, int sw, int dlh, int dlw)
{
    extern __shared__ __align__(16) unsigned short wg_tiles[];
    const int M = N * Ho * Wo, R = Y * X * C;
    const int k0 = blockIdx.y * 128, r0 = blockIdx.x * 128;
    const int per_slice = ((M + gridDim.z - 1) / gridDim.z + IG_BK - 1) / IG_BK * IG_BK;
    const int first = blockIdx.z * per_slice, last = min(M, first + per_slice);
    const int steps = last > first ? (last - first + IG_BK - 1) / IG_BK : 0;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32;
    const int wm = (warp / 2) * 64, wn = (warp % 2) * 64;
    const int group = lane >> 2, tig = lane & 3;

    /* This thread's 16-byte pieces: rows (positions) t / 16 + 8 q of each step, columns
     * (t % 16) * 8 of the tile's 128; for x, the piece's tap and channel found once. */
    const int col = (t % 16) * 8;
    const int r = r0 + col, tap = r / C, c = r - tap * C, a = tap / X, b = tap - (tap / X) * X;
    const bool r_ok = r < R, k_ok = k0 + col < K;

    auto stage = [&](int buf, int step) {
        unsigned short* as = wg_tiles + buf * WG_STAGE;
        unsigned short* bs = as + IG_BK * WG_ROW;
        const int p0 = first + step * IG_BK;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int row = t / 16 + 8 * q, m = p0 + row;
            const bool live = m < last;
            const int mm = live ? m : 0, j = mm % Wo, i = mm / Wo % Ho, n = mm / (Wo * Ho);
            ig_copy16(as + row * WG_ROW + col, live && k_ok ? dy + (long)mm * K + k0 + col : dy, live && k_ok);
            const int h = i * sh - ph + a * dlh, v = j * sw - pw + b * dlw;
            const bool inside = live && r_ok && h >= 0 && h < H && v >= 0 && v < W;
            ig_copy16(bs + row * WG_ROW + col, inside ? x + (((long)n * H + h) * W + v) * C + c : x, inside);
        }
    };

    float acc[4][8][4];
    ig_zero(acc);
    for (int s = 0; s < IG_STAGES - 1; ++s) {
        if (s < steps)
            stage(s, s);
        asm volatile("cp.async.commit_group;");
    }
    for (int step = 0; step < steps; ++step) {
        asm volatile("cp.async.wait_group %0;" ::"n"(IG_STAGES - 2));
        __syncthreads();
        const int next = step + IG_STAGES - 1;
        if (next < steps)
            stage(next % IG_STAGES, next);
        asm volatile("cp.async.commit_group;");
        const unsigned short* as = wg_tiles + (step % IG_STAGES) * WG_STAGE;
        const unsigned short* bs = as + IG_BK * WG_ROW;
#pragma unroll
        for (int kk = 0; kk < IG_BK; kk += 16) {
            unsigned int fa[4][4], fb[8][2];
            /* A (dw's rows = output channels, by positions) is stored [position][channel]:
             * matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15). */
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int quad = lane / 8;
                const unsigned short* p = as + (kk + 8 * (quad / 2) + (lane % 8)) * WG_ROW + wm + 16 * i + 8 * (quad % 2);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(fa[i][0]), "=r"(fa[i][1]), "=r"(fa[i][2]), "=r"(fa[i][3])
                             : "r"(ig_smem(p)));
            }
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                const unsigned short* p = bs + (kk + (lane % 16)) * WG_ROW + wn + 8 * j + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(fb[j][0]), "=r"(fb[j][1]), "=r"(fb[j + 1][0]), "=r"(fb[j + 1][1])
                             : "r"(ig_smem(p)));
            }
            ig_mma_step(acc, fa, fb);
        }
    }
    asm volatile("cp.async.wait_group 0;");
    if (steps == 0)
        return;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int kout = k0 + wm + 16 * i + group + 8 * half, rr = r0 + wn + 8 * j + 2 * tig;
                if (kout < K && rr < R) {
                    atomicAdd(partial + (long)kout * R + rr, acc[i][j][2 * half]);
                    if (rr + 1 < R)
                        atomicAdd(partial + (long)kout * R + rr + 1, acc[i][j][2 * half + 1]);
                }
            }
}

extern "C" __global__ void __launch_bounds__(IG_THREADS)
conv_wrw_igemm_nhwc(const unsigned short* __restrict__ dy, const unsigned short* __restrict__ x,
                    float* __restrict__ partial, CONV_SHAPE_ARGS)
{
    conv_wrw_body<0>(dy, x, partial, N, C, H, W, K, Ho, Wo, Y, X, ph, pw, sh, sw, dlh, dlw);
}

/* dw[e] = partial[e] rounded to the type, and partial[e] = 0 for the next call (partial KYXC
 * with C channels, element e = ((k Y + a) X + b) C + c; dw through its strides, its first
 * `keep` channels: x's channels may have been padded with zeros to a multiple of 8). */
extern "C" __global__ void conv_wrw_finish(float* __restrict__ partial, unsigned short* __restrict__ dw, int K, int C,
                                           int Y, int X, int keep, int s0, int s1, int s2, int s3)
{
    const long total = (long)K * Y * X * C;
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < total; e += (long)blockDim.x * gridDim.x) {
        const int c = (int)(e % C), b = (int)(e / C % X), a = (int)(e / ((long)C * X) % Y);
        const int k = (int)(e / ((long)C * X * Y));
        if (c < keep)
            dw[(long)k * s0 + (long)c * s1 + (long)a * s2 + (long)b * s3] = tc_from_float(partial[e]);
        partial[e] = 0.0f;
    }
}
