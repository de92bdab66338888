/* conv_depthwise.c: depthwise convolution (one filter per channel: groups = C = K), forward
 * and backward data, memory-bound, for MobileNet-style layers.
 *
 * A thread per element written, taken in the layout's memory order (channels_fastest: NHWC,
 * c varies fastest; else NCHW, the column does), so that a warp's reads and writes go along
 * memory; its 4-D index found once, then the filter's taps. Sums are fp32.
 *
 * Options: the element type (kdb_data.h).
 * Arguments: the tensors, conv_shape.h's CONV_SHAPE_ARGS (K = C, G = C), channels_fastest.
 * Launch: 1-D over the elements written (y; dx), any grid (grid-stride).
 */
#include "kdb_data.h"
#include "conv_shape.h"

/* (n, c, row, col) of element e of an N x C x rows x cols tensor enumerated in layout order. */
#define CONV_DW_INDEX(e, rows, cols, channels_fastest, n, c, row, col)                                      \
    do {                                                                                                    \
        if (channels_fastest) {                                                                             \
            c = (int)((e) % C);                                                                             \
            col = (int)((e) / C % (cols));                                                                  \
            row = (int)((e) / ((long)C * (cols)) % (rows));                                                 \
            n = (int)((e) / ((long)C * (cols) * (rows)));                                                   \
        } else {                                                                                            \
            col = (int)((e) % (cols));                                                                      \
            row = (int)((e) / (cols) % (rows));                                                             \
            c = (int)((e) / ((long)(cols) * (rows)) % C);                                                   \
            n = (int)((e) / ((long)(cols) * (rows) * C));                                                   \
        }                                                                                                   \
    } while (0)

KDB_KERNEL void conv_dw_fwd(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* w, KDB_GLOBAL kdb_data_t* y,
                            CONV_SHAPE_ARGS, int channels_fastest)
{
    const long total = (long)N * C * Ho * Wo;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        int n, c, i, j;
        CONV_DW_INDEX(e, Ho, Wo, channels_fastest, n, c, i, j);
        const KDB_GLOBAL kdb_data_t* plane = x + (long)n * xs0 + (long)c * xs1;
        const KDB_GLOBAL kdb_data_t* filter = w + (long)c * ws0;
        float acc = 0.0f;
        for (int a = 0; a < Y; ++a) {
            const int h = i * sh - ph + a * dlh;
            if (h < 0 || h >= H)
                continue;
            for (int b = 0; b < X; ++b) {
                const int v = j * sw - pw + b * dlw;
                if (v >= 0 && v < W)
                    acc += KDB_LOAD(plane, (long)h * xs2 + (long)v * xs3) * KDB_LOAD(filter, a * ws2 + b * ws3);
            }
        }
        KDB_STORE(y, (long)n * ys0 + (long)c * ys1 + (long)i * ys2 + (long)j * ys3, acc);
    }
}

#define CONV_DW_THREADS 256
#define CONV_DW_MAX_TAPS 25 /* filters up to 5 x 5 keep their sums (backward weights) or weights in registers */
#define CONV_DW_TILE_FLOATS 8192 /* the tiled forward's shared memory (32 KiB): the halo, then the weights */

/* Forward, tiled: a group takes TH x TW output positions of CB channels of one image (grid:
 * ceil(Ho / TH) ceil(Wo / TW) tiles, ceil(C / CB) slabs, N) and first copies their input window
 * (the halo, zeros outside the image) and their weights into shared memory, so that each input
 * element is read from memory once per tile, not once per tap. The halo is held in the layout's
 * order: [pixel][CB] when channels_fastest (NHWC: CB divides CONV_DW_THREADS, and a thread keeps
 * one channel, its weights in registers, the group's threads reading neighbouring channels),
 * else [CB][pixel] (NCHW: TH TW <= CONV_DW_THREADS, a thread keeps one position, neighbouring
 * threads reading neighbouring columns). The host picks tiles whose halo and weights fit
 * CONV_DW_TILE_FLOATS (conv's depthwise.py). */
