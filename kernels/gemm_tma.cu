/* gemm_tma.cu: the Hopper GEMM: tensor copies (TMA) feeding wgmma, warp-specialised and persistent.
 *
 * C = alpha * op(A) op(B) + beta * C, row-major, fp16 or bf16 in, fp32 accumulation, batched and
 * strided. One block per multiprocessor walks the 128 x GEMM_BN tiles of C (every batch's) in a
 * grouped order: 8 tile rows at a time, so that the tiles in flight share A's and B's rows in L2.
 * A block's three warpgroups split the work:
 *   - the producer (warpgroup 0, 40 registers a thread): one thread issues the tensor copies of
 *     A's 128 x 64 and B's 64 x GEMM_BN slices into a ring of GEMM_STAGES shared-memory stages,
 *     running ahead into the next tiles while the consumers finish one;
 *   - two consumers (232 registers): each multiplies 64 rows of the tile with wgmma (m64nBNk16,
 *     both operands read from shared memory), then writes its rows of C, alpha and beta applied:
 *     a whole tile with beta 0 through a per-warp staging area (stmatrix) as 16-byte stores of
 *     whole 128-byte rows, any other tile as element pairs straight from the registers.
 * Each stage has two mbarriers: "full" (the copies' bytes have landed: the producer's
 * expect_tx and the copies' complete_tx) and "empty" (every consumer warpgroup whose stage the
 * copies fill has finished the multiplies that read it).
 *
 * Operands: A is M x K (GEMM_TA=0: K-major) or K x M (GEMM_TA=1: M-major); B is K x N (GEMM_TB=0:
 * N-major) or N x K (GEMM_TB=1: K-major). Tiles are stored as TMA writes them with the 128-byte
 * swizzle (tma_wgmma.h, which holds the barriers, the consumers' loop and the epilogue that this
 * kernel shares with conv_tma.cu). wgmma reads an MN-major tile transposed (its transpose bit; fp16 and bf16 have one), so every
 * transposition runs the same loop with no transposing copy first.
 * Edges: the copies fill what lies past M, N or K with zeros; the epilogue writes only inside C.
 *
 * Options: -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16, -DGEMM_BN=128|192|256, -DGEMM_STAGES=<n>,
 * -DGEMM_TA=0|1, -DGEMM_TB=0|1, --gpu-architecture=sm_90a (wgmma and setmaxnreg).
 * Launch (gemm_tma): blocks of 384 threads, grid (min(tiles, multiprocessors), 1, 1), dynamic
 * shared memory GEMM_STAGES * (128 + GEMM_BN) * 128 + 16 KiB (staging) + 2 KiB. map_a and
 * map_b: 3-D tensor maps (cuTensorMapEncodeTiled: 16-bit elements, 128-byte swizzle, zero fill)
 * over (contiguous dimension, rows, batch) with boxes of 64 x 128 (A K-major), 64 x 64 (A
 * M-major, B N-major) or 64 x GEMM_BN (B K-major); a_step, b_step: 1
 * where the operand has a matrix per batch, 0 where one matrix serves every batch (its map's
 * batch dimension is then 1). C: 16-byte aligned, ldc and stride_c even; c_vec: 1 where ldc and
 * stride_c are multiples of 8 (C's rows take 16-byte stores).
 */
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "gemm_tma.cu is CUDA only"
#endif

#if !defined(GEMM_BN) || !defined(GEMM_STAGES)
#error "gemm_tma.cu needs -DGEMM_BN (128, 192 or 256) and -DGEMM_STAGES"
#endif
#ifndef GEMM_TA
#define GEMM_TA 0
#endif
#ifndef GEMM_TB
#define GEMM_TB 0
#endif

#define TM_BN GEMM_BN
#define TM_STAGES GEMM_STAGES
/* wgmma's transpose bits: 1 for an MN-major operand (A stored K x M, B stored K x N). */
#define TM_TA GEMM_TA
#if GEMM_TB
#define TM_TB 0
#else
#define TM_TB 1
#endif
#include "tma_wgmma.h"

extern "C" __global__ void __launch_bounds__(384, 1)
gemm_tma(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, unsigned short* C, int M, int N,
         int K, int ldc, long stride_c, int c_vec, int batch, int a_step, int b_step, float alpha, float beta)
{
    extern __shared__ __align__(16) unsigned char tm_raw[];
    const auto [base, staging, full, empty] = tm_layout(tm_raw);
    const int t = threadIdx.x, warpgroup = t / 128;
    const int tiles_m = (M + TM_BM - 1) / TM_BM, tiles_n = (N + GEMM_BN - 1) / GEMM_BN;
    const int tiles = tiles_m * tiles_n * batch, k_steps = (K + TM_BK - 1) / TM_BK;

    tm_init_barriers(full, empty);

    if (warpgroup == 0) {
        tm_producer_start();
        if (t == 0) {
            asm volatile("prefetch.tensormap [%0];" ::"l"((unsigned long long)&map_a) : "memory");
            asm volatile("prefetch.tensormap [%0];" ::"l"((unsigned long long)&map_b) : "memory");
            unsigned int stage = 0, phase = 0;
            for (int id = blockIdx.x; id < tiles; id += gridDim.x) {
                int tm, tn, z;
                tm_tile(id, tiles_m, tiles_n, &tm, &tn, &z);
                const int m0 = tm * TM_BM, n0 = tn * GEMM_BN, za = z * a_step, zb = z * b_step;
                for (int ks = 0; ks < k_steps; ++ks) {
                    const int k0 = ks * TM_BK;
                    const unsigned int bar = full + 8 * stage, as = base + stage * TM_STAGE_BYTES, bs = as + TM_A_BYTES;
                    tm_bar_wait(empty + 8 * stage, phase ^ 1); /* a fresh barrier passes parity 1 */
                    tm_bar_expect(bar, TM_STAGE_BYTES);        /* boxes past the edges count whole, zero-filled */
#if GEMM_TA
                    tm_load(as, &map_a, m0, k0, za, bar);
                    tm_load(as + TM_BLOCK_BYTES, &map_a, m0 + 64, k0, za, bar);
#else
                    tm_load(as, &map_a, k0, m0, za, bar);
#endif
#if GEMM_TB
                    tm_load(bs, &map_b, k0, n0, zb, bar);
#else
#pragma unroll
                    for (int j = 0; j < GEMM_BN / 64; ++j)
                        tm_load(bs + j * TM_BLOCK_BYTES, &map_b, n0 + 64 * j, k0, zb, bar);
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
        for (int id = blockIdx.x; id < tiles; id += gridDim.x) {
            int tm, tn, z;
            tm_tile(id, tiles_m, tiles_n, &tm, &tn, &z);
            tm_consume(d, base, full, empty, stage, phase, k_steps, half, wt);
            tm_store(d, C + (long)z * stride_c, tm, tn, M, N, ldc, c_vec, alpha, beta, staging, half, warp, lane);
        }
    }
}
