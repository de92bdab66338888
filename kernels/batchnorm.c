/* batchnorm.c: batch normalisation, inference, training forward and backward; spatial and per-activation.
 *
 * N x C x H x W with any element strides. A "channel" k groups the elements normalised together:
 * spatial (spatial = 1): k = c, over N * H * W elements; per-activation: k = (c, h, w), over N.
 * Scale, bias, means, variances and saved statistics are float32, one per channel, whatever
 * the tensors' type.
 *   inference: y = scale * (x - mean) / sqrt(var + eps) + bias (the given estimates)
 *   training:  mean, var of the batch; y as above with them; running mean and variance
 *              (unbiased) move by `factor`: r = (1 - factor) * r + factor * batch; saved mean
 *              and inverse std for the backward pass
 *   backward:  dbias = sum dy, dscale = sum dy * xhat,
 *              dx = scale * invstd / M * (M * dy - dbias - xhat * dscale), M elements per channel;
 *              mean and inverse std are the saved ones (use_saved) or computed again
 *
 * Options: the element type (kdb_data.h); -DBLOCK=<n> (default 256): the training and backward
 * kernels run BLOCK threads per group, one group per channel (grid-stride over channels);
 * bn_fwd_infer is 1-D, any launch; bn_fwd_infer_planes (spatial, each H x W plane contiguous) takes
 * any block size, a group per plane (grid-stride over planes); bn_fwd_infer_vec is 1-D, any launch;
 * bn_fwd_infer_rows[_vec] (spatial, channels-last packed) are 1-D over exactly C[v] * R threads.
 */
#include "kdb_data.h"
#include "kdb_reduce.h"

#ifndef BLOCK
#define BLOCK 256
#endif

#define BN_GEOMETRY int N, int C, int H, int W, int spatial

/* Element m of channel k, at strides s0..s3. */
KDB_DEVICE_FN long bn_offset(int k, int m, BN_GEOMETRY, int s0, int s1, int s2, int s3)
{
    int n, c, h, w;
    if (spatial) {
        c = k;
        n = m / (H * W);
        h = (m / W) % H;
        w = m % W;
    } else {
        n = m;
        c = k / (H * W);
        h = (k / W) % H;
        w = k % W;
    }
    return (long)n * s0 + (long)c * s1 + (long)h * s2 + (long)w * s3;
}

#define BN_CHANNELS (spatial ? C : C * H * W)
#define BN_MEMBERS (spatial ? N * H * W : N)


KDB_KERNEL void bn_fwd_infer(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, const KDB_GLOBAL float* scale,
                             const KDB_GLOBAL float* bias, const KDB_GLOBAL float* mean, const KDB_GLOBAL float* var,
                             BN_GEOMETRY, int xs0, int xs1, int xs2, int xs3, int ys0, int ys1, int ys2, int ys3,
                             float eps)
{
    const int total = N * C * H * W;
    for (int i = KDB_GLOBAL_ID_X; i < total; i += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int w = i % W, h = (i / W) % H, c = (i / (W * H)) % C, n = i / (W * H * C);
        const int k = spatial ? c : (c * H + h) * W + w;
        const float v = KDB_LOAD(x, (long)n * xs0 + (long)c * xs1 + (long)h * xs2 + (long)w * xs3);
        const float out = scale[k] * (v - mean[k]) / KDB_SQRTF(var[k] + eps) + bias[k];
        KDB_STORE(y, (long)n * ys0 + (long)c * ys1 + (long)h * ys2 + (long)w * ys3, out);
    }
}

/* Spatial inference over contiguous H*W planes: a group per (n, c) plane, no index division
 * per element, the channel's scale and shift computed once. */
/* Spatial inference 16 bytes at a time: each plane's HWv vectors contiguous; strides in
 * vectors (every plane starts 16-byte aligned). A 1-D grid-stride loop over all vectors. */