KDB_KERNEL void KDB_BOUNDS(CONV_DW_THREADS, 4)
conv_dw_fwd_tiled(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* w, KDB_GLOBAL kdb_data_t* y,
                  CONV_SHAPE_ARGS, int channels_fastest, int TH, int TW, int CB)
{
    KDB_SHARED(float, tile, CONV_DW_TILE_FLOATS);
    const int t = KDB_LOCAL_ID_X, taps = Y * X, P = TH * TW;
    const int HH = (TH - 1) * sh + (Y - 1) * dlh + 1, WW = (TW - 1) * sw + (X - 1) * dlw + 1, pixels = HH * WW;
    const int tiles_w = (Wo + TW - 1) / TW;
    const int i0 = KDB_GROUP_ID_X / tiles_w * TH, j0 = KDB_GROUP_ID_X % tiles_w * TW;
    const int c0 = KDB_GROUP_ID_Y * CB, n = KDB_GROUP_ID_Z, h0 = i0 * sh - ph, v0 = j0 * sw - pw;
    const int halo = pixels * CB;
    /* Element e of the halo is tile[e] in either order; 8 loads issued before their stores, so
     * that a thread waits for memory once per 8 elements, not once per element. */
    for (int e0 = t; e0 < halo; e0 += 8 * CONV_DW_THREADS) {
        float value[8];
        KDB_UNROLL for (int u = 0; u < 8; ++u) {
            const int e = e0 + u * CONV_DW_THREADS;
            const int c = channels_fastest ? e % CB : e / pixels, pix = channels_fastest ? e / CB : e - c * pixels;
            const int hh = pix / WW, h = h0 + hh, v = v0 + pix - hh * WW, ch = c0 + c;
            value[u] = e < halo && ch < C && h >= 0 && h < H && v >= 0 && v < W
                           ? KDB_LOAD(x, (long)n * xs0 + (long)ch * xs1 + (long)h * xs2 + (long)v * xs3)
                           : 0.0f;
        }
        KDB_UNROLL for (int u = 0; u < 8; ++u) {
            if (e0 + u * CONV_DW_THREADS < halo)
                tile[e0 + u * CONV_DW_THREADS] = value[u];
        }
    }
    for (int e = t; e < CB * taps; e += CONV_DW_THREADS) {
        const int c = e / taps, tap = e - c * taps, a = tap / X;
        tile[halo + e] = c0 + c < C ? KDB_LOAD(w, (long)(c0 + c) * ws0 + (long)a * ws2 + (long)(tap - a * X) * ws3)
                                    : 0.0f;
    }
    KDB_BARRIER;
    const int tap_h = dlh * WW, tap_w = dlw; /* a tap's step in pixels: down a filter row, along it */
    if (channels_fastest) {
        const int c = t % CB, step = CONV_DW_THREADS / CB;
        float wc[CONV_DW_MAX_TAPS];
        KDB_UNROLL for (int e = 0; e < CONV_DW_MAX_TAPS; ++e) {
            if (e >= taps)
                break;
            wc[e] = tile[halo + c * taps + e];
        }
        if (c0 + c >= C)
            return;
        int p = t / CB, ti = p / TW, tj = p - ti * TW;
        const int step_i = step / TW, step_j = step - step_i * TW;
        for (; p < P; p += step) {
            const int i = i0 + ti, j = j0 + tj;
            if (i < Ho && j < Wo) {
                const int base = ti * sh * WW + tj * sw;
                float acc = 0.0f;
                int a = 0, b = 0;
                KDB_UNROLL for (int e = 0; e < CONV_DW_MAX_TAPS; ++e) {
                    if (e >= taps)
                        break;
                    acc += tile[(base + a * tap_h + b * tap_w) * CB + c] * wc[e];
                    const int wrap = ++b == X; /* the next filter row: no division per tap */
                    b = wrap ? 0 : b;
                    a += wrap;
                }
                if (taps > CONV_DW_MAX_TAPS) /* larger filters: their other taps' weights from the tile */
                    for (int e = CONV_DW_MAX_TAPS; e < taps; ++e) {
                        const int fa = e / X, fb = e - fa * X;
                        acc += tile[(base + fa * tap_h + fb * tap_w) * CB + c] * tile[halo + c * taps + e];
                    }
                KDB_STORE(y, (long)n * ys0 + (long)(c0 + c) * ys1 + (long)i * ys2 + (long)j * ys3, acc);
            }
            ti += step_i;
            tj += step_j;
            if (tj >= TW) {
                tj -= TW;
                ++ti;
            }
        }
        return;
    }
    const int step = CONV_DW_THREADS / P, p = t % P, ti = p / TW, tj = p - ti * TW, i = i0 + ti, j = j0 + tj;
    if (t >= step * P || i >= Ho || j >= Wo)
        return;
    const int base = ti * sh * WW + tj * sw;
    for (int c = t / P; c < CB && c0 + c < C; c += step) {
        const int at = c * pixels + base;
        float acc = 0.0f;
        for (int a = 0; a < Y; ++a)
            for (int b = 0; b < X; ++b)
                acc += tile[at + a * tap_h + b * tap_w] * tile[halo + c * taps + a * X + b];
        KDB_STORE(y, (long)n * ys0 + (long)(c0 + c) * ys1 + (long)i * ys2 + (long)j * ys3, acc);
    }
}

