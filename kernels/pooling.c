/* pooling.c: 2-D max and average pooling, forward and backward, NCHW with any element strides.
 *
 * Output size per dimension: (in + 2 * pad - window) / stride + 1. mode (argument): 0 max,
 * 1 average over the window's elements inside the input (padding excluded), 2 average over
 * the whole window (padding included). Max pooling records, per output, the index h * W + w of
 * its maximum in the input plane (int32; the first maximum wins); backward routes dy there.
 *
 * Options: the element type (kdb_data.h).
 * Launch: 1-D, any block size and grid (grid-stride): pool_fwd over N*C*Ho*Wo outputs,
 * pool_bwd over N*C*H*W inputs (each gathers from the outputs whose windows cover it),
 * pool_fwd_nhwc (channels-last) over N*Ho*Wo*C/lanes items (lanes: KDB_VEC where vec, else 1).
 */
#include "kdb_data.h"

#define POOL_GEOMETRY int N, int C, int H, int W, int Ho, int Wo, int kh, int kw, int sh, int sw, int ph, int pw

/* One output from its window's maximum (best_at < 0: the window held no input), sum and count. */
KDB_DEVICE_FN float pool_result(int mode, float best, int best_at, float sum, int count, int window)
{
    if (mode == 0)
        return best_at < 0 ? 0.0f : best;
    if (mode == 1)
        return count ? sum / count : 0.0f;
    return sum / window;
}

KDB_KERNEL void pool_fwd(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, KDB_GLOBAL int* indices,
                         POOL_GEOMETRY, int xs0, int xs1, int xs2, int xs3, int ys0, int ys1, int ys2, int ys3,
                         int mode, int save_indices)
{
    const int total = N * C * Ho * Wo;
    for (int i = KDB_GLOBAL_ID_X; i < total; i += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int wo = i % Wo, ho = (i / Wo) % Ho, c = (i / (Wo * Ho)) % C, n = i / (Wo * Ho * C);
        const int h0 = ho * sh - ph, w0 = wo * sw - pw;
        const long plane = (long)n * xs0 + (long)c * xs1;
        float best = -3.402823466e38f, sum = 0.0f;
        int best_at = -1, count = 0;
        for (int a = 0; a < kh; ++a) {
            const int h = h0 + a;
            if (h < 0 || h >= H)
                continue;
            for (int b = 0; b < kw; ++b) {
                const int w = w0 + b;
                if (w < 0 || w >= W)
                    continue;
                const float v = KDB_LOAD(x, plane + (long)h * xs2 + (long)w * xs3);
                if (v > best || best_at < 0) {
                    best = v;
                    best_at = h * W + w;
                }
                sum += v;
                ++count;
            }
        }
        KDB_STORE(y, (long)n * ys0 + (long)c * ys1 + (long)ho * ys2 + (long)wo * ys3,
                  pool_result(mode, best, best_at, sum, count, kh * kw));
        if (save_indices)
            indices[i] = best_at;
    }
}

/* dy and indices share the output's shape (dy with strides ys*); dx has strides xs*. */
KDB_KERNEL void pool_bwd(const KDB_GLOBAL kdb_data_t* dy, const KDB_GLOBAL int* indices, KDB_GLOBAL kdb_data_t* dx,
                         POOL_GEOMETRY, int xs0, int xs1, int xs2, int xs3, int ys0, int ys1, int ys2, int ys3,
                         int mode)
{
    const int total = N * C * H * W;
    for (int i = KDB_GLOBAL_ID_X; i < total; i += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int w = i % W, h = (i / W) % H, c = (i / (W * H)) % C, n = i / (W * H * C);
        /* Outputs whose window [o * s - p, o * s - p + k) covers h (likewise w). */
        const int ho_lo = h + ph - kh + 1 > 0 ? (h + ph - kh + 1 + sh - 1) / sh : 0;
        const int ho_hi = (h + ph) / sh < Ho - 1 ? (h + ph) / sh : Ho - 1;
        const int wo_lo = w + pw - kw + 1 > 0 ? (w + pw - kw + 1 + sw - 1) / sw : 0;
        const int wo_hi = (w + pw) / sw < Wo - 1 ? (w + pw) / sw : Wo - 1;
        float g = 0.0f;
        for (int ho = ho_lo; ho <= ho_hi; ++ho) {
            for (int wo = wo_lo; wo <= wo_hi; ++wo) {
                const int o = ((n * C + c) * Ho + ho) * Wo + wo;
                const float d = KDB_LOAD(dy, (long)n * ys0 + (long)c * ys1 + (long)ho * ys2 + (long)wo * ys3);
                if (mode == 0) {
                    if (indices[o] == h * W + w)
                        g += d;
                } else if (mode == 2) {
                    g += d / (kh * kw);
                } else {
                    const int hs = ho * sh - ph, ws = wo * sw - pw;
                    const int he = hs + kh < H ? hs + kh : H, we = ws + kw < W ? ws + kw : W;
                    const int count = (he - (hs > 0 ? hs : 0)) * (we - (ws > 0 ? ws : 0));
                    g += d / count;
                }
            }
        }
        KDB_STORE(dx, (long)n * xs0 + (long)c * xs1 + (long)h * xs2 + (long)w * xs3, g);
    }
}

