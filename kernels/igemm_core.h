/* igemm_core.h: the register-blocked matrix multiply the general-core kernels share
 * (conv_igemm.c's convolutions, gemm.c's gemm_blocked): 128 x 128 tiles of the product, 256
 * threads with 8 x 8 sums each in fp32, the reduction 8 at a time through two shared buffers
 * (one barrier a step), four 16-byte shared reads per 64 FMAs. A kernel supplies how its
 * operands' elements are found (LOAD: into ga and gb, per IG_LOAD_SLOT's places) and how the
 * reduction index moves on (ADVANCE), and where its results go (IG_EPILOGUE's row offsets and
 * store); this file does the rest. Plain macros: CUDA, HIP and OpenCL alike (kdb_compat.h).
 *
 * -DIG_TF32 (CUDA, sm_80+; asked for, never a default: it rounds fp32 operands to TF32's 10-bit
 * mantissa): the same tiles, loads and pipeline, the multiply on the tensor cores instead
 * (mma.sync m16n8k8 tf32, fp32 sums): 8 warps of 64 x 32 results, each operand rounded to
 * tf32 as it is staged. */
#ifndef IGEMM_CORE_H
#define IGEMM_CORE_H
#include "kdb_compat.h"

/* The tile: 128 x 128 by default; -DIG_BM=64 -DIG_BN=256 or -DIG_BM=256 -DIG_BN=64 for products
 * with one side of 64 or fewer (the same 256 threads and 8 x 8 sums each, none of them wasted). */
#ifndef IG_BM
#define IG_BM 128
#endif
#ifndef IG_BN
#define IG_BN 128
#endif
#if IG_BM * IG_BN != 128 * 128 || IG_BM % 64 || IG_BN % 64
#error "igemm_core.h: the tile is 128 x 128, 64 x 256 or 256 x 64"
#endif
#define IG_BK 8
#define IG_THREADS 256
#define IG_QA (IG_BM / 32) /* A's elements a thread loads a step (rows 32 apart), and B's */
#define IG_QB (IG_BN / 32)
#define IG_TX (IG_BN / 8) /* threads across the tile */
#ifdef IG_TF32
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "IG_TF32 is CUDA only (mma.sync)"
#endif
#if IG_BM != 128
#error "IG_TF32 takes the 128 x 128 tile"
#endif
#define IG_PAD 8 /* a fragment's 4 x 8 reads (reduction x rows) spread over the 32 banks */
#else
#define IG_PAD 4 /* a shared row: 16-byte aligned, and r-fastest stores spread over the banks */
#endif
#define IG_LDA (IG_BM + IG_PAD)
#define IG_LDB (IG_BN + IG_PAD)
#define IG_TILE_A (IG_BK * IG_LDA)
#define IG_TILE_B (IG_BK * IG_LDB)
/* Which elements of a rows x 8 tile a thread loads: one reduction index (kr) and rows / 32 rows
 * (kr's partner + 32 q). Rows fastest: a warp reads 32 rows of one reduction index; else the
 * reduction fastest: 8 reduction indices of 4 rows. */
#define IG_LOAD_SLOT(rows_fastest, t, kr, row) \
    const int kr = (rows_fastest) ? (t) >> 5 : (t) & 7, row = (rows_fastest) ? (t) & 31 : (t) >> 3

#ifdef IG_TF32
__device__ __forceinline__ float ig_tf32(float v)
{
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return __uint_as_float(r);
}
#define IG_OPERAND(v) ig_tf32(v)
#else
#define IG_OPERAND(v) (v)
#endif

/* The loaded elements into shared buffer buf: As[buf][kr][row + 32 q], and B's the same way. */
#define IG_STAGE(buf)                                                     \
    do {                                                                  \
        KDB_UNROLL for (int q = 0; q < IG_QA; ++q)                        \
            As[(buf) * IG_TILE_A + ka * IG_LDA + ma + 32 * q] = IG_OPERAND(ga[q]); \
        KDB_UNROLL for (int q = 0; q < IG_QB; ++q)                        \
            Bs[(buf) * IG_TILE_B + kb * IG_LDB + nb + 32 * q] = IG_OPERAND(gb[q]); \
    } while (0)

#define IG_READ4(tile, at, v, o)                                                 \
    do {                                                                       \
        const kdb_vec4u u_ = *(KDB_SHARED_PTR(kdb_vec4u))&tile[at];            \
        v[o] = KDB_BITS_FLOAT(u_.x);                                           \
        v[o + 1] = KDB_BITS_FLOAT(u_.y);                                       \
        v[o + 2] = KDB_BITS_FLOAT(u_.z);                                       \
        v[o + 3] = KDB_BITS_FLOAT(u_.w);                                       \
    } while (0)

