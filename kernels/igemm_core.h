/* igemm_core.h: the register-blocked matrix multiply the general-core kernels share
 * (conv_igemm.c's convolutions, gemm.c's gemm_blocked): 128 x 128 tiles of the product, 256
 * threads with 8 x 8 sums each in fp32, the reduction 8 at a time through two shared buffers
 * (one barrier a step), four 16-byte shared reads per 64 FMAs. A kernel supplies how its
 * operands' elements are found (LOAD: into ga and gb, per IG_LOAD_SLOT's places) and how the
 * reduction index moves on (ADVANCE), and where its results go (IG_EPILOGUE's row offsets and
 * store); this file does the rest. Plain macros: CUDA, HIP and OpenCL alike (kdb_compat.h). */
#ifndef IGEMM_CORE_H
#define IGEMM_CORE_H
#include "kdb_compat.h"

#define IG_BM 128
#define IG_BN 128
#define IG_BK 8
#define IG_THREADS 256
#define IG_LD (IG_BM + 4) /* a shared row: 16-byte aligned, and r-fastest stores spread over the banks */
#define IG_TILE (IG_BK * IG_LD)
/* Which element of a 128 x 8 tile a thread loads: one reduction index (kr) and four rows
 * (kr's partner + 32 q). Rows fastest: a warp reads 32 rows of one reduction index; else the
 * reduction fastest: 8 reduction indices of 4 rows. */
#define IG_LOAD_SLOT(rows_fastest, t, kr, row) \
    const int kr = (rows_fastest) ? (t) >> 5 : (t) & 7, row = (rows_fastest) ? (t) & 31 : (t) >> 3

/* The loaded elements into shared buffer buf: As[buf][kr][row + 32 q], and B's the same way. */
#define IG_STAGE(buf)                                                     \
    do {                                                                  \
        KDB_UNROLL for (int q = 0; q < 4; ++q) {                          \
            As[(buf) * IG_TILE + ka * IG_LD + ma + 32 * q] = ga[q];        \
            Bs[(buf) * IG_TILE + kb * IG_LD + nb + 32 * q] = gb[q];        \
        }                                                                 \
    } while (0)

#define IG_READ4(tile, at, v, o)                                                 \
    do {                                                                       \
        const kdb_vec4u u_ = *(KDB_SHARED_PTR(kdb_vec4u))&tile[at];            \
        v[o] = KDB_BITS_FLOAT(u_.x);                                           \
        v[o + 1] = KDB_BITS_FLOAT(u_.y);                                       \
        v[o + 2] = KDB_BITS_FLOAT(u_.z);                                       \
        v[o + 3] = KDB_BITS_FLOAT(u_.w);                                       \
    } while (0)

/* acc += the shared buffer buf's A tile (rows ty*4.. and 64+ty*4..) x B tile (columns tx*4..
 * and 64+tx*4..): four 16-byte shared reads per 64 FMAs. */
#define IG_MULTIPLY(buf)                                                            \
    do {                                                                            \
        KDB_UNROLL for (int kk = 0; kk < IG_BK; ++kk) {                             \
            float a_[8], b_[8];                                                     \
            IG_READ4(As, (buf) * IG_TILE + kk * IG_LD + ty * 4, a_, 0);             \
            IG_READ4(As, (buf) * IG_TILE + kk * IG_LD + 64 + ty * 4, a_, 4);        \
            IG_READ4(Bs, (buf) * IG_TILE + kk * IG_LD + tx * 4, b_, 0);             \
            IG_READ4(Bs, (buf) * IG_TILE + kk * IG_LD + 64 + tx * 4, b_, 4);        \
            KDB_UNROLL for (int i_ = 0; i_ < 8; ++i_)                               \
                KDB_UNROLL for (int j_ = 0; j_ < 8; ++j_)                           \
                    acc[i_ * 8 + j_] = KDB_FMAF(a_[i_], b_[j_], acc[i_ * 8 + j_]);   \
        }                                                                           \
    } while (0)

