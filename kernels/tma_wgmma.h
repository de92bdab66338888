/* tma_wgmma.h: the pieces of Hopper's warp-specialised matrix pipeline that gemm_tma.cu and
 * conv_tma.cu share: mbarriers, tensor copies (tile and im2col), wgmma descriptors and the
 * m64nBNk16 instruction, the consumers' main loop over a ring of stages, and the epilogue that
 * writes a 128 x BN tile of a row-major C.
 *
 * The including kernel defines TM_BN (64, 128, 192 or 256: the tile's columns), TM_STAGES, and
 * TM_TA / TM_TB (0 or 1: wgmma's transpose bits, 1 for an MN-major A or B tile), and may define
 * TM_BK (the K values a stage holds: 64, or 32 or 16 for K-major tiles of a narrow reduction,
 * such as a convolution over 16 or 32 channels; 64 unless defined). Its producer fills stage s
 * at base + s * TM_STAGE_BYTES: A's 128 x TM_BK tile first (TM_A_BYTES), then B's TM_BK x TM_BN,
 * both as TMA writes them with the swizzle as wide as a row (TM_ROW_BYTES: 128, 64 or 32 bytes;
 * 16-byte chunk c of row r at chunk c ^ ((r / (128 / TM_ROW_BYTES)) % (TM_ROW_BYTES / 16)),
 * stages 1024-byte aligned):
 *   - a K-major tile: one row of TM_BK K values (TM_ROW_BYTES) per M (or N) index;
 *   - an MN-major tile (TM_BK 64 only): blocks of 64 M (or N) values, 8 KiB apart, each 64 rows
 *     of K by 128 bytes.
 * Each stage has two mbarriers: "full" (the copies' bytes have landed: the producer's
 * expect_tx and the copies' complete_tx) and "empty" (both consumer warpgroups have finished
 * the multiplies that read it). Needs --gpu-architecture=sm_90a (wgmma, setmaxnreg).
 */
#ifndef TMA_WGMMA_H
#define TMA_WGMMA_H

#include "tc_types.h"

#if !defined(TM_BN) || !defined(TM_STAGES) || !defined(TM_TA) || !defined(TM_TB)
#error "tma_wgmma.h needs TM_BN, TM_STAGES, TM_TA and TM_TB"
#endif

#ifndef TM_BK
#define TM_BK 64
#endif
#if TM_BK != 64 && TM_BK != 32 && TM_BK != 16
#error "TM_BK must be 64, 32 or 16"
#endif
#if TM_BK != 64 && (TM_TA || TM_TB)
#error "a narrower K step than 64 takes K-major tiles only"
#endif
#define TM_BM 128
#define TM_ROW_BYTES (TM_BK * 2) /* a K-major row, and the swizzle's span */
#define TM_A_BYTES (TM_BM * TM_BK * 2) /* 16 KiB at TM_BK 64 */
#define TM_B_BYTES (TM_BN * TM_BK * 2)
#define TM_STAGE_BYTES (TM_A_BYTES + TM_B_BYTES)
#define TM_BLOCK_BYTES (64 * 128) /* one MN-major block: 64 rows of K by 64 values */
#define TM_STAGING_BYTES 2048      /* a consumer warp's epilogue staging: 16 rows of C by 64 values */
#define TM_GROUP_M 8
#define TM_ACC (TM_BN / 2) /* a consumer thread's accumulators: 64 x TM_BN over 128 threads */
#define TM_STR_(x) #x
#define TM_STR(x) TM_STR_(x)

/* The accumulator operands of one wgmma: "{%0,...}" and d[0..], for 32, 64, 96 or 128 registers. */
#define TM_R0_31 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
    "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define TM_R0 TM_R0_31 "," \
    "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
    "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define TM_R64 "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79," \
    "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95"
#define TM_R96 "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111," \
    "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define TM_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define TM_F16(i) TM_F4(i), TM_F4(i + 4), TM_F4(i + 8), TM_F4(i + 12)
#define TM_F32(i) TM_F16(i), TM_F16(i + 16)
#if TM_BN == 64
#define TM_REGS "{" TM_R0_31 "}, %32, %33, p"
#define TM_SCALE "%34"
#define TM_OPERANDS TM_F32(0)
#elif TM_BN == 128
#define TM_REGS "{" TM_R0 "}, %64, %65, p"
#define TM_SCALE "%66"
#define TM_OPERANDS TM_F32(0), TM_F32(32)
#elif TM_BN == 192
#define TM_REGS "{" TM_R0 "," TM_R64 "}, %96, %97, p"
#define TM_SCALE "%98"
#define TM_OPERANDS TM_F32(0), TM_F32(32), TM_F32(64)
#elif TM_BN == 256
#define TM_REGS "{" TM_R0 "," TM_R64 "," TM_R96 "}, %128, %129, p"
#define TM_SCALE "%130"
#define TM_OPERANDS TM_F32(0), TM_F32(32), TM_F32(64), TM_F32(96)
#else
#error "TM_BN must be 64, 128, 192 or 256"
#endif
#define TM_MMA "wgmma.mma_async.sync.aligned.m64n" TM_STR(TM_BN) "k16.f32." TC_TYPE "." TC_TYPE " "
#define TM_TNSP_AB TM_STR(TM_TA) ", " TM_STR(TM_TB)

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

