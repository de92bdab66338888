/* conv_direct.c: 2-D convolution in its three directions, direct (no transform, no workspace):
 * the reference solver every other convolution solver is checked against, and the fallback
 * for any shape, layout, group count, stride, dilation and padding.
 *
 * Tensors are indexed N, C, H, W through element strides (arguments), so one program serves
 * NCHW and NHWC alike; weights K x C/G x Y x X the same way. Sums are fp32 whatever the type.
 *
 * Options: the element type (kdb_data.h).
 * Arguments, after the tensors: conv_shape.h's CONV_SHAPE_ARGS (N, C, H, W, K, Ho, Wo, Y, X, pad h, pad w, stride
 *   h, stride w, dilation h, dilation w, groups), then x's, w's and y's strides (4 each).
 * Launch: conv_fwd_direct and conv_bwd_data_direct 1-D over the outputs (y; dx), any grid
 *   (grid-stride); conv_bwd_weights_direct one group of CONV_WRW_BLOCK threads per weight
 *   element (K * C/G * Y * X groups, a grid stride over them), each reducing over N x Ho x Wo.
 */
#include "kdb_data.h"
#include "conv_shape.h"
#include "kdb_reduce.h"

#define CONV_WRW_BLOCK 256
#define BLOCK CONV_WRW_BLOCK /* kdb_reduce.h's */

/* y[n, k, i, j] = sum over the group's channels and the filter's taps. */
KDB_KERNEL void conv_fwd_direct(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* w,
                                KDB_GLOBAL kdb_data_t* y, CONV_SHAPE_ARGS)
{
    const int cg = C / G, kg = K / G;
    const long total = (long)N * K * Ho * Wo;
    for (long o = KDB_GLOBAL_ID_X; o < total; o += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int j = (int)(o % Wo), i = (int)(o / Wo % Ho), k = (int)(o / ((long)Wo * Ho) % K);
        const int n = (int)(o / ((long)Wo * Ho * K));
        const int c0 = k / kg * cg;
        float acc = 0.0f;
        for (int c = 0; c < cg; ++c)
            for (int a = 0; a < Y; ++a) {
                const int h = i * sh - ph + a * dlh;
                if (h < 0 || h >= H)
                    continue;
                for (int b = 0; b < X; ++b) {
                    const int v = j * sw - pw + b * dlw;
                    if (v >= 0 && v < W)
                        acc += KDB_LOAD(x, (long)n * xs0 + (long)(c0 + c) * xs1 + (long)h * xs2 + (long)v * xs3) *
                               KDB_LOAD(w, (long)k * ws0 + (long)c * ws1 + (long)a * ws2 + (long)b * ws3);
                }
            }
        KDB_STORE(y, (long)n * ys0 + (long)k * ys1 + (long)i * ys2 + (long)j * ys3, acc);
    }
}

/* dx[n, c, h, v] = sum over the outputs whose windows reach (h, v), gathered: no atomics. */
KDB_KERNEL void conv_bwd_data_direct(const KDB_GLOBAL kdb_data_t* dy, const KDB_GLOBAL kdb_data_t* w,
                                     KDB_GLOBAL kdb_data_t* dx, CONV_SHAPE_ARGS)
{
    const int cg = C / G, kg = K / G;
    const long total = (long)N * C * H * W;
    for (long o = KDB_GLOBAL_ID_X; o < total; o += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int v = (int)(o % W), h = (int)(o / W % H), c = (int)(o / ((long)W * H) % C);
        const int n = (int)(o / ((long)W * H * C));
        const int k0 = c / cg * kg, cl = c % cg;
        float acc = 0.0f;
        for (int a = 0; a < Y; ++a) {
            const int top = h + ph - a * dlh; /* = i * sh for the output row i that reads h */
            if (top < 0 || top % sh)
                continue;
            const int i = top / sh;
            if (i >= Ho)
                continue;
            for (int b = 0; b < X; ++b) {
                const int left = v + pw - b * dlw;
                if (left < 0 || left % sw)
                    continue;
                const int j = left / sw;
                if (j >= Wo)
                    continue;
                for (int k = 0; k < kg; ++k)
                    acc += KDB_LOAD(dy, (long)n * ys0 + (long)(k0 + k) * ys1 + (long)i * ys2 + (long)j * ys3) *
                           KDB_LOAD(w, (long)(k0 + k) * ws0 + (long)cl * ws1 + (long)a * ws2 + (long)b * ws3);
            }
        }
        KDB_STORE(dx, (long)n * xs0 + (long)c * xs1 + (long)h * xs2 + (long)v * xs3, acc);
    }
}

/* dw[k, c, a, b] = sum over n, i, j of dy[n, k, i, j] * x[n, group's c, i * sh - ph + a * dlh, ...]:
 * a group per weight element, its threads striding over N x Ho x Wo, then a tree in shared memory. */
KDB_KERNEL void conv_bwd_weights_direct(const KDB_GLOBAL kdb_data_t* dy, const KDB_GLOBAL kdb_data_t* x,
                                        KDB_GLOBAL kdb_data_t* dw, CONV_SHAPE_ARGS)
{
    KDB_SHARED(float, part, CONV_WRW_BLOCK);
    const int cg = C / G, kg = K / G, t = KDB_LOCAL_ID_X;
    const long weights = (long)K * cg * Y * X, per_filter = (long)N * Ho * Wo;
    for (long e = KDB_GROUP_ID_X; e < weights; e += KDB_NUM_GROUPS_X) { /* uniform across the group */
        const int b = (int)(e % X), a = (int)(e / X % Y), c = (int)(e / ((long)X * Y) % cg);
        const int k = (int)(e / ((long)X * Y * cg));
        const int cx = k / kg * cg + c;
        float acc = 0.0f;
        for (long q = t; q < per_filter; q += CONV_WRW_BLOCK) {
            const int j = (int)(q % Wo), i = (int)(q / Wo % Ho), n = (int)(q / ((long)Wo * Ho));
            const int h = i * sh - ph + a * dlh, v = j * sw - pw + b * dlw;
            if (h >= 0 && h < H && v >= 0 && v < W)
                acc += KDB_LOAD(dy, (long)n * ys0 + (long)k * ys1 + (long)i * ys2 + (long)j * ys3) *
                       KDB_LOAD(x, (long)n * xs0 + (long)cx * xs1 + (long)h * xs2 + (long)v * xs3);
        }
        float sum;
        KDB_BLOCK_REDUCE(part, acc, KDB_REDUCE_ADD, sum); /* ends on a barrier: part is free again */
        if (t == 0)
            KDB_STORE(dw, (long)k * ws0 + (long)c * ws1 + (long)a * ws2 + (long)b * ws3, sum);
    }
}
