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
 *   gemm_tc_nn: neither operand transposed, M and N multiples of 128, K of 32, lda and ldb of 8,
 *            every matrix 16-byte aligned: blocks of 128 threads (4 warps of 64 x 64 each) with
 *            75,776 bytes of dynamic shared memory: tiles copied with 16-byte cp.async into 4
 *            buffers (three tiles load while one computes), fragments read with ldmatrix
 */
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "gemm_tc.cu is CUDA only (tensor cores through mma.sync)"
#endif

#if defined(KDB_TYPE_FP16)
#define TC_MMA "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
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
#define TC_MMA "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
__device__ __forceinline__ float tc_to_float(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short tc_from_float(float f)
{
    unsigned short b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
    return b;
}
#else
#error "gemm_tc.cu needs -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16"
#endif

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

#define STAGES 4
#define A_STAGE (BM * (BK + PAD))
#define B_STAGE (BK * (BN + PAD))

extern "C" __global__ void __launch_bounds__(128)
gemm_tc_nn(const unsigned short* A, const unsigned short* B, unsigned short* C, int M, int N, int K, int lda, int ldb,
           int ldc, long stride_a, long stride_b, long stride_c, float alpha, float beta)
{
    /* STAGES buffers of A's and B's tiles: dynamic shared memory, STAGES * (A_STAGE + B_STAGE) * 2 bytes. */
    extern __shared__ __align__(16) unsigned short smem[];
    unsigned short* As = smem;
    unsigned short* Bs = smem + STAGES * A_STAGE;
    const unsigned short* a = A + blockIdx.z * stride_a + (long)blockIdx.y * BM * lda;
    const unsigned short* b = B + blockIdx.z * stride_b + (long)blockIdx.x * BN;
    unsigned short* c = C + blockIdx.z * stride_c;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int wm = (warp / 2) * 64, wn = (warp % 2) * 64; /* 4 warps, each a 64 x 64 quarter */
    const int group = lane >> 2, tig = lane & 3;

    /* Each of the 128 threads copies four 16-byte chunks of A's tile (128 x 32) and four of B's (32 x 128). */
    const int t = threadIdx.x;
    const int a_row = t / 4, a_col = (t % 4) * 8;    /* rows a_row + 32 q */
    const int b_row = t / 16, b_col = (t % 16) * 8;  /* rows b_row + 8 q */

    float acc[4][8][4];
    #pragma unroll
    for (int i = 0; i < 4; ++i)
        #pragma unroll
        for (int j = 0; j < 8; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r)
                acc[i][j][r] = 0.0f;

    const int tiles = K / BK;
#define STAGE(buf, p0)                                                                                   \
    do {                                                                                                 \
        unsigned short* as_ = As + (buf) * A_STAGE;                                                      \
        unsigned short* bs_ = Bs + (buf) * B_STAGE;                                                      \
        _Pragma("unroll") for (int q = 0; q < 4; ++q) {                                                  \
            copy16_async(as_ + (a_row + 32 * q) * (BK + PAD) + a_col,                                    \
                         a + (long)(a_row + 32 * q) * lda + (p0) + a_col);                               \
            copy16_async(bs_ + (b_row + 8 * q) * (BN + PAD) + b_col, b + (long)((p0) + b_row + 8 * q) * ldb + b_col); \
        }                                                                                                \
    } while (0)

    /* Tiles 0 .. STAGES-2 in flight before the first computes; each iteration waits for its tile,
     * starts the copy STAGES-1 tiles ahead into the buffer the previous iteration finished with. */
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles)
            STAGE(s, s * BK);
        asm volatile("cp.async.commit_group;");
    }
    for (int tile = 0; tile < tiles; ++tile) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
        __syncthreads();
        const int next = tile + STAGES - 1;
        if (next < tiles)
            STAGE(next % STAGES, next * BK);
        asm volatile("cp.async.commit_group;");
        const unsigned short* as = As + (tile % STAGES) * A_STAGE;
        const unsigned short* bs = Bs + (tile % STAGES) * B_STAGE;
        #pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned int fa[4][4], fb[8][2];
            #pragma unroll
            for (int i = 0; i < 4; ++i) {
                const unsigned short* p = as + (wm + 16 * i + (lane % 16)) * (BK + PAD) + kk + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(fa[i][0]), "=r"(fa[i][1]), "=r"(fa[i][2]), "=r"(fa[i][3])
                             : "r"(smem_address(p)));
            }
            #pragma unroll
            for (int j = 0; j < 8; j += 2) {
                const unsigned short* p = bs + (kk + (lane % 16)) * (BN + PAD) + wn + 8 * j + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(fb[j][0]), "=r"(fb[j][1]), "=r"(fb[j + 1][0]), "=r"(fb[j + 1][1])
                             : "r"(smem_address(p)));
            }
            #pragma unroll
            for (int i = 0; i < 4; ++i)
                #pragma unroll
                for (int j = 0; j < 8; ++j)
                    asm volatile(TC_MMA " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                                 : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                                 : "r"(fa[i][0]), "r"(fa[i][1]), "r"(fa[i][2]), "r"(fa[i][3]), "r"(fb[j][0]),
                                   "r"(fb[j][1]));
        }
    }
    asm volatile("cp.async.wait_group 0;");
#undef STAGE
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
                c[o] = tc_from_float(v0);
                c[o + 1] = tc_from_float(v1);
            }
}