/* Forward over a 3-D grid, no index division: blocks of 16 x 16 threads over each plane's
 * Wo x Ho outputs, one grid z per (n, c) plane: grid (ceil(Wo / 16), ceil(Ho / 16), N * C). */
KDB_KERNEL void pool_fwd_2d(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, KDB_GLOBAL int* indices,
                            POOL_GEOMETRY, int xs0, int xs1, int xs2, int xs3, int ys0, int ys1, int ys2, int ys3,
                            int mode, int save_indices)
{
    const int wo = KDB_GLOBAL_ID_X, ho = KDB_GLOBAL_ID_Y, plane = KDB_GROUP_ID_Z;
    if (wo >= Wo || ho >= Ho)
        return;
    const int c = plane % C, n = plane / C;
    const int h0 = ho * sh - ph, w0 = wo * sw - pw;
    const int ha = h0 > 0 ? h0 : 0, hb = h0 + kh < H ? h0 + kh : H;
    const int wa = w0 > 0 ? w0 : 0, wb = w0 + kw < W ? w0 + kw : W;
    const KDB_GLOBAL kdb_data_t* p = x + (long)n * xs0 + (long)c * xs1;
    float best = -3.402823466e38f, sum = 0.0f;
    int best_at = -1;
    for (int h = ha; h < hb; ++h)
        for (int w = wa; w < wb; ++w) {
            const float v = KDB_LOAD(p, (long)h * xs2 + (long)w * xs3);
            if (v > best || best_at < 0) {
                best = v;
                best_at = h * W + w;
            }
            sum += v;
        }
    const int count = (hb - ha) * (wb - wa);
    KDB_STORE(y, (long)n * ys0 + (long)c * ys1 + (long)ho * ys2 + (long)wo * ys3,
              pool_result(mode, best, best_at, sum, count, kh * kw));
    if (save_indices)
        indices[((long)plane * Ho + ho) * Wo + wo] = best_at;
}

/* Forward for windows of at most POOL_SMALL x POOL_SMALL (3 x 3 and 2 x 2, the usual CNN
 * pools): the window loops have constant bounds, so they unroll and every load of a thread is
 * in flight at once, and each thread computes POOL_RUN outputs down a column, so that enough
 * bytes are in flight to cover memory latency. Offsets within a plane are int (the solver
 * checks that they fit). Grid (ceil(Wo / bx), ceil(Ho / (by * POOL_RUN)), N * C) for any
 * bx x by block. */
#define POOL_SMALL 3
#define POOL_RUN 4

