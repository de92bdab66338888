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

#endif /* KDB_REDUCE_H */
