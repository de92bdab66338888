/* conv_winograd.c: the transforms of Winograd's F(2 x 2, 3 x 3) forward convolution (3 x 3
 * filters, stride 1, no dilation, one group; backward data is one too, of dy by the flipped
 * filters with the channels' roles swapped): each 2 x 2 output tile is A^T [(G g G^T) * (B^T d B)]
 * A over its 4 x 4 input patch d. The 16 elementwise products summed over the channels are 16
 * matrix multiplies (K x C by C x tiles), which the solver hands to a GEMM solver in fp32; these
 * kernels move the data in and out, in fp32 whatever the tensors' type.
 *
 *   G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]
 *   A^T = [1 1 1 0; 0 1 -1 -1]
 *
 * Options: the element type (kdb_data.h).
 * Arguments: see each kernel; strides in elements (any layout).
 * Launch: 1-D, any grid (grid-stride) over the items named.
 */
#include "kdb_data.h"

/* U[t][k][c] = (G g G^T)[t / 4][t % 4] of w[k][c]: a thread per (k, c). flip turns the filter
 * half a turn (g[a][b] = w[k][c][2 - a][2 - b]): with the strides of w's first two axes swapped,
 * the filters of backward data, itself a forward convolution of dy. */
KDB_KERNEL void wino_filter(const KDB_GLOBAL kdb_data_t* w, KDB_GLOBAL float* U, int K, int C, int s0, int s1, int s2,
                            int s3, int flip)
{
    const long total = (long)K * C;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const int c = (int)(e % C), k = (int)(e / C);
        float g[3][3], gg[4][3];
        for (int a = 0; a < 3; ++a)
            for (int b = 0; b < 3; ++b)
                g[a][b] = KDB_LOAD(w, (long)k * s0 + (long)c * s1 + (long)(flip ? 2 - a : a) * s2 +
                                          (long)(flip ? 2 - b : b) * s3);
        for (int b = 0; b < 3; ++b) { /* G g: rows */
            gg[0][b] = g[0][b];
            gg[1][b] = 0.5f * (g[0][b] + g[1][b] + g[2][b]);
            gg[2][b] = 0.5f * (g[0][b] - g[1][b] + g[2][b]);
            gg[3][b] = g[2][b];
        }
        for (int a = 0; a < 4; ++a) { /* (G g) G^T: columns */
            const float u[4] = {gg[a][0], 0.5f * (gg[a][0] + gg[a][1] + gg[a][2]), 0.5f * (gg[a][0] - gg[a][1] + gg[a][2]),
                                gg[a][2]};
            for (int b = 0; b < 4; ++b)
                U[(long)(4 * a + b) * total + e] = u[b];
        }
    }
}

/* V[t][c][p] = (B^T d B)[t / 4][t % 4] of the 4 x 4 patch of x[n][c] at (2 th - ph, 2 tw - pw),
 * zeros outside x, p = (n tiles_h + th) tiles_w + tw: a thread per (n, c, th, tw). */
KDB_KERNEL void wino_input(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL float* V, int N, int C, int H, int W, int ph,
                           int pw, int tiles_h, int tiles_w, int s0, int s1, int s2, int s3)
{
    const long P = (long)N * tiles_h * tiles_w, total = (long)C * P;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const long p = e % P;
        const int c = (int)(e / P), tw = (int)(p % tiles_w), th = (int)(p / tiles_w % tiles_h);
        const int n = (int)(p / ((long)tiles_w * tiles_h));
        float d[4][4], bd[4][4];
        for (int a = 0; a < 4; ++a)
            for (int b = 0; b < 4; ++b) {
                const int h = 2 * th - ph + a, v = 2 * tw - pw + b;
                d[a][b] = h >= 0 && h < H && v >= 0 && v < W
                              ? KDB_LOAD(x, (long)n * s0 + (long)c * s1 + (long)h * s2 + (long)v * s3)
                              : 0.0f;
            }
        for (int b = 0; b < 4; ++b) { /* B^T d */
            bd[0][b] = d[0][b] - d[2][b];
            bd[1][b] = d[1][b] + d[2][b];
            bd[2][b] = d[2][b] - d[1][b];
            bd[3][b] = d[1][b] - d[3][b];
        }
        for (int a = 0; a < 4; ++a) { /* (B^T d) B */
            const float v4[4] = {bd[a][0] - bd[a][2], bd[a][1] + bd[a][2], bd[a][2] - bd[a][1], bd[a][1] - bd[a][3]};
            for (int b = 0; b < 4; ++b)
                V[(long)(4 * a + b) * total + e] = v4[b];
        }
    }
}

/* y's 2 x 2 tile (th, tw) of image n, channel k = A^T m A with m[t] = M[t][k][p]: a thread per
 * (n, k, th, tw); outputs past Ho x Wo are not written. */
KDB_KERNEL void wino_output(const KDB_GLOBAL float* M, KDB_GLOBAL kdb_data_t* y, int N, int K, int Ho, int Wo,
                            int tiles_h, int tiles_w, int s0, int s1, int s2, int s3)
{
    const long P = (long)N * tiles_h * tiles_w, total = (long)K * P;
    for (long e = KDB_GLOBAL_ID_X; e < total; e += (long)KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const long p = e % P;
        const int k = (int)(e / P), tw = (int)(p % tiles_w), th = (int)(p / tiles_w % tiles_h);
        const int n = (int)(p / ((long)tiles_w * tiles_h));
        float m[4][4], am[2][4];
        for (int t = 0; t < 16; ++t)
            m[t / 4][t % 4] = M[(long)t * total + e];
        for (int b = 0; b < 4; ++b) { /* A^T m */
            am[0][b] = m[0][b] + m[1][b] + m[2][b];
            am[1][b] = m[1][b] - m[2][b] - m[3][b];
        }
        for (int a = 0; a < 2; ++a) {
            const float out[2] = {am[a][0] + am[a][1] + am[a][2], am[a][1] - am[a][2] - am[a][3]};
            for (int b = 0; b < 2; ++b) {
                const int i = 2 * th + a, j = 2 * tw + b;
                if (i < Ho && j < Wo)
                    KDB_STORE(y, (long)n * s0 + (long)k * s1 + (long)i * s2 + (long)j * s3, out[b]);
            }
        }
    }
}
