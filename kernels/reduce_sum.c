/* reduce_sum.c: sum of n elements, one partial sum per block.
 *
 * Each thread accumulates a grid-stride slice of x, then the block combines its threads'
 * values by a tree reduction in shared/local memory, and thread 0 writes the block's sum to
 * partial[block]. Launching again with one block on the partial sums gives the total.
 *
 * Options: -DBLOCK=<threads per block> (power of two, default 256; the launch's block size
 * must equal it, since it sizes the shared array), -DKDB_DTYPE=float|double (default float).
 */
#include "kdb_compat.h"

#ifndef BLOCK
#define BLOCK 256
#endif
#if BLOCK < 1 || (BLOCK & (BLOCK - 1)) != 0
#error "reduce_sum.c: BLOCK must be a power of two"
#endif
#ifndef KDB_DTYPE
#define KDB_DTYPE float
#endif
typedef KDB_DTYPE kdb_t;

KDB_KERNEL void reduce_sum(const KDB_GLOBAL kdb_t* x, KDB_GLOBAL kdb_t* partial, int n)
{
    KDB_SHARED(kdb_t, sdata, BLOCK);
    const int tid = KDB_LOCAL_ID_X;
    const int stride = BLOCK * KDB_NUM_GROUPS_X;

    kdb_t acc = (kdb_t)0;
    for (int i = KDB_GROUP_ID_X * BLOCK + tid; i < n; i += stride)
        acc += x[i];
    sdata[tid] = acc;
    KDB_BARRIER;

    /* Every thread reaches each barrier: the loop bound is uniform across the block. */
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s)
            sdata[tid] += sdata[tid + s];
        KDB_BARRIER;
    }
    if (tid == 0)
        partial[KDB_GROUP_ID_X] = sdata[0];
}
