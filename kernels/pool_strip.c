/* pool_strip.c: 2-D pooling forward from registers, for the windows CNNs use: square K x K
 * windows of stride S with (K, S, left/right pad) one of (3, 2, 1), (3, 2, 0), (2, 2, 0) and
 * (3, 1, 1); the top/bottom pad is any.
 *
 * A thread owns one column group (the KDB_VEC input columns of one 16-byte vector, that is
 * KDB_VEC / S outputs of a row) over a strip of POOL_STRIP_ROWS output rows. It walks the
 * strip's input rows once, top to bottom: per row, one vector read plus the one or two columns
 * its windows reach beyond it (its neighbour's, from the L1 cache), the row maxima (or sums)
 * of its outputs' windows, folded into the two output rows that row belongs to. So each input
 * element leaves device memory once (a strip's last row twice), with few instructions per
 * output: no shared memory, no division per element. The geometry is dispatched once per
 * thread to a function whose loops have constant bounds, so the row and its outputs stay in
 * registers.
 *
 * mode: 0 max, 1 average padding excluded, 2 average padding included (pooling.c's). With
 * save_indices, max also writes each output's argmax h * W + w (first maximum in row-major
 * order, as pooling.c). A window with no input element gives 0.
 *
 * Options: the element type (kdb_data.h).
 * vec, two flags the solver checks: bit 0, x's rows are contiguous, start 16-byte aligned and
 * hold whole vectors (else every element is read on its own, any strides); bit 1, y's rows are
 * contiguous and every run of outs outputs starting at a multiple of outs is outs elements
 * aligned (then each thread writes a row's outputs in one store).
 * Kernels pool_strip_k<K>s<S>p<P>_max, _argmax (max with indices) and _avg (mode 1 or 2).
 * Launch: 1-D, blocks of at most POOL_STRIP_THREADS threads, any grid (grid-stride over
 * N * C * strips * groups jobs), with strips = ceil(Ho / POOL_STRIP_ROWS),
 * groups = ceil(Wo / outs), outs = KDB_VEC / S.
 */
#include "kdb_data.h"

#ifndef POOL_STRIP_ROWS
#define POOL_STRIP_ROWS 4
#endif
/* Blocks of at most 128 threads, five per multiprocessor on CUDA: the registers go down from
 * about 110 to 96 a thread (a few spilled), so 20 warps fit a multiprocessor instead of 16
 * (scripts/compare_pool_strip.py: max pooling fp16 75% -> 81% of copy on the H100). */
#ifndef POOL_STRIP_THREADS
#define POOL_STRIP_THREADS 128
#define POOL_STRIP_GROUPS_PER_MP 5
#endif
#define POOL_STRIP_LOWEST -3.402823466e38f
#define POOL_STRIP_IDENTITY(AVG_) ((AVG_) ? 0.0f : POOL_STRIP_LOWEST) /* what a missing element adds */

/* One column of the thread's row: v[e] is input column c0 + e of row `row`, or the identity
 * where the column is outside the input. */
#define POOL_STRIP_COLUMN(e, AVG_)                                                                          \
    v[e] = (c0 + (e) >= 0 && c0 + (e) < W) ? KDB_LOAD(row, (long)(c0 + (e)) * xs3)                          \
                                           : POOL_STRIP_IDENTITY(AVG_)

/* OUTS = KDB_VEC / S outputs (4 / S words) at dst, 8 (S = 2) or 16 (S = 1) bytes aligned. */
#define POOL_STRIP_STORE_PACKED(dst, out, S_)                                                               \
    do {                                                                                                    \
        if ((S_) == 1) {                                                                                    \
            *(KDB_GLOBAL kdb_vec4u*)(dst) = kdb_pack(out);                                                  \
        } else {                                                                                            \
            kdb_vec2u w2;                                                                                   \
            w2.x = kdb_pack_word(out);                                                                      \
            w2.y = kdb_pack_word((out) + KDB_PER_WORD);                                                     \
            *(KDB_GLOBAL kdb_vec2u*)(dst) = w2;                                                             \
        }                                                                                                   \
    } while (0)

