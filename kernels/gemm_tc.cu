/* gemm_tc.cu: the CUDA tensor-core GEMM, fp16 or bf16 in, fp32 accumulation (mma.sync, sm_80+).
 *
 * The same contract as gemm.c's gemm_tiled (row-major C = alpha * op(A) op(B) + beta * C,
 * batched, transposes, leading dimensions, beta == 0 never reads C), for NVIDIA GPUs of
 * sm_80 and later only: a vendor fast path, a separate solver, not part of the dialect. It
 * uses PTX's mma.sync.m16n8k16 directly, so NVRTC needs no CUDA header beyond its own.
 *
 * Options: -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16 (required).
 * Launch: blocks of 256 threads (8 warps), grid (ceil(N / 128), ceil(M / 128), batch). A block
 * computes a 128 x 128 tile of C; warps are 2 (M) x 4 (N), each 64 x 32 = 4 x 4 mma tiles of
 * 16 x 8, stepping K by 32 through shared memory.
 *   gemm_tc: any layout, sizes and alignment (A as [m][k], B as [n][k] in shared memory: each
 *            fragment register is one 32-bit load of two k-neighbours)
 *   gemm_tc_nn: neither operand transposed, M and N multiples of 128, K of 32, lda, ldb and
 *            ldc of 8, every matrix 16-byte aligned: blocks of 128 threads (4 warps of 64 x 64
 *            each) with 75,776 bytes of dynamic shared memory: tiles copied with 16-byte
 *            cp.async into 4 buffers (three tiles load while one computes), fragments read
 *            with ldmatrix; grid (N / 128, M / 128, batch), taken in groups of 8 tile rows
 *   gemm_tc_nn_wide, gemm_tc_nn_wide_deep: the same for N a multiple of 256 with 128 x 256
 *            tiles: blocks of 256 threads, 108,544 / 162,816 bytes (4 / 6 buffers), grid
 *            (N / 256, M / 128, batch)
 */
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "gemm_tc.cu is CUDA only (tensor cores through mma.sync)"
#endif

#include "tc_types.h"

#define TC_MMA "mma.sync.aligned.m16n8k16.row.col.f32." TC_TYPE "." TC_TYPE ".f32"

#define BM 128
#define BN 128
#define BK 32
#define PAD 8 /* halves of padding per shared row: spreads the fragment loads over the banks */