KDB_KERNEL void bn_fwd_infer_vec(const KDB_GLOBAL kdb_vec4u* x, KDB_GLOBAL kdb_vec4u* y, const KDB_GLOBAL float* scale,
                                 const KDB_GLOBAL float* bias, const KDB_GLOBAL float* mean,
                                 const KDB_GLOBAL float* var, int N, int C, int HWv, int xs0, int xs1, int ys0,
                                 int ys1, float eps)
{
    const int total = N * C * HWv;
    for (int i = KDB_GLOBAL_ID_X; i < total; i += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int p = i / HWv, j = i - p * HWv, c = p % C, n = p / C;
        const float a = scale[c] / KDB_SQRTF(var[c] + eps), b = bias[c] - a * mean[c];
        float v[KDB_VEC];
        kdb_unpack(x[(long)n * xs0 + (long)c * xs1 + j], v);
        for (int e = 0; e < KDB_VEC; ++e)
            v[e] = a * v[e] + b;
        y[(long)n * ys0 + (long)c * ys1 + j] = kdb_pack(v);
    }
}

/* Spatial inference over large planes of 16-byte vectors (HWv a plane, each plane's start on a
 * vector): a 2-D grid, x over the N * C planes and y over chunks of BN_PLANE_VECS * block
 * vectors of a plane. A thread computes its plane's scale and shift once and moves
 * BN_PLANE_VECS vectors, all loaded before any is stored, where bn_fwd_infer_vec spends three
 * divisions, a square root and a division on each vector: on a large plane the instructions
 * cost about what the memory does. Launch: grid (N * C, ceil(HWv / (BN_PLANE_VECS * block))). */
#define BN_PLANE_VECS 4
KDB_KERNEL void bn_fwd_infer_plane_vec(const KDB_GLOBAL kdb_vec4u* x, KDB_GLOBAL kdb_vec4u* y,
                                       const KDB_GLOBAL float* scale, const KDB_GLOBAL float* bias,
                                       const KDB_GLOBAL float* mean, const KDB_GLOBAL float* var, int C, int HWv,
                                       int xs0, int xs1, int ys0, int ys1, float eps)
{
    const int p = KDB_GROUP_ID_X, c = p % C, n = p / C;
    const float a = scale[c] / KDB_SQRTF(var[c] + eps), b = bias[c] - a * mean[c];
    const long xo = (long)n * xs0 + (long)c * xs1, yo = (long)n * ys0 + (long)c * ys1;
    const int first = KDB_GROUP_ID_Y * KDB_LOCAL_SIZE_X * BN_PLANE_VECS + KDB_LOCAL_ID_X;
    kdb_vec4u q[BN_PLANE_VECS];
    KDB_UNROLL
    for (int k = 0; k < BN_PLANE_VECS; ++k) {
        const int j = first + k * KDB_LOCAL_SIZE_X;
        if (j < HWv)
            q[k] = x[xo + j];
    }
    KDB_UNROLL
    for (int k = 0; k < BN_PLANE_VECS; ++k) {
        const int j = first + k * KDB_LOCAL_SIZE_X;
        if (j < HWv) {
            float v[KDB_VEC];
            kdb_unpack(q[k], v);
            KDB_UNROLL
            for (int e = 0; e < KDB_VEC; ++e)
                v[e] = a * v[e] + b;
            y[yo + j] = kdb_pack(v);
        }
    }
}

/* Spatial inference over channels-last rows (N*H*W rows of C contiguous channels, y packed the
 * same way): a thread keeps one 16-byte vector of channels, whose scale and shift it computes
 * once, and steps over the rows. Threads Cv * R (Cv vectors per row), row step R. */
KDB_KERNEL void bn_fwd_infer_rows_vec(const KDB_GLOBAL kdb_vec4u* x, KDB_GLOBAL kdb_vec4u* y,
                                      const KDB_GLOBAL float* scale, const KDB_GLOBAL float* bias,
                                      const KDB_GLOBAL float* mean, const KDB_GLOBAL float* var, int rows, int Cv,
                                      int R, float eps)
{
    const int t = KDB_GLOBAL_ID_X;
    if (t >= Cv * R)
        return;
    const int j = t % Cv;
    float a[KDB_VEC], b[KDB_VEC];
    for (int e = 0; e < KDB_VEC; ++e) {
        const int c = j * KDB_VEC + e;
        a[e] = scale[c] / KDB_SQRTF(var[c] + eps);
        b[e] = bias[c] - a[e] * mean[c];
    }
    for (long r = t / Cv; r < rows; r += R) {
        float v[KDB_VEC];
        kdb_unpack(x[r * Cv + j], v);
        for (int e = 0; e < KDB_VEC; ++e)
            v[e] = a[e] * v[e] + b[e];
        y[r * Cv + j] = kdb_pack(v);
    }
}

