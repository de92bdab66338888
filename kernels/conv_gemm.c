/* conv_gemm.c: the memory movements around a convolution computed as a matrix multiply
 * (ConvIm2colGemm): im2col (each output position's receptive field as a row or a column),
 * col2im (the sum back into the input's positions, gathered: no atomics) and a transpose of
 * the output gradient for backward weights. One group (the solver takes groups = 1).
 *
 * The column matrix is addressed by strides, so one kernel writes every arrangement the
 * solver multiplies: element (n, c, a, b, p) of the receptive fields (p = i * Wo + j the
 * output position, (a, b) the filter tap) lies at n*cn + p*cp + c*cc + a*ca + b*cb.
 *
 * Options: the element type (kdb_data.h).
 * Arguments: the tensors, conv_shape.h's CONV_SHAPE_ARGS (x's strides where x is read or
 *   dx written), then the column strides and the enumeration order.
 * Launch: 1-D, any grid (grid-stride over the elements written).
 */
#include "kdb_data.h"
#include "conv_shape.h"

#define CONV_COL_ARGS long cn, long cp, long cc, long ca, long cb

/* col[n, c, a, b, p] = x[n, c, i * sh - ph + a * dlh, j * sw - pw + b * dlw], 0 in the padding.
 * channels_fastest: elements go in (n, p, a, b, c) order (NHWC: contiguous reads and writes),
 * else (n, c, a, b, p) (NCHW). */
KDB_KERNEL void conv_im2col(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* col, CONV_SHAPE_ARGS, CONV_COL_ARGS,
                            int channels_fastest)
{
    const long P = (long)Ho * Wo, taps = (long)Y * X, total = (long)N * C * taps * P;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        long p, tap;
        int c, n;
        if (channels_fastest) {
            c = (int)(e % C);
            tap = e / C % taps;
            p = e / ((long)C * taps) % P;
            n = (int)(e / ((long)C * taps * P));
        } else {
            p = e % P;
            tap = e / P % taps;
            c = (int)(e / (P * taps) % C);
            n = (int)(e / (P * taps * C));
        }
        const int a = (int)(tap / X), b = (int)(tap % X), i = (int)(p / Wo), j = (int)(p % Wo);
        const int h = i * sh - ph + a * dlh, v = j * sw - pw + b * dlw;
        const float value = h >= 0 && h < H && v >= 0 && v < W
                                ? KDB_LOAD(x, (long)n * xs0 + (long)c * xs1 + (long)h * xs2 + (long)v * xs3)
                                : 0.0f;
        KDB_STORE(col, n * cn + p * cp + c * cc + a * ca + b * cb, value);
    }
}

/* dx[n, c, h, v] = sum of col[n, c, a, b, p] over the taps (a, b) and output positions p whose
 * window reads (h, v). channels_fastest: dx's elements in (n, h, v, c) order, else (n, c, h, v). */
KDB_KERNEL void conv_col2im(const KDB_GLOBAL kdb_data_t* col, KDB_GLOBAL kdb_data_t* dx, CONV_SHAPE_ARGS,
                            CONV_COL_ARGS, int channels_fastest)
{
    const long total = (long)N * C * H * W;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        int n, c, h, v;
        if (channels_fastest) {
            c = (int)(e % C);
            v = (int)(e / C % W);
            h = (int)(e / ((long)C * W) % H);
            n = (int)(e / ((long)C * W * H));
        } else {
            v = (int)(e % W);
            h = (int)(e / W % H);
            c = (int)(e / ((long)W * H) % C);
            n = (int)(e / ((long)W * H * C));
        }
        float acc = 0.0f;
        for (int a = 0; a < Y; ++a) {
            const int top = h + ph - a * dlh;
            if (top < 0 || top % sh || top / sh >= Ho)
                continue;
            for (int b = 0; b < X; ++b) {
                const int left = v + pw - b * dlw;
                if (left < 0 || left % sw || left / sw >= Wo)
                    continue;
                const long p = (long)(top / sh) * Wo + left / sw;
                acc += KDB_LOAD(col, n * cn + p * cp + c * cc + a * ca + b * cb);
            }
        }
        KDB_STORE(dx, (long)n * xs0 + (long)c * xs1 + (long)h * xs2 + (long)v * xs3, acc);
    }
}