extern "C" __global__ void __launch_bounds__(256)
gemm_tc(const unsigned short* A, const unsigned short* B, unsigned short* C, int M, int N, int K, int lda, int ldb,
        int ldc, long stride_a, long stride_b, long stride_c, int trans_a, int trans_b, float alpha, float beta)
{
    __shared__ __align__(16) unsigned short As[BM][BK + PAD];
    __shared__ __align__(16) unsigned short Bs[BN][BK + PAD];
    const unsigned short* a = A + blockIdx.z * stride_a;
    const unsigned short* b = B + blockIdx.z * stride_b;
    unsigned short* c = C + blockIdx.z * stride_c;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;
    const int group = lane >> 2, tig = lane & 3;

    float acc[4][4][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r)
                acc[i][j][r] = 0.0f;

    for (int p0 = 0; p0 < K; p0 += BK) {
        /* Stage op(A)[row0 .. +128][p0 .. +32] as As[m][k] and op(B)[p0 .. +32][col0 .. +128] as Bs[n][k];
         * consecutive threads read consecutive addresses for the untransposed layouts. */
        for (int e = threadIdx.x; e < BM * BK; e += 256) {
            int i, p;
            if (trans_a) { i = e % BM; p = e / BM; } else { i = e / BK; p = e % BK; }
            const int gi = row0 + i, gp = p0 + p;
            As[i][p] = (gi < M && gp < K) ? a[trans_a ? (long)gp * lda + gi : (long)gi * lda + gp] : 0;
        }
        for (int e = threadIdx.x; e < BN * BK; e += 256) {
            int j, p;
            if (trans_b) { j = e / BK; p = e % BK; } else { j = e % BN; p = e / BN; }
            const int gj = col0 + j, gp = p0 + p;
            Bs[j][p] = (gj < N && gp < K) ? b[trans_b ? (long)gj * ldb + gp : (long)gp * ldb + gj] : 0;
        }
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned int fa[4][4], fb[4][2];
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = wm + 16 * i + group, k = kk + 2 * tig;
                fa[i][0] = *reinterpret_cast<const unsigned int*>(&As[r][k]);
                fa[i][1] = *reinterpret_cast<const unsigned int*>(&As[r + 8][k]);
                fa[i][2] = *reinterpret_cast<const unsigned int*>(&As[r][k + 8]);
                fa[i][3] = *reinterpret_cast<const unsigned int*>(&As[r + 8][k + 8]);
            }
            #pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int n = wn + 8 * j + group, k = kk + 2 * tig;
                fb[j][0] = *reinterpret_cast<const unsigned int*>(&Bs[n][k]);
                fb[j][1] = *reinterpret_cast<const unsigned int*>(&Bs[n][k + 8]);
            }
            #pragma unroll
            for (int i = 0; i < 4; ++i)
                #pragma unroll
                for (int j = 0; j < 4; ++j)
                    asm volatile(TC_MMA " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                                 : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                                 : "r"(fa[i][0]), "r"(fa[i][1]), "r"(fa[i][2]), "r"(fa[i][3]), "r"(fb[j][0]),
                                   "r"(fb[j][1]));
        }
        __syncthreads();
    }
    /* Each accumulator register pair is (row, 2 * tig + {0, 1}) of a 16 x 8 tile; +8 rows for the second pair. */
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 4; ++j)
            #pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int gi = row0 + wm + 16 * i + group + 8 * half;
                #pragma unroll
                for (int q = 0; q < 2; ++q) {
                    const int gj = col0 + wn + 8 * j + 2 * tig + q;
                    if (gi < M && gj < N) {
                        const long o = (long)gi * ldc + gj;
                        const float v = alpha * acc[i][j][2 * half + q];
                        c[o] = tc_from_float(beta == 0.0f ? v : v + beta * tc_to_float(c[o]));
                    }
                }
            }
}

/* ---------------------------------------------------------------- the aligned, untransposed fast path */

__device__ __forceinline__ unsigned int smem_address(const void* p)
{
    return (unsigned int)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void copy16_async(void* shared, const void* global)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_address(shared)), "l"(global));
}

/* The fast path's body, for a 128 x TBN block tile of WARPS_N x 2 warps (each 64 x 64) and
 * NSTAGES shared-memory buffers of A's and B's tiles (dynamic shared memory,
 * NSTAGES * (128 * (BK + PAD) + BK * (TBN + PAD)) * 2 bytes). Blocks are taken in groups of
 * GROUP_M tile rows (the grid's x, y read as one sequence), so that the blocks running at
 * once share A's and B's tiles in L2. */
#define GROUP_M 8