#define CONV_DW_RUN 4 /* neighbouring outputs of a row a thread of the direct forward kernels computes */
/* The input columns a run reads at column stride SW. OpenCL C's unroller wants a constant count
 * (it warns before inlining makes SW one): there, the count at stride 2, the rest skipped. */
#if defined(KDB_BACKEND_OPENCL)
#define CONV_DW_COLS(SW) ((CONV_DW_RUN - 1) * 2 + 3)
#else
#define CONV_DW_COLS(SW) ((CONV_DW_RUN - 1) * (SW) + 3)
#endif

/* Whether a forward's filter rows take the direct kernels' register path: at most 3 taps wide,
 * column dilation 1, column stride 1 or 2 (MobileNet's 3 x 3 depthwise layers). */
#define CONV_DW_NARROW (X <= 3 && dlw == 1 && (sw == 1 || sw == 2))

/* One filter row (weights wr[b], zero past the filter's width) added into a run of CONV_DW_RUN
 * outputs of 16-byte channel vectors, the row's input vectors read once each (SW, the column
 * stride, is a constant once inlined: every index below is known, the arrays stay in
 * registers); v0 is the run's first window column, `row` the input row at column 0. */
KDB_DEVICE_FN void conv_dw_vec_row(const KDB_GLOBAL kdb_vec4u* row, int v0, int W, int CV, const int SW,
                                   const float* wr, float* acc)
{
    KDB_UNROLL for (int col = 0; col < CONV_DW_COLS(SW); ++col) {
        const int v = v0 + col;
        if (col < (CONV_DW_RUN - 1) * SW + 3 && v >= 0 && v < W) {
            float xv[KDB_VEC];
            kdb_unpack(row[v * CV], xv);
            KDB_UNROLL for (int q = 0; q < CONV_DW_RUN; ++q) {
                const int b = col - q * SW;
                if (b >= 0 && b < 3)
                    KDB_UNROLL for (int u = 0; u < KDB_VEC; ++u) acc[q * KDB_VEC + u] += xv[u] * wr[b * KDB_VEC + u];
            }
        }
    }
}

/* The same for one channel's row of scalars, `step` elements apart (NCHW: 1). */
KDB_DEVICE_FN void conv_dw_scalar_row(const KDB_GLOBAL kdb_data_t* row, int v0, int W, int step, const int SW,
                                      const float* wr, float* acc)
{
    KDB_UNROLL for (int col = 0; col < CONV_DW_COLS(SW); ++col) {
        const int v = v0 + col;
        if (col < (CONV_DW_RUN - 1) * SW + 3 && v >= 0 && v < W) {
            const float xv = KDB_LOAD(row, v * step);
            KDB_UNROLL for (int q = 0; q < CONV_DW_RUN; ++q) {
                const int b = col - q * SW;
                if (b >= 0 && b < 3)
                    acc[q] += xv * wr[b];
            }
        }
    }
}