KDB_KERNEL void pool_fwd_small(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, KDB_GLOBAL int* indices,
                               POOL_GEOMETRY, int xs0, int xs1, int xs2, int xs3, int ys0, int ys1, int ys2, int ys3,
                               int mode, int save_indices)
{
    const int wo = KDB_GLOBAL_ID_X, first = KDB_GLOBAL_ID_Y * POOL_RUN, plane = KDB_GROUP_ID_Z;
    if (wo >= Wo || first >= Ho)
        return;
    const int c = plane % C, n = plane / C, w0 = wo * sw - pw;
    const KDB_GLOBAL kdb_data_t* p = x + (long)n * xs0 + (long)c * xs1;
    KDB_GLOBAL kdb_data_t* q = y + (long)n * ys0 + (long)c * ys1;
    for (int r = 0; r < POOL_RUN; ++r) {
        const int ho = first + r, h0 = ho * sh - ph;
        float best = -3.402823466e38f, sum = 0.0f;
        int best_at = -1, count = 0;
        for (int a = 0; a < POOL_SMALL; ++a)
            for (int b = 0; b < POOL_SMALL; ++b) {
                const int h = h0 + a, w = w0 + b;
                if (ho < Ho && a < kh && b < kw && h >= 0 && h < H && w >= 0 && w < W) {
                    const float v = KDB_LOAD(p, h * xs2 + w * xs3);
                    if (v > best || best_at < 0) {
                        best = v;
                        best_at = h * W + w;
                    }
                    sum += v;
                    ++count;
                }
            }
        if (ho < Ho) {
            KDB_STORE(q, ho * ys2 + wo * ys3, pool_result(mode, best, best_at, sum, count, kh * kw));
            if (save_indices)
                indices[((long)plane * Ho + ho) * Wo + wo] = best_at;
        }
    }
}

/* Forward through shared memory: a group stages a band of input rows of one plane (every
 * column), read as 16-byte vectors where the rows allow (vec = 1: x's rows contiguous, whole
 * vectors, 16-byte aligned) or element by element, then computes the band's outputs from it:
 * each input element is read from device memory once, with many bytes in flight per thread.
 * band_rows: output rows per band, such that their input rows fit POOL_BAND floats.
 * Launch: 1-D, groups of a multiple of 32 threads, any grid (groups loop over the (plane, band)
 * jobs). */
#define POOL_BAND 6144 /* floats of input staged per group (24 KiB) */

/* One band's outputs from the stage, for a constant mode MODE_ and save flag SAVE_ (the kernel
 * dispatches once, so a plain max or sum does only its own work per element). Macros, not a
 * helper taking the stage: PoCL 3.0 read another address through such a helper's pointer. */
#define POOL_BAND_ELEMENT(MODE_, SAVE_, h, w)                                                              \
    do {                                                                                                   \
        const float v_ = stage[((h) - h_lo) * W + (w)];                                                    \
        if (MODE_ != 0) {                                                                                  \
            sum += v_;                                                                                     \
        } else if (SAVE_) {                                                                                \
            if (v_ > best || best_at < 0) {                                                                \
                best = v_;                                                                                 \
                best_at = (h) * W + (w);                                                                   \
            }                                                                                              \
        } else {                                                                                           \
            best = KDB_FMAXF(best, v_);                                                                    \
        }                                                                                                  \
    } while (0)

/* SMALL_: windows of at most POOL_SMALL x POOL_SMALL, whose loops unroll with guards. */
#define POOL_BAND_OUTPUTS(MODE_, SAVE_, SMALL_)                                                             \
    for (int oy = t / 32; oy < ho1 - ho0; oy += threads / 32)                                              \
    for (int wo = t % 32; wo < Wo; wo += 32) {  /* rows of 32 threads: no division per output */           \
        const int ho = ho0 + oy;                                                                           \
        const int h0 = ho * sh - ph, w0 = wo * sw - pw;                                                    \
        const int ha = h0 > 0 ? h0 : 0, hb = h0 + kh < H ? h0 + kh : H;                                    \
        const int wa = w0 > 0 ? w0 : 0, wb = w0 + kw < W ? w0 + kw : W;                                    \
        float best = -3.402823466e38f, sum = 0.0f;                                                         \
        int best_at = -1;                                                                                  \
        if (SMALL_) {                                                                                      \
            for (int a = 0; a < POOL_SMALL; ++a)                                                           \
                for (int b = 0; b < POOL_SMALL; ++b)                                                       \
                    if (h0 + a >= ha && h0 + a < hb && w0 + b >= wa && w0 + b < wb)                        \
                        POOL_BAND_ELEMENT(MODE_, SAVE_, h0 + a, w0 + b);                                   \
        } else {                                                                                           \
            for (int h = ha; h < hb; ++h)                                                                  \
                for (int w = wa; w < wb; ++w)                                                              \
                    POOL_BAND_ELEMENT(MODE_, SAVE_, h, w);                                                 \
        }                                                                                                  \
        if (MODE_ == 0 && !(SAVE_))                                                                        \
            best_at = hb > ha && wb > wa ? 0 : -1; /* pool_result's "the window held an input" */          \
        KDB_STORE(y, (long)n * ys0 + (long)c * ys1 + (long)ho * ys2 + (long)wo * ys3,                      \
                  pool_result(MODE_, best, best_at, sum, (hb - ha) * (wb - wa), kh * kw));                 \
        if (SAVE_)                                                                                         \
            indices[((long)plane * Ho + ho) * Wo + wo] = best_at;                                          \
    }

