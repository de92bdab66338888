/* layernorm.c: layer normalisation forward and backward over each row of a packed tensor.
 *
 * A row is the `inner` trailing elements (the normalised dimensions); there are `rows`.
 * Forward:  mean, rstd = 1 / sqrt(var + eps) per row (float32), y = (x - mean) * rstd [* w + b].
 * Backward: dx = rstd * (g - (sum(g) + xhat * sum(g * xhat)) / inner), g = dy [* w];
 *           dw = sum over rows of dy * xhat, db = sum over rows of dy (affine only).
 * affine (argument): 0 ignores weight and bias, 1 applies them (shape: one row).
 *
 * Options: the element type (kdb_data.h); -DBLOCK=<n> (default 256): layernorm_fwd and
 * layernorm_bwd_data run BLOCK threads per group, one group per row (grid-stride over rows);
 * layernorm_bwd_weight gives each thread one column (any 1-D launch).
 */
#include "kdb_data.h"
#include "kdb_reduce.h"

#ifndef BLOCK
#define BLOCK 256
#endif
#define LN_CACHE 8 /* elements per thread kept in registers when a row fits: rows up to BLOCK * 8 */


KDB_KERNEL void layernorm_fwd(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* weight,
                              const KDB_GLOBAL kdb_data_t* bias, KDB_GLOBAL kdb_data_t* y, KDB_GLOBAL float* mean,
                              KDB_GLOBAL float* rstd, int rows, int inner, int affine, float eps)
{
    KDB_SHARED(float, scratch, BLOCK);
    const int t = KDB_LOCAL_ID_X;
    if (inner <= BLOCK * LN_CACHE) {
        /* The row fits in registers: read x once instead of three times. */
        for (int r = KDB_GROUP_ID_X; r < rows; r += KDB_NUM_GROUPS_X) {
            const long base = (long)r * inner;
            float cache[LN_CACHE];
            float s = 0.0f;
            for (int q = 0; q < LN_CACHE; ++q) {
                const int j = t + q * BLOCK;
                cache[q] = j < inner ? KDB_LOAD(x, base + j) : 0.0f;
                s += cache[q];
            }
            KDB_BLOCK_REDUCE(scratch, s, KDB_REDUCE_ADD, s);
            const float m = s / inner;
            float v = 0.0f;
            for (int q = 0; q < LN_CACHE; ++q) {
                const float d = t + q * BLOCK < inner ? cache[q] - m : 0.0f;
                v += d * d;
            }
            KDB_BLOCK_REDUCE(scratch, v, KDB_REDUCE_ADD, v);
            const float rs = 1.0f / KDB_SQRTF(v / inner + eps);
            if (t == 0) {
                mean[r] = m;
                rstd[r] = rs;
            }
            for (int q = 0; q < LN_CACHE; ++q) {
                const int j = t + q * BLOCK;
                if (j >= inner)
                    break;
                float out = (cache[q] - m) * rs;
                if (affine)
                    out = out * KDB_LOAD(weight, j) + KDB_LOAD(bias, j);
                KDB_STORE(y, base + j, out);
            }
        }
        return;
    }
    for (int r = KDB_GROUP_ID_X; r < rows; r += KDB_NUM_GROUPS_X) {
        const long base = (long)r * inner;
        float s = 0.0f;
        for (int j = t; j < inner; j += BLOCK)
            s += KDB_LOAD(x, base + j);
        KDB_BLOCK_REDUCE(scratch, s, KDB_REDUCE_ADD, s);
        const float m = s / inner;
        float v = 0.0f;
        for (int j = t; j < inner; j += BLOCK) {
            const float d = KDB_LOAD(x, base + j) - m;
            v += d * d;
        }
        KDB_BLOCK_REDUCE(scratch, v, KDB_REDUCE_ADD, v);
        const float rs = 1.0f / KDB_SQRTF(v / inner + eps);
        if (t == 0) {
            mean[r] = m;
            rstd[r] = rs;
        }
        for (int j = t; j < inner; j += BLOCK) {
            float out = (KDB_LOAD(x, base + j) - m) * rs;
            if (affine)
                out = out * KDB_LOAD(weight, j) + KDB_LOAD(bias, j);
            KDB_STORE(y, base + j, out);
        }
    }
}

KDB_KERNEL void layernorm_bwd_data(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* dy,
                                   const KDB_GLOBAL kdb_data_t* weight, const KDB_GLOBAL float* mean,
                                   const KDB_GLOBAL float* rstd, KDB_GLOBAL kdb_data_t* dx, int rows, int inner,
                                   int affine)
{
    KDB_SHARED(float, scratch, BLOCK);
    const int t = KDB_LOCAL_ID_X;
    for (int r = KDB_GROUP_ID_X; r < rows; r += KDB_NUM_GROUPS_X) {
        const long base = (long)r * inner;
        const float m = mean[r], rs = rstd[r];
        float sg = 0.0f, sgx = 0.0f;
        for (int j = t; j < inner; j += BLOCK) {
            const float g = KDB_LOAD(dy, base + j) * (affine ? KDB_LOAD(weight, j) : 1.0f);
            sg += g;
            sgx += g * (KDB_LOAD(x, base + j) - m) * rs;
        }
        KDB_BLOCK_REDUCE(scratch, sg, KDB_REDUCE_ADD, sg);
        KDB_BLOCK_REDUCE(scratch, sgx, KDB_REDUCE_ADD, sgx);
        for (int j = t; j < inner; j += BLOCK) {
            const float g = KDB_LOAD(dy, base + j) * (affine ? KDB_LOAD(weight, j) : 1.0f);
            const float xhat = (KDB_LOAD(x, base + j) - m) * rs;
            KDB_STORE(dx, base + j, rs * (g - (sg + xhat * sgx) / inner));
        }
    }
}