/* The same, an element at a time: any channel count, any alignment. Threads C * R. */
KDB_KERNEL void bn_fwd_infer_rows(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y,
                                  const KDB_GLOBAL float* scale, const KDB_GLOBAL float* bias,
                                  const KDB_GLOBAL float* mean, const KDB_GLOBAL float* var, int rows, int C, int R,
                                  float eps)
{
    const int t = KDB_GLOBAL_ID_X;
    if (t >= C * R)
        return;
    const int c = t % C;
    const float a = scale[c] / KDB_SQRTF(var[c] + eps), b = bias[c] - a * mean[c];
    for (long r = t / C; r < rows; r += R)
        KDB_STORE(y, r * C + c, a * KDB_LOAD(x, r * C + c) + b);
}

KDB_KERNEL void bn_fwd_infer_planes(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y,
                                    const KDB_GLOBAL float* scale, const KDB_GLOBAL float* bias,
                                    const KDB_GLOBAL float* mean, const KDB_GLOBAL float* var, int N, int C, int HW,
                                    int xs0, int xs1, int ys0, int ys1, float eps)
{
    for (int p = KDB_GROUP_ID_X; p < N * C; p += KDB_NUM_GROUPS_X) {
        const int c = p % C, n = p / C;
        const float a = scale[c] / KDB_SQRTF(var[c] + eps), b = bias[c] - a * mean[c];
        const long xo = (long)n * xs0 + (long)c * xs1, yo = (long)n * ys0 + (long)c * ys1;
        for (int j = KDB_LOCAL_ID_X; j < HW; j += KDB_LOCAL_SIZE_X)
            KDB_STORE(y, yo + j, a * KDB_LOAD(x, xo + j) + b);
    }
}

KDB_KERNEL void bn_fwd_train(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, const KDB_GLOBAL float* scale,
                             const KDB_GLOBAL float* bias, KDB_GLOBAL float* running_mean,
                             KDB_GLOBAL float* running_var, KDB_GLOBAL float* saved_mean,
                             KDB_GLOBAL float* saved_invstd, BN_GEOMETRY, int xs0, int xs1, int xs2, int xs3, int ys0,
                             int ys1, int ys2, int ys3, float eps, float factor, int update_running)
{
    KDB_SHARED(float, scratch, BLOCK);
    const int channels = BN_CHANNELS, members = BN_MEMBERS, t = KDB_LOCAL_ID_X;
    for (int k = KDB_GROUP_ID_X; k < channels; k += KDB_NUM_GROUPS_X) {
        float s = 0.0f;
        for (int m = t; m < members; m += BLOCK)
            s += KDB_LOAD(x, bn_offset(k, m, N, C, H, W, spatial, xs0, xs1, xs2, xs3));
        KDB_BLOCK_REDUCE(scratch, s, KDB_REDUCE_ADD, s);
        const float mean = s / members;
        float q = 0.0f;
        for (int m = t; m < members; m += BLOCK) {
            const float d = KDB_LOAD(x, bn_offset(k, m, N, C, H, W, spatial, xs0, xs1, xs2, xs3)) - mean;
            q += d * d;
        }
        KDB_BLOCK_REDUCE(scratch, q, KDB_REDUCE_ADD, q);
        const float var = q / members, invstd = 1.0f / KDB_SQRTF(var + eps);
        for (int m = t; m < members; m += BLOCK) {
            const float v = KDB_LOAD(x, bn_offset(k, m, N, C, H, W, spatial, xs0, xs1, xs2, xs3));
            KDB_STORE(y, bn_offset(k, m, N, C, H, W, spatial, ys0, ys1, ys2, ys3),
                      scale[k] * (v - mean) * invstd + bias[k]);
        }
        if (t == 0) {
            saved_mean[k] = mean;
            saved_invstd[k] = invstd;
            if (update_running) {
                const float unbiased = members > 1 ? q / (members - 1) : var;
                running_mean[k] = (1.0f - factor) * running_mean[k] + factor * mean;
                running_var[k] = (1.0f - factor) * running_var[k] + factor * unbiased;
            }
        }
    }
}