KDB_KERNEL void pool_fwd_band(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, KDB_GLOBAL int* indices,
                              POOL_GEOMETRY, int xs0, int xs1, int xs2, int xs3, int ys0, int ys1, int ys2, int ys3,
                              int mode, int save_indices, int band_rows, int vec)
{
    KDB_SHARED(float, stage, POOL_BAND);
    const int t = KDB_LOCAL_ID_X, threads = KDB_LOCAL_SIZE_X;
    const int bands = (Ho + band_rows - 1) / band_rows;
    for (int job = KDB_GROUP_ID_X; job < N * C * bands; job += KDB_NUM_GROUPS_X) {
        const int band = job % bands, plane = job / bands, c = plane % C, n = plane / C;
        const int ho0 = band * band_rows, ho1 = Ho < ho0 + band_rows ? Ho : ho0 + band_rows;
        const int top = ho0 * sh - ph, bottom = (ho1 - 1) * sh - ph + kh;
        const int h_lo = top > 0 ? top : 0, h_hi = bottom < H ? bottom : H, rows = h_hi - h_lo;
        const KDB_GLOBAL kdb_data_t* p = x + (long)n * xs0 + (long)c * xs1;
        KDB_BARRIER; /* the previous job's reads of the stage are done */
        if (vec) {
            /* Whole vectors in, whole 16-byte words out to the stage (KDB_VEC / 4 per vector). */
            const int wv = W / KDB_VEC;
            KDB_SHARED_PTR(kdb_vec4u) words = (KDB_SHARED_PTR(kdb_vec4u))stage;
            for (int i = t; i < rows * wv; i += threads) {
                const int r = i / wv, v = i - r * wv;
                float f[KDB_VEC];
                kdb_unpack(((const KDB_GLOBAL kdb_vec4u*)(p + (long)(h_lo + r) * xs2))[v], f);
                for (int q = 0; q < KDB_VEC / 4; ++q) {
                    kdb_vec4u bits;
                    bits.x = KDB_FLOAT_BITS(f[4 * q]);
                    bits.y = KDB_FLOAT_BITS(f[4 * q + 1]);
                    bits.z = KDB_FLOAT_BITS(f[4 * q + 2]);
                    bits.w = KDB_FLOAT_BITS(f[4 * q + 3]);
                    words[(r * W + v * KDB_VEC) / 4 + q] = bits;
                }
            }
        } else {
            for (int i = t; i < rows * W; i += threads) {
                const int r = i / W, w = i - r * W;
                stage[i] = KDB_LOAD(p, (long)(h_lo + r) * xs2 + (long)w * xs3);
            }
        }
        KDB_BARRIER;
        const int small = kh <= POOL_SMALL && kw <= POOL_SMALL;
        if (mode == 0 && save_indices) {
            POOL_BAND_OUTPUTS(0, 1, 0)
        } else if (mode == 0 && small) {
            POOL_BAND_OUTPUTS(0, 0, 1)
        } else if (mode == 0) {
            POOL_BAND_OUTPUTS(0, 0, 0)
        } else if (small) {
            POOL_BAND_OUTPUTS(mode, 0, 1)
        } else {
            POOL_BAND_OUTPUTS(mode, 0, 0)
        }
    }
}

/* Forward over channels-last tensors (x's and y's channels contiguous: xs1 == ys1 == 1): an item
 * is an output pixel and KDB_VEC channels read and written as 16-byte vectors (vec: C a multiple
 * of KDB_VEC, x, y and their other strides on whole vectors) or one channel, and neighbouring
 * items hold neighbouring channels. A warp's reads of each window element are then contiguous,
 * where pool_fwd's threads (one output each, along a row) read elements a row of channels apart.
 * Indices (save_indices, max) as pool_fwd writes them: h * W + w, at the output's N C Ho Wo
 * position. The window's elements go POOL_BATCH at a time, every load of a batch issued before
 * any is used (an element past the window or in the padding reads the image's first pixel and is
 * not taken): a thread waits on memory once a batch rather than once an element, which is what
 * bounds a global pool (few outputs, long windows). The caller checks that N Ho Wo C fits an int.
 */