/* Forward, NHWC packed, C a multiple of KDB_VEC, x and y 16-byte aligned: a thread takes one
 * 16-byte vector of channels (KDB_VEC) at CONV_DW_RUN neighbouring outputs of a row, reading x
 * straight from memory (a warp's neighbouring threads read neighbouring vectors of a pixel;
 * neighbouring runs' and rows' overlapping reads hit the cache), the group's weights for its
 * channels first copied into shared memory as [tap][channel]. A group takes `lanes` channel
 * vectors (grid y: C / KDB_VEC / lanes, rounded up) and CONV_DW_THREADS / lanes runs at a time,
 * striding over the N Ho ceil(Wo / CONV_DW_RUN) runs by the grid's x (the host sizes it from
 * the multiprocessors, so that each group's weights serve several passes); at most
 * CONV_DW_TILE_FLOATS weights. Narrow filters (CONV_DW_NARROW) read each input vector of a
 * window row once into registers, a filter row's weights with it; others read x per tap. */
KDB_KERNEL void KDB_BOUNDS(CONV_DW_THREADS, 3)
conv_dw_fwd_nhwc_vec(const KDB_GLOBAL kdb_vec4u* x, const KDB_GLOBAL kdb_data_t* w, KDB_GLOBAL kdb_vec4u* y,
                     CONV_SHAPE_ARGS, int lanes)
{
    KDB_SHARED(float, wts, CONV_DW_TILE_FLOATS);
    const int t = KDB_LOCAL_ID_X, taps = Y * X, CV = C / KDB_VEC, width = lanes * KDB_VEC;
    const int cv0 = KDB_GROUP_ID_Y * lanes, c0 = cv0 * KDB_VEC;
    for (int e = t; e < taps * width; e += CONV_DW_THREADS) {
        const int tap = e / width, c = c0 + e - tap * width, a = tap / X;
        wts[e] = c < C ? KDB_LOAD(w, (long)c * ws0 + (long)a * ws2 + (long)(tap - a * X) * ws3) : 0.0f;
    }
    KDB_BARRIER;
    const int lane = t % lanes, cv = cv0 + lane, runs = (Wo + CONV_DW_RUN - 1) / CONV_DW_RUN;
    const int per = CONV_DW_THREADS / lanes, total = N * Ho * runs; /* sizes fit int (the host checks) */
    if (t >= per * lanes || cv >= CV)
        return;
    const int wl = lane * KDB_VEC; /* this lane's weights in wts */
    for (int r = KDB_GROUP_ID_X * per + t / lanes; r < total; r += KDB_NUM_GROUPS_X * per) {
        const int jr = r % runs, i = r / runs % Ho, n = r / (runs * Ho);
        const int j0 = jr * CONV_DW_RUN;
        float acc[CONV_DW_RUN * KDB_VEC];
        KDB_UNROLL for (int e = 0; e < CONV_DW_RUN * KDB_VEC; ++e) acc[e] = 0.0f;
        for (int a = 0; a < Y; ++a) {
            const int h = i * sh - ph + a * dlh;
            if (h < 0 || h >= H)
                continue;
            const KDB_GLOBAL kdb_vec4u* row = x + (n * H + h) * W * CV + cv;
            if (CONV_DW_NARROW) {
                float wr[3 * KDB_VEC];
                KDB_UNROLL for (int b = 0; b < 3; ++b)
                    KDB_UNROLL for (int u = 0; u < KDB_VEC; ++u)
                        wr[b * KDB_VEC + u] = b < X ? wts[(a * X + b) * width + wl + u] : 0.0f;
                if (sw == 1)
                    conv_dw_vec_row(row, j0 - pw, W, CV, 1, wr, acc);
                else
                    conv_dw_vec_row(row, j0 * 2 - pw, W, CV, 2, wr, acc);
                continue;
            }
            for (int b = 0; b < X; ++b) {
                float wv[KDB_VEC];
                KDB_UNROLL for (int u = 0; u < KDB_VEC; ++u) wv[u] = wts[(a * X + b) * width + wl + u];
                KDB_UNROLL for (int q = 0; q < CONV_DW_RUN; ++q) {
                    const int v = (j0 + q) * sw - pw + b * dlw;
                    if (v >= 0 && v < W) {
                        float xv[KDB_VEC];
                        kdb_unpack(row[v * CV], xv);
                        KDB_UNROLL for (int u = 0; u < KDB_VEC; ++u) acc[q * KDB_VEC + u] += xv[u] * wv[u];
                    }
                }
            }
        }
        KDB_UNROLL for (int q = 0; q < CONV_DW_RUN; ++q) {
            if (j0 + q < Wo)
                y[((n * Ho + i) * Wo + j0 + q) * CV + cv] = kdb_pack(acc + q * KDB_VEC);
        }
    }
}