/* x and dy share strides (s*); dx has its own (ds*). */
KDB_KERNEL void bn_bwd(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* dy, KDB_GLOBAL kdb_data_t* dx,
                       const KDB_GLOBAL float* scale, KDB_GLOBAL float* dscale, KDB_GLOBAL float* dbias,
                       const KDB_GLOBAL float* saved_mean, const KDB_GLOBAL float* saved_invstd, BN_GEOMETRY, int s0,
                       int s1, int s2, int s3, int ds0, int ds1, int ds2, int ds3, float eps, int use_saved)
{
    KDB_SHARED(float, scratch, BLOCK);
    const int channels = BN_CHANNELS, members = BN_MEMBERS, t = KDB_LOCAL_ID_X;
    for (int k = KDB_GROUP_ID_X; k < channels; k += KDB_NUM_GROUPS_X) {
        float mean, invstd;
        if (use_saved) {
            mean = saved_mean[k];
            invstd = saved_invstd[k];
        } else {
            float s = 0.0f, q = 0.0f;
            for (int m = t; m < members; m += BLOCK)
                s += KDB_LOAD(x, bn_offset(k, m, N, C, H, W, spatial, s0, s1, s2, s3));
            KDB_BLOCK_REDUCE(scratch, s, KDB_REDUCE_ADD, s);
            mean = s / members;
            for (int m = t; m < members; m += BLOCK) {
                const float d = KDB_LOAD(x, bn_offset(k, m, N, C, H, W, spatial, s0, s1, s2, s3)) - mean;
                q += d * d;
            }
            KDB_BLOCK_REDUCE(scratch, q, KDB_REDUCE_ADD, q);
            invstd = 1.0f / KDB_SQRTF(q / members + eps);
        }
        float sdy = 0.0f, sdyx = 0.0f;
        for (int m = t; m < members; m += BLOCK) {
            const long o = bn_offset(k, m, N, C, H, W, spatial, s0, s1, s2, s3);
            const float g = KDB_LOAD(dy, o);
            sdy += g;
            sdyx += g * (KDB_LOAD(x, o) - mean) * invstd;
        }
        KDB_BLOCK_REDUCE(scratch, sdy, KDB_REDUCE_ADD, sdy);
        KDB_BLOCK_REDUCE(scratch, sdyx, KDB_REDUCE_ADD, sdyx);
        const float coef = scale[k] * invstd / members;
        for (int m = t; m < members; m += BLOCK) {
            const long o = bn_offset(k, m, N, C, H, W, spatial, s0, s1, s2, s3);
            const float xhat = (KDB_LOAD(x, o) - mean) * invstd;
            KDB_STORE(dx, bn_offset(k, m, N, C, H, W, spatial, ds0, ds1, ds2, ds3),
                      coef * (members * KDB_LOAD(dy, o) - sdy - xhat * sdyx));
        }
        if (t == 0) {
            dscale[k] = sdyx;
            dbias[k] = sdy;
        }
    }
}

/* Spatial training in three launches, for many elements per channel over few channels (a
 * group per channel leaves most of a GPU idle). Each H x W plane must be contiguous.
 *   bn_train_partial: grid (chunks, C); group (j, c) sums x - k and (x - k)^2 over planes
 *       n = j, j + chunks, ... of channel c (k = x[0, c, 0, 0]: shifting by a sample keeps the
 *       one-pass variance accurate) into partial[(c * chunks + j) * 2 + {0, 1}]
 *   bn_train_finalize: one thread per channel: mean, variance, saved statistics, running ones,
 *       and the batch variance into var_out for the normalisation (bn_fwd_infer_planes) */
