/* conv_stem.c: the forward convolution of a network's first layer, few input channels (RGB's
 * 3, a mask's 1) and a short reduction (C x Y x X taps), on the general cores in fp32.
 *
 * A block computes a tile of STEM_ROWS x STEM_COLS output pixels of one image for STEM_KB
 * output channels: the tile's input window (every channel, halo included, zeros in the
 * padding) and the STEM_KB channels' weights are staged in shared memory once, then each
 * thread accumulates STEM_PX pixels of one row (STEM_THREADS_X apart, so a warp's reads of the
 * stage fall on neighbouring columns) for STEM_KG channels. The implicit GEMM's tensor-core
 * tiles pad such a layer's 3 channels to 8 (16 a stage on Hopper) and its 16 or 32 output
 * channels to a 128-wide tile: most of their multiplies are of zeros.
 *
 * Options: the element type (kdb_data.h).
 * Arguments, after x, w, y: conv_shape.h's CONV_SHAPE_ARGS (G is 1), then the stage's input rows
 *   and columns (ROWS and COLS below: (STEM_ROWS - 1) * sh + (Y - 1) * dlh + 1, and the same
 *   for the columns), then vec_y: 1 where y is channels-last in whole 16-byte vectors (ys1 1,
 *   K and y's other strides multiples of KDB_VEC, y 16-byte aligned), so that a thread writes
 *   each pixel's channels as vectors; 0 writes element by element. Any layout through the
 *   strides.
 * Launch: blocks of STEM_THREADS, grid (ceil(Wo / STEM_COLS), ceil(Ho / STEM_ROWS),
 *   N * ceil(K / STEM_KB)); the solver checks that C * ROWS * COLS <= STEM_STAGE and
 *   C * Y * X <= STEM_TAPS.
 */
#include "kdb_data.h"
#include "conv_shape.h"

#define STEM_ROWS 16
#define STEM_PX 4
#define STEM_THREADS_X 8
#define STEM_COLS (STEM_THREADS_X * STEM_PX) /* 32 */
#define STEM_KG 8                            /* output channels a thread */
#define STEM_GROUPS 2                        /* channel groups a block */
#define STEM_KB (STEM_KG * STEM_GROUPS)      /* 16 */
#define STEM_THREADS (STEM_THREADS_X * STEM_ROWS * STEM_GROUPS) /* 256 */
#define STEM_STAGE 7680                      /* floats of input staged (30 KiB) */
#define STEM_TAPS 192                        /* C * Y * X at most: the weights' stage, 12 KiB */

KDB_KERNEL void conv_stem_fwd(const KDB_GLOBAL kdb_data_t* x, const KDB_GLOBAL kdb_data_t* w, KDB_GLOBAL kdb_data_t* y,
                              CONV_SHAPE_ARGS, int ROWS, int COLS, int vec_y)
{
    KDB_SHARED(float, stage, STEM_STAGE);
    KDB_SHARED(float, weights, STEM_TAPS * STEM_KB); /* [tap][k]: a thread's STEM_KG weights of a tap side by side */
    const int t = KDB_LOCAL_ID_X, k_blocks = (K + STEM_KB - 1) / STEM_KB;
    const int n = KDB_GROUP_ID_Z / k_blocks, k0 = KDB_GROUP_ID_Z % k_blocks * STEM_KB;
    const int ho0 = KDB_GROUP_ID_Y * STEM_ROWS, wo0 = KDB_GROUP_ID_X * STEM_COLS;
    const int h_in = ho0 * sh - ph, w_in = wo0 * sw - pw, taps = C * Y * X, plane = ROWS * COLS;
    /* The input window, zeros where it leaves the image. */
    for (int e = t; e < C * plane; e += STEM_THREADS) {
        const int c = e / plane, r = e % plane / COLS, q = e % COLS, h = h_in + r, v = w_in + q;
        stage[e] = h >= 0 && h < H && v >= 0 && v < W
                       ? KDB_LOAD(x, (long)n * xs0 + (long)c * xs1 + (long)h * xs2 + (long)v * xs3)
                       : 0.0f;
    }
    for (int e = t; e < taps * STEM_KB; e += STEM_THREADS) {
        const int tap = e / STEM_KB, kk = e % STEM_KB, k = k0 + kk;
        const int c = tap / (Y * X), a = tap / X % Y, b = tap % X;
        weights[e] = k < K ? KDB_LOAD(w, (long)k * ws0 + (long)c * ws1 + (long)a * ws2 + (long)b * ws3) : 0.0f;
    }
    KDB_BARRIER;
    /* Vector stores: neighbouring threads hold the two channel groups of one pixel, so that
     * their stores are one run of the pixel's channels; else a warp holds one group (its stores
     * along rows of a plane, as measured for NCHW). */
    const int group = vec_y ? t % STEM_GROUPS : t / (STEM_THREADS / STEM_GROUPS);
    const int u = vec_y ? t / STEM_GROUPS : t % (STEM_THREADS / STEM_GROUPS);
    const int tx = u % STEM_THREADS_X, ty = u / STEM_THREADS_X;
    float acc[STEM_PX][STEM_KG];
    KDB_UNROLL
    for (int p = 0; p < STEM_PX; ++p)
        KDB_UNROLL
        for (int g = 0; g < STEM_KG; ++g)
            acc[p][g] = 0.0f;
    for (int c = 0; c < C; ++c)
        for (int a = 0; a < Y; ++a) {
            const int row = (c * ROWS + ty * sh + a * dlh) * COLS + tx * sw;
            for (int b = 0; b < X; ++b) {
                const int tap = (c * Y + a) * X + b, at = row + b * dlw;
                float in[STEM_PX], wk[STEM_KG];
                KDB_UNROLL
                for (int p = 0; p < STEM_PX; ++p)
                    in[p] = stage[at + p * STEM_THREADS_X * sw];
                KDB_UNROLL
                for (int g = 0; g < STEM_KG; ++g)
                    wk[g] = weights[tap * STEM_KB + group * STEM_KG + g];
                KDB_UNROLL
                for (int p = 0; p < STEM_PX; ++p)
                    KDB_UNROLL
                    for (int g = 0; g < STEM_KG; ++g)
                        acc[p][g] += in[p] * wk[g];
            }
        }
    const int ho = ho0 + ty;
    if (ho >= Ho)
        return;
    KDB_UNROLL
    for (int p = 0; p < STEM_PX; ++p) {
        const int wo = wo0 + tx + p * STEM_THREADS_X;
        if (wo >= Wo)
            continue;
        const long at = (long)n * ys0 + (long)ho * ys2 + (long)wo * ys3;
        if (vec_y) {
            KDB_UNROLL
            for (int j = 0; j < STEM_KG; j += KDB_VEC) {
                const int k = k0 + group * STEM_KG + j;
                if (k < K)
                    *(KDB_GLOBAL kdb_vec4u*)(y + at + k) = kdb_pack(acc[p] + j);
            }
            continue;
        }
        KDB_UNROLL
        for (int g = 0; g < STEM_KG; ++g) {
            const int k = k0 + group * STEM_KG + g;
            if (k < K)
                KDB_STORE(y, at + (long)k * ys1, acc[p][g]);
        }
    }
}