template <int TBN, int NSTAGES, int TBK = BK>
__device__ __forceinline__ void gemm_nn_body(const unsigned short* A, const unsigned short* B, unsigned short* C, int M,
                                             int N, int K, int lda, int ldb, int ldc, long stride_a, long stride_b,
                                             long stride_c, float alpha, float beta)
{
    constexpr int WARPS_N = TBN / 64, THREADS = 64 * WARPS_N;
    constexpr int A_STAGE = BM * (TBK + PAD), B_STAGE = TBK * (TBN + PAD);
    extern __shared__ __align__(16) unsigned short smem[];
    unsigned short* As = smem;
    unsigned short* Bs = smem + NSTAGES * A_STAGE;
    /* Grouped order: consecutive blocks walk down GROUP_M tile rows, then across. */
    const int tiles_m = gridDim.y, tiles_n = gridDim.x, id = blockIdx.y * tiles_n + blockIdx.x;
    const int first_m = (id / (GROUP_M * tiles_n)) * GROUP_M;
    const int rows_here = min(tiles_m - first_m, GROUP_M);
    const int tile_m = first_m + (id % rows_here), tile_n = (id % (GROUP_M * tiles_n)) / rows_here;
    const unsigned short* a = A + blockIdx.z * stride_a + (long)tile_m * BM * lda;
    const unsigned short* b = B + blockIdx.z * stride_b + (long)tile_n * TBN;
    unsigned short* c = C + blockIdx.z * stride_c;
    const int row0 = tile_m * BM, col0 = tile_n * TBN;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wm = (warp / WARPS_N) * 64, wn = (warp % WARPS_N) * 64;
    const int group = lane >> 2, tig = lane & 3;
    const int t = threadIdx.x;

    float acc[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r)
                acc[i][j][r] = 0.0f;

    const int tiles = K / TBK;
    /* Each thread copies (BM * TBK / 8) / THREADS 16-byte chunks of A's tile and (TBK * TBN / 8) /
     * THREADS of B's. */
    auto stage = [&](int buf, int p0) {
        unsigned short* as_ = As + buf * A_STAGE;
        unsigned short* bs_ = Bs + buf * B_STAGE;
#pragma unroll
        for (int q = 0; q < BM * TBK / 8 / THREADS; ++q) {
            const int chunk = t + q * THREADS, r = chunk / (TBK / 8), col = (chunk % (TBK / 8)) * 8;
            copy16_async(as_ + r * (TBK + PAD) + col, a + (long)r * lda + p0 + col);
        }
#pragma unroll
        for (int q = 0; q < TBK * TBN / 8 / THREADS; ++q) {
            const int chunk = t + q * THREADS, r = chunk / (TBN / 8), col = (chunk % (TBN / 8)) * 8;
            copy16_async(bs_ + r * (TBN + PAD) + col, b + (long)(p0 + r) * ldb + col);
        }
    };

    /* Tiles 0 .. NSTAGES-2 in flight before the first computes; each iteration waits for its
     * tile and starts the copy NSTAGES-1 tiles ahead into the buffer the previous one finished. */
    for (int s = 0; s < NSTAGES - 1; ++s) {
        if (s < tiles)
            stage(s, s * TBK);
        asm volatile("cp.async.commit_group;");
    }
    for (int tile = 0; tile < tiles; ++tile) {
        asm volatile("cp.async.wait_group %0;" ::"n"(NSTAGES - 2));
        __syncthreads();
        const int next = tile + NSTAGES - 1;
        if (next < tiles)
            stage(next % NSTAGES, next * TBK);
        asm volatile("cp.async.commit_group;");
        const unsigned short* as = As + (tile % NSTAGES) * A_STAGE;
        const unsigned short* bs = Bs + (tile % NSTAGES) * B_STAGE;
        /* Fragments double-buffered: step kk + 16's are read from shared memory before step kk's
         * multiplies issue. The reads stay volatile (ordered after the barrier); the multiplies
         * are plain register operations the compiler may schedule around them. */
        unsigned int fa[2][4][4], fb[2][8][2];
        auto fragments = [&](int buf, int kk) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const unsigned short* p = as + (wm + 16 * i + (lane % 16)) * (TBK + PAD) + kk + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(fa[buf][i][0]), "=r"(fa[buf][i][1]), "=r"(fa[buf][i][2]), "=r"(fa[buf][i][3])
                             : "r"(smem_address(p)));
            }
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                const unsigned short* p = bs + (kk + (lane % 16)) * (TBN + PAD) + wn + 8 * j + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(fb[buf][j][0]), "=r"(fb[buf][j][1]), "=r"(fb[buf][j + 1][0]), "=r"(fb[buf][j + 1][1])
                             : "r"(smem_address(p)));
            }
        };
        fragments(0, 0);