#ifdef IG_TF32
/* acc += the shared buffer's 8-deep step on the tensor cores: warp (wm, wn) of 2 x 4 owns rows
 * wm * 64 .. + 63 and columns wn * 32 .. + 31, 4 x 4 mma tiles of 16 x 8; acc[(i * 4 + j) * 4 + r]
 * is row wm * 64 + i * 16 + lane / 4 + 8 (r / 2), column wn * 32 + j * 8 + 2 (lane % 4) + r % 2
 * (the mma's accumulator fragment). Fragments read straight from the k-major tiles. */
#define IG_MMA_TF32(c, a, b)                                                                                \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, " \
                 "{%8, %9}, {%0, %1, %2, %3};"                                                             \
                 : "+f"((c)[0]), "+f"((c)[1]), "+f"((c)[2]), "+f"((c)[3])                                  \
                 : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"((b)[0]), "r"((b)[1]))
#define IG_MULTIPLY(buf)                                                                       \
    do {                                                                                       \
        const float* at_ = As + (buf) * IG_TILE_A + wq * IG_LDA + wm * 64 + wg;                 \
        const float* bt_ = Bs + (buf) * IG_TILE_B + wq * IG_LDB + wn * 32 + wg;                 \
        unsigned int a_[4][4], b_[4][2];                                                       \
        KDB_UNROLL for (int i_ = 0; i_ < 4; ++i_) {                                            \
            a_[i_][0] = __float_as_uint(at_[i_ * 16]);                                         \
            a_[i_][1] = __float_as_uint(at_[i_ * 16 + 8]);                                     \
            a_[i_][2] = __float_as_uint(at_[4 * IG_LDA + i_ * 16]);                            \
            a_[i_][3] = __float_as_uint(at_[4 * IG_LDA + i_ * 16 + 8]);                        \
            b_[i_][0] = __float_as_uint(bt_[i_ * 8]);                                          \
            b_[i_][1] = __float_as_uint(bt_[4 * IG_LDB + i_ * 8]);                             \
        }                                                                                      \
        KDB_UNROLL for (int i_ = 0; i_ < 4; ++i_)                                              \
            KDB_UNROLL for (int j_ = 0; j_ < 4; ++j_)                                          \
                IG_MMA_TF32(&acc[(i_ * 4 + j_) * 4], a_[i_], b_[j_]);                          \
    } while (0)
/* The results of quarter p (rows 64 (p / 2) .., columns 64 (p % 2) ..) into Sm: the two warps
 * that own them. */
#define IG_QUARTER_TO_SHARED(p)                                                                \
    do {                                                                                       \
        if (wm == ((p) >> 1) && (wn >> 1) == ((p) & 1))                                        \
            KDB_UNROLL for (int e_ = 0; e_ < 64; ++e_) {                                       \
                const int r_ = ((e_ >> 4) & 3) * 16 + wg + 8 * ((e_ >> 1) & 1);               \
                const int c_ = (wn & 1) * 32 + ((e_ >> 2) & 3) * 8 + 2 * wq + (e_ & 1);         \
                Sm[r_ * IG_OUT_LD + c_] = acc[e_];                                            \
            }                                                                                  \
    } while (0)
#else
/* acc += the shared buffer buf's A tile (rows ty*4.. and IG_BM/2+ty*4..) x B tile (columns
 * tx*4.. and IG_BN/2+tx*4..): four 16-byte shared reads per 64 FMAs. */
#define IG_MULTIPLY(buf)                                                            \
    do {                                                                            \
        KDB_UNROLL for (int kk = 0; kk < IG_BK; ++kk) {                             \
            float a_[8], b_[8];                                                     \
            IG_READ4(As, (buf) * IG_TILE_A + kk * IG_LDA + ty * 4, a_, 0);          \
            IG_READ4(As, (buf) * IG_TILE_A + kk * IG_LDA + IG_BM / 2 + ty * 4, a_, 4); \
            IG_READ4(Bs, (buf) * IG_TILE_B + kk * IG_LDB + tx * 4, b_, 0);          \
            IG_READ4(Bs, (buf) * IG_TILE_B + kk * IG_LDB + IG_BN / 2 + tx * 4, b_, 4); \
            KDB_UNROLL for (int i_ = 0; i_ < 8; ++i_)                               \
                KDB_UNROLL for (int j_ = 0; j_ < 8; ++j_)                           \
                    acc[i_ * 8 + j_] = KDB_FMAF(a_[i_], b_[j_], acc[i_ * 8 + j_]);   \
        }                                                                           \
    } while (0)

/* The results of quarter p (rows IG_BM/2 (p / 2) .., columns IG_BN/2 (p % 2) ..) into Sm: every
 * thread's 4 x 4 of them. */
