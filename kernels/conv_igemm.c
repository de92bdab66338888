/* conv_igemm.c: 2-D convolution in its three directions as an implicit GEMM on the general
 * cores (ConvImplicitGemm): igemm_core.h's multiply (fp32 FMAs whatever the element type,
 * 128 x 128 tiles, 8 x 8 per thread, double-buffered shared memory), the operands gathered
 * straight from the tensors through their strides (zeros in the padding): no im2col, any
 * layout, group count, stride, dilation and padding.
 *
 * The products, per group g (grid z):
 *   forward           y[m = (n, i, j)][k]       = sum over r = (c, a, b) of x gathered * w
 *   backward data     dx[m = (n, h, v)][c]      = sum over r = (k, a, b) of dy gathered * w
 *   backward weights  dw[k][col = (c, a, b)]    = sum over r = (n, i, j) of dy * x gathered,
 *                     r split in slices (grid z = g * slices + s) whose fp32 sums go to a
 *                     workspace that conv_igemm_wrw_finish adds in a fixed order: the result
 *                     does not depend on timing (no atomics)
 *   forward and backward data may split r the same way (grid z = (g [* phases + phase]) *
 *   slices + s, for grids too small to fill the GPU): their slices' sums go to partial, and
 *   conv_igemm_split_finish adds them into y or dx in slice order
 * cfast (NHWC) orders the channel digit of r (and of col) fastest, else the filter's column
 * (NCHW), so that consecutive reduction steps read consecutive memory in either layout.
 * Results leave through shared memory (IG_EPILOGUE): a warp writes 32 neighbours of y, dx or
 * the partial sums along whichever axis is contiguous.
 *
 * Options: the element type (kdb_data.h); the tile (igemm_core.h's IG_BM x IG_BN: 128 x 128,
 *   64 x 256 or 256 x 64); -DIG_TF32 (ConvImplicitGemmTf32).
 * Arguments: the tensors, conv_shape.h's CONV_SHAPE_ARGS, cfast; forward and backward data
 *   then partial (fp32, slices x the product; read only when slices > 1), and each direction
 *   the slice length (a multiple of IG_BK) and the slice count.
 * Launch: (IG_THREADS, 1, 1); grid (ceil(M / IG_BM), ceil(columns / IG_BN), G [x phases] x
 *   slices); offsets within one image must fit an int (the solver checks).
 */
#include "kdb_data.h"
#include "conv_shape.h"
#include "igemm_core.h"

#define IG_FAR (-(1 << 29)) /* a row or column outside the product: every bounds check fails */
#define IG_NONZERO(v) ((v) > 0 ? (v) : 1)

/* Digits (d0, d1, d2) of a reduction index in radices (., r1, r2): set from r, or advanced by
 * IG_BK, whose digits (s0, s1, s2) each kernel computes once; each carry is at most one. */
#define IG_DIGITS_SET(r, r1, r2, d0, d1, d2) \
    do {                                     \
        d2 = (r) % (r2);                     \
        d1 = (r) / (r2) % (r1);              \
        d0 = (r) / ((r2) * (r1));            \
    } while (0)
#define IG_DIGITS_STEP(r1, r2, d0, d1, d2) \
    do {                                   \
        d2 += s2;                          \
        const int c2_ = d2 >= (r2);        \
        d2 -= c2_ ? (r2) : 0;              \
        d1 += s1 + c2_;                    \
        const int c1_ = d1 >= (r1);        \
        d1 -= c1_ ? (r1) : 0;              \
        d0 += s0 + c1_;                    \
    } while (0)
#define IG_STEP_DIGITS(r1, r2)                           \
    const int s2 = IG_BK % (r2), s1 = IG_BK / (r2) % (r1); \
    const int s0 = IG_BK / ((r2) * (r1))

#define IG_PROLOGUE \
    IG_SETUP;       \
    const int cg = C / G, kg = K / G

