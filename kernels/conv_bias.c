/* conv_bias.c: a convolution's bias, forward (y[n, c, h, w] += bias[c], in place) and
 * backward (db[c] = the sum of dy over n, h, w), through the tensor's strides (NCHW, NHWC).
 *
 * Options: the element type (kdb_data.h).
 * Arguments: the tensors, then N, C, H, W and the 4-D tensor's strides.
 * Launch: conv_bias_fwd 1-D over the N C H W elements, any grid (grid-stride);
 *   conv_bias_bwd one group of CONV_BIAS_BLOCK threads per channel (a grid stride over them);
 *   conv_epilogue_fwd as conv_bias_fwd; conv_epilogue_dense the same over a packed NCHW or NHWC
 *   tensor of fewer than 2^31 elements: the channel is (e / inner) % C (inner: H W, or 1 for
 *   NHWC), one 32-bit division where the general kernel does four 64-bit ones.
 * conv_epilogue_fwd, in place: y = y scale[c] + shift[c] (float per channel: a batch norm folded
 * in; scale only where has_scale, so a linear layer's bias is the shift alone), plus res (laid
 * out as y) where has_res, then the activation act (CONV_ACT_*): a convolution's or gemm's
 * epilogue for solvers whose kernels do not take it (ConvTma's does, tma_wgmma.h, with ReLU).
 */
#include "kdb_data.h"
#include "kdb_reduce.h"

#define CONV_BIAS_BLOCK 256
#define BLOCK CONV_BIAS_BLOCK /* kdb_reduce.h's */

KDB_KERNEL void conv_bias_fwd(KDB_GLOBAL kdb_data_t* y, const KDB_GLOBAL kdb_data_t* bias, int N, int C, int H, int W,
                              int s0, int s1, int s2, int s3)
{
    const long total = (long)N * C * H * W;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int v = (int)(e % W), h = (int)(e / W % H), c = (int)(e / ((long)W * H) % C);
        const int n = (int)(e / ((long)W * H * C));
        const long at = (long)n * s0 + (long)c * s1 + (long)h * s2 + (long)v * s3;
        KDB_STORE(y, at, KDB_LOAD(y, at) + KDB_LOAD(bias, c));
    }
}

#define CONV_ACT_RELU 1
#define CONV_ACT_GELU 2 /* x Phi(x) with erf, PyTorch's default GELU */

/* The epilogue of y's element at (of channel c), in place. */
KDB_DEVICE_FN void conv_epilogue_at(KDB_GLOBAL kdb_data_t* y, const KDB_GLOBAL float* scale,
                                    const KDB_GLOBAL float* shift, const KDB_GLOBAL kdb_data_t* res, int has_scale,
                                    int has_res, int act, long at, int c)
{
    float out = KDB_LOAD(y, at);
    if (has_scale)
        out *= scale[c];
    out += shift[c];
    if (has_res)
        out += KDB_LOAD(res, at);
    if (act == CONV_ACT_RELU)
        out = KDB_FMAXF(out, 0.0f);
    else if (act == CONV_ACT_GELU)
        out = 0.5f * out * (1.0f + KDB_ERFF(out * 0.70710678118654752f));
    KDB_STORE(y, at, out);
}

KDB_KERNEL void conv_epilogue_fwd(KDB_GLOBAL kdb_data_t* y, const KDB_GLOBAL float* scale,
                                  const KDB_GLOBAL float* shift, const KDB_GLOBAL kdb_data_t* res, int has_scale,
                                  int has_res, int act, int N, int C, int H, int W, int s0, int s1, int s2, int s3)
{
    const long total = (long)N * C * H * W;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int v = (int)(e % W), h = (int)(e / W % H), c = (int)(e / ((long)W * H) % C);
        const int n = (int)(e / ((long)W * H * C));
        const long at = (long)n * s0 + (long)c * s1 + (long)h * s2 + (long)v * s3;
        conv_epilogue_at(y, scale, shift, res, has_scale, has_res, act, at, c);
    }
}

KDB_KERNEL void conv_epilogue_dense(KDB_GLOBAL kdb_data_t* y, const KDB_GLOBAL float* scale,
                                    const KDB_GLOBAL float* shift, const KDB_GLOBAL kdb_data_t* res, int has_scale,
                                    int has_res, int act, int total, int C, int inner)
{
    for (int e = KDB_GLOBAL_ID_X; e < total; e += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        conv_epilogue_at(y, scale, shift, res, has_scale, has_res, act, e, (inner == 1 ? e : e / inner) % C);
    }
}

KDB_KERNEL void conv_bias_bwd(const KDB_GLOBAL kdb_data_t* dy, KDB_GLOBAL kdb_data_t* db, int N, int C, int H, int W,
                              int s0, int s1, int s2, int s3)
{
    KDB_SHARED(float, part, CONV_BIAS_BLOCK);
    const int t = KDB_LOCAL_ID_X;
    const long per_channel = (long)N * H * W;
    for (int c = KDB_GROUP_ID_X; c < C; c += KDB_NUM_GROUPS_X) { /* uniform across the group */
        float acc = 0.0f;
        for (long q = t; q < per_channel; q += CONV_BIAS_BLOCK) {
            const int v = (int)(q % W), h = (int)(q / W % H), n = (int)(q / ((long)W * H));
            acc += KDB_LOAD(dy, (long)n * s0 + (long)c * s1 + (long)h * s2 + (long)v * s3);
        }
        float sum;
        KDB_BLOCK_REDUCE(part, acc, KDB_REDUCE_ADD, sum); /* ends on a barrier: part is free again */
        if (t == 0)
            KDB_STORE(db, c, sum);
    }
}