/* Forward, any strides (NCHW in practice): a thread takes CONV_DW_RUN neighbouring outputs of a
 * row of one channel, neighbouring threads the next runs of the row (1-D grid over N C Ho
 * ceil(Wo / CONV_DW_RUN), grid-stride), x read straight from memory (neighbouring runs' and
 * rows' overlapping reads hit the cache); narrow filters (CONV_DW_NARROW) read each input of a
 * window row once, a filter row's weights with it. */
KDB_KERNEL void KDB_BOUNDS(CONV_DW_THREADS, 4)
conv_dw_fwd_rows(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* w, KDB_GLOBAL kdb_data_t* y,
                 CONV_SHAPE_ARGS)
{
    const int runs = (Wo + CONV_DW_RUN - 1) / CONV_DW_RUN;
    const int total = N * C * Ho * runs; /* at most y's elements: int (the host checks) */
    for (int e = KDB_GLOBAL_ID_X; e < total; e += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int jr = e % runs, i = e / runs % Ho, nc = e / (runs * Ho), c = nc % C, n = nc / C;
        const int j0 = jr * CONV_DW_RUN;
        const KDB_GLOBAL kdb_data_t* plane = x + (long)n * xs0 + (long)c * xs1;
        float acc[CONV_DW_RUN];
        KDB_UNROLL for (int q = 0; q < CONV_DW_RUN; ++q) acc[q] = 0.0f;
        for (int a = 0; a < Y; ++a) {
            const int h = i * sh - ph + a * dlh;
            if (h < 0 || h >= H)
                continue;
            if (CONV_DW_NARROW) {
                float wr[3];
                KDB_UNROLL for (int b = 0; b < 3; ++b)
                    wr[b] = b < X ? KDB_LOAD(w, (long)c * ws0 + (long)a * ws2 + (long)b * ws3) : 0.0f;
                if (sw == 1)
                    conv_dw_scalar_row(plane + (long)h * xs2, j0 - pw, W, xs3, 1, wr, acc);
                else
                    conv_dw_scalar_row(plane + (long)h * xs2, j0 * 2 - pw, W, xs3, 2, wr, acc);
                continue;
            }
            for (int b = 0; b < X; ++b) {
                const float wv = KDB_LOAD(w, (long)c * ws0 + (long)a * ws2 + (long)b * ws3);
                KDB_UNROLL for (int q = 0; q < CONV_DW_RUN; ++q) {
                    const int v = (j0 + q) * sw - pw + b * dlw;
                    if (v >= 0 && v < W)
                        acc[q] += KDB_LOAD(plane, (long)h * xs2 + (long)v * xs3) * wv;
                }
            }
        }
        KDB_UNROLL for (int q = 0; q < CONV_DW_RUN; ++q) {
            if (j0 + q < Wo)
                KDB_STORE(y, (long)n * ys0 + (long)c * ys1 + (long)i * ys2 + (long)(j0 + q) * ys3, acc[q]);
        }
    }
}