/* dyt[k, n, p] = dy[n, k, p] (dy NCHW): backward weights multiplies K x (N * Ho * Wo). */
KDB_KERNEL void conv_dy_by_channel(const KDB_GLOBAL kdb_data_t* dy, KDB_GLOBAL kdb_data_t* dyt, CONV_SHAPE_ARGS)
{
    const long P = (long)Ho * Wo, total = (long)K * N * P;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const long p = e % P;
        const int n = (int)(e / P % N), k = (int)(e / (P * N));
        KDB_STORE(dyt, e, KDB_LOAD(dy, (long)n * ys0 + (long)k * ys1 + (p / Wo) * ys2 + (p % Wo) * ys3));
    }
}

/* dst[b] = src[b]^T for each of the grid's z matrices of rows x cols (packed): the tensor-core
 * convolution's staging of NCHW tensors channels-last (x: C x HW per image; weights: C x YX per
 * output channel) and back (y: HoWo x K per image). A 32 x 32 tile through shared memory, so
 * both the reads and the writes go along rows. Launch: blocks of 32 x 8, grid (ceil(cols / 32),
 * ceil(rows / 32), matrices). */
#define CONV_TILE 32
KDB_KERNEL void conv_transpose(const KDB_GLOBAL kdb_data_t* src, KDB_GLOBAL kdb_data_t* dst, int rows, int cols)
{
    KDB_SHARED(float, tile, CONV_TILE * (CONV_TILE + 1));
    const long base = (long)KDB_GROUP_ID_Z * rows * cols;
    const int c0 = KDB_GROUP_ID_X * CONV_TILE, r0 = KDB_GROUP_ID_Y * CONV_TILE;
    const int tx = KDB_LOCAL_ID_X, ty = KDB_LOCAL_ID_Y;
    for (int k = ty; k < CONV_TILE; k += 8)
        if (r0 + k < rows && c0 + tx < cols)
            tile[k * (CONV_TILE + 1) + tx] = KDB_LOAD(src, base + (long)(r0 + k) * cols + c0 + tx);
    KDB_BARRIER;
    for (int k = ty; k < CONV_TILE; k += 8)
        if (c0 + k < cols && r0 + tx < rows)
            KDB_STORE(dst, base + (long)(c0 + k) * rows + r0 + tx, tile[tx * (CONV_TILE + 1) + k]);
}

#if defined(KDB_TYPE_FP16) || defined(KDB_TYPE_BF16)
/* conv_transpose for 16-bit elements, two at a time (rows and cols even, so that every pair
 * is a 4-byte word in both matrices): a 64 x 64 tile, each thread reading words along the
 * source's rows and writing words along the destination's, four times the work of a 32 x 32
 * tile per block. Launch: blocks of 32 x 8, grid (ceil(cols / 64), ceil(rows / 64), matrices). */
#define CONV_PAIR_TILE 64
#define CONV_PAIR_ROW (CONV_PAIR_TILE + 2) /* halves: 33 words, the rows' words spread over the banks */
KDB_KERNEL void conv_transpose_pairs(const KDB_GLOBAL unsigned int* src, KDB_GLOBAL unsigned int* dst, int rows,
                                     int cols)
{
    KDB_SHARED(unsigned short, tile, CONV_PAIR_TILE * CONV_PAIR_ROW);
    const long base = (long)KDB_GROUP_ID_Z * rows * (cols / 2); /* words */
    const int c0 = KDB_GROUP_ID_X * CONV_PAIR_TILE, r0 = KDB_GROUP_ID_Y * CONV_PAIR_TILE;
    const int tx = KDB_LOCAL_ID_X, ty = KDB_LOCAL_ID_Y;
    for (int k = ty; k < CONV_PAIR_TILE; k += 8) {
        const int r = r0 + k, c = c0 + 2 * tx;
        if (r < rows && c < cols) {
            const unsigned int word = src[base + (long)r * (cols / 2) + c / 2];
            tile[k * CONV_PAIR_ROW + 2 * tx] = (unsigned short)(word & 0xffffu);
            tile[k * CONV_PAIR_ROW + 2 * tx + 1] = (unsigned short)(word >> 16);
        }
    }
    KDB_BARRIER;
    for (int k = ty; k < CONV_PAIR_TILE; k += 8) {
        const int c = c0 + k, r = r0 + 2 * tx; /* dst row c, its columns r and r + 1 */
        if (c < cols && r < rows)
            dst[base + (long)c * (rows / 2) + r / 2] = (unsigned int)tile[2 * tx * CONV_PAIR_ROW + k] |
                                                       ((unsigned int)tile[(2 * tx + 1) * CONV_PAIR_ROW + k] << 16);
    }
}
#endif

