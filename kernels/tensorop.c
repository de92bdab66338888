/* tensorop.c: c = op(alpha1 * a, alpha2 * b) + beta * c, with b broadcast (MIOpen's OpTensor).
 *
 * op (argument): 0 add, 1 mul, 2 min, 3 max. Up to 5-D; every tensor has its own element
 * strides, and a dimension b broadcasts along has stride 0. beta == 0 never reads c.
 *
 * Options: the element type (kdb_data.h).
 * Launch: 1-D, any block size and grid (grid-stride). op_tensor_packed takes n elements of
 * three packed tensors of one shape (op_tensor_vec the same, 16-byte aligned); op_tensor_strided a 5-D shape (leading sizes 1);
 * op_tensor_rows the same 16 bytes at a time where the last dimension allows it.
 */
#include "kdb_data.h"

KDB_DEVICE_FN float op_apply(int op, float a, float b)
{
    switch (op) {
    case 1: return a * b;
    case 2: return KDB_FMINF(a, b);
    case 3: return KDB_FMAXF(a, b);
    default: return a + b;
    }
}

KDB_KERNEL void op_tensor_packed(const KDB_GLOBAL kdb_data_t* a, const KDB_GLOBAL kdb_data_t* b,
                                 KDB_GLOBAL kdb_data_t* c, int n, int op, float alpha1, float alpha2, float beta)
{
    const int stride = KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X;
    for (int i = KDB_GLOBAL_ID_X; i < n; i += stride) {
        const float v = op_apply(op, alpha1 * KDB_LOAD(a, i), alpha2 * KDB_LOAD(b, i));
        KDB_STORE(c, i, beta == 0.0f ? v : v + beta * KDB_LOAD(c, i));
    }
}

/* op_tensor_packed 16 bytes at a time: every tensor 16-byte aligned; the last n % KDB_VEC
 * elements one per thread of the first group. The op is dispatched once per thread (each case
 * inlines the loop with a constant op); each step takes OP_UNROLL vectors a group's size
 * apart, every load issued before any use. One vector a thread: the ops are a few instructions,
 * and many short threads beat fewer long ones (scripts/compare_elementwise.py: add on the H100
 * 0.992x PyTorch's speed at 4 vectors a step, 0.995x at 1 for fp16; fp32 1.003x either way). */
#ifndef OP_UNROLL
#define OP_UNROLL 1
#endif

KDB_DEVICE_FN void op_tensor_run(const KDB_GLOBAL kdb_vec4u* a, const KDB_GLOBAL kdb_vec4u* b, KDB_GLOBAL kdb_vec4u* c,
                                 int vectors, const int op, float alpha1, float alpha2, float beta)
{
    /* A group takes OP_UNROLL * its size consecutive vectors per step (one stretch of memory). */
    const int stride = KDB_LOCAL_SIZE_X, step = KDB_LOCAL_SIZE_X * OP_UNROLL * KDB_NUM_GROUPS_X;
    for (int i = KDB_GROUP_ID_X * KDB_LOCAL_SIZE_X * OP_UNROLL + KDB_LOCAL_ID_X; i < vectors; i += step) {
        kdb_vec4u qa[OP_UNROLL], qb[OP_UNROLL], qc[OP_UNROLL];
#pragma unroll
        for (int u = 0; u < OP_UNROLL; ++u)
            if (i + u * stride < vectors) {
                qa[u] = a[i + u * stride];
                qb[u] = b[i + u * stride];
                if (beta != 0.0f)
                    qc[u] = c[i + u * stride];
            }
#pragma unroll
        for (int u = 0; u < OP_UNROLL; ++u)
            if (i + u * stride < vectors) {
                float av[KDB_VEC], bv[KDB_VEC], cv[KDB_VEC];
                kdb_unpack(qa[u], av);
                kdb_unpack(qb[u], bv);
                for (int e = 0; e < KDB_VEC; ++e)
                    av[e] = op_apply(op, alpha1 * av[e], alpha2 * bv[e]);
                if (beta != 0.0f) {
                    kdb_unpack(qc[u], cv);
                    for (int e = 0; e < KDB_VEC; ++e)
                        av[e] += beta * cv[e];
                }
                c[i + u * stride] = kdb_pack(av);
            }
    }
}

KDB_KERNEL void op_tensor_vec(const KDB_GLOBAL kdb_vec4u* a, const KDB_GLOBAL kdb_vec4u* b, KDB_GLOBAL kdb_vec4u* c,
                              int n, int op, float alpha1, float alpha2, float beta)
{
    const int vectors = n / KDB_VEC;
    switch (op) {
    case 1: op_tensor_run(a, b, c, vectors, 1, alpha1, alpha2, beta); break;
    case 2: op_tensor_run(a, b, c, vectors, 2, alpha1, alpha2, beta); break;
    case 3: op_tensor_run(a, b, c, vectors, 3, alpha1, alpha2, beta); break;
    default: op_tensor_run(a, b, c, vectors, 0, alpha1, alpha2, beta); break;
    }
    const int j = vectors * KDB_VEC + KDB_GLOBAL_ID_X;
    if (j < n) {
        KDB_GLOBAL kdb_data_t* cs = (KDB_GLOBAL kdb_data_t*)c;
        const float v = op_apply(op, alpha1 * KDB_LOAD((const KDB_GLOBAL kdb_data_t*)a, j),
                                 alpha2 * KDB_LOAD((const KDB_GLOBAL kdb_data_t*)b, j));
        KDB_STORE(cs, j, beta == 0.0f ? v : v + beta * KDB_LOAD(cs, j));
    }
}

