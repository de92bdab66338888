/* activation.c: element-wise ReLU and leaky ReLU.
 *
 *   relu_fwd:        y[i] = max(x[i], 0)
 *   leaky_relu_fwd:  y[i] = x[i] > 0 ? x[i] : alpha * x[i]
 *
 * Options: -DKDB_DTYPE=float|double (element type, default float).
 * Launch: 1-D, any block size and grid; a grid-stride loop covers all n elements, so a
 * small grid may serve a large tensor. x and y may be the same buffer (in-place).
 */
#include "kdb_compat.h"

#ifndef KDB_DTYPE
#define KDB_DTYPE float
#endif
typedef KDB_DTYPE kdb_t;

KDB_KERNEL void relu_fwd(const KDB_GLOBAL kdb_t* x, KDB_GLOBAL kdb_t* y, int n)
{
    const int stride = KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X;
    for (int i = KDB_GLOBAL_ID_X; i < n; i += stride) {
        const kdb_t v = x[i];
        y[i] = v > (kdb_t)0 ? v : (kdb_t)0;
    }
}

KDB_KERNEL void leaky_relu_fwd(const KDB_GLOBAL kdb_t* x, KDB_GLOBAL kdb_t* y, int n, float alpha)
{
    const int stride = KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X;
    for (int i = KDB_GLOBAL_ID_X; i < n; i += stride) {
        const kdb_t v = x[i];
        y[i] = v > (kdb_t)0 ? v : (kdb_t)alpha * v;
    }
}
