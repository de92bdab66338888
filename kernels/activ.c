/* activ.c: every activation, forward and backward, packed and strided.
 *
 * The mode is a launch argument, with MIOpen's numbering (miopenActivationMode_t) and two
 * more: 0 pass-through, 1 logistic (sigmoid), 2 tanh (beta * tanh(alpha * x)), 3 relu,
 * 4 soft relu (log(1 + e^x)), 5 abs, 6 power ((alpha + beta * x)^gamma, 0 where the base is
 * <= 1e-6), 7 clipped relu (min(alpha, max(0, x))), 8 leaky relu (alpha * x for x <= 0),
 * 9 elu (alpha * (e^x - 1) for x <= 0), 10 gelu (erf form), 11 gelu (tanh form).
 * Backward computes dx = dy * f'(x) from x, y = f(x) and dy (power uses dy too, where MIOpen's
 * kernel drops it).
 *
 * Options: the element type only (kdb_data.h): every shape, stride and mode is an argument,
 * so one program per type serves every activation problem.
 * Launch: 1-D, any block size and grid (grid-stride loops). Packed kernels take n elements
 * (the *_vec ones 16-byte aligned tensors);
 * strided ones a 5-D shape (pad leading dimensions with 1) and each tensor's element strides.
 */
#include "kdb_data.h"

#define KDB_ACTIV_EPSILON 1e-6f
#define KDB_GELU_TANH_K 0.7978845608028654f /* sqrt(2 / pi) */

/* gelu (erf form) for 16-bit tensors: x * Phi(x), with Phi(x) = 1 - q for x >= 0 and q for x < 0,
 * q = erfc(|x| / sqrt 2) / 2 = e^(-x^2 / 2) * t * P(t) and t = 1 / (1 + p |x| / sqrt 2), P a
 * degree-6 polynomial fitted for the least relative error of erfc (p = 0.55, coefficients already
 * halved). About 17 instructions, two of them the hardware's 2^x and 1 / x, against about 28 for
 * erff's two polynomials and their selects: eight a 16-byte vector made gelu bound by instruction
 * issue, not memory, on a card of the H200's bandwidth. Relative error under 1e-5 for every
 * |result| > 1e-37 (fp32 emulation against float64), so 16-bit results are rounded from a value
 * closer to the exact one than 0.5 * x * (1 + erff(...)) (which cancels for x < 0). fp32 keeps
 * erff: there it is not the bound, and its tests ask for 1e-6. */
#if defined(KDB_TYPE_FP16) || defined(KDB_TYPE_BF16)
#define ACTIV_GELU_ERF(x) activ_gelu_erf16(x)
KDB_DEVICE_FN float activ_gelu_erf16(float x)
{
    const float t = KDB_FAST_RCPF(KDB_FMAF(0.3889087297f, KDB_FABSF(x), 1.0f)); /* 0.55 / sqrt 2 */
    float h = 4.942413433e-2f;
    h = KDB_FMAF(h, t, -1.509259263e-1f);
    h = KDB_FMAF(h, t, 8.859000720e-2f);
    h = KDB_FMAF(h, t, 6.930861690e-2f);
    h = KDB_FMAF(h, t, 1.333593513e-1f);
    h = KDB_FMAF(h, t, 1.550938622e-1f);
    h = KDB_FMAF(h, t, 1.551520855e-1f);
    const float q = h * t * KDB_FAST_EXP2F(x * x * -0.7213475204f); /* e^(-x^2 / 2) = 2^(-x^2 log2(e) / 2) */
    const float r = x * q;
    return x < 0.0f ? r : x - r;
}
#else
#define ACTIV_GELU_ERF(x) (0.5f * (x) * (1.0f + KDB_ERFF((x) * 0.7071067811865476f)))
#endif