/* dst[c][a][b][k] = src[k][c][Y-1-a][X-1-b] (src through its strides, KCYX or KYXC): the
 * weights of backward data at stride 1 read as a forward convolution of dy, whose "input
 * channels" are K and "output channels" C, in that convolution's KYXC order. */
KDB_KERNEL void conv_flip_weights(const KDB_GLOBAL kdb_data_t* src, KDB_GLOBAL kdb_data_t* dst, int K, int C, int Y,
                                  int X, int s0, int s1, int s2, int s3)
{
    const long total = (long)K * C * Y * X;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int k = (int)(e % K), b = (int)(e / K % X), a = (int)(e / ((long)K * X) % Y);
        const int c = (int)(e / ((long)K * X * Y));
        KDB_STORE(dst, e, KDB_LOAD(src, (long)k * s0 + (long)c * s1 + (long)(Y - 1 - a) * s2 + (long)(X - 1 - b) * s3));
    }
}

/* dst (N x H x W x Cp, packed, Cp >= C) = src (N x C x H x W through its strides), the
 * channels past C zero: a first layer's 3 channels widened to a multiple of 8 for the
 * tensor-core backward weights. */
KDB_KERNEL void conv_pad_channels(const KDB_GLOBAL kdb_data_t* src, KDB_GLOBAL kdb_data_t* dst, int N, int C, int H,
                                  int W, int Cp, int s0, int s1, int s2, int s3)
{
    const long total = (long)N * H * W * Cp;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int c = (int)(e % Cp), v = (int)(e / Cp % W), h = (int)(e / ((long)Cp * W) % H);
        const int n = (int)(e / ((long)Cp * W * H));
        KDB_STORE(dst, e, c < C ? KDB_LOAD(src, (long)n * s0 + (long)c * s1 + (long)h * s2 + (long)v * s3) : 0.0f);
    }
}

/* conv_pad_channels a 16-byte vector of dst at a time (Cp a multiple of KDB_VEC; the vectors,
 * N * H * W * Cp / KDB_VEC, and the pixels fit an int): an item is one pixel's KDB_VEC channels,
 * so one division by Cp / KDB_VEC and three by the sizes in 32 bits, where conv_pad_channels
 * spends four 64-bit divisions on every element (a first layer's input is large: 224 x 224
 * pixels an image). Neighbouring items write neighbouring vectors and read, for NCHW, the same
 * channel at neighbouring pixels. Launch: 1-D, any block size and grid (grid-stride). */
KDB_KERNEL void conv_pad_channels_vec(const KDB_GLOBAL kdb_data_t* src, KDB_GLOBAL kdb_vec4u* dst, int N, int C, int H,
                                      int W, int Cp, int s0, int s1, int s2, int s3)
{
    const int vecs = Cp / KDB_VEC, total = N * H * W * vecs;
    for (int e = KDB_GLOBAL_ID_X; e < total; e += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int c0 = e % vecs * KDB_VEC, pixel = e / vecs;
        const int v = pixel % W, h = pixel / W % H, n = pixel / (W * H);
        const long at = (long)n * s0 + (long)h * s2 + (long)v * s3;
        float values[KDB_VEC];
        KDB_UNROLL
        for (int l = 0; l < KDB_VEC; ++l)
            values[l] = c0 + l < C ? KDB_LOAD(src, at + (long)(c0 + l) * s1) : 0.0f;
        dst[e] = kdb_pack(values);
    }
}

/* Backward data at stride s > 1 by output phase (ConvTmaBwdDataStrided): along each axis, the
 * rows h = s i + a of dx (phase a) are a stride-1 correlation of dy with the taps r = r0 + s t
 * (t < T, r0 = (a + pad) mod s) of the filter, flipped. Phases go H's outer, W's inner. */

/* T: how many of an axis's Y taps phase a reads (r0 = (a + pad) mod s, r0 + s t < Y). */
KDB_DEVICE_FN int conv_phase_taps(int a, int pad, int s, int Y)
{
    const int r0 = (a + pad) % s;
    return r0 < Y ? (Y - r0 + s - 1) / s : 0;
}

/* The phases' sub-filters, flipped, one after another in phase order, each the KYXC weights of
 * its forward convolution of dy (its "input channels" K, "output channels" C): phase (a, b)'s
 * block is C x Th x Tw x K, dst[c][u][v][k] = src[k][c][r0h + sh (Th-1-u)][r0w + sw (Tw-1-v)].
 * Every tap lies in exactly one phase of each axis (r mod s = r0), so the blocks hold K C Y X
 * elements in all; phases with no tap have an empty block. src through its strides (KCYX or
 * KYXC); read in its own order. A 1 x 1 filter's one block (phase (0, 0) unpadded) is w
 * transposed. */
