/* gemm.c: C = alpha * op(A) op(B) + beta * C, batched and strided, row-major, fp32 accumulation.
 *
 * op(A) is M x K: A itself (trans_a = 0, element (i, p) at i * lda + p) or A transposed
 * (trans_a = 1, at p * lda + i); op(B) is K x N likewise with ldb; C is M x N with ldc.
 * Batch b adds b * stride_a, b * stride_b and b * stride_c. beta == 0 never reads C.
 *
 * Options: the element type (kdb_data.h); -DTILE=<t> (default 16): launch blocks of t x t
 * threads, grid (ceil(N / t), ceil(M / t), batch); each block computes a t x t tile of C
 * through shared memory.
 */
#include "kdb_data.h"

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