KDB_DEVICE_FN float activ_f(float x, int mode, float alpha, float beta, float gamma)
{
    switch (mode) {
    case 1: return 1.0f / (1.0f + KDB_EXPF(-x));
    case 2: return beta * KDB_TANHF(alpha * x);
    case 3: return x > 0.0f ? x : 0.0f;
    case 4: return x > 0.0f ? x + KDB_LOGF(1.0f + KDB_EXPF(-x)) : KDB_LOGF(1.0f + KDB_EXPF(x));
    case 5: return KDB_FABSF(x);
    case 6: {
        const float base = alpha + beta * x;
        return base <= KDB_ACTIV_EPSILON ? 0.0f : KDB_POWF(base, gamma);
    }
    case 7: return KDB_FMINF(alpha, KDB_FMAXF(x, 0.0f));
    case 8: return x > 0.0f ? x : alpha * x;
    case 9: return x > 0.0f ? x : alpha * (KDB_EXPF(x) - 1.0f);
    case 10: return ACTIV_GELU_ERF(x);
    case 11: return 0.5f * x * (1.0f + KDB_TANHF(KDB_GELU_TANH_K * (x + 0.044715f * x * x * x)));
    default: return x;
    }
}

KDB_DEVICE_FN float activ_df(float x, float y, float dy, int mode, float alpha, float beta, float gamma)
{
    switch (mode) {
    case 1: return dy * y * (1.0f - y);
    case 2: return KDB_FABSF(beta) <= KDB_ACTIV_EPSILON ? 0.0f : dy * alpha * (beta - y * y / beta);
    case 3: return x > 0.0f ? dy : 0.0f;
    case 4: {
        const float e = KDB_EXPF(KDB_FMINF(x, 50.0f));
        return dy * e / (e + 1.0f);
    }
    case 5: return x > 0.0f ? dy : -dy;
    case 6: {
        const float base = alpha + beta * x;
        return base <= KDB_ACTIV_EPSILON ? 0.0f : dy * gamma * beta * y / base;
    }
    case 7: return (x > 0.0f && x <= alpha) ? dy : 0.0f;
    case 8: return x > 0.0f ? dy : alpha * dy;
    case 9: return x > 0.0f ? dy : dy * (y + alpha);
    case 10: {
        const float cdf = 0.5f * (1.0f + KDB_ERFF(x * 0.7071067811865476f));
        const float pdf = 0.3989422804014327f * KDB_EXPF(-0.5f * x * x);
        return dy * (cdf + x * pdf);
    }
    case 11: {
        const float inner = KDB_GELU_TANH_K * (x + 0.044715f * x * x * x);
        const float t = KDB_TANHF(inner);
        const float dinner = KDB_GELU_TANH_K * (1.0f + 3.0f * 0.044715f * x * x);
        return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner);
    }
    default: return dy;
    }
}

/* Offset of flat index i of a 5-D shape in a tensor with these element strides. */
KDB_DEVICE_FN long activ_offset(long i, int d1, int d2, int d3, int d4, int s0, int s1, int s2, int s3, int s4)
{
    const long i4 = i % d4;
    i /= d4;
    const long i3 = i % d3;
    i /= d3;
    const long i2 = i % d2;
    i /= d2;
    const long i1 = i % d1;
    return (i / d1) * s0 + i1 * s1 + i2 * s2 + i3 * s3 + i4 * s4;
}

KDB_KERNEL void activ_fwd_packed(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, int n, int mode,
                                 float alpha, float beta, float gamma)
{
    const int stride = KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X;
    for (int i = KDB_GLOBAL_ID_X; i < n; i += stride)
        KDB_STORE(y, i, activ_f(KDB_LOAD(x, i), mode, alpha, beta, gamma));
}

/* Packed tensors 16 bytes at a time (KDB_VEC elements): n elements, every tensor 16-byte
 * aligned (the solver checks); the last n % KDB_VEC go one per thread of the first group.
 * The mode is dispatched once per thread: each case inlines the whole loop with a constant
 * mode (a switch per element, or per vector inside the loop, kept the loop from unrolling and
 * its vectors from registers). Each step of activ_fwd_vec takes ACTIV_UNROLL vectors a group's
 * size apart, all loads issued before any use, so that more bytes are in flight while the
 * function's instructions run; activ_fwd_vec_light takes ACTIV_LIGHT_UNROLL, for the modes
 * whose function is a few instructions (pass-through, relu, abs, clipped and leaky relu),
 * where small groups of one-vector threads beat long threads (scripts/compare_elementwise.py:
 * relu fp16 on the H100 0.984x PyTorch's speed at 4 vectors a step, 0.998x at 1; gelu the
 * other way round, 1.009x at 4, 0.91x at 1). Both take any mode. */