/* dx[n, c, h, v] = sum over the taps of dy at the output whose window puts that tap on (h, v). */
KDB_KERNEL void conv_dw_bwd_data(const KDB_GLOBAL kdb_data_t* dy, const KDB_GLOBAL kdb_data_t* w,
                                 KDB_GLOBAL kdb_data_t* dx, CONV_SHAPE_ARGS, int channels_fastest)
{
    const long total = (long)N * C * H * W;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        int n, c, h, v;
        CONV_DW_INDEX(e, H, W, channels_fastest, n, c, h, v);
        const KDB_GLOBAL kdb_data_t* plane = dy + (long)n * ys0 + (long)c * ys1;
        const KDB_GLOBAL kdb_data_t* filter = w + (long)c * ws0;
        float acc = 0.0f;
        for (int a = 0; a < Y; ++a) {
            const int top = h + ph - a * dlh;
            if (top < 0 || top % sh || top / sh >= Ho)
                continue;
            for (int b = 0; b < X; ++b) {
                const int left = v + pw - b * dlw;
                if (left >= 0 && left % sw == 0 && left / sw < Wo)
                    acc += KDB_LOAD(plane, (long)(top / sh) * ys2 + (long)(left / sw) * ys3) *
                           KDB_LOAD(filter, a * ws2 + b * ws3);
            }
        }
        KDB_STORE(dx, (long)n * xs0 + (long)c * xs1 + (long)h * xs2 + (long)v * xs3, acc);
    }
}

/* partial[k][s][tap] = the sum over slice s of the output positions of dy[n, k, i, j] times
 * x[n, k, i * sh - ph + a * dlh, j * sw - pw + b * dlw], tap = a X + b: every tap of a channel
 * from one read of dy, the block's rows then added in a tree. A block takes `lanes` channels
 * (32 when channels_fastest: a warp reads 32 neighbouring channels; else 1: a warp reads 32
 * neighbouring positions) and CONV_DW_THREADS / lanes rows of positions; grid (ceil(K / lanes),
 * slices). conv_igemm.c's conv_igemm_wrw_finish adds the slices into dw (G = K, 1 channel). */
KDB_KERNEL void conv_dw_bwd_weights(const KDB_GLOBAL kdb_data_t* dy, const KDB_GLOBAL kdb_data_t* x,
                                    KDB_GLOBAL float* partial, CONV_SHAPE_ARGS, int channels_fastest, int slice)
{
    KDB_SHARED(float, rows_sum, CONV_DW_THREADS);
    const int t = KDB_LOCAL_ID_X, lanes = channels_fastest ? 32 : 1, rows = CONV_DW_THREADS / lanes;
    const int lane = t % lanes, row = t / lanes, k = KDB_GROUP_ID_X * lanes + lane, taps = Y * X;
    const int P = N * Ho * Wo, begin = KDB_GROUP_ID_Y * slice, end = P - begin < slice ? P : begin + slice;
    float acc[CONV_DW_MAX_TAPS];
    KDB_UNROLL for (int e = 0; e < CONV_DW_MAX_TAPS; ++e) acc[e] = 0.0f;
    if (k < K)
        for (int p = begin + row; p < end; p += rows) {
            const int j = p % Wo, i = p / Wo % Ho, n = p / (Wo * Ho);
            const float g = KDB_LOAD(dy, (long)n * ys0 + (long)k * ys1 + (long)i * ys2 + (long)j * ys3);
            const long xk = (long)n * xs0 + (long)k * xs1;
            int h = i * sh - ph, v = j * sw - pw, b = 0; /* tap e = (a, b): row h, column v of x */
            KDB_UNROLL for (int e = 0; e < CONV_DW_MAX_TAPS; ++e) {
                if (e < taps && h >= 0 && h < H && v >= 0 && v < W)
                    acc[e] += g * KDB_LOAD(x, xk + (long)h * xs2 + (long)v * xs3);
                const int wrap = ++b == X; /* the next filter row: no division per tap */
                b = wrap ? 0 : b;
                h += wrap ? dlh : 0;
                v += wrap ? -(X - 1) * dlw : dlw;
            }
        }
    for (int e = 0; e < taps; ++e) {
        rows_sum[t] = acc[e < CONV_DW_MAX_TAPS ? e : 0];
        KDB_BARRIER;
        for (int span = rows / 2; span > 0; span /= 2) {
            if (row < span)
                rows_sum[t] += rows_sum[t + span * lanes];
            KDB_BARRIER;
        }
        if (row == 0 && k < K)
            partial[((long)k * KDB_NUM_GROUPS_Y + KDB_GROUP_ID_Y) * taps + e] = rows_sum[lane];
        KDB_BARRIER;
    }
}