#define IG_QUARTER_TO_SHARED(p)                                                                \
    do {                                                                                       \
        KDB_UNROLL for (int i_ = 0; i_ < 4; ++i_)                                              \
            KDB_UNROLL for (int j_ = 0; j_ < 4; ++j_)                                          \
                Sm[(ty * 4 + i_) * IG_OUT_LD + tx * 4 + j_] = acc[(((p) >> 1) * 4 + i_) * 8 + ((p) & 1) * 4 + j_]; \
    } while (0)
#endif

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

#ifdef IG_TF32 /* the warp's place (wm, wn), the lane's in the mma fragments (wg, wq) */
#define IG_WARP_PLACE \
    const int wm = t >> 7, wn = (t >> 5) & 3, wg = (t & 31) >> 2, wq = t & 3
#else /* this thread's place (tx, ty) in the grid of 8 x 8 results */
#define IG_WARP_PLACE const int tx = t % IG_TX, ty = t / IG_TX
#endif

/* The kernel's opening: the two double-buffered shared tiles (one array, which IG_EPILOGUE
 * reuses), the result rows' offsets, this thread's index and place (IG_WARP_PLACE), the block's first row m0 and column n0, the zeroed sums and the registers
 * a step's loads go to. */
#define IG_SETUP                                                         \
    KDB_SHARED(float, Sm, 2 * (IG_TILE_A + IG_TILE_B));                  \
    KDB_SHARED(long, Rb, IG_BM);                                         \
    KDB_SHARED_PTR(float) const As = Sm;                                 \
    KDB_SHARED_PTR(float) const Bs = Sm + 2 * IG_TILE_A;                 \
    const int t = KDB_LOCAL_ID_X;                                        \
    IG_WARP_PLACE;                                                       \
    const int m0 = KDB_GROUP_ID_X * IG_BM, n0 = KDB_GROUP_ID_Y * IG_BN;  \
    float acc[64];                                                       \
    KDB_UNROLL for (int e = 0; e < 64; ++e) acc[e] = 0.0f;                \
    float ga[IG_QA], gb[IG_QB]

/* The results out through shared memory, a quarter of the tile (IG_BM/2 x IG_BN/2) at a time,
 * so that a warp writes 32 neighbours along whichever of rows and columns is contiguous:
 * columns when colstride is 1, else rows. ROWBASE(m) is row m's offset (a long; negative: no
 * such row), column n adds n * colstride; STORE(offset, value) writes one; columns from ncols
 * on are not written. Every thread of the block must get here (barriers). */
/* CUDA and HIP unroll the epilogue's loops so that the sums stay in registers (a quarter's
 * index into acc must be a constant). OpenCL keeps them loops: PoCL, the OpenCL device kdbkit
 * targets, holds acc in memory anyway, and compiles an unrolled epilogue's barrier regions one
 * by one, which made the JIT of this file several times longer (docs/performance.md). */
#ifdef __OPENCL_VERSION__
#define IG_EPILOGUE_UNROLL
#else
#define IG_EPILOGUE_UNROLL KDB_UNROLL
#endif
#define IG_OUT_LD (IG_BN / 2 + 1) /* a quarter's shared row: a column's reads spread over the banks */
#define IG_QR (IG_BM / 2)
#define IG_QC (IG_BN / 2)
#define IG_EPILOGUE(ROWBASE, ncols, colstride, STORE)                                                  \
    do {                                                                                               \
        if (t < IG_BM)                                                                                 \
            Rb[t] = ROWBASE(m0 + t);                                                                   \
        const int cf_ = (colstride) == 1;                                                              \
        IG_EPILOGUE_UNROLL for (int p_ = 0; p_ < 4; ++p_) {                                            \
            KDB_BARRIER;                                                                               \
            IG_QUARTER_TO_SHARED(p_);                                                                  \
            KDB_BARRIER;                                                                               \
            IG_EPILOGUE_UNROLL for (int j_ = 0; j_ < IG_QR * IG_QC / IG_THREADS; ++j_) {               \
                const int r_ = cf_ ? t / IG_QC + IG_THREADS / IG_QC * j_ : t % IG_QR;                  \
                const int c_ = cf_ ? t % IG_QC : t / IG_QR + IG_THREADS / IG_QR * j_;                  \
                const long rb_ = Rb[(p_ >> 1) * IG_QR + r_];                                           \
                const int n_ = n0 + (p_ & 1) * IG_QC + c_;                                             \
                if (rb_ >= 0 && n_ < (ncols))                                                          \
                    STORE(rb_ + (long)n_ * (colstride), Sm[r_ * IG_OUT_LD + c_]);                      \
            }                                                                                          \
        }                                                                                              \
    } while (0)

#endif /* IGEMM_CORE_H */