/* The slice s of r = 0 .. R - 1 a block sums: [r_begin, r_end). */
#define IG_SLICE(s, R)                                          \
    const int r_begin = (s) * slice < (R) ? (s) * slice : (R); \
    const int r_end = (R) - r_begin < slice ? (R) : r_begin + slice

/* Stores into the partial sums (float) and into a tensor (its element type). */
#define IG_STORE_PART(o, v) (part[o] = (v))
#define IG_STORE_OUT(o, v) KDB_STORE(out, o, v)

KDB_KERNEL void KDB_BOUNDS(IG_THREADS, 2)
    conv_fwd_igemm(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* w, KDB_GLOBAL kdb_data_t* y,
                   CONV_SHAPE_ARGS, int cfast, KDB_GLOBAL float* partial, int slice, int slices)
{
    IG_PROLOGUE;
    const int g = KDB_GROUP_ID_Z / slices, plane = Ho * Wo, M = N * plane, R = cg * Y * X;
    IG_SLICE(KDB_GROUP_ID_Z % slices, R);
    /* A = x gathered: rows fastest in NCHW (along an image row), channels fastest in NHWC.
     * B = w: the reduction fastest, as weights lie in either layout. */
    IG_LOAD_SLOT(!cfast, t, ka, ma);
    IG_LOAD_SLOT(0, t, kb, nb);
    long xo[IG_QA];
    int hb[IG_QA], vb[IG_QA], wk[IG_QB];
    KDB_UNROLL for (int q = 0; q < IG_QA; ++q) {
        const int m = m0 + ma + 32 * q;
        const int n = m / plane, i = m % plane / Wo, j = m % Wo;
        hb[q] = m < M ? i * sh - ph : IG_FAR;
        vb[q] = j * sw - pw;
        xo[q] = (long)n * xs0 + (long)(g * cg) * xs1 + (long)hb[q] * xs2 + (long)vb[q] * xs3;
    }
    KDB_UNROLL for (int q = 0; q < IG_QB; ++q) {
        const int k = n0 + nb + 32 * q;
        wk[q] = k < kg ? (g * kg + k) * ws0 : -1;
    }
    /* r's digits: (a, b, c) when cfast, else (c, a, b). */
    const int r1 = cfast ? X : Y, r2 = cfast ? cg : X;
    IG_STEP_DIGITS(r1, r2);
    int ra = r_begin + ka, a0, a1, a2, rb = r_begin + kb, b0, b1, b2;
    IG_DIGITS_SET(ra, r1, r2, a0, a1, a2);
    IG_DIGITS_SET(rb, r1, r2, b0, b1, b2);
#define IG_FWD_LOAD                                                                                  \
    do {                                                                                             \
        const int c_ = cfast ? a2 : a0, dh_ = (cfast ? a0 : a1) * dlh, dv_ = (cfast ? a1 : a2) * dlw; \
        const int off_ = c_ * xs1 + dh_ * xs2 + dv_ * xs3;                                           \
        KDB_UNROLL for (int q = 0; q < IG_QA; ++q) {                                                 \
            const int h_ = hb[q] + dh_, v_ = vb[q] + dv_;                                            \
            ga[q] = ra < r_end && (unsigned)h_ < (unsigned)H && (unsigned)v_ < (unsigned)W            \
                        ? KDB_LOAD(x, xo[q] + off_)                                                  \
                        : 0.0f;                                                                      \
        }                                                                                            \
        const int wr_ = (cfast ? b2 : b0) * ws1 + (cfast ? b0 : b1) * ws2 + (cfast ? b1 : b2) * ws3;  \
        KDB_UNROLL for (int q = 0; q < IG_QB; ++q)                                                   \
            gb[q] = rb < r_end && wk[q] >= 0 ? KDB_LOAD(w, wk[q] + wr_) : 0.0f;                      \
    } while (0)
#define IG_ADVANCE                            \
    do {                                          \
        ra += IG_BK;                              \
        rb += IG_BK;                              \
        IG_DIGITS_STEP(r1, r2, a0, a1, a2);       \
        IG_DIGITS_STEP(r1, r2, b0, b1, b2);       \
    } while (0)
    IG_PIPELINE((r_end - r_begin + IG_BK - 1) / IG_BK, IG_FWD_LOAD, IG_ADVANCE);
    if (slices > 1) { /* this slice's sums, rows m by columns k */
        KDB_GLOBAL float* part = partial + (long)KDB_GROUP_ID_Z * M * kg;
#define IG_PART_ROW(m) ((m) < M ? (long)(m) * kg : -1L)
        IG_EPILOGUE(IG_PART_ROW, kg, 1, IG_STORE_PART);
    } else {
        KDB_GLOBAL kdb_data_t* out = y + (long)(g * kg) * ys1;
#define IG_FWD_ROW(m) \
    ((m) < M ? (long)((m) / plane) * ys0 + (long)((m) % plane / Wo) * ys2 + (long)((m) % Wo) * ys3 : -1L)
        IG_EPILOGUE(IG_FWD_ROW, kg, ys1, IG_STORE_OUT);
    }
}