/* The function for window K_, stride S_, left pad P_; AVG_: sum instead of max; SAVE_: argmax. */
#define POOL_STRIP_FN(NAME, K_, S_, P_, AVG_, SAVE_)                                                         \
    KDB_DEVICE_FN void NAME(const KDB_GLOBAL kdb_data_t* p, KDB_GLOBAL kdb_data_t* q, KDB_GLOBAL int* at_out, \
                            int H, int W, int Ho, int Wo, int ph, int xs2, int xs3, int ys2, int ys3,         \
                            int ho0, int g, int mode, int vec)                                                \
    {                                                                                                         \
        enum { OUTS = KDB_VEC / S_, SPAN = KDB_VEC + K_ - S_, ROWS_IN = (POOL_STRIP_ROWS - 1) * S_ + K_ };    \
        const int c0 = g * KDB_VEC - P_, wo0 = g * OUTS, top = ho0 * S_ - ph;                                 \
        const int whole = (vec & 1) && c0 + P_ + KDB_VEC <= W, packed = vec & 2;                               \
        float acc[POOL_STRIP_ROWS][OUTS];                                                                     \
        int acc_at[POOL_STRIP_ROWS][OUTS];                                                                    \
        /* Vector path: every row's reads issued before any is used (rows and halo columns        */         \
        /* outside the input read a clamped address, then count as the identity).                  */         \
        kdb_vec4u rowv[ROWS_IN];                                                                              \
        float halo[ROWS_IN][SPAN - KDB_VEC + 1];                                                              \
        if (whole) {                                                                                          \
            KDB_UNROLL for (int j = 0; j < ROWS_IN; ++j) {                                                    \
                const int h = top + j < 0 ? 0 : (top + j < H ? top + j : H - 1);                              \
                const KDB_GLOBAL kdb_data_t* row = p + (long)h * xs2;                                         \
                rowv[j] = *(const KDB_GLOBAL kdb_vec4u*)(row + c0 + P_);                                      \
                KDB_UNROLL for (int e = 0; e < SPAN - KDB_VEC; ++e) {                                         \
                    const int col = c0 + (e < P_ ? e : e + KDB_VEC);                                          \
                    halo[j][e] = KDB_LOAD(row, (long)(col < 0 ? 0 : (col < W ? col : W - 1)) * xs3);          \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
        KDB_UNROLL for (int j = 0; j < ROWS_IN; ++j) {                                                        \
            const int h = top + j;                                                                            \
            float v[SPAN];                                                                                    \
            if (h < 0 || h >= H) {                                                                            \
                for (int e = 0; e < SPAN; ++e)                                                                \
                    v[e] = POOL_STRIP_IDENTITY(AVG_);                                                   \
            } else if (whole) {                                                                               \
                float m[KDB_VEC];                                                                             \
                kdb_unpack(rowv[j], m);                                                                       \
                for (int e = 0; e < KDB_VEC; ++e)                                                             \
                    v[P_ + e] = m[e];                                                                         \
                for (int e = 0; e < SPAN - KDB_VEC; ++e) {                                                    \
                    const int at = e < P_ ? e : e + KDB_VEC, col = c0 + at;                                   \
                    v[at] = col >= 0 && col < W ? halo[j][e] : POOL_STRIP_IDENTITY(AVG_);             \
                }                                                                                             \
            } else {                                                                                          \
                const KDB_GLOBAL kdb_data_t* row = p + (long)h * xs2;                                         \
                for (int e = 0; e < SPAN; ++e)                                                                \
                    POOL_STRIP_COLUMN(e, AVG_);                                                               \
            }                                                                                                 \
            /* This row's part of each output's window: a max (its column) or a sum. */                       \
            float part[OUTS];                                                                                 \
            int part_at[OUTS];                                                                                \
            for (int o = 0; o < OUTS; ++o) {                                                                  \
                part[o] = v[o * S_];                                                                          \
                part_at[o] = -1;                                                                              \
                if (SAVE_) {                                                                                  \
                    part[o] = POOL_STRIP_LOWEST;                                                              \
                    for (int b = 0; b < K_; ++b) {                                                            \
                        const int w = c0 + o * S_ + b;                                                        \
                        if (h >= 0 && h < H && w >= 0 && w < W && (v[o * S_ + b] > part[o] || part_at[o] < 0)) { \
                            part[o] = v[o * S_ + b];                                                          \
                            part_at[o] = h * W + w;                                                           \
                        }                                                                                     \
                    }                                                                                         \
                } else {                                                                                      \
                    for (int b = 1; b < K_; ++b)                                                              \
                        part[o] = AVG_ ? part[o] + v[o * S_ + b] : KDB_FMAXF(part[o], v[o * S_ + b]);         \
                }                                                                                             \
            }                                                                                                 \
            KDB_UNROLL for (int r = 0; r < POOL_STRIP_ROWS; ++r) {                                            \
                if (j < r * S_ || j >= r * S_ + K_)                                                           \
                    continue;                                                                                 \
                for (int o = 0; o < OUTS; ++o) {                                                              \
                    if (j == r * S_) {                                                                        \
                        acc[r][o] = part[o];                                                                  \
                        acc_at[r][o] = part_at[o];                                                            \
                    } else if (SAVE_) {                                                                       \
                        if (part_at[o] >= 0 && (part[o] > acc[r][o] || acc_at[r][o] < 0)) {                   \
                            acc[r][o] = part[o];                                                              \
                            acc_at[r][o] = part_at[o];                                                        \
                        }                                                                                     \
                    } else {                                                                                  \
                        acc[r][o] = AVG_ ? acc[r][o] + part[o] : KDB_FMAXF(acc[r][o], part[o]);               \
                    }                                                                                         \
                }                                                                                             \
                if (j != r * S_ + K_ - 1 || ho0 + r >= Ho)                                                    \
                    continue;                                                                                 \
                /* The window's last row: the output row is complete. */                                      \
                const int h0 = top + r * S_;                                                                  \
                const int rows_in = (h0 + K_ < H ? h0 + K_ : H) - (h0 > 0 ? h0 : 0);                          \
                float out[KDB_VEC];                                                                           \
                for (int o = 0; o < OUTS; ++o) {                                                              \
                    const int wo = wo0 + o, w0 = wo * S_ - P_;                                                \
                    const int count = rows_in * ((w0 + K_ < W ? w0 + K_ : W) - (w0 > 0 ? w0 : 0));            \
                    if (AVG_)                                                                                 \
                        out[o] = mode == 2 ? acc[r][o] / (K_ * K_) : (count > 0 ? acc[r][o] / count : 0.0f);  \
                    else                                                                                      \
                        out[o] = (SAVE_ ? acc_at[r][o] >= 0 : count > 0) ? acc[r][o] : 0.0f;                  \
                    if (SAVE_ && wo < Wo)                                                                     \
                        at_out[(long)(ho0 + r) * Wo + wo] = acc_at[r][o];                                     \
                }                                                                                             \
                KDB_GLOBAL kdb_data_t* dst = q + (long)(ho0 + r) * ys2;                                       \
                if (packed && wo0 + OUTS <= Wo) {                                                             \
                    /* The outputs in one 8- or 16-byte store: a warp's stores cover whole  */                \
                    /* sectors (one per element cost the L2 four times the requests).      */                 \
                    POOL_STRIP_STORE_PACKED(dst + wo0, out, S_);                                              \
                } else {                                                                                      \
                    for (int o = 0; o < OUTS; ++o)                                                            \
                        if (wo0 + o < Wo)                                                                     \
                            KDB_STORE(dst, (long)(wo0 + o) * ys3, out[o]);                                    \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
    }

/* One kernel per geometry and variant (each gets the registers its own loops need). */
#define POOL_STRIP_KERNEL(NAME, FN)                                                                          \
    KDB_KERNEL void KDB_BOUNDS(POOL_STRIP_THREADS, POOL_STRIP_GROUPS_PER_MP)                                   \
    NAME(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, KDB_GLOBAL int* indices,                  \
                         int N, int C, int H, int W, int Ho, int Wo, int ph, int xs0, int xs1, int xs2, int xs3,  \
                         int ys0, int ys1, int ys2, int ys3, int outs, int mode, int vec)                      \
    {                                                                                                        \
        const int groups = (Wo + outs - 1) / outs, strips = (Ho + POOL_STRIP_ROWS - 1) / POOL_STRIP_ROWS;     \
        const long jobs = (long)N * C * strips * groups;                                                     \
        for (long job = KDB_GLOBAL_ID_X; job < jobs; job += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {     \
            const int g = (int)(job % groups);                                                               \
            const long rest = job / groups;                                                                  \
            const int strip = (int)(rest % strips), plane = (int)(rest / strips);                            \
            const int c = plane % C, n = plane / C;                                                          \
            FN(x + (long)n * xs0 + (long)c * xs1, y + (long)n * ys0 + (long)c * ys1,                         \
               indices + (long)plane * Ho * Wo, H, W, Ho, Wo, ph, xs2, xs3, ys2, ys3,                        \
               strip * POOL_STRIP_ROWS, g, mode, vec);                                                       \
        }                                                                                                    \
    }

#define POOL_STRIP_VARIANTS(NAME, K_, S_, P_)                                                                \
    POOL_STRIP_FN(NAME##_max_fn, K_, S_, P_, 0, 0)                                                           \
    POOL_STRIP_FN(NAME##_argmax_fn, K_, S_, P_, 0, 1)                                                        \
    POOL_STRIP_FN(NAME##_avg_fn, K_, S_, P_, 1, 0)                                                           \
    POOL_STRIP_KERNEL(NAME##_max, NAME##_max_fn)                                                             \
    POOL_STRIP_KERNEL(NAME##_argmax, NAME##_argmax_fn)                                                       \
    POOL_STRIP_KERNEL(NAME##_avg, NAME##_avg_fn)

/* pool_strip_k<window>s<stride>p<left pad>_{max,argmax,avg}; outs: KDB_VEC / stride. */
POOL_STRIP_VARIANTS(pool_strip_k3s2p1, 3, 2, 1)
POOL_STRIP_VARIANTS(pool_strip_k3s2p0, 3, 2, 0)
POOL_STRIP_VARIANTS(pool_strip_k2s2p0, 2, 2, 0)
POOL_STRIP_VARIANTS(pool_strip_k3s1p1, 3, 1, 1)
