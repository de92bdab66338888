/* kdb_reduce.h: a block-wide reduction through shared memory, for kernels launched with BLOCK threads.
 *
 *   KDB_BLOCK_REDUCE(scratch, value, OP, result)
 *
 * scratch is a KDB_SHARED float array of BLOCK elements; OP(a, b) a binary macro or function
 * (KDB_REDUCE_ADD, KDB_FMAXF, ...); every thread of the group must reach it (it holds barriers),
 * and every thread gets the result. BLOCK must be a power of two.
 */
#ifndef KDB_REDUCE_H
#define KDB_REDUCE_H
#include "kdb_compat.h"

#define KDB_REDUCE_ADD(a, b) ((a) + (b))

#define KDB_BLOCK_REDUCE(scratch, value, OP, result)                                       \
    do {                                                                                   \
        scratch[KDB_LOCAL_ID_X] = (value);                                                 \
        KDB_BARRIER;                                                                       \
        for (int s_ = BLOCK / 2; s_ > 0; s_ >>= 1) {                                       \
            if (KDB_LOCAL_ID_X < s_)                                                       \
                scratch[KDB_LOCAL_ID_X] = OP(scratch[KDB_LOCAL_ID_X], scratch[KDB_LOCAL_ID_X + s_]); \
            KDB_BARRIER;                                                                   \
        }                                                                                  \
        result = scratch[0];                                                               \
        KDB_BARRIER;                                                                       \
    } while (0)

/* kdb_lanes_reduce(v, lanes, sum, scratch): the sum (sum != 0) or maximum of v over each
 * run of `lanes` consecutive threads of the group (lanes a power of two, at most the group
 * size), every thread getting its run's result. Every thread of the group must call it with
 * the same lanes (it may hold barriers). scratch: a KDB_SHARED float array of one float per
 * thread, unused where the runs fit in 32 lanes and the backend shuffles. */
KDB_DEVICE_FN float kdb_lanes_op(float a, float b, int sum) { return sum ? a + b : KDB_FMAXF(a, b); }

KDB_DEVICE_FN float kdb_lanes_reduce(float v, int lanes, int sum, KDB_SHARED_PTR(float) scratch)
{
    const int t = KDB_LOCAL_ID_X;
#if KDB_HAS_SHUFFLE
    for (int m = (lanes < 32 ? lanes : 32) >> 1; m > 0; m >>= 1)
        v = kdb_lanes_op(v, KDB_SHFL_XOR(v, m), sum);
    if (lanes > 32) {
        /* Runs wider than 32 lanes: each 32's result through shared memory. */
        if ((t & 31) == 0)
            scratch[t >> 5] = v;
        KDB_BARRIER;
        const int first = (t / lanes) * (lanes >> 5);
        v = scratch[first];
        for (int j = 1; j < (lanes >> 5); ++j)
            v = kdb_lanes_op(v, scratch[first + j], sum);
        KDB_BARRIER;
    }
#else
    /* A butterfly through local memory: after step m each thread holds its 2m-run's result. */
    for (int m = lanes >> 1; m > 0; m >>= 1) {
        scratch[t] = v;
        KDB_BARRIER;
        v = kdb_lanes_op(v, scratch[t ^ m], sum);
        KDB_BARRIER;
    }
#endif
    return v;
}

#endif /* KDB_REDUCE_H */