/* One stride phase along an axis: the input positions q + s * u (u = 0, 1, ...) take exactly
 * the taps a = a0 + step * t (t < taps), those with q + p - a * dl a multiple of s, and read
 * the output index u + i0 - di * t: no tap between strides is ever visited. */
#define IG_PHASE(q, p, s, dl, F, a0, step, taps, i0, di)                                     \
    int a0 = -1, step, taps, i0, di;                                                          \
    do {                                                                                      \
        int g_ = dl, b_ = s;                                                                  \
        while (b_) {                                                                          \
            const int r_ = g_ % b_;                                                           \
            g_ = b_;                                                                          \
            b_ = r_;                                                                          \
        }                                                                                     \
        step = (s) / g_;                                                                      \
        di = (dl) / g_;                                                                       \
        for (int a_ = step - 1; a_ >= 0; --a_)                                                \
            if (((q) + (p) - a_ * (dl)) % (s) == 0)                                           \
                a0 = a_;                                                                      \
        taps = a0 < 0 || a0 >= (F) ? 0 : ((F) - a0 + step - 1) / step;                        \
        a0 = a0 < 0 ? 0 : a0;                                                                 \
        i0 = ((q) + (p) - a0 * (dl)) / (s);                                                   \
    } while (0)

/* dx[n, c, h, v] = sum of dy[n, k, i, j] w[k, c, a, b] over i * sh = h + ph - a * dlh (likewise
 * j): grid z runs the groups and the sh x sw stride phases, each a GEMM over its own taps. */