/* One im2col box of a 4-D (C, W, H, N) tensor map: channels c.. of the pixels the map's
 * traversal walks from (w, h, n), each pixel moved by the filter offset (dw, dh). */
__device__ __forceinline__ void tm_load_im2col(unsigned int dst, const TmaMap* map, int c, int w, int h, int n,
                                               unsigned short dw, unsigned short dh, unsigned int bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};" ::"r"(dst),
                 "l"((unsigned long long)map), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar), "h"(dw), "h"(dh)
                 : "memory");
}

__device__ __forceinline__ unsigned int tm_pack(float lo, float hi)
{
    return (unsigned int)tc_from_float(lo) | ((unsigned int)tc_from_float(hi) << 16);
}

/* A wgmma shared-memory descriptor, the swizzle TM_ROW_BYTES wide (layout 1: 128 bytes, 2: 64,
 * 3: 32, in bits 62-63): start address, leading byte offset (the step between MN-major blocks of
 * 64 values; unused for K-major tiles), 8 rows' bytes between groups of 8 rows. */
#define TM_SWIZZLE_LAYOUT (TM_ROW_BYTES == 128 ? 1ull : TM_ROW_BYTES == 64 ? 2ull : 3ull)
__device__ __forceinline__ unsigned long long tm_desc(unsigned int address, unsigned int leading)
{
    return (unsigned long long)((address & 0x3FFFF) >> 4) | ((unsigned long long)(leading >> 4) << 16) |
           ((unsigned long long)((8 * TM_ROW_BYTES) >> 4) << 32) | (TM_SWIZZLE_LAYOUT << 62);
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

/* Barriers and roles: the block's first thread sets up each stage's two barriers. Call with
 * every thread; `full` and `empty` are the shared addresses of TM_STAGES barriers each. */
__device__ __forceinline__ void tm_init_barriers(unsigned int full, unsigned int empty)
{
    if (threadIdx.x == 0) {
        for (int s = 0; s < TM_STAGES; ++s) {
            tm_bar_init(full + 8 * s, 1);  /* the producer's expect_tx */
            tm_bar_init(empty + 8 * s, 2); /* one arrival per consumer warpgroup */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

/* Where a kernel's dynamic shared memory goes: the TM_STAGES stages from the first 1024-byte
 * boundary (swizzled tiles start on one: the launch asks for 2 KiB more than the stages, which
 * also holds the barriers), the consumer warps' epilogue staging, then the full and the empty
 * barriers. */
struct TmLayout {
    unsigned int base, staging, full, empty;
};

__device__ __forceinline__ TmLayout tm_layout(const void* raw)
{
    const unsigned int base = (tm_smem(raw) + 1023u) & ~1023u, staging = base + TM_STAGES * TM_STAGE_BYTES;
    const unsigned int full = staging + 8 * TM_STAGING_BYTES;
    return TmLayout{base, staging, full, full + 8 * TM_STAGES};
}

/* The producer warpgroup gives up registers for the consumers, which take them. */
__device__ __forceinline__ void tm_producer_start() { asm volatile("setmaxnreg.dec.sync.aligned.u32 40;"); }

__device__ __forceinline__ void tm_consumer_start() { asm volatile("setmaxnreg.inc.sync.aligned.u32 232;"); }

/* The producer's step to the next stage of the ring. */
__device__ __forceinline__ void tm_next_stage(unsigned int& stage, unsigned int& phase)
{
    if (++stage == TM_STAGES) {
        stage = 0;
        phase ^= 1;
    }
}

/* A consumer warpgroup's multiplies for one tile: k_steps stages of the ring, from (stage,
 * phase) on, into d (its 64 rows: `half` 0 or 1 of the tile's 128), each stage handed back
 * through its empty barrier once wgmma has finished reading it. */
__device__ __forceinline__ void tm_consume(float* d, unsigned int base, unsigned int full, unsigned int empty,
                                           unsigned int& stage, unsigned int& phase, int k_steps, int half, int wt)
{
    unsigned int last = 0;
    for (int ks = 0; ks < k_steps; ++ks) {
        tm_bar_wait(full + 8 * stage, phase);
        /* This warpgroup's 64 rows of A: the second 64 rows of a K-major tile (64 rows on), or
         * its second block of 64 M values (8 KiB on). */
        const unsigned int as = base + stage * TM_STAGE_BYTES + half * (TM_TA ? TM_BLOCK_BYTES : 64 * TM_ROW_BYTES),
                           bs = base + stage * TM_STAGE_BYTES + TM_A_BYTES;
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < TM_BK / 16; ++kk) {
            /* 16 K values on: 32 bytes along a K-major row, 16 rows (2 KiB) down an MN-major block. */
            const unsigned long long da =
                TM_TA ? tm_desc(as + kk * 2048, TM_BLOCK_BYTES) : tm_desc(as + kk * 32, 16);
            const unsigned long long db =
                TM_TB ? tm_desc(bs + kk * 2048, TM_BLOCK_BYTES) : tm_desc(bs + kk * 32, 16);
            tm_mma(d, da, db, ks | kk);
        }
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        /* The step before this one has finished reading its stage: hand it back. */
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        if (ks > 0 && wt == 0)
            tm_bar_arrive(empty + 8 * last);
        last = stage;
        tm_next_stage(stage, phase);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    if (wt == 0)
        tm_bar_arrive(empty + 8 * last);
}

/* What the epilogue does to each value of c after alpha and beta, in this order: times
 * scale[column] plus shift[column] (fp32 per column: a batch norm folded into the convolution;
 * both null for none), plus res at the same place (16-bit, laid out as c: a residual
 * connection; null for none), then max(value, 0) where relu. The default does nothing. */
struct TmEpilogue {
    const float* scale = nullptr;
    const float* shift = nullptr;
    const unsigned short* res = nullptr;
    int relu = 0;
};

/* scale and shift, and relu where no residual follows: what applies before rounding to 16 bits. */
__device__ __forceinline__ float tm_affine(float v, int col, const TmEpilogue& ep)
{
    if (ep.scale)
        v = v * ep.scale[col] + ep.shift[col];
    return ep.relu && !ep.res ? fmaxf(v, 0.0f) : v;
}

/* A pair of stored 16-bit values plus a pair of the residual's, then ReLU where asked. */
__device__ __forceinline__ unsigned int tm_add_pair(unsigned int v, unsigned int r, int relu)
{
    float lo = tc_to_float((unsigned short)(v & 0xFFFF)) + tc_to_float((unsigned short)(r & 0xFFFF));
    float hi = tc_to_float((unsigned short)(v >> 16)) + tc_to_float((unsigned short)(r >> 16));
    if (relu) {
        lo = fmaxf(lo, 0.0f);
        hi = fmaxf(hi, 0.0f);
    }
    return tm_pack(lo, hi);
}

/* One element of an edge tile: beta, the epilogue, then a 2-byte store. */
__device__ __forceinline__ void tm_store_one(unsigned short* c, long o, float v, int col, float beta,
                                             const TmEpilogue& ep)
{
    if (beta != 0.0f)
        v += beta * tc_to_float(c[o]);
    v = tm_affine(v, col, ep);
    if (ep.res) { /* rounded first, as the pair path's sum of two stored values */
        v = tc_to_float(tc_from_float(v)) + tc_to_float(ep.res[o]);
        if (ep.relu)
            v = fmaxf(v, 0.0f);
    }
    c[o] = tc_from_float(v);
}

/* A consumer warpgroup's rows of tile (tm, tn) of the M x N row-major c (leading dimension
 * ldc), alpha, beta and the epilogue ``ep`` applied: with beta 0 and c_vec (ldc a multiple of
 * 8) through the warp's staging area (stmatrix) as 16-byte stores of 128-byte rows, a tile cut
 * by M or N too (its rows and 8-column chunks past the edges left out, a chunk cut by N stored
 * element by element, the 64-column parts wholly past N skipped), any other tile as element
 * pairs straight from the registers. d[4j + 0..1]: row r, columns 8j + 2 (lane % 4) and the
 * next; d[4j + 2..3]: row r + 8. */
__device__ __forceinline__ void tm_store(const float* d, unsigned short* c, int tm, int tn, int M, int N, int ldc,
                                         int c_vec, float alpha, float beta, unsigned int staging, int half, int warp,
                                         int lane, const TmEpilogue ep = TmEpilogue())
{
    if (beta == 0.0f && c_vec) {
        /* Each warp's 16 rows go through its staging area 64 columns at a time (stmatrix,
         * 16-byte chunks swizzled by row), then out as 16-byte stores, each instruction 4 rows
         * of 128 contiguous bytes where the tile is whole. */
        const unsigned int own = staging + half * 4 * TM_STAGING_BYTES + warp * TM_STAGING_BYTES;
        const int quad = lane / 8, srow = lane % 8 + 8 * (quad & 1);
        const int first = tm * TM_BM + half * 64 + warp * 16, rows_in = M - first, cols_in = N - tn * TM_BN;
        unsigned short* rows = c + (long)first * ldc + tn * TM_BN;
#pragma unroll
        for (int part = 0; part < TM_BN / 64; ++part) {
            if (part * 64 >= cols_in) /* the same for the whole warp: no stmatrix is left half-done */
                break;
#pragma unroll
            for (int p = 0; p < 4; ++p) {
                /* matrices: columns 8j0.. rows 0-7 and 8-15, then columns 8j0 + 8.. the same */
                const int j0 = part * 8 + 2 * p;
                const unsigned int at = own + srow * 128 + (((2 * p + (quad >> 1)) ^ (srow & 7)) << 4);
                /* d[4 j0 + q]: column 8 (j0 + q / 4) + 2 (lane % 4) + q % 2 of the tile */
                float e[8];
#pragma unroll
                for (int q = 0; q < 8; ++q) {
                    const int col = tn * TM_BN + 8 * (j0 + q / 4) + 2 * (lane % 4) + (q & 1);
                    e[q] = tm_affine(alpha * d[4 * j0 + q], col, ep);
                }
                asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(at),
                             "r"(tm_pack(e[0], e[1])), "r"(tm_pack(e[2], e[3])), "r"(tm_pack(e[4], e[5])),
                             "r"(tm_pack(e[6], e[7]))
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
                const int at_col = part * 64 + col * 8;
                if (row >= rows_in || at_col >= cols_in)
                    continue;
                unsigned short* out = rows + (long)row * ldc + at_col;
                if (at_col + 8 <= cols_in) {
                    if (ep.res) {
                        unsigned int r0, r1, r2, r3;
                        asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                                     : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                                     : "l"(ep.res + (out - c)));
                        v0 = tm_add_pair(v0, r0, ep.relu);
                        v1 = tm_add_pair(v1, r1, ep.relu);
                        v2 = tm_add_pair(v2, r2, ep.relu);
                        v3 = tm_add_pair(v3, r3, ep.relu);
                    }
                    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(out), "r"(v0), "r"(v1), "r"(v2),
                                 "r"(v3)
                                 : "memory");
                } else { /* a chunk cut by N (N not a multiple of 8) */
                    const unsigned int v[4] = {v0, v1, v2, v3};
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        if (at_col + e >= cols_in)
                            continue;
                        unsigned short value = (unsigned short)(v[e / 2] >> (16 * (e % 2)));
                        if (ep.res) { /* the sum of two stored values, as the whole chunks' */
                            float sum = tc_to_float(value) + tc_to_float(ep.res[(out - c) + e]);
                            value = tc_from_float(ep.relu ? fmaxf(sum, 0.0f) : sum);
                        }
                        out[e] = value;
                    }
                }
            }
            __syncwarp(); /* the staging area is read before the next part overwrites it */
        }
        return;
    }
    /* An edge tile, beta != 0 or C not in 16-byte rows: element pairs from the registers, one
     * 4-byte store a pair where ldc is even, else two 2-byte stores. */
    const int r0 = tm * TM_BM + half * 64 + warp * 16 + lane / 4, c0 = tn * TM_BN + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < TM_ACC / 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = r0 + 8 * h, col = c0 + 8 * j;
            if (row >= M || col >= N)
                continue;
            const long o = (long)row * ldc + col;
            float v0 = alpha * d[4 * j + 2 * h], v1 = alpha * d[4 * j + 2 * h + 1];
            if (col + 1 < N && !(ldc & 1)) { /* an odd ldc puts every other row's pairs off 4 bytes */
                unsigned int* p = (unsigned int*)(c + o);
                if (beta != 0.0f) {
                    const unsigned int old = *p;
                    v0 += beta * tc_to_float((unsigned short)(old & 0xFFFF));
                    v1 += beta * tc_to_float((unsigned short)(old >> 16));
                }
                unsigned int pair = tm_pack(tm_affine(v0, col, ep), tm_affine(v1, col + 1, ep));
                if (ep.res)
                    pair = tm_add_pair(pair, *(const unsigned int*)(ep.res + o), ep.relu);
                *p = pair;
            } else {
                tm_store_one(c, o, v0, col, beta, ep);
                if (col + 1 < N)
                    tm_store_one(c, o + 1, v1, col + 1, beta, ep);
            }
        }
}

#endif /* TMA_WGMMA_H */