KDB_KERNEL void layernorm_bwd_weight(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* dy,
                                     const KDB_GLOBAL float* mean, const KDB_GLOBAL float* rstd,
                                     KDB_GLOBAL kdb_data_t* dweight, KDB_GLOBAL kdb_data_t* dbias, int rows, int inner)
{
    for (int j = KDB_GLOBAL_ID_X; j < inner; j += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        float dw = 0.0f, db = 0.0f;
        for (int r = 0; r < rows; ++r) {
            const long i = (long)r * inner + j;
            const float g = KDB_LOAD(dy, i);
            dw += g * (KDB_LOAD(x, i) - mean[r]) * rstd[r];
            db += g;
        }
        KDB_STORE(dweight, j, dw);
        KDB_STORE(dbias, j, db);
    }
}

/* ------------------------------------------------------------------ lanes: 16-byte rows
 * layernorm_fwd over rows of whole 16-byte vectors (inner % KDB_VEC == 0; every tensor,
 * weight and bias included, 16-byte aligned: the solver checks): `lanes` threads share a row
 * (a power of two, at most BLOCK; launch BLOCK threads per group), each keeping up to
 * LANES_VECS of its vectors in registers, as floats; the mean and the variance reduce across the
 * run (kdb_reduce.h). Options: -DLANES_VECS=<n> (default 4). */
#ifndef LANES_VECS
#define LANES_VECS 4
#endif
/* 16-bit rows of up to 4 vectors a thread: registers capped on CUDA so that 3 groups fit a
 * multiprocessor (89 -> 80 registers, no spills), for more reads in flight (an H200: 82-83% ->
 * 84-85% of copy, docs/performance.md). -DLANES_GROUPS=<g> sets another cap. */
#if !defined(LANES_GROUPS) && LANES_VECS == 4 && (defined(KDB_TYPE_FP16) || defined(KDB_TYPE_BF16))
#define LANES_GROUPS 3
#endif
#ifdef LANES_GROUPS
#define LN_LANES_BOUNDS KDB_BOUNDS(BLOCK, LANES_GROUPS)
#else
#define LN_LANES_BOUNDS
#endif

KDB_KERNEL void LN_LANES_BOUNDS layernorm_fwd_lanes(const KDB_GLOBAL kdb_vec4u* x, const KDB_GLOBAL kdb_vec4u* weight,
                                    const KDB_GLOBAL kdb_vec4u* bias, KDB_GLOBAL kdb_vec4u* y,
                                    KDB_GLOBAL float* mean, KDB_GLOBAL float* rstd, int rows, int inner, int affine,
                                    float eps, int lanes)
{
    KDB_SHARED(float, scratch, BLOCK);
    const int vecs = inner / KDB_VEC;
    const int lane = KDB_LOCAL_ID_X & (lanes - 1), per_group = KDB_LOCAL_SIZE_X / lanes;
    const int step = KDB_NUM_GROUPS_X * per_group;
    /* The next row's vectors are read while this one's reductions run (the solver sizes the
     * grid so that a group takes several rows). */
    kdb_vec4u q[LANES_VECS];
    {
        const int r = KDB_GROUP_ID_X * per_group + KDB_LOCAL_ID_X / lanes;
#pragma unroll
        for (int k = 0; k < LANES_VECS; ++k)
            if (r < rows && lane + k * lanes < vecs)
                q[k] = x[(long)r * vecs + lane + k * lanes];
    }
    /* The loop's trip count is the same for the whole group: every thread reaches the reductions. */
    for (int first = KDB_GROUP_ID_X * per_group; first < rows; first += step) {
        const int r = first + KDB_LOCAL_ID_X / lanes, live = r < rows;
        const long base = live ? (long)r * vecs : 0;
        float f[LANES_VECS * KDB_VEC], s = 0.0f; /* each element converted once */
#pragma unroll
        for (int k = 0; k < LANES_VECS; ++k)
            if (live && lane + k * lanes < vecs) {
                kdb_unpack(q[k], f + k * KDB_VEC);
                for (int e = 0; e < KDB_VEC; ++e)
                    s += f[k * KDB_VEC + e];
            }
#pragma unroll
        for (int k = 0; k < LANES_VECS; ++k)
            if (r + step < rows && lane + k * lanes < vecs)
                q[k] = x[(long)(r + step) * vecs + lane + k * lanes];
        const float m = kdb_lanes_reduce(s, lanes, 1, scratch) / inner;
        float d2 = 0.0f;
#pragma unroll
        for (int k = 0; k < LANES_VECS; ++k)
            if (live && lane + k * lanes < vecs)
                for (int e = 0; e < KDB_VEC; ++e)
                    d2 += (f[k * KDB_VEC + e] - m) * (f[k * KDB_VEC + e] - m);
        const float rs = 1.0f / KDB_SQRTF(kdb_lanes_reduce(d2, lanes, 1, scratch) / inner + eps);
        if (live && lane == 0) {
            mean[r] = m;
            rstd[r] = rs;
        }
#pragma unroll
        for (int k = 0; k < LANES_VECS; ++k)
            if (live && lane + k * lanes < vecs) {
                const int j = lane + k * lanes;
                float* v = f + k * KDB_VEC;
                for (int e = 0; e < KDB_VEC; ++e)
                    v[e] = (v[e] - m) * rs;
                if (affine) {
                    float w[KDB_VEC], b[KDB_VEC];
                    kdb_unpack(weight[j], w);
                    kdb_unpack(bias[j], b);
                    for (int e = 0; e < KDB_VEC; ++e)
                        v[e] = v[e] * w[e] + b[e];
                }
                y[base + j] = kdb_pack(v);
            }
    }
}