KDB_KERNEL void KDB_BOUNDS(IG_THREADS, 2)
    conv_bwd_data_igemm(const KDB_GLOBAL kdb_data_t* dy, const KDB_GLOBAL kdb_data_t* w, KDB_GLOBAL kdb_data_t* dx,
                        CONV_SHAPE_ARGS, int cfast, KDB_GLOBAL float* partial, int slice, int slices)
{
    IG_PROLOGUE;
    const int phases = sh * sw, gp = KDB_GROUP_ID_Z / slices, g = gp / phases, qh = gp % phases / sw, qw = gp % sw;
    IG_PHASE(qh, ph, sh, dlh, Y, ah, sa, Yp, ih, di);
    IG_PHASE(qw, pw, sw, dlw, X, aw, sb, Xp, jw, dj);
    const int Hq = (H - qh + sh - 1) / sh, Wq = (W - qw + sw - 1) / sw;
    /* (A phase may have no rows, H < sh: its divisions take 1 and nothing is stored.) */
    const int plane = IG_NONZERO(Hq * Wq), M = N * Hq * Wq, R = kg * Yp * Xp, Wd = IG_NONZERO(Wq);
    /* Blocks past a smaller phase's rows multiply nothing (no early return: every thread of
     * a block must meet its barriers, and OpenCL compilers such as PoCL rely on it). */
    IG_SLICE(KDB_GROUP_ID_Z % slices, R);
    const int steps = m0 < M ? (r_end - r_begin + IG_BK - 1) / IG_BK : 0;
    /* A = dy gathered (as the forward's x); B = w: its channels fastest in KYXC, the filter's
     * column in KCYX. */
    IG_LOAD_SLOT(!cfast, t, ka, ma);
    IG_LOAD_SLOT(cfast, t, kb, nb);
    long yo[IG_QA];
    int hp[IG_QA], vp[IG_QA], wc[IG_QB];
    KDB_UNROLL for (int q = 0; q < IG_QA; ++q) {
        const int m = m0 + ma + 32 * q;
        const int n = m / plane, hh = m % plane / Wd, vv = m % Wd;
        hp[q] = m < M ? hh + ih : IG_FAR; /* dy's row at tap 0 of the phase */
        vp[q] = vv + jw;
        yo[q] = (long)n * ys0 + (long)(g * kg) * ys1 + (long)hp[q] * ys2 + (long)vp[q] * ys3;
    }
    KDB_UNROLL for (int q = 0; q < IG_QB; ++q) {
        const int c = n0 + nb + 32 * q;
        wc[q] = c < cg ? c * ws1 : -1;
    }
    /* r's digits: (ta, tb, k) when cfast, else (k, ta, tb): the phase's taps and dy's channels. */
    const int r1 = IG_NONZERO(cfast ? Xp : Yp), r2 = IG_NONZERO(cfast ? kg : Xp); /* R = 0: no digits to count */
    IG_STEP_DIGITS(r1, r2);
    int ra = r_begin + ka, a0, a1, a2, rb = r_begin + kb, b0, b1, b2;
    IG_DIGITS_SET(ra, r1, r2, a0, a1, a2);
    IG_DIGITS_SET(rb, r1, r2, b0, b1, b2);
#define IG_BWD_LOAD                                                                                     \
    do {                                                                                                \
        const int di_ = (cfast ? a0 : a1) * di, dj_ = (cfast ? a1 : a2) * dj;                           \
        const int off_ = (cfast ? a2 : a0) * ys1 - di_ * ys2 - dj_ * ys3;                               \
        KDB_UNROLL for (int q = 0; q < IG_QA; ++q) {                                                    \
            const int i_ = hp[q] - di_, j_ = vp[q] - dj_;                                               \
            ga[q] = ra < r_end && (unsigned)i_ < (unsigned)Ho && (unsigned)j_ < (unsigned)Wo            \
                        ? KDB_LOAD(dy, yo[q] + off_)                                                    \
                        : 0.0f;                                                                         \
        }                                                                                               \
        const int wr_ = (g * kg + (cfast ? b2 : b0)) * ws0 + (ah + sa * (cfast ? b0 : b1)) * ws2 +       \
                        (aw + sb * (cfast ? b1 : b2)) * ws3;                                            \
        KDB_UNROLL for (int q = 0; q < IG_QB; ++q)                                                      \
            gb[q] = rb < r_end && wc[q] >= 0 ? KDB_LOAD(w, wr_ + wc[q]) : 0.0f;                         \
    } while (0)
    IG_PIPELINE(steps, IG_BWD_LOAD, IG_ADVANCE);
    if (slices > 1) { /* this slice's sums, rows m by columns c, in slabs of the largest phase's rows */
        const long Mmax = (long)N * ((H + sh - 1) / sh) * ((W + sw - 1) / sw);
        KDB_GLOBAL float* part = partial + KDB_GROUP_ID_Z * Mmax * cg;
#define IG_PART_ROW_B(m) ((m) < M ? (long)(m) * cg : -1L)
        IG_EPILOGUE(IG_PART_ROW_B, cg, 1, IG_STORE_PART);
    } else {
        KDB_GLOBAL kdb_data_t* out = dx + (long)(g * cg) * xs1;
#define IG_BWD_ROW(m)                                                                                  \
    ((m) < M ? (long)((m) / plane) * xs0 + (long)(qh + (m) % plane / Wd * sh) * xs2 + (long)(qw + (m) % Wd * sw) * xs3 \
             : -1L)
        IG_EPILOGUE(IG_BWD_ROW, cg, xs1, IG_STORE_OUT);
    }
}