KDB_KERNEL void conv_phase_weights(const KDB_GLOBAL kdb_data_t* src, KDB_GLOBAL kdb_data_t* dst, int K, int C, int Y,
                                   int X, int s0, int s1, int s2, int s3, int ph, int pw, int sh, int sw)
{
    const long total = (long)K * C * Y * X;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int q = (int)(e % X), r = (int)(e / X % Y), c = (int)(e / ((long)X * Y) % C);
        const int k = (int)(e / ((long)X * Y * C));
        /* the phases whose r0 are r mod s and q mod s; t = r / s */
        const int a = ((r - ph) % sh + sh) % sh, b = ((q - pw) % sw + sw) % sw;
        const int th = conv_phase_taps(a, ph, sh, Y), tw = conv_phase_taps(b, pw, sw, X);
        int before_h = 0, before_w = 0; /* taps of the earlier phases of each axis */
        for (int i = 0; i < a; ++i)
            before_h += conv_phase_taps(i, ph, sh, Y);
        for (int j = 0; j < b; ++j)
            before_w += conv_phase_taps(j, pw, sw, X);
        const long block = (long)C * K * ((long)before_h * X + (long)th * before_w);
        const int u = th - 1 - r / sh, v = tw - 1 - q / sw;
        KDB_STORE(dst, block + (((long)c * th + u) * tw + v) * K + k,
                  KDB_LOAD(src, (long)k * s0 + (long)c * s1 + (long)r * s2 + (long)q * s3));
    }
}

/* dx[n, c, h, v] = the output of phase (h mod sh, v mod sw) at pixel (h / sh, v / sw), or 0
 * where that phase has no tap. src holds the phases with taps one after another in phase
 * order, each packed N x Hp x Wp x C (Hp = ceil((H - a) / sh)) and starting on a multiple of
 * `align` elements (the tensor copies' 16-byte alignment, with room). dx through its strides
 * (N, C, H, W order). Every element of dx written once. Launch: blocks of CONV_SCATTER_X x
 * CONV_SCATTER_Y, grid (1, any, 1): each row of a block takes a pixel (n, h, v) of dx, grid-
 * stride, finds its phase and offset once (int arithmetic: N H W and the workspace fit an
 * int, as the solver's gate says), then walks its C channels CONV_SCATTER_X at a time, so a
 * channels-last dx is written, and src read, along memory. */
#define CONV_SCATTER_X 64
#define CONV_SCATTER_Y 4
KDB_KERNEL void conv_phase_scatter(const KDB_GLOBAL kdb_data_t* src, KDB_GLOBAL kdb_data_t* dx, int N, int C, int H,
                                   int W, int Y, int X, int ph, int pw, int sh, int sw, int xs0, int xs1, int xs2,
                                   int xs3, int align)
{
    const int pixels = N * H * W;
    for (int p = KDB_GROUP_ID_Y * CONV_SCATTER_Y + KDB_LOCAL_ID_Y; p < pixels;
         p += KDB_NUM_GROUPS_Y * CONV_SCATTER_Y) {
        const int v = p % W, h = p / W % H, n = p / (W * H);
        const int a = h % sh, b = v % sw;
        const long out = (long)n * xs0 + (long)h * xs2 + (long)v * xs3;
        if (conv_phase_taps(a, ph, sh, Y) == 0 || conv_phase_taps(b, pw, sw, X) == 0) {
            for (int c = KDB_LOCAL_ID_X; c < C; c += CONV_SCATTER_X)
                KDB_STORE(dx, out + (long)c * xs1, 0.0f);
            continue;
        }
        int offset = 0; /* the phases with taps before (a, b), each rounded up to align */
        for (int i = 0; i <= a; ++i) {
            for (int j = 0; j < (i == a ? b : (sw < W ? sw : W)); ++j) {
                if (conv_phase_taps(i, ph, sh, Y) > 0 && conv_phase_taps(j, pw, sw, X) > 0) {
                    const int size = N * ((H - i + sh - 1) / sh) * ((W - j + sw - 1) / sw) * C;
                    offset += (size + align - 1) / align * align;
                }
            }
        }
        const int hp = (H - a + sh - 1) / sh, wp = (W - b + sw - 1) / sw;
        const long in = offset + ((long)(n * hp + h / sh) * wp + v / sw) * C;
        for (int c = KDB_LOCAL_ID_X; c < C; c += CONV_SCATTER_X)
            KDB_STORE(dx, out + (long)c * xs1, KDB_LOAD(src, in + c));
    }
}