/* The group's two sums, reduced over its threads, into the pair `slot` of partial. */
#define BN_PUBLISH_PARTIAL(scratch, s1, s2, partial, slot)                                                  \
    do {                                                                                                   \
        KDB_BLOCK_REDUCE(scratch, s1, KDB_REDUCE_ADD, s1);                                                 \
        KDB_BLOCK_REDUCE(scratch, s2, KDB_REDUCE_ADD, s2);                                                 \
        if (KDB_LOCAL_ID_X == 0) {                                                                         \
            partial[(slot) * 2] = s1;                                                                      \
            partial[(slot) * 2 + 1] = s2;                                                                  \
        }                                                                                                  \
    } while (0)

KDB_KERNEL void bn_train_partial(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL float* partial, int N, int C, int HW,
                                 int xs0, int xs1, int chunks)
{
    KDB_SHARED(float, scratch, BLOCK);
    const int j = KDB_GROUP_ID_X, c = KDB_GROUP_ID_Y;
    const float k = KDB_LOAD(x, (long)c * xs1);
    float s1 = 0.0f, s2 = 0.0f;
    for (int n = j; n < N; n += chunks) {
        const long base = (long)n * xs0 + (long)c * xs1;
        for (int i = KDB_LOCAL_ID_X; i < HW; i += BLOCK) {
            const float d = KDB_LOAD(x, base + i) - k;
            s1 += d;
            s2 += d * d;
        }
    }
    BN_PUBLISH_PARTIAL(scratch, s1, s2, partial, (long)c * chunks + j);
}

/* bn_train_partial 16 bytes at a time: HWv vectors per plane, strides in vectors. */
KDB_KERNEL void bn_train_partial_vec(const KDB_GLOBAL kdb_vec4u* x, KDB_GLOBAL float* partial, int N, int C, int HWv,
                                     int xs0, int xs1, int chunks)
{
    KDB_SHARED(float, scratch, BLOCK);
    const int j = KDB_GROUP_ID_X, c = KDB_GROUP_ID_Y;
    float v[KDB_VEC];
    kdb_unpack(x[(long)c * xs1], v);
    const float k = v[0];
    float s1 = 0.0f, s2 = 0.0f;
    for (int n = j; n < N; n += chunks) {
        const long base = (long)n * xs0 + (long)c * xs1;
        for (int i = KDB_LOCAL_ID_X; i < HWv; i += BLOCK) {
            kdb_unpack(x[base + i], v);
            for (int e = 0; e < KDB_VEC; ++e) {
                const float d = v[e] - k;
                s1 += d;
                s2 += d * d;
            }
        }
    }
    BN_PUBLISH_PARTIAL(scratch, s1, s2, partial, (long)c * chunks + j);
}

KDB_KERNEL void bn_train_finalize(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL float* partial,
                                  KDB_GLOBAL float* running_mean, KDB_GLOBAL float* running_var,
                                  KDB_GLOBAL float* saved_mean, KDB_GLOBAL float* saved_invstd,
                                  KDB_GLOBAL float* var_out, int C, int xs1, int chunks, int count, float eps,
                                  float factor, int update_running)
{
    for (int c = KDB_GLOBAL_ID_X; c < C; c += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        float s1 = 0.0f, s2 = 0.0f;
        for (int j = 0; j < chunks; ++j) {
            s1 += partial[((long)c * chunks + j) * 2];
            s2 += partial[((long)c * chunks + j) * 2 + 1];
        }
        const float shifted_mean = s1 / count;
        const float var = KDB_FMAXF(s2 / count - shifted_mean * shifted_mean, 0.0f);
        const float mean = KDB_LOAD(x, (long)c * xs1) + shifted_mean;
        saved_mean[c] = mean;
        saved_invstd[c] = 1.0f / KDB_SQRTF(var + eps);
        var_out[c] = var;
        if (update_running) {
            const float unbiased = count > 1 ? var * count / (count - 1) : var;
            running_mean[c] = (1.0f - factor) * running_mean[c] + factor * mean;
            running_var[c] = (1.0f - factor) * running_var[c] + factor * unbiased;
        }
    }
}