/* partial[g, s][k][col] = the sum over slice s of the positions r = (n, i, j). */
KDB_KERNEL void KDB_BOUNDS(IG_THREADS, 2)
    conv_wrw_igemm(const KDB_GLOBAL kdb_data_t* dy, const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL float* partial,
                   CONV_SHAPE_ARGS, int cfast, int slice, int slices)
{
    IG_PROLOGUE;
    const int g = KDB_GROUP_ID_Z / slices, s = KDB_GROUP_ID_Z % slices;
    const int RC = cg * Y * X, R = N * Ho * Wo, r_begin = s * slice;
    const int r_end = R - r_begin < slice ? R : r_begin + slice;
    /* A = dy: the positions fastest in NCHW, the output channels in NHWC. B = x gathered: the
     * positions fastest in NCHW, the channels (col's fastest digit) in NHWC. */
    IG_LOAD_SLOT(cfast, t, ka, ma);
    IG_LOAD_SLOT(cfast, t, kb, nb);
    int dk[IG_QA], dh[IG_QB], dv[IG_QB], xc[IG_QB];
    KDB_UNROLL for (int q = 0; q < IG_QA; ++q) {
        const int k = m0 + ma + 32 * q;
        dk[q] = k < kg ? (g * kg + k) * ys1 : -1;
    }
    KDB_UNROLL for (int q = 0; q < IG_QB; ++q) {
        const int col = n0 + nb + 32 * q;
        /* col's digits: (a, b, c) when cfast, else (c, a, b) */
        const int c = cfast ? col % cg : col / (Y * X);
        const int a = cfast ? col / (X * cg) : col / X % Y, b = cfast ? col / cg % X : col % X;
        dh[q] = col < RC ? a * dlh - ph : IG_FAR;
        dv[q] = b * dlw - pw;
        xc[q] = (g * cg + c) * xs1 + dh[q] * xs2 + dv[q] * xs3;
    }
    /* r's digits: (n, i, j) */
    const int r1 = Ho, r2 = Wo;
    IG_STEP_DIGITS(r1, r2);
    int ra = r_begin + ka, a0, a1, a2, rb = r_begin + kb, b0, b1, b2;
    IG_DIGITS_SET(ra, r1, r2, a0, a1, a2);
    IG_DIGITS_SET(rb, r1, r2, b0, b1, b2);
#define IG_WRW_LOAD                                                                                   \
    do {                                                                                              \
        const long yr_ = (long)a0 * ys0 + a1 * ys2 + a2 * ys3;                                        \
        KDB_UNROLL for (int q = 0; q < IG_QA; ++q)                                                    \
            ga[q] = ra < r_end && dk[q] >= 0 ? KDB_LOAD(dy, yr_ + dk[q]) : 0.0f;                      \
        const int hi_ = b1 * sh, vj_ = b2 * sw;                                                       \
        const long xr_ = (long)b0 * xs0 + (long)hi_ * xs2 + (long)vj_ * xs3;                          \
        KDB_UNROLL for (int q = 0; q < IG_QB; ++q) {                                                  \
            const int h_ = hi_ + dh[q], v_ = vj_ + dv[q];                                             \
            gb[q] = rb < r_end && (unsigned)h_ < (unsigned)H && (unsigned)v_ < (unsigned)W            \
                        ? KDB_LOAD(x, xr_ + xc[q])                                                    \
                        : 0.0f;                                                                       \
        }                                                                                             \
    } while (0)
    IG_PIPELINE((r_end - r_begin + IG_BK - 1) / IG_BK, IG_WRW_LOAD, IG_ADVANCE);
    KDB_GLOBAL float* part = partial + (long)KDB_GROUP_ID_Z * kg * RC;
#define IG_WRW_ROW(k) ((k) < kg ? (long)(k) * RC : -1L)
    IG_EPILOGUE(IG_WRW_ROW, RC, 1, IG_STORE_PART);
}

