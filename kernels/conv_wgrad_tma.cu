/* conv_wgrad_tma.cu: backward weights of a convolution on Hopper, tensor copies (TMA) feeding
 * wgmma, warp-specialised and persistent on tma_wgmma.h's pipeline (gemm_tma.cu's, conv_tma.cu's).
 *
 * dw[k][tap][c] = sum over the output pixels p = (n, ho, wo) of dy[p][k] im2col(x)[p][tap][c]:
 * a GEMM whose reduction is the N Ho Wo pixels (long) and whose output, K by the taps' channels,
 * is small. Its columns are 64-channel chunks: chunk j is tap j / c_chunks, channels 64 (j %
 * c_chunks)..., so every 64-wide block of a tile is one copy of one tap and no block spans two
 * taps (channels past C arrive as zeros). The GEMM is computed in either orientation (swap 0:
 * rows the K output channels, columns the chunks; swap 1: the transpose), as the solver's plan
 * says. The reduction is split: work item i is tile i % tiles over slice i / tiles
 * of the reduction's 64-pixel steps (items of one slice run side by side, reading the same
 * pixels from L2); each item writes its fp32 sums to its slab of the workspace, ws[slice][row]
 * [column], and conv_wgrad_reduce adds the slabs in order (deterministic: no atomics) into dw,
 * rounded to the type, through dw's strides (either layout).
 *
 * WG_NCHW 0 (channels-last x and dy): A's and B's 64-wide blocks, each MN-major (64 pixels by
 * 64 contiguous values, wgmma's transpose bit set):
 *   - of dy: a tile copy of dy seen as (K, N Ho Wo, 1), box 64 x 64;
 *   - of x: an im2col copy, 64 channels of 64 output pixels walked as conv_tma.cu's map walks
 *     them (from the step's first pixel's window corner, moved by the tap's offset; zeros in
 *     the padding, past C and past the last image); or, x_plain (a 1 x 1 filter at stride 1
 *     unpadded: x is the matrix N H W x C), a tile copy as dy's (the copy engine moves tiles
 *     faster than im2col boxes).
 * WG_NCHW 1 (NCHW x and dy, a 1 x 1 filter at stride 1 unpadded): dw (K x C) = sum over n of
 * dy[n] (K x HW) x[n]^T (HW x C); both operands K-major tiles of (HW, rows, N) tile maps
 * (rows K or C), the reduction's steps ceil(HW / 64) per image (zeros past HW).
 *
 * Options: -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16, -DWG_BN=64|128|256, -DWG_STAGES=<n>,
 * -DWG_NCHW=0|1, --gpu-architecture=sm_90a.
 * Launch (conv_wgrad_tma): blocks of 384 threads, grid (min(items, multiprocessors), 1, 1),
 * dynamic shared memory WG_STAGES * (128 + WG_BN) * 128 + 16 KiB + 2 KiB (conv_tma.cu's). map_dy,
 * map_x: 16-bit elements, 128-byte swizzle, zero fill. WG_NCHW 0: map_dy tiled over (K, N Ho
 * Wo, 1) box (64, 64, 1); map_x im2col over (C, W, H, N), 64 channels by 64 pixels, conv_tma.cu's
 * corners and element strides (x_plain: tiled over (C, N H W, 1), box (64, 64, 1)). WG_NCHW 1:
 * tiled over (HW, K, N) and (HW, C, N), boxes (64, 128, 1) for A's and (64, WG_BN, 1) for B's.
 * ws: slices x M x N floats. M, N: the GEMM's rows and columns (even); steps: the reduction's
 * 64-pixel steps.
 * Beside it in the program: conv_wgrad_reduce (the slabs into dw) and conv_wgrad_columns (x's
 * receptive fields packed, for an x of few channels), each described where it is defined.
 */
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "conv_wgrad_tma.cu is CUDA only"
#endif

#if !defined(WG_BN) || !defined(WG_STAGES) || !defined(WG_NCHW)
#error "conv_wgrad_tma.cu needs -DWG_BN (64, 128 or 256), -DWG_STAGES and -DWG_NCHW"
#endif