#pragma unroll
        for (int kk = 0; kk < TBK; kk += 16) {
            const int cur = (kk / 16) % 2;
            if (kk + 16 < TBK)
                fragments(cur ^ 1, kk + 16);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    asm(TC_MMA " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                        : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                        : "r"(fa[cur][i][0]), "r"(fa[cur][i][1]), "r"(fa[cur][i][2]), "r"(fa[cur][i][3]),
                          "r"(fb[cur][j][0]), "r"(fb[cur][j][1]));
        }
    }
    asm volatile("cp.async.wait_group 0;");
    /* Each thread's two neighbouring outputs as one 32-bit store (ldc and the columns are even). */
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int gi = row0 + wm + 16 * i + group + 8 * half, gj = col0 + wn + 8 * j + 2 * tig;
                const long o = (long)gi * ldc + gj;
                float v0 = alpha * acc[i][j][2 * half], v1 = alpha * acc[i][j][2 * half + 1];
                if (beta != 0.0f) {
                    v0 += beta * tc_to_float(c[o]);
                    v1 += beta * tc_to_float(c[o + 1]);
                }
                *(unsigned int*)(c + o) = (unsigned int)tc_from_float(v0) | ((unsigned int)tc_from_float(v1) << 16);
            }
}

/* 128 x 128 tiles, 4 warps, 4 stages (75,776 bytes): for problems with few tiles. */
extern "C" __global__ void __launch_bounds__(128)
gemm_tc_nn(const unsigned short* A, const unsigned short* B, unsigned short* C, int M, int N, int K, int lda, int ldb,
           int ldc, long stride_a, long stride_b, long stride_c, float alpha, float beta)
{
    gemm_nn_body<128, 4>(A, B, C, M, N, K, lda, ldb, ldc, stride_a, stride_b, stride_c, alpha, beta);
}

/* 128 x 256 tiles, 8 warps, 4 stages (108,544 bytes): a third more arithmetic per byte read from
 * L2 than 128 x 128, for problems that fill the GPU with them. */
extern "C" __global__ void __launch_bounds__(256)
gemm_tc_nn_wide(const unsigned short* A, const unsigned short* B, unsigned short* C, int M, int N, int K, int lda,
                int ldb, int ldc, long stride_a, long stride_b, long stride_c, float alpha, float beta)
{
    gemm_nn_body<256, 4>(A, B, C, M, N, K, lda, ldb, ldc, stride_a, stride_b, stride_c, alpha, beta);
}

/* 128 x 128 tiles stepping K by 64 through 3 buffers (107,520 bytes): half the barriers. */
extern "C" __global__ void __launch_bounds__(128)
gemm_tc_nn_k64(const unsigned short* A, const unsigned short* B, unsigned short* C, int M, int N, int K, int lda,
               int ldb, int ldc, long stride_a, long stride_b, long stride_c, float alpha, float beta)
{
    gemm_nn_body<128, 3, 64>(A, B, C, M, N, K, lda, ldb, ldc, stride_a, stride_b, stride_c, alpha, beta);
}

/* The wide tile stepping K by 64 through 3 buffers (156,672 bytes). */
extern "C" __global__ void __launch_bounds__(256)
gemm_tc_nn_wide_k64(const unsigned short* A, const unsigned short* B, unsigned short* C, int M, int N, int K, int lda,
                    int ldb, int ldc, long stride_a, long stride_b, long stride_c, float alpha, float beta)
{
    gemm_nn_body<256, 3, 64>(A, B, C, M, N, K, lda, ldb, ldc, stride_a, stride_b, stride_c, alpha, beta);
}

/* The wide tile with 6 stages (162,816 bytes): deeper copies ahead, one block per SM. */
extern "C" __global__ void __launch_bounds__(256)
gemm_tc_nn_wide_deep(const unsigned short* A, const unsigned short* B, unsigned short* C, int M, int N, int K, int lda,
                     int ldb, int ldc, long stride_a, long stride_b, long stride_c, float alpha, float beta)
{
    gemm_nn_body<256, 6>(A, B, C, M, N, K, lda, ldb, ldc, stride_a, stride_b, stride_c, alpha, beta);
}