/* dw[k, c, a, b] = the sum of the slices' partial sums, in slice order; one thread per weight. */
KDB_KERNEL void conv_igemm_wrw_finish(const KDB_GLOBAL float* partial, KDB_GLOBAL kdb_data_t* dw, int K, int cg,
                                      int Y, int X, int G, int slices, int cfast, int ws0, int ws1, int ws2,
                                      int ws3)
{
    const int kg = K / G, RC = cg * Y * X;
    const long total = (long)K * RC;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int col = (int)(e % RC), k = (int)(e / RC), g = k / kg;
        const KDB_GLOBAL float* p = partial + ((long)g * slices * kg + k % kg) * RC + col;
        float sum = 0.0f;
        for (int s = 0; s < slices; ++s)
            sum += p[(long)s * kg * RC];
        const int c = cfast ? col % cg : col / (Y * X);
        const int a = cfast ? col / (X * cg) : col / X % Y, b = cfast ? col / cg % X : col % X;
        KDB_STORE(dw, (long)k * ws0 + (long)c * ws1 + (long)a * ws2 + (long)b * ws3, sum);
    }
}

/* out[n, g * cols + col, h, v] = the sum over the slices s of the partial sums of (h, v)'s
 * stride phase (qh, qw) = (h % sh, v % sw), row m = (n, h / sh, v / sw) of that phase's
 * (H - qh) / sh x (W - qw) / sw positions, in slice order: slab (g * sh * sw + qh * sw + qw) *
 * slices + s, each of the largest phase's rows (N ceil(H / sh) ceil(W / sw)) x cols. The
 * forward's y (H x W its output, sh = sw = 1) or backward data's dx from split sums. One thread
 * per element, along whichever of positions and channels is contiguous in out. */
KDB_KERNEL void conv_igemm_split_finish(const KDB_GLOBAL float* partial, KDB_GLOBAL kdb_data_t* out, int N, int H,
                                        int W, int sh, int sw, int cols, int G, int slices, int os0, int os1,
                                        int os2, int os3)
{
    const long positions = (long)N * H * W, total = G * positions * cols;
    const long mmax = (long)N * ((H + sh - 1) / sh) * ((W + sw - 1) / sw);
    const int cf = os1 == 1;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int g = (int)(e / (positions * cols));
        const long within = e % (positions * cols);
        const long pos = cf ? within / cols : within % positions;
        const int col = (int)(cf ? within % cols : within / positions);
        const int n = (int)(pos / ((long)H * W)), h = (int)(pos / W % H), v = (int)(pos % W);
        const int qh = h % sh, qw = v % sw, wq = (W - qw + sw - 1) / sw, hq = (H - qh + sh - 1) / sh;
        const long m = ((long)n * hq + h / sh) * wq + v / sw;
        const long z = ((long)g * sh * sw + qh * sw + qw) * slices;
        const KDB_GLOBAL float* p = partial + (z * mmax + m) * cols + col;
        float sum = 0.0f;
        for (int s = 0; s < slices; ++s)
            sum += p[(long)s * mmax * cols];
        KDB_STORE(out, (long)n * os0 + (long)(g * cols + col) * os1 + (long)h * os2 + (long)v * os3, sum);
    }
}