#ifndef ACTIV_UNROLL
#define ACTIV_UNROLL 4
#endif
#ifndef ACTIV_LIGHT_UNROLL
#define ACTIV_LIGHT_UNROLL 1
#endif
#define ACTIV_DISPATCH(RUN)                                                                            \
    switch (mode) {                                                                                    \
    case 1: RUN(1); break; case 2: RUN(2); break; case 3: RUN(3); break; case 4: RUN(4); break;          \
    case 5: RUN(5); break; case 6: RUN(6); break; case 7: RUN(7); break; case 8: RUN(8); break;          \
    case 9: RUN(9); break; case 10: RUN(10); break; case 11: RUN(11); break; default: RUN(0); break;     \
    }

/* unroll (a constant once inlined, at most ACTIV_UNROLL_MAX): vectors per thread and step. */
#define ACTIV_UNROLL_MAX (ACTIV_UNROLL > ACTIV_LIGHT_UNROLL ? ACTIV_UNROLL : ACTIV_LIGHT_UNROLL)
KDB_DEVICE_FN void activ_fwd_run(const KDB_GLOBAL kdb_vec4u* x, KDB_GLOBAL kdb_vec4u* y, int vectors, const int mode,
                                 float alpha, float beta, float gamma, const int unroll)
{
    /* A group takes unroll * its size consecutive vectors per step: a warp's loads stay
     * within one stretch of memory instead of unroll far-apart ones. */
    const int stride = KDB_LOCAL_SIZE_X, step = KDB_LOCAL_SIZE_X * unroll * KDB_NUM_GROUPS_X;
    for (int i = KDB_GROUP_ID_X * KDB_LOCAL_SIZE_X * unroll + KDB_LOCAL_ID_X; i < vectors; i += step) {
        kdb_vec4u q[ACTIV_UNROLL_MAX];
#pragma unroll
        for (int u = 0; u < ACTIV_UNROLL_MAX; ++u)
            if (u < unroll && i + u * stride < vectors)
                q[u] = x[i + u * stride];
#pragma unroll
        for (int u = 0; u < ACTIV_UNROLL_MAX; ++u)
            if (u < unroll && i + u * stride < vectors) {
                float v[KDB_VEC];
                kdb_unpack(q[u], v);
                for (int e = 0; e < KDB_VEC; ++e)
                    v[e] = activ_f(v[e], mode, alpha, beta, gamma);
                y[i + u * stride] = kdb_pack(v);
            }
    }
}

KDB_DEVICE_FN void activ_bwd_run(const KDB_GLOBAL kdb_vec4u* x, const KDB_GLOBAL kdb_vec4u* y,
                                 const KDB_GLOBAL kdb_vec4u* dy, KDB_GLOBAL kdb_vec4u* dx, int vectors, const int mode,
                                 float alpha, float beta, float gamma)
{
    const int stride = KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X;
    for (int i = KDB_GLOBAL_ID_X; i < vectors; i += stride) {
        float xv[KDB_VEC], yv[KDB_VEC], g[KDB_VEC];
        kdb_unpack(x[i], xv);
        kdb_unpack(y[i], yv);
        kdb_unpack(dy[i], g);
        for (int e = 0; e < KDB_VEC; ++e)
            g[e] = activ_df(xv[e], yv[e], g[e], mode, alpha, beta, gamma);
        dx[i] = kdb_pack(g);
    }
}

/* The last n % KDB_VEC elements, one per thread of the first group. */
KDB_DEVICE_FN void activ_fwd_tail(const KDB_GLOBAL kdb_vec4u* x, KDB_GLOBAL kdb_vec4u* y, int n, int mode, float alpha,
                                  float beta, float gamma)
{
    const int j = n / KDB_VEC * KDB_VEC + KDB_GLOBAL_ID_X;
    if (j < n)
        KDB_STORE((KDB_GLOBAL kdb_data_t*)y, j,
                  activ_f(KDB_LOAD((const KDB_GLOBAL kdb_data_t*)x, j), mode, alpha, beta, gamma));
}

KDB_KERNEL void activ_fwd_vec(const KDB_GLOBAL kdb_vec4u* x, KDB_GLOBAL kdb_vec4u* y, int n, int mode, float alpha,
                              float beta, float gamma)
{
    const int vectors = n / KDB_VEC;
#define ACTIV_FWD_RUN(m) activ_fwd_run(x, y, vectors, m, alpha, beta, gamma, ACTIV_UNROLL)
    ACTIV_DISPATCH(ACTIV_FWD_RUN)
    activ_fwd_tail(x, y, n, mode, alpha, beta, gamma);
}

