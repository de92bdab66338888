/* gemm.c: C = alpha * op(A) op(B) + beta * C, batched and strided, row-major, fp32 accumulation.
 *
 * op(A) is M x K: A itself (trans_a = 0, element (i, p) at i * lda + p) or A transposed
 * (trans_a = 1, at p * lda + i); op(B) is K x N likewise with ldb; C is M x N with ldc.
 * Batch b adds b * stride_a, b * stride_b and b * stride_c. beta == 0 never reads C.
 *
 * Options: the element type (kdb_data.h); -DTILE=<t> (default 16): gemm_tiled's blocks of
 * t x t threads, grid (ceil(N / t), ceil(M / t), batch); each block computes a t x t tile of C
 * through shared memory. gemm_blocked: igemm_core.h's 128 x 128 tiles, 8 x 8 sums a thread,
 * blocks of IG_THREADS, grid (ceil(M / 128), ceil(N / 128), batch).
 */
#include "kdb_data.h"
#include "igemm_core.h"

#ifndef TILE
#define TILE 16
#endif

KDB_KERNEL void gemm_tiled(const KDB_GLOBAL kdb_data_t* A, const KDB_GLOBAL kdb_data_t* B, KDB_GLOBAL kdb_data_t* C,
                           int M, int N, int K, int lda, int ldb, int ldc, long stride_a, long stride_b,
                           long stride_c, int trans_a, int trans_b, float alpha, float beta)
{
    KDB_SHARED(float, As, TILE * (TILE + 1));
    KDB_SHARED(float, Bs, TILE * (TILE + 1));
    const int tx = KDB_LOCAL_ID_X, ty = KDB_LOCAL_ID_Y;
    const int row = KDB_GROUP_ID_Y * TILE + ty, col = KDB_GROUP_ID_X * TILE + tx;
    const long batch = KDB_GROUP_ID_Z;
    const KDB_GLOBAL kdb_data_t* a = A + batch * stride_a;
    const KDB_GLOBAL kdb_data_t* b = B + batch * stride_b;
    float acc = 0.0f;
    for (int p0 = 0; p0 < K; p0 += TILE) {
        /* Thread (ty, tx) loads op(A)[row][p0 + tx] and op(B)[p0 + ty][col]. */
        const int pa = p0 + tx, pb = p0 + ty;
        float va = 0.0f, vb = 0.0f;
        if (row < M && pa < K)
            va = KDB_LOAD(a, trans_a ? (long)pa * lda + row : (long)row * lda + pa);
        if (col < N && pb < K)
            vb = KDB_LOAD(b, trans_b ? (long)col * ldb + pb : (long)pb * ldb + col);
        As[ty * (TILE + 1) + tx] = va;
        Bs[ty * (TILE + 1) + tx] = vb;
        KDB_BARRIER;
        for (int p = 0; p < TILE; ++p)
            acc = KDB_FMAF(As[ty * (TILE + 1) + p], Bs[p * (TILE + 1) + tx], acc);
        KDB_BARRIER;
    }
    if (row < M && col < N) {
        const long o = batch * stride_c + (long)row * ldc + col;
        KDB_STORE(C, o, beta == 0.0f ? alpha * acc : alpha * acc + beta * KDB_LOAD(C, o));
    }
}

/* The same product through igemm_core.h. Each operand is read along its memory: op(A)'s rows
 * fastest when A is transposed (a warp reads 32 neighbouring rows of one column), its
 * reduction fastest when not; op(B)'s columns fastest when B is not transposed. */
KDB_KERNEL void KDB_BOUNDS(IG_THREADS, 2)
    gemm_blocked(const KDB_GLOBAL kdb_data_t* A, const KDB_GLOBAL kdb_data_t* B, KDB_GLOBAL kdb_data_t* C, int M,
                 int N, int K, int lda, int ldb, int ldc, long stride_a, long stride_b, long stride_c, int trans_a,
                 int trans_b, float alpha, float beta)
{
    IG_SETUP;
    const long batch = KDB_GROUP_ID_Z;
    const KDB_GLOBAL kdb_data_t* a = A + batch * stride_a;
    const KDB_GLOBAL kdb_data_t* b = B + batch * stride_b;
    IG_LOAD_SLOT(trans_a, t, ka, ma);
    IG_LOAD_SLOT(!trans_b, t, kb, nb);
    long am[IG_QA], bn[IG_QB]; /* each row's (column's) part of the offset; -1 outside the product */
    KDB_UNROLL for (int q = 0; q < IG_QA; ++q) {
        const int m = m0 + ma + 32 * q;
        am[q] = m < M ? (trans_a ? (long)m : (long)m * lda) : -1;
    }
    KDB_UNROLL for (int q = 0; q < IG_QB; ++q) {
        const int n = n0 + nb + 32 * q;
        bn[q] = n < N ? (trans_b ? (long)n * ldb : (long)n) : -1;
    }
    int ra = ka, rb = kb;
#define GB_LOAD                                                                       \
    do {                                                                              \
        const long ak_ = trans_a ? (long)ra * lda : ra, bk_ = trans_b ? rb : (long)rb * ldb; \
        KDB_UNROLL for (int q = 0; q < IG_QA; ++q)                                    \
            ga[q] = ra < K && am[q] >= 0 ? KDB_LOAD(a, am[q] + ak_) : 0.0f;           \
        KDB_UNROLL for (int q = 0; q < IG_QB; ++q)                                    \
            gb[q] = rb < K && bn[q] >= 0 ? KDB_LOAD(b, bn[q] + bk_) : 0.0f;           \
    } while (0)
#define GB_ADVANCE \
    do {           \
        ra += IG_BK; \
        rb += IG_BK; \
    } while (0)
    IG_PIPELINE((K + IG_BK - 1) / IG_BK, GB_LOAD, GB_ADVANCE);
    /* beta == 0 never reads C: it may hold NaNs */
#define GB_ROW(m) ((m) < M ? batch * stride_c + (long)(m) * ldc : -1L)
#define GB_STORE(o, v) KDB_STORE(C, o, beta == 0.0f ? alpha * (v) : alpha * (v) + beta * KDB_LOAD(C, o))
    IG_EPILOGUE(GB_ROW, N, 1, GB_STORE);
}