/* The k loop: tile 0 staged, then each step loads the next tile's elements (LOAD, into ga and
 * gb) before multiplying the current one, and stages them into the other buffer: one barrier
 * a step. ADVANCE moves the reduction digits on by IG_BK. */
#define IG_PIPELINE(steps, LOAD, ADVANCE)         \
    do {                                          \
        LOAD;                                     \
        IG_STAGE(0);                              \
        KDB_BARRIER;                              \
        for (int step = 0; step < (steps); ++step) { \
            const int cur = step & 1;             \
            if (step + 1 < (steps)) {             \
                ADVANCE;                          \
                LOAD;                             \
            }                                     \
            IG_MULTIPLY(cur);                     \
            if (step + 1 < (steps))               \
                IG_STAGE(cur ^ 1);                \
            KDB_BARRIER;                          \
        }                                         \
    } while (0)

/* The kernel's opening: the two double-buffered shared tiles (one array, which IG_EPILOGUE
 * reuses), the result rows' offsets, this thread's index (tx, ty its place in the 16 x 16 grid
 * of 8 x 8 results), the block's first row m0 and column n0, the zeroed sums and the registers
 * a step's loads go to. */
#define IG_SETUP                                                         \
    KDB_SHARED(float, Sm, 4 * IG_TILE);                                  \
    KDB_SHARED(long, Rb, IG_BM);                                         \
    KDB_SHARED_PTR(float) const As = Sm;                                 \
    KDB_SHARED_PTR(float) const Bs = Sm + 2 * IG_TILE;                   \
    const int t = KDB_LOCAL_ID_X, tx = t & 15, ty = t >> 4;             \
    const int m0 = KDB_GROUP_ID_X * IG_BM, n0 = KDB_GROUP_ID_Y * IG_BN;  \
    float acc[64];                                                       \
    KDB_UNROLL for (int e = 0; e < 64; ++e) acc[e] = 0.0f;                \
    float ga[4], gb[4]

/* The results out through shared memory, a 64 x 64 quarter of the tile at a time, so that a
 * warp writes 32 neighbours along whichever of rows and columns is contiguous: columns when
 * colstride is 1, else rows. ROWBASE(m) is row m's offset (a long; negative: no such row),
 * column n adds n * colstride; STORE(offset, value) writes one; columns from ncols on are not
 * written. Every thread of the block must get here (barriers). */
#define IG_OUT_LD (IG_BM / 2 + 1) /* a quarter's shared row: a column's reads spread over the banks */
#define IG_EPILOGUE(ROWBASE, ncols, colstride, STORE)                                                  \
    do {                                                                                               \
        if (t < IG_BM)                                                                                 \
            Rb[t] = ROWBASE(m0 + t);                                                                   \
        const int cf_ = (colstride) == 1;                                                              \
        KDB_UNROLL for (int p_ = 0; p_ < 4; ++p_) {                                                    \
            KDB_BARRIER;                                                                               \
            KDB_UNROLL for (int i_ = 0; i_ < 4; ++i_)                                                  \
                KDB_UNROLL for (int j_ = 0; j_ < 4; ++j_)                                              \
                    Sm[(ty * 4 + i_) * IG_OUT_LD + tx * 4 + j_] = acc[((p_ >> 1) * 4 + i_) * 8 + (p_ & 1) * 4 + j_]; \
            KDB_BARRIER;                                                                               \
            KDB_UNROLL for (int j_ = 0; j_ < 16; ++j_) {                                               \
                const int r_ = cf_ ? (t >> 6) + 4 * j_ : t & 63, c_ = cf_ ? t & 63 : (t >> 6) + 4 * j_; \
                const long rb_ = Rb[(p_ >> 1) * 64 + r_];                                              \
                const int n_ = n0 + (p_ & 1) * 64 + c_;                                                \
                if (rb_ >= 0 && n_ < (ncols))                                                          \
                    STORE(rb_ + (long)n_ * (colstride), Sm[r_ * IG_OUT_LD + c_]);                      \
            }                                                                                          \
        }                                                                                              \
    } while (0)

#endif /* IGEMM_CORE_H */
