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
 * swizzle (16-byte chunk c of a 128-byte row r at chunk c ^ (r % 8), stages 1024-byte aligned):
 *   - a K-major tile: one row of 64 K values (128 bytes) per M (or N) index;
 *   - an MN-major tile: blocks of 64 M (or N) values, 8 KiB apart, each 64 rows of K by 128 bytes.
 * wgmma reads an MN-major tile transposed (its transpose bit; fp16 and bf16 have one), so every
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

#include "tc_types.h"

#if !defined(GEMM_BN) || !defined(GEMM_STAGES)
#error "gemm_tma.cu needs -DGEMM_BN (128, 192 or 256) and -DGEMM_STAGES"
#endif
#ifndef GEMM_TA
#define GEMM_TA 0
#endif
#ifndef GEMM_TB
#define GEMM_TB 0
#endif

#define TM_BM 128
#define TM_BK 64
#define TM_A_BYTES (TM_BM * TM_BK * 2) /* 16 KiB */
#define TM_B_BYTES (GEMM_BN * TM_BK * 2)
#define TM_STAGE_BYTES (TM_A_BYTES + TM_B_BYTES)
#define TM_BLOCK_BYTES (64 * 128) /* one MN-major block: 64 rows of K by 64 values */
#define TM_STAGING_BYTES 2048      /* a consumer warp's epilogue staging: 16 rows of C by 64 values */
#define TM_GROUP_M 8
#define TM_ACC (GEMM_BN / 2) /* a consumer thread's accumulators: 64 x GEMM_BN over 128 threads */
#define TM_STR_(x) #x
#define TM_STR(x) TM_STR_(x)

/* The accumulator operands of one wgmma: "{%0,...}" and d[0..], for 64, 96 or 128 registers. */
#define TM_R0 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define TM_R64 "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
    "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
#define TM_R96 "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111," \
    "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define TM_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define TM_F16(i) TM_F4(i), TM_F4(i + 4), TM_F4(i + 8), TM_F4(i + 12)
#define TM_F32(i) TM_F16(i), TM_F16(i + 16)
#if GEMM_BN == 128
#define TM_REGS "{" TM_R0 "}, %64, %65, p"
#define TM_SCALE "%66"
#define TM_OPERANDS TM_F32(0), TM_F32(32)
#elif GEMM_BN == 192
#define TM_REGS "{" TM_R0 "," TM_R64 "}, %96, %97, p"
#define TM_SCALE "%98"
#define TM_OPERANDS TM_F32(0), TM_F32(32), TM_F32(64)
#elif GEMM_BN == 256
#define TM_REGS "{" TM_R0 "," TM_R64 "," TM_R96 "}, %128, %129, p"
#define TM_SCALE "%130"
#define TM_OPERANDS TM_F32(0), TM_F32(32), TM_F32(64), TM_F32(96)
#else
#error "GEMM_BN must be 128, 192 or 256"
#endif
#define TM_MMA "wgmma.mma_async.sync.aligned.m64n" TM_STR(GEMM_BN) "k16.f32." TC_TYPE "." TC_TYPE " "
/* wgmma's transpose bits: 1 for an MN-major operand (A stored K x M, B stored K x N). */
#if GEMM_TA
#define TM_TNSP "1, "
#else
#define TM_TNSP "0, "
#endif
#if GEMM_TB
#define TM_TNSP_AB TM_TNSP "0"
#else
#define TM_TNSP_AB TM_TNSP "1"
#endif

/* A CUtensorMap: 128 opaque bytes, passed by value (a __grid_constant__ parameter) and 64-byte aligned. */
struct __align__(64) TmaMap {
    unsigned long long word[16];
};