#define POOL_BATCH 4

/* One window element's lanes into an item's running maximum or sum. */
KDB_DEVICE_FN void pool_take(int mode, const float* v, int at, int lanes, int first, float* acc, int* acc_at)
{
    KDB_UNROLL
    for (int l = 0; l < KDB_VEC; ++l) {
        if (l < lanes) {
            if (mode != 0) {
                acc[l] += v[l];
            } else if (first || v[l] > acc[l]) {
                acc[l] = v[l];
                acc_at[l] = at;
            }
        }
    }
}

KDB_KERNEL void pool_fwd_nhwc(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, KDB_GLOBAL int* indices,
                              POOL_GEOMETRY, int xs0, int xs1, int xs2, int xs3, int ys0, int ys1, int ys2, int ys3,
                              int mode, int save_indices, int vec)
{
    const int lanes = vec ? KDB_VEC : 1, groups = C / lanes, total = N * Ho * Wo * groups, length = kh * kw;
    for (int i = KDB_GLOBAL_ID_X; i < total; i += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int c0 = (i % groups) * lanes, pixel = i / groups;
        const int wo = pixel % Wo, ho = pixel / Wo % Ho, n = pixel / (Wo * Ho);
        const int h0 = ho * sh - ph, w0 = wo * sw - pw;
        const long base = (long)n * xs0 + (long)c0;
        float acc[KDB_VEC], v[KDB_VEC];
        int acc_at[KDB_VEC], count = 0;
        KDB_UNROLL
        for (int l = 0; l < KDB_VEC; ++l) {
            acc[l] = 0.0f;
            acc_at[l] = -1;
        }
        int a = 0, b = 0; /* element e = a * kw + b of the window */
        for (int e = 0; e < length; e += POOL_BATCH) {
            long at[POOL_BATCH];
            int where[POOL_BATCH]; /* h * W + w, or -1: not an element to take */
            KDB_UNROLL
            for (int u = 0; u < POOL_BATCH; ++u) {
                const int h = h0 + a, w = w0 + b;
                const int inside = e + u < length && h >= 0 && h < H && w >= 0 && w < W;
                at[u] = inside ? base + (long)h * xs2 + (long)w * xs3 : base;
                where[u] = inside ? h * W + w : -1;
                if (++b == kw) {
                    b = 0;
                    ++a;
                }
            }
            kdb_vec4u q[POOL_BATCH];
            float one[POOL_BATCH];
            if (vec) {
                KDB_UNROLL
                for (int u = 0; u < POOL_BATCH; ++u)
                    q[u] = *(const KDB_GLOBAL kdb_vec4u*)(x + at[u]);
            } else {
                KDB_UNROLL
                for (int u = 0; u < POOL_BATCH; ++u)
                    one[u] = KDB_LOAD(x, at[u]);
            }
            KDB_UNROLL
            for (int u = 0; u < POOL_BATCH; ++u) {
                if (where[u] < 0)
                    continue;
                if (vec)
                    kdb_unpack(q[u], v);
                else
                    v[0] = one[u];
                pool_take(mode, v, where[u], lanes, count == 0, acc, acc_at);
                ++count;
            }
        }
        KDB_UNROLL
        for (int l = 0; l < KDB_VEC; ++l)
            v[l] = pool_result(mode, acc[l], count ? 0 : -1, acc[l], count, length);
        const long out = (long)n * ys0 + (long)c0 + (long)ho * ys2 + (long)wo * ys3;
        if (vec)
            *(KDB_GLOBAL kdb_vec4u*)(y + out) = kdb_pack(v);
        else
            KDB_STORE(y, out, v[0]);
        if (save_indices) {
            for (int l = 0; l < lanes; ++l)
                indices[((n * C + c0 + l) * Ho + ho) * Wo + wo] = acc_at[l];
        }
    }
}