#define TM_BN WG_BN
#define TM_STAGES WG_STAGES
#if WG_NCHW
#define TM_TA 0 /* rows of 64 contiguous pixels: K-major */
#define TM_TB 0
#else
#define TM_TA 1 /* 64 pixels of 64 contiguous channels: MN-major */
#define TM_TB 1
#endif
#include "tma_wgmma.h"

/* Work item ``id`` (items run tile by tile within a slice, slice after slice): its tile (tm, tn),
 * its slice, returned, and the slice's share [first, last) of the reduction's steps. */
__device__ __forceinline__ int wg_item(int id, int tiles, int tiles_m, int tiles_n, int steps, int slices, int* tm,
                                       int* tn, int* first, int* last)
{
    const int slice = id / tiles;
    int z;
    tm_tile(id - slice * tiles, tiles_m, tiles_n, tm, tn, &z);
    *first = (int)((long)slice * steps / slices);
    *last = (int)((long)(slice + 1) * steps / slices);
    return slice;
}

extern "C" __global__ void __launch_bounds__(384, 1)
conv_wgrad_tma(const __grid_constant__ TmaMap map_dy, const __grid_constant__ TmaMap map_x, float* ws, int M, int N,
               int steps, int slices, int swap, int c_chunks, int S, int plane, int Wo, int pad_h, int pad_w,
               int stride_h, int stride_w, int dil_h, int dil_w, int hw_steps, int x_plain)
{
    extern __shared__ __align__(16) unsigned char tm_raw[];
    const auto [base, staging, full, empty] = tm_layout(tm_raw);
    const int t = threadIdx.x, warpgroup = t / 128;
    const int tiles_m = (M + TM_BM - 1) / TM_BM, tiles_n = (N + WG_BN - 1) / WG_BN, tiles = tiles_m * tiles_n;
    const int items = tiles * slices;

    tm_init_barriers(full, empty);

    if (warpgroup == 0) {
        tm_producer_start();
        if (t == 0) {
            asm volatile("prefetch.tensormap [%0];" ::"l"((unsigned long long)&map_dy) : "memory");
            asm volatile("prefetch.tensormap [%0];" ::"l"((unsigned long long)&map_x) : "memory");
            unsigned int stage = 0, phase = 0;
            for (int id = blockIdx.x; id < items; id += gridDim.x) {
                int tm, tn, first, last;
                wg_item(id, tiles, tiles_m, tiles_n, steps, slices, &tm, &tn, &first, &last);
                for (int ks = first; ks < last; ++ks) {
                    const unsigned int bar = full + 8 * stage, as = base + stage * TM_STAGE_BYTES, bs = as + TM_A_BYTES;
                    tm_bar_wait(empty + 8 * stage, phase ^ 1); /* a fresh barrier passes parity 1 */
                    tm_bar_expect(bar, TM_STAGE_BYTES);        /* boxes past the edges count whole, zero-filled */
#if WG_NCHW
                    const int n = ks / hw_steps, hw0 = (ks - n * hw_steps) * TM_BK;
                    tm_load(as, swap ? &map_x : &map_dy, hw0, tm * TM_BM, n, bar);
                    tm_load(bs, swap ? &map_dy : &map_x, hw0, tn * WG_BN, n, bar);
#else
                    /* The step's first output pixel and the top-left corner of its window. */
                    const int p0 = ks * TM_BK, n = p0 / plane, ho = (p0 - n * plane) / Wo;
                    const int wo = p0 - n * plane - ho * Wo;
                    const int h0 = ho * stride_h - pad_h, w0 = wo * stride_w - pad_w;
#pragma unroll
                    for (int j = 0; j < 2 + WG_BN / 64; ++j) {
                        /* A's two blocks of 64 rows, then B's WG_BN / 64 blocks of 64 columns */
                        const unsigned int dst = j < 2 ? as + j * TM_BLOCK_BYTES : bs + (j - 2) * TM_BLOCK_BYTES;
                        const int block = j < 2 ? tm * 2 + j : tn * (WG_BN / 64) + j - 2;
                        if ((j < 2) == (swap != 0) && x_plain) { /* 64 channels of x read as a matrix */
                            tm_load(dst, &map_x, block * 64, p0, 0, bar);
                        } else if ((j < 2) == (swap != 0)) { /* a chunk of x: one tap's 64 channels */
                            const int tap = block / c_chunks, c0 = (block - tap * c_chunks) * TM_BK;
                            const int r = tap / S, s = tap - r * S;
                            tm_load_im2col(dst, &map_x, c0, w0, h0, n, (unsigned short)(s * dil_w),
                                           (unsigned short)(r * dil_h), bar);
                        } else {
                            tm_load(dst, &map_dy, block * 64, p0, 0, bar); /* 64 output channels */
                        }
                    }
#endif
                    tm_next_stage(stage, phase);
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
        for (int id = blockIdx.x; id < items; id += gridDim.x) {
            int tm, tn, first, last;
            const int slice = wg_item(id, tiles, tiles_m, tiles_n, steps, slices, &tm, &tn, &first, &last);
            tm_consume(d, base, full, empty, stage, phase, last - first, half, wt);
            /* This slice's fp32 sums into its slab: d[4j + 2h + 0..1] is row r0 + 8h, columns
             * 8j + 2 (lane % 4) and the next (each four lanes one 32-byte sector). */
            float* slab = ws + (long)slice * M * N;
            const int r0 = tm * TM_BM + half * 64 + warp * 16 + lane / 4, c0 = tn * WG_BN + 2 * (lane % 4);
#pragma unroll
            for (int j = 0; j < TM_ACC / 4; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = r0 + 8 * h, col = c0 + 8 * j;
                    if (row < M && col < N)
                        *(float2*)(slab + (long)row * N + col) = make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
                }
        }
    }
}

/* dw[k][c][r][s] (through strides s0..s3, K C Y X order) = the sum over the slabs, in order,
 * of the GEMM's element for (k, tap r S + s, c): row k, column tap col_tap + c (col_tap: a
 * tap's columns, c_chunks x 64, or C where conv_wgrad_columns packed the taps' channels) of
 * `cols` (swap 0), or the transpose (swap 1). Grid-stride, any launch; the walk puts the GEMM's
 * columns innermost so that neighbouring threads read neighbouring floats. vec: 8 channels a
 * thread, two 16-byte loads a slab and one 16-byte store (swap 0, C, col_tap and the strides
 * but s1 multiples of 8, s1 = 1, dw 16-byte aligned: channels-last weights, or any 1 x 1). */
extern "C" __global__ void conv_wgrad_reduce(const float* __restrict__ ws, unsigned short* __restrict__ dw, int K,
                                             int C, int R, int S, int col_tap, int cols, int slices, int swap, int s0,
                                             int s1, int s2, int s3, int vec)
{
    if (vec) {
        const int total = K * C * R * S / 8, taps = R * S, groups = C / 8;
        const long slab = (long)K * cols;
        for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += blockDim.x * gridDim.x) {
            const int c = e % groups * 8, rest = e / groups, tap = rest % taps, k = rest / taps;
            const float4* at = (const float4*)(ws + (long)k * cols + (long)tap * col_tap + c);
            float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
            for (int z = 0; z < slices; ++z) {
                const float4 u = at[z * slab / 4], v = at[z * slab / 4 + 1];
                a.x += u.x, a.y += u.y, a.z += u.z, a.w += u.w;
                b.x += v.x, b.y += v.y, b.z += v.z, b.w += v.w;
            }
            const int r = tap / S, s = tap - r * S;
            *(uint4*)(dw + (long)k * s0 + c + (long)r * s2 + (long)s * s3) =
                make_uint4(tm_pack(a.x, a.y), tm_pack(a.z, a.w), tm_pack(b.x, b.y), tm_pack(b.z, b.w));
        }
        return;
    }
    /* int indices (dw's and a slab's sizes are ints): 64-bit divisions would cost more than the
     * pass's memory traffic */
    const int total = K * C * R * S, taps = R * S;
    const long slab = (long)K * cols;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += blockDim.x * gridDim.x) {
        int k, c, tap;
        if (swap) { /* rows the columns of dw's taps, columns k */
            k = e % K;
            const int rest = e / K;
            c = rest % C;
            tap = rest / C;
        } else {
            c = e % C;
            const int rest = e / C;
            tap = rest % taps;
            k = rest / taps;
        }
        const long col = (long)tap * col_tap + c, at = swap ? col * K + k : (long)k * cols + col;
        float sum = 0.0f;
        for (int z = 0; z < slices; ++z)
            sum += ws[z * slab + at];
        const int r = tap / S, s = tap - r * S;
        dw[(long)k * s0 + (long)c * s1 + (long)r * s2 + (long)s * s3] = tc_from_float(sum);
    }
}

/* x's receptive fields packed channels-last: col[n][ho][wo][j] = x[n, c, ho sh - ph + r dh,
 * wo sw - pw + s dw] for j = (r S + s) C + c < R S C, zeros in the padding and for j up to
 * `width` (a multiple of 8): the 1 x 1 convolution whose backward weights are dw with its taps'
 * channels packed, for an x of few channels (a first layer's 3), where 64-channel chunks per
 * tap would be mostly zeros. A block builds the rows of `pixels` consecutive output pixels in
 * shared memory (blockDim / pixels threads per pixel, each every so many filter rows; x read through
 * its element strides: either layout), then writes them out as one contiguous run of 16-byte
 * stores. Int indices: N Ho Wo x width is an int (the solver's gate). Launch: 256 threads,
 * pixels <= 256, dynamic shared memory pixels x width x 2 bytes, any grid. */
extern "C" __global__ void __launch_bounds__(256)
conv_wgrad_columns(const unsigned short* __restrict__ x, unsigned short* __restrict__ col, int N, int C, int H, int W,
                   int Ho, int Wo, int R, int S, int ph, int pw, int sh, int sw, int dh, int dw, int xs0, int xs1,
                   int xs2, int xs3, int width, int pixels)
{
    extern __shared__ __align__(16) unsigned short wg_rows[];
    const int total = N * Ho * Wo, taps = R * S, used = taps * C, lanes = blockDim.x / pixels;
    const int i = threadIdx.x % pixels, lane = threadIdx.x / pixels;
    for (int p0 = blockIdx.x * pixels; p0 < total; p0 += gridDim.x * pixels) {
        const int count = min(pixels, total - p0), p = p0 + i;
        const int wo = p % Wo, ho = p / Wo % Ho, n = p / (Wo * Ho);
        const unsigned short* image = x + (long)n * xs0;
        for (int r = lane; lane < lanes && r < R; r += lanes) { /* a filter row's S taps */
            const int h = ho * sh - ph + r * dh;
            const bool row_inside = i < count && h >= 0 && h < H;
            unsigned short* row = wg_rows + i * width + r * S * C;
            for (int s = 0, w = wo * sw - pw; s < S; ++s, w += dw, row += C) {
                const bool inside = row_inside && w >= 0 && w < W;
                const unsigned short* from = image + (long)h * xs2 + (long)w * xs3;
                for (int c = 0; c < C; ++c)
                    row[c] = inside ? from[(long)c * xs1] : (unsigned short)0;
            }
        }
        for (int it = threadIdx.x; it < pixels * (width - used); it += blockDim.x) { /* the padding columns */
            const int i = it / (width - used);
            wg_rows[i * width + used + it - i * (width - used)] = 0;
        }
        __syncthreads();
        const uint4* from = (const uint4*)wg_rows;
        uint4* to = (uint4*)(col + (long)p0 * width);
        for (int v = threadIdx.x; v < count * width / 8; v += blockDim.x)
            to[v] = from[v];
        __syncthreads(); /* the rows are read out before the next pixels overwrite them */
    }
}