KDB_KERNEL void op_tensor_strided(const KDB_GLOBAL kdb_data_t* a, const KDB_GLOBAL kdb_data_t* b,
                                  KDB_GLOBAL kdb_data_t* c, int n, int d1, int d2, int d3, int d4, int as0, int as1,
                                  int as2, int as3, int as4, int bs0, int bs1, int bs2, int bs3, int bs4, int cs0,
                                  int cs1, int cs2, int cs3, int cs4, int op, float alpha1, float alpha2, float beta)
{
    const int stride = KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X;
    for (int i = KDB_GLOBAL_ID_X; i < n; i += stride) {
        long r = i;
        const long i4 = r % d4;
        r /= d4;
        const long i3 = r % d3;
        r /= d3;
        const long i2 = r % d2;
        r /= d2;
        const long i1 = r % d1;
        const long i0 = r / d1;
        const long ao = i0 * as0 + i1 * as1 + i2 * as2 + i3 * as3 + i4 * as4;
        const long bo = i0 * bs0 + i1 * bs1 + i2 * bs2 + i3 * bs3 + i4 * bs4;
        const long co = i0 * cs0 + i1 * cs1 + i2 * cs2 + i3 * cs3 + i4 * cs4;
        const float v = op_apply(op, alpha1 * KDB_LOAD(a, ao), alpha2 * KDB_LOAD(b, bo));
        KDB_STORE(c, co, beta == 0.0f ? v : v + beta * KDB_LOAD(c, co));
    }
}

/* op_tensor_strided 16 bytes at a time, for tensors whose last dimension is contiguous in a, b
 * and c and a whole number of vectors long, every other stride a multiple of KDB_VEC elements
 * and every tensor 16-byte aligned: a bias added along rows (b broadcast), heads split or
 * merged through permuted strides. The shape is d0 x d1 x d2 x d3 x (vpr vectors), strides in
 * vectors; one thread per vector, whose 32-bit index divisions are paid once per KDB_VEC
 * elements (the element-wise kernel pays four 64-bit ones per element, which bounds it). */
KDB_DEVICE_FN void op_tensor_rows_run(const KDB_GLOBAL kdb_vec4u* a, const KDB_GLOBAL kdb_vec4u* b,
                                      KDB_GLOBAL kdb_vec4u* c, int vectors, int vpr, int d1, int d2, int d3,
                                      int as0, int as1, int as2, int as3, int bs0, int bs1, int bs2, int bs3,
                                      int cs0, int cs1, int cs2, int cs3, const int op, float alpha1, float alpha2,
                                      float beta)
{
    const unsigned stride = KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X;
    for (unsigned i = KDB_GLOBAL_ID_X; i < (unsigned)vectors; i += stride) {
        unsigned r = i / (unsigned)vpr;
        const long j = (long)(i - r * (unsigned)vpr);
        const long i3 = r % (unsigned)d3;
        r /= (unsigned)d3;
        const long i2 = r % (unsigned)d2;
        r /= (unsigned)d2;
        const long i1 = r % (unsigned)d1;
        const long i0 = r / (unsigned)d1;
        const long ao = i0 * as0 + i1 * as1 + i2 * as2 + i3 * as3 + j;
        const long bo = i0 * bs0 + i1 * bs1 + i2 * bs2 + i3 * bs3 + j;
        const long co = i0 * cs0 + i1 * cs1 + i2 * cs2 + i3 * cs3 + j;
        float av[KDB_VEC], bv[KDB_VEC], cv[KDB_VEC];
        kdb_unpack(a[ao], av);
        kdb_unpack(b[bo], bv);
        for (int e = 0; e < KDB_VEC; ++e)
            av[e] = op_apply(op, alpha1 * av[e], alpha2 * bv[e]);
        if (beta != 0.0f) {
            kdb_unpack(c[co], cv);
            for (int e = 0; e < KDB_VEC; ++e)
                av[e] += beta * cv[e];
        }
        c[co] = kdb_pack(av);
    }
}

KDB_KERNEL void op_tensor_rows(const KDB_GLOBAL kdb_vec4u* a, const KDB_GLOBAL kdb_vec4u* b, KDB_GLOBAL kdb_vec4u* c,
                               int vectors, int vpr, int d1, int d2, int d3, int as0, int as1, int as2, int as3,
                               int bs0, int bs1, int bs2, int bs3, int cs0, int cs1, int cs2, int cs3, int op,
                               float alpha1, float alpha2, float beta)
{
#define OP_ROWS(o) op_tensor_rows_run(a, b, c, vectors, vpr, d1, d2, d3, as0, as1, as2, as3, bs0, bs1, bs2, bs3, \
                                      cs0, cs1, cs2, cs3, o, alpha1, alpha2, beta)
    switch (op) {
    case 1: OP_ROWS(1); break;
    case 2: OP_ROWS(2); break;
    case 3: OP_ROWS(3); break;
    default: OP_ROWS(0); break;
    }
#undef OP_ROWS
}