KDB_KERNEL void activ_fwd_vec_light(const KDB_GLOBAL kdb_vec4u* x, KDB_GLOBAL kdb_vec4u* y, int n, int mode,
                                    float alpha, float beta, float gamma)
{
    const int vectors = n / KDB_VEC;
#define ACTIV_FWD_RUN_LIGHT(m) activ_fwd_run(x, y, vectors, m, alpha, beta, gamma, ACTIV_LIGHT_UNROLL)
    ACTIV_DISPATCH(ACTIV_FWD_RUN_LIGHT)
    activ_fwd_tail(x, y, n, mode, alpha, beta, gamma);
}

KDB_KERNEL void activ_bwd_vec(const KDB_GLOBAL kdb_vec4u* x, const KDB_GLOBAL kdb_vec4u* y,
                              const KDB_GLOBAL kdb_vec4u* dy, KDB_GLOBAL kdb_vec4u* dx, int n, int mode, float alpha,
                              float beta, float gamma)
{
    const int vectors = n / KDB_VEC;
#define ACTIV_BWD_RUN(m) activ_bwd_run(x, y, dy, dx, vectors, m, alpha, beta, gamma)
    ACTIV_DISPATCH(ACTIV_BWD_RUN)
    const int j = vectors * KDB_VEC + KDB_GLOBAL_ID_X;
    if (j < n)
        KDB_STORE((KDB_GLOBAL kdb_data_t*)dx, j,
                  activ_df(KDB_LOAD((const KDB_GLOBAL kdb_data_t*)x, j), KDB_LOAD((const KDB_GLOBAL kdb_data_t*)y, j),
                           KDB_LOAD((const KDB_GLOBAL kdb_data_t*)dy, j), mode, alpha, beta, gamma));
}

KDB_KERNEL void activ_bwd_packed(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* y,
                                 const KDB_GLOBAL kdb_data_t* dy, KDB_GLOBAL kdb_data_t* dx, int n, int mode,
                                 float alpha, float beta, float gamma)
{
    const int stride = KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X;
    for (int i = KDB_GLOBAL_ID_X; i < n; i += stride)
        KDB_STORE(dx, i, activ_df(KDB_LOAD(x, i), KDB_LOAD(y, i), KDB_LOAD(dy, i), mode, alpha, beta, gamma));
}

KDB_KERNEL void activ_fwd_strided(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, int n, int d1, int d2,
                                  int d3, int d4, int xs0, int xs1, int xs2, int xs3, int xs4, int ys0, int ys1,
                                  int ys2, int ys3, int ys4, int mode, float alpha, float beta, float gamma)
{
    const int stride = KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X;
    for (int i = KDB_GLOBAL_ID_X; i < n; i += stride) {
        const long xi = activ_offset(i, d1, d2, d3, d4, xs0, xs1, xs2, xs3, xs4);
        const long yi = activ_offset(i, d1, d2, d3, d4, ys0, ys1, ys2, ys3, ys4);
        KDB_STORE(y, yi, activ_f(KDB_LOAD(x, xi), mode, alpha, beta, gamma));
    }
}

/* x, y and dy share strides (s*); dx has its own (ds*). */
KDB_KERNEL void activ_bwd_strided(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* y,
                                  const KDB_GLOBAL kdb_data_t* dy, KDB_GLOBAL kdb_data_t* dx, int n, int d1, int d2,
                                  int d3, int d4, int s0, int s1, int s2, int s3, int s4, int ds0, int ds1, int ds2,
                                  int ds3, int ds4, int mode, float alpha, float beta, float gamma)
{
    const int stride = KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X;
    for (int i = KDB_GLOBAL_ID_X; i < n; i += stride) {
        const long si = activ_offset(i, d1, d2, d3, d4, s0, s1, s2, s3, s4);
        const long di = activ_offset(i, d1, d2, d3, d4, ds0, ds1, ds2, ds3, ds4);
        KDB_STORE(dx, di,
                  activ_df(KDB_LOAD(x, si), KDB_LOAD(y, si), KDB_LOAD(dy, si), mode, alpha, beta, gamma));
    }
}