__device__ __forceinline__ unsigned int tm_smem(const void* p) { return (unsigned int)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void tm_bar_init(unsigned int bar, unsigned int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

/* Wait until the barrier's phase of this parity has completed. */
__device__ __forceinline__ void tm_bar_wait(unsigned int bar, unsigned int parity)
{
    unsigned int done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}

__device__ __forceinline__ void tm_bar_arrive(unsigned int bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

/* The producer's arrival on a full barrier, announcing the bytes its copies will deliver. */
__device__ __forceinline__ void tm_bar_expect(unsigned int bar, unsigned int bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

/* One box of a 3-D tensor map into shared memory at dst, completing on bar. */
__device__ __forceinline__ void tm_load(unsigned int dst, const TmaMap* map, int c0, int c1, int c2, unsigned int bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
                 "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}

__device__ __forceinline__ unsigned int tm_pack(float lo, float hi)
{
    return (unsigned int)tc_from_float(lo) | ((unsigned int)tc_from_float(hi) << 16);
}

/* A wgmma shared-memory descriptor, 128-byte swizzle: start address, leading byte offset (the
 * step between MN-major blocks of 64 values; unused for K-major tiles), 1024 bytes between
 * groups of 8 rows. */
__device__ __forceinline__ unsigned long long tm_desc(unsigned int address, unsigned int leading)
{
    return (unsigned long long)((address & 0x3FFFF) >> 4) | ((unsigned long long)(leading >> 4) << 16) |
           ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

/* D (+)= A B for one 16-deep K step; scale 0 starts a tile (D = A B). */
__device__ __forceinline__ void tm_mma(float* d, unsigned long long a, unsigned long long b, int scale)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " TM_SCALE ", 0;\n" TM_MMA TM_REGS ", 1, 1, " TM_TNSP_AB ";\n}\n"
                 : TM_OPERANDS
                 : "l"(a), "l"(b), "r"(scale));
}

/* Tile number `id` -> (tile row, tile column, batch), in groups of TM_GROUP_M tile rows. */
__device__ __forceinline__ void tm_tile(int id, int tiles_m, int tiles_n, int* tm, int* tn, int* z)
{
    const int per_batch = tiles_m * tiles_n, group = TM_GROUP_M * tiles_n;
    *z = id / per_batch;
    const int r = id - *z * per_batch, first = (r / group) * TM_GROUP_M, in = r - (r / group) * group;
    const int rows = min(tiles_m - first, TM_GROUP_M);
    *tm = first + in % rows;
    *tn = in / rows;
}

extern "C" __global__ void __launch_bounds__(384, 1)
gemm_tma(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, unsigned short* C, int M, int N,
         int K, int ldc, long stride_c, int c_vec, int batch, int a_step, int b_step, float alpha, float beta)
{
    extern __shared__ __align__(16) unsigned char tm_raw[];
    /* Swizzled tiles start on 1024 bytes: the launch asks for 2 KiB more than the stages,
     * which also holds the barriers. */
    const unsigned int raw = tm_smem(tm_raw), base = (raw + 1023u) & ~1023u;
    const unsigned int staging = base + GEMM_STAGES * TM_STAGE_BYTES, full = staging + 8 * TM_STAGING_BYTES,
                       empty = full + 8 * GEMM_STAGES;
    const int t = threadIdx.x, warpgroup = t / 128;
    const int tiles_m = (M + TM_BM - 1) / TM_BM, tiles_n = (N + GEMM_BN - 1) / GEMM_BN;
    const int tiles = tiles_m * tiles_n * batch, k_steps = (K + TM_BK - 1) / TM_BK;

    if (t == 0) {
        for (int s = 0; s < GEMM_STAGES; ++s) {
            tm_bar_init(full + 8 * s, 1);  /* the producer's expect_tx */
            tm_bar_init(empty + 8 * s, 2); /* one arrival per consumer warpgroup */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
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
                    if (++stage == GEMM_STAGES) {
                        stage = 0;
                        phase ^= 1;
                    }
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int half = warpgroup - 1, wt = t % 128, warp = wt / 32, lane = t % 32;
        float d[TM_ACC];
#pragma unroll
        for (int i = 0; i < TM_ACC; ++i)
            d[i] = 0.0f;
        unsigned int stage = 0, phase = 0;
        for (int id = blockIdx.x; id < tiles; id += gridDim.x) {
            int tm, tn, z;
            tm_tile(id, tiles_m, tiles_n, &tm, &tn, &z);
            unsigned int last = 0;
            for (int ks = 0; ks < k_steps; ++ks) {
                tm_bar_wait(full + 8 * stage, phase);
                /* This warpgroup's 64 rows of A: the second 64 rows of a K-major tile, or its
                 * second block of 64 M values, both 8 KiB on. */
                const unsigned int as = base + stage * TM_STAGE_BYTES + half * TM_BLOCK_BYTES,
                                   bs = base + stage * TM_STAGE_BYTES + TM_A_BYTES;
                asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
                for (int kk = 0; kk < TM_BK / 16; ++kk) {
                    /* 16 K values on: 32 bytes along a K-major row, 16 rows (2 KiB) down an MN-major block. */
                    const unsigned long long da =
                        GEMM_TA ? tm_desc(as + kk * 2048, TM_BLOCK_BYTES) : tm_desc(as + kk * 32, 16);
                    const unsigned long long db =
                        GEMM_TB ? tm_desc(bs + kk * 32, 16) : tm_desc(bs + kk * 2048, TM_BLOCK_BYTES);
                    tm_mma(d, da, db, ks | kk);
                }
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                /* The step before this one has finished reading its stage: hand it back. */
                asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
                if (ks > 0 && wt == 0)
                    tm_bar_arrive(empty + 8 * last);
                last = stage;
                if (++stage == GEMM_STAGES) {
                    stage = 0;
                    phase ^= 1;
                }
            }
            asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            if (wt == 0)
                tm_bar_arrive(empty + 8 * last);

            /* d[4j + 0..1]: row r, columns 8j + 2 (lane % 4) and the next; d[4j + 2..3]: row r + 8. */
            unsigned short* c = C + (long)z * stride_c;
            if (beta == 0.0f && c_vec && (tm + 1) * TM_BM <= M && (tn + 1) * GEMM_BN <= N) {
                /* A whole tile: each warp's 16 rows go through its staging area 64 columns at a time
                 * (stmatrix, 16-byte chunks swizzled by row), then out as 16-byte stores, each
                 * instruction 4 rows of 128 contiguous bytes. */
                const unsigned int own = staging + (warpgroup - 1) * 4 * TM_STAGING_BYTES + warp * TM_STAGING_BYTES;
                const int quad = lane / 8, srow = lane % 8 + 8 * (quad & 1);
                unsigned short* rows = c + (long)(tm * TM_BM + half * 64 + warp * 16) * ldc + tn * GEMM_BN;
#pragma unroll
                for (int part = 0; part < GEMM_BN / 64; ++part) {
#pragma unroll
                    for (int p = 0; p < 4; ++p) {
                        /* matrices: columns 8j0.. rows 0-7 and 8-15, then columns 8j0 + 8.. the same */
                        const int j0 = part * 8 + 2 * p;
                        const unsigned int at = own + srow * 128 + (((2 * p + (quad >> 1)) ^ (srow & 7)) << 4);
                        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(at),
                                     "r"(tm_pack(alpha * d[4 * j0], alpha * d[4 * j0 + 1])),
                                     "r"(tm_pack(alpha * d[4 * j0 + 2], alpha * d[4 * j0 + 3])),
                                     "r"(tm_pack(alpha * d[4 * j0 + 4], alpha * d[4 * j0 + 5])),
                                     "r"(tm_pack(alpha * d[4 * j0 + 6], alpha * d[4 * j0 + 7]))
                                     : "memory");
                    }
                    __syncwarp();
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int chunk = lane + 32 * i, row = chunk / 8, col = chunk % 8;
                        unsigned int v0, v1, v2, v3;
                        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                                     : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
                                     : "r"(own + row * 128 + ((col ^ (row & 7)) << 4)));
                        unsigned short* out = rows + (long)row * ldc + part * 64 + col * 8;
                        asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(out), "r"(v0), "r"(v1), "r"(v2),
                                     "r"(v3)
                                     : "memory");
                    }
                    __syncwarp(); /* the staging area is read before the next part overwrites it */
                }
                continue;
            }
            /* An edge tile, beta != 0 or C not in 16-byte rows: element pairs from the registers. */
            const int r0 = tm * TM_BM + half * 64 + warp * 16 + lane / 4, c0 = tn * GEMM_BN + 2 * (lane % 4);
#pragma unroll
            for (int j = 0; j < TM_ACC / 4; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = r0 + 8 * h, col = c0 + 8 * j;
                    if (row >= M || col >= N)
                        continue;
                    const long o = (long)row * ldc + col;
                    float v0 = alpha * d[4 * j + 2 * h], v1 = alpha * d[4 * j + 2 * h + 1];
                    if (col + 1 < N) {
                        unsigned int* p = (unsigned int*)(c + o);
                        if (beta != 0.0f) {
                            const unsigned int old = *p;
                            v0 += beta * tc_to_float((unsigned short)(old & 0xFFFF));
                            v1 += beta * tc_to_float((unsigned short)(old >> 16));
                        }
                        *p = (unsigned int)tc_from_float(v0) | ((unsigned int)tc_from_float(v1) << 16);
                    } else {
                        if (beta != 0.0f)
                            v0 += beta * tc_to_float(c[o]);
                        c[o] = tc_from_float(v0);
                    }
                }
        }
    }
}
