/* matmul_tiled.c: single-precision GEMM, C = alpha * A @ B + beta * C, row-major.
 *
 * A is M x K, B is K x N, C is M x N. Each block computes one TILE x TILE tile of C,
 * staging TILE x TILE tiles of A and B through shared/local memory. Sizes need not be
 * multiples of TILE: out-of-range loads read zero and out-of-range stores are skipped.
 *
 * Options: -DTILE=<n> (default 16).
 * Launch: block (TILE, TILE, 1), grid (ceil(N / TILE), ceil(M / TILE), 1).
 */
#include "kdb_compat.h"

#ifndef TILE
#define TILE 16
#endif

KDB_KERNEL void sgemm_tiled(const KDB_GLOBAL float* A, const KDB_GLOBAL float* B, KDB_GLOBAL float* C,
                            int M, int N, int K, float alpha, float beta)
{
    KDB_SHARED(float, As, TILE * TILE);
    KDB_SHARED(float, Bs, TILE * TILE);
    const int tx = KDB_LOCAL_ID_X;
    const int ty = KDB_LOCAL_ID_Y;
    const int col = KDB_GROUP_ID_X * TILE + tx;
    const int row = KDB_GROUP_ID_Y * TILE + ty;

    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        const int a_col = t + tx;
        const int b_row = t + ty;
        As[ty * TILE + tx] = (row < M && a_col < K) ? A[row * K + a_col] : 0.0f;
        Bs[ty * TILE + tx] = (b_row < K && col < N) ? B[b_row * N + col] : 0.0f;
        KDB_BARRIER;
        for (int k = 0; k < TILE; ++k)
            acc = KDB_FMAF(As[ty * TILE + k], Bs[k * TILE + tx], acc);
        /* The next iteration overwrites the tiles: wait until every thread has read them. */
        KDB_BARRIER;
    }
    if (row < M && col < N) {
        const int idx = row * N + col;
        /* beta == 0 must not read C: it may be uninitialised memory holding NaNs. */
        C[idx] = beta == 0.0f ? alpha * acc : alpha * acc + beta * C[idx];
    }
}
