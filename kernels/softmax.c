/* softmax.c: softmax and log-softmax, forward and backward, instance and channel modes.
 *
 * A 4-D tensor N x C x H x W with any element strides. Instance mode normalises each n over
 * C*H*W; channel mode each (n, h, w) over C. A "row" is one such set; row r and its element j:
 *   instance: n = r, (c, h, w) from j;   channel: (n, h, w) from r, c = j.
 * Algorithm (argument): 0 fast (no max subtracted), 1 accurate (max subtracted), 2 log.
 * Forward:  y = alpha * softmax(x) + beta * y   (log: alpha * log_softmax(x) + beta * y)
 * Backward: dx = alpha * (dy - sum(dy * y)) * y + beta * dx   (log: alpha * (dy - e^y * sum(dy)) + beta * dx)
 *
 * Options: the element type (kdb_data.h); -DBLOCK=<n> (default 256) for the *_block kernels,
 * which must be launched with BLOCK threads per group, one group per row (grid-stride over
 * rows). The *_thread kernels give each thread a row: for many short rows (channel mode).
 */
#include "kdb_data.h"
#include "kdb_reduce.h"

#ifndef BLOCK
#define BLOCK 256
#endif
#define SM_CACHE 8 /* elements per thread kept in registers when a row fits: rows up to BLOCK * 8 */

/* Offset of element j of row r. Channel mode: the row's base plus j * s1, so the division
 * by the shape happens once per row (the compiler hoists it out of the loops over j); instance
 * mode divides j by the shape only when C, H and W are not laid out one after another. */
KDB_DEVICE_FN long sm_offset(int r, int j, int channel_mode, int C, int H, int W, int s0, int s1, int s2, int s3)
{
    if (channel_mode) {
        const int w = r % W, h = (r / W) % H, n = r / (W * H);
        return (long)n * s0 + (long)h * s2 + (long)w * s3 + (long)j * s1;
    }
    if (s2 == W * s3 && s1 == H * s2)  /* C x H x W packed within the row: one stride */
        return (long)r * s0 + (long)j * s3;
    const int w = j % W, h = (j / W) % H, c = j / (W * H);
    return (long)r * s0 + (long)c * s1 + (long)h * s2 + (long)w * s3;
}

/* A row's first element and the step between its elements, computed once per row; step 0
 * means the elements are not evenly spaced (instance mode over a non-packed C x H x W), and
 * SM_AT falls back to sm_offset's division per element. */
KDB_DEVICE_FN long sm_base(int r, int channel_mode, int C, int H, int W, int s0, int s1, int s2, int s3)
{
    return channel_mode ? sm_offset(r, 0, 1, C, H, W, s0, s1, s2, s3) : (long)r * s0;
}

KDB_DEVICE_FN int sm_step(int channel_mode, int H, int W, int s1, int s2, int s3)
{
    if (channel_mode)
        return s1;
    return (s2 == W * s3 && s1 == H * s2) ? s3 : 0;
}

#define SM_AT(base, step, r, j, ...) ((step) ? (base) + (long)(j) * (step) : sm_offset(r, j, __VA_ARGS__))
/* SM_AT where `even` (a constant) promises step != 0: the division path compiles away. */
#define SM_AT_IF(even, base, step, r, j, ...) ((even) ? (base) + (long)(j) * (step) : SM_AT(base, step, r, j, __VA_ARGS__))

#define SM_GEOMETRY int N, int C, int H, int W, int channel_mode
#define SM_ROWS (channel_mode ? N * H * W : N)
#define SM_LEN (channel_mode ? C : C * H * W)


/* The forward block kernels' body; `even` is a constant at each call (rows evenly spaced or
 * not), so that the inlined copy for even rows holds no per-element division path at all (its
 * registers, and with them the occupancy, were the kernel's limit). */
KDB_DEVICE_FN void sm_fwd_block(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, SM_GEOMETRY, int xs0, int xs1,
                                int xs2, int xs3, int ys0, int ys1, int ys2, int ys3, int algorithm, float alpha,
                                float beta, KDB_SHARED_PTR(float) scratch, const int even)
{
    const int rows = SM_ROWS, len = SM_LEN, t = KDB_LOCAL_ID_X;
    if (len <= BLOCK * SM_CACHE) {
        /* The row fits in registers, SM_CACHE elements per thread: read x once instead of three times. */
        for (int r = KDB_GROUP_ID_X; r < rows; r += KDB_NUM_GROUPS_X) {
            const long xb = sm_base(r, channel_mode, C, H, W, xs0, xs1, xs2, xs3);
            const long yb = sm_base(r, channel_mode, C, H, W, ys0, ys1, ys2, ys3);
            const int xst = sm_step(channel_mode, H, W, xs1, xs2, xs3);
            const int yst = sm_step(channel_mode, H, W, ys1, ys2, ys3);
            float cache[SM_CACHE];
            float m = algorithm != 0 ? -3.402823466e38f : 0.0f;
            for (int q = 0; q < SM_CACHE; ++q) {
                const int j = t + q * BLOCK;
                cache[q] = j < len ? KDB_LOAD(x, SM_AT_IF(even, xb, xst, r, j, channel_mode, C, H, W, xs0, xs1, xs2, xs3)) : 0.0f;
                if (algorithm != 0 && j < len)
                    m = KDB_FMAXF(m, cache[q]);
            }
            if (algorithm != 0)
                KDB_BLOCK_REDUCE(scratch, m, KDB_FMAXF, m);
            float sum = 0.0f;
            for (int q = 0; q < SM_CACHE; ++q)
                if (t + q * BLOCK < len)
                    sum += KDB_EXPF(cache[q] - m);
            KDB_BLOCK_REDUCE(scratch, sum, KDB_REDUCE_ADD, sum);
            const float log_sum = KDB_LOGF(sum), inv = 1.0f / sum;
            for (int q = 0; q < SM_CACHE; ++q) {
                const int j = t + q * BLOCK;
                if (j >= len)
                    break;
                const float v = cache[q] - m;
                const float out = algorithm == 2 ? v - log_sum : KDB_EXPF(v) * inv;
                const long yo = SM_AT_IF(even, yb, yst, r, j, channel_mode, C, H, W, ys0, ys1, ys2, ys3);
                KDB_STORE(y, yo, beta == 0.0f ? alpha * out : alpha * out + beta * KDB_LOAD(y, yo));
            }
        }
        return;
    }
    for (int r = KDB_GROUP_ID_X; r < rows; r += KDB_NUM_GROUPS_X) {
        const long xb = sm_base(r, channel_mode, C, H, W, xs0, xs1, xs2, xs3);
        const long yb = sm_base(r, channel_mode, C, H, W, ys0, ys1, ys2, ys3);
        const int xst = sm_step(channel_mode, H, W, xs1, xs2, xs3);
        const int yst = sm_step(channel_mode, H, W, ys1, ys2, ys3);
        float m = -3.402823466e38f;
        if (algorithm != 0) {
            for (int j = t; j < len; j += BLOCK)
                m = KDB_FMAXF(m, KDB_LOAD(x, SM_AT_IF(even, xb, xst, r, j, channel_mode, C, H, W, xs0, xs1, xs2, xs3)));
            KDB_BLOCK_REDUCE(scratch, m, KDB_FMAXF, m);
        } else {
            m = 0.0f;
        }
        float sum = 0.0f;
        for (int j = t; j < len; j += BLOCK)
            sum += KDB_EXPF(KDB_LOAD(x, SM_AT_IF(even, xb, xst, r, j, channel_mode, C, H, W, xs0, xs1, xs2, xs3)) - m);
        KDB_BLOCK_REDUCE(scratch, sum, KDB_REDUCE_ADD, sum);
        const float log_sum = KDB_LOGF(sum);
        for (int j = t; j < len; j += BLOCK) {
            const float v = KDB_LOAD(x, SM_AT_IF(even, xb, xst, r, j, channel_mode, C, H, W, xs0, xs1, xs2, xs3)) - m;
            const float out = algorithm == 2 ? v - log_sum : KDB_EXPF(v) / sum;
            const long yo = SM_AT_IF(even, yb, yst, r, j, channel_mode, C, H, W, ys0, ys1, ys2, ys3);
            KDB_STORE(y, yo, beta == 0.0f ? alpha * out : alpha * out + beta * KDB_LOAD(y, yo));
        }
    }
}

KDB_KERNEL void softmax_fwd_block(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, SM_GEOMETRY, int xs0,
                                  int xs1, int xs2, int xs3, int ys0, int ys1, int ys2, int ys3, int algorithm,
                                  float alpha, float beta)
{
    KDB_SHARED(float, scratch, BLOCK);
    sm_fwd_block(x, y, N, C, H, W, channel_mode, xs0, xs1, xs2, xs3, ys0, ys1, ys2, ys3, algorithm, alpha, beta, scratch,
                 0);
}

/* softmax_fwd_block for rows whose elements are evenly spaced in x and y (channel mode, or
 * packed C x H x W in instance mode). */
KDB_KERNEL void softmax_fwd_block_even(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, SM_GEOMETRY, int xs0,
                                       int xs1, int xs2, int xs3, int ys0, int ys1, int ys2, int ys3, int algorithm,
                                       float alpha, float beta)
{
    KDB_SHARED(float, scratch, BLOCK);
    sm_fwd_block(x, y, N, C, H, W, channel_mode, xs0, xs1, xs2, xs3, ys0, ys1, ys2, ys3, algorithm, alpha, beta, scratch,
                 1);
}

/* y and dy share strides (s*); dx has its own (ds*). */
KDB_KERNEL void softmax_bwd_block(const KDB_GLOBAL kdb_data_t* y, const KDB_GLOBAL kdb_data_t* dy,
                                  KDB_GLOBAL kdb_data_t* dx, SM_GEOMETRY, int s0, int s1, int s2, int s3, int ds0,
                                  int ds1, int ds2, int ds3, int algorithm, float alpha, float beta)
{
    KDB_SHARED(float, scratch, BLOCK);
    const int rows = SM_ROWS, len = SM_LEN, t = KDB_LOCAL_ID_X;
    for (int r = KDB_GROUP_ID_X; r < rows; r += KDB_NUM_GROUPS_X) {
        const long sb = sm_base(r, channel_mode, C, H, W, s0, s1, s2, s3);
        const long db = sm_base(r, channel_mode, C, H, W, ds0, ds1, ds2, ds3);
        const int sst = sm_step(channel_mode, H, W, s1, s2, s3);
        const int dst = sm_step(channel_mode, H, W, ds1, ds2, ds3);
        float dot = 0.0f;
        for (int j = t; j < len; j += BLOCK) {
            const long o = SM_AT(sb, sst, r, j, channel_mode, C, H, W, s0, s1, s2, s3);
            dot += algorithm == 2 ? KDB_LOAD(dy, o) : KDB_LOAD(dy, o) * KDB_LOAD(y, o);
        }
        KDB_BLOCK_REDUCE(scratch, dot, KDB_REDUCE_ADD, dot);
        for (int j = t; j < len; j += BLOCK) {
            const long o = SM_AT(sb, sst, r, j, channel_mode, C, H, W, s0, s1, s2, s3);
            const float yv = KDB_LOAD(y, o), g = KDB_LOAD(dy, o);
            const float out = algorithm == 2 ? g - KDB_EXPF(yv) * dot : (g - dot) * yv;
            const long d = SM_AT(db, dst, r, j, channel_mode, C, H, W, ds0, ds1, ds2, ds3);
            KDB_STORE(dx, d, beta == 0.0f ? alpha * out : alpha * out + beta * KDB_LOAD(dx, d));
        }
    }
}

KDB_KERNEL void softmax_fwd_thread(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, SM_GEOMETRY, int xs0,
                                   int xs1, int xs2, int xs3, int ys0, int ys1, int ys2, int ys3, int algorithm,
                                   float alpha, float beta)
{
    const int rows = SM_ROWS, len = SM_LEN;
    for (int r = KDB_GLOBAL_ID_X; r < rows; r += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const long xb = sm_base(r, channel_mode, C, H, W, xs0, xs1, xs2, xs3);
        const long yb = sm_base(r, channel_mode, C, H, W, ys0, ys1, ys2, ys3);
        const int xst = sm_step(channel_mode, H, W, xs1, xs2, xs3);
        const int yst = sm_step(channel_mode, H, W, ys1, ys2, ys3);
        float m = 0.0f;
        if (algorithm != 0) {
            m = -3.402823466e38f;
            for (int j = 0; j < len; ++j)
                m = KDB_FMAXF(m, KDB_LOAD(x, SM_AT(xb, xst, r, j, channel_mode, C, H, W, xs0, xs1, xs2, xs3)));
        }
        float sum = 0.0f;
        for (int j = 0; j < len; ++j)
            sum += KDB_EXPF(KDB_LOAD(x, SM_AT(xb, xst, r, j, channel_mode, C, H, W, xs0, xs1, xs2, xs3)) - m);
        const float log_sum = KDB_LOGF(sum);
        for (int j = 0; j < len; ++j) {
            const float v = KDB_LOAD(x, SM_AT(xb, xst, r, j, channel_mode, C, H, W, xs0, xs1, xs2, xs3)) - m;
            const float out = algorithm == 2 ? v - log_sum : KDB_EXPF(v) / sum;
            const long yo = SM_AT(yb, yst, r, j, channel_mode, C, H, W, ys0, ys1, ys2, ys3);
            KDB_STORE(y, yo, beta == 0.0f ? alpha * out : alpha * out + beta * KDB_LOAD(y, yo));
        }
    }
}

KDB_KERNEL void softmax_bwd_thread(const KDB_GLOBAL kdb_data_t* y, const KDB_GLOBAL kdb_data_t* dy,
                                   KDB_GLOBAL kdb_data_t* dx, SM_GEOMETRY, int s0, int s1, int s2, int s3, int ds0,
                                   int ds1, int ds2, int ds3, int algorithm, float alpha, float beta)
{
    const int rows = SM_ROWS, len = SM_LEN;
    for (int r = KDB_GLOBAL_ID_X; r < rows; r += KDB_LOCAL_SIZE_X * KDB_NUM_GROUPS_X) {
        const long sb = sm_base(r, channel_mode, C, H, W, s0, s1, s2, s3);
        const long db = sm_base(r, channel_mode, C, H, W, ds0, ds1, ds2, ds3);
        const int sst = sm_step(channel_mode, H, W, s1, s2, s3);
        const int dst = sm_step(channel_mode, H, W, ds1, ds2, ds3);
        float dot = 0.0f;
        for (int j = 0; j < len; ++j) {
            const long o = SM_AT(sb, sst, r, j, channel_mode, C, H, W, s0, s1, s2, s3);
            dot += algorithm == 2 ? KDB_LOAD(dy, o) : KDB_LOAD(dy, o) * KDB_LOAD(y, o);
        }
        for (int j = 0; j < len; ++j) {
            const long o = SM_AT(sb, sst, r, j, channel_mode, C, H, W, s0, s1, s2, s3);
            const float yv = KDB_LOAD(y, o), g = KDB_LOAD(dy, o);
            const float out = algorithm == 2 ? g - KDB_EXPF(yv) * dot : (g - dot) * yv;
            const long d = SM_AT(db, dst, r, j, channel_mode, C, H, W, ds0, ds1, ds2, ds3);
            KDB_STORE(dx, d, beta == 0.0f ? alpha * out : alpha * out + beta * KDB_LOAD(dx, d));
        }
    }
}

/* Forward over evenly spaced rows (see softmax_fwd_block_even) of at most ROWS_T * ROWS_CACHE
 * (1024) elements, ROWS_T (32) threads per row and BLOCK / ROWS_T rows per group: each reduction takes 5 steps over a 32-wide segment
 * instead of 8 over the whole group, and one group serves 8 rows. Launch BLOCK threads per
 * group, any number of groups (grid-stride over blocks of rows). */
#define ROWS_T 32
#define ROWS_CACHE 32
#define ROWS_PER (BLOCK / ROWS_T)

#define SM_SEGMENT_REDUCE(scratch, value, OP, result)                                      \
    do {                                                                                   \
        const int tid_ = KDB_LOCAL_ID_X, lane_ = tid_ % ROWS_T;                            \
        scratch[tid_] = (value);                                                           \
        KDB_BARRIER;                                                                       \
        for (int s_ = ROWS_T / 2; s_ > 0; s_ >>= 1) {                                      \
            if (lane_ < s_)                                                                \
                scratch[tid_] = OP(scratch[tid_], scratch[tid_ + s_]);                     \
            KDB_BARRIER;                                                                   \
        }                                                                                  \
        result = scratch[tid_ - lane_];                                                    \
        KDB_BARRIER;                                                                       \
    } while (0)

KDB_KERNEL void softmax_fwd_rows(const KDB_GLOBAL kdb_data_t* x, KDB_GLOBAL kdb_data_t* y, SM_GEOMETRY, int xs0,
                                 int xs1, int xs2, int xs3, int ys0, int ys1, int ys2, int ys3, int algorithm,
                                 float alpha, float beta)
{
    KDB_SHARED(float, scratch, BLOCK);
    const int rows = SM_ROWS, len = SM_LEN;
    const int lane = KDB_LOCAL_ID_X % ROWS_T, slot = KDB_LOCAL_ID_X / ROWS_T;
    for (int r0 = KDB_GROUP_ID_X * ROWS_PER; r0 < rows; r0 += KDB_NUM_GROUPS_X * ROWS_PER) {
        const int r = r0 + slot, live = r < rows;
        const long xb = sm_base(r, channel_mode, C, H, W, xs0, xs1, xs2, xs3);
        const long yb = sm_base(r, channel_mode, C, H, W, ys0, ys1, ys2, ys3);
        const int xst = sm_step(channel_mode, H, W, xs1, xs2, xs3);
        const int yst = sm_step(channel_mode, H, W, ys1, ys2, ys3);
        float cache[ROWS_CACHE];
        float m = algorithm != 0 ? -3.402823466e38f : 0.0f;
        for (int q = 0; q < ROWS_CACHE; ++q) {
            const int j = lane + q * ROWS_T;
            const int in = live && j < len;
            cache[q] = in ? KDB_LOAD(x, SM_AT_IF(1, xb, xst, r, j, channel_mode, C, H, W, xs0, xs1, xs2, xs3)) : 0.0f;
            if (algorithm != 0 && in)
                m = KDB_FMAXF(m, cache[q]);
        }
        if (algorithm != 0)
            SM_SEGMENT_REDUCE(scratch, m, KDB_FMAXF, m);
        float sum = 0.0f;
        for (int q = 0; q < ROWS_CACHE; ++q)
            if (live && lane + q * ROWS_T < len)
                sum += KDB_EXPF(cache[q] - m);
        SM_SEGMENT_REDUCE(scratch, sum, KDB_REDUCE_ADD, sum);
        if (!live)
            continue;
        const float log_sum = KDB_LOGF(sum), inv = 1.0f / sum;
        for (int q = 0; q < ROWS_CACHE; ++q) {
            const int j = lane + q * ROWS_T;
            if (j < len) {
                const float v = cache[q] - m;
                const float out = algorithm == 2 ? v - log_sum : KDB_EXPF(v) * inv;
                const long yo = SM_AT_IF(1, yb, yst, r, j, channel_mode, C, H, W, ys0, ys1, ys2, ys3);
                KDB_STORE(y, yo, beta == 0.0f ? alpha * out : alpha * out + beta * KDB_LOAD(y, yo));
            }
        }
    }
}

/* ------------------------------------------------------------------ lanes: 16-byte rows
 * Rows whose elements are contiguous in every tensor, start on a 16-byte vector and hold a
 * whole number of vectors (len % KDB_VEC == 0; the solver checks, and that every tensor is
 * 16-byte aligned). `lanes` threads share a row (a power of two, at most BLOCK; launch BLOCK
 * threads per group), each keeping up to LANES_VECS of its vectors in registers as they were
 * read: x is read once, the reductions run across the row's lanes (kdb_reduce.h).
 * Options: -DLANES_VECS=<n> (default 4): rows of up to BLOCK * LANES_VECS vectors. */
#ifndef LANES_VECS
#define LANES_VECS 4
#endif

/* Rows of up to 4 vectors a thread: registers capped on CUDA so that LANES_GROUPS groups fit a
 * multiprocessor, for more bytes in flight. fp32: 4 (71 -> 64 registers, no spills; softmax of
 * 1024-element fp32 rows on the H100 187 -> 180 us, 95% -> 99% of copy). 16-bit types: 3 (91 ->
 * 80 registers, no spills; 2 groups held 16 warps, too few reads in flight for an H200's
 * bandwidth: 68% -> 80% of copy there); at 4 they spill. -DLANES_GROUPS=<g> sets another. */
#if !defined(LANES_GROUPS) && LANES_VECS == 4
#if defined(KDB_TYPE_FP16) || defined(KDB_TYPE_BF16)
#define LANES_GROUPS 3
#else
#define LANES_GROUPS 4
#endif
#endif
#ifdef LANES_GROUPS
#define SM_LANES_BOUNDS KDB_BOUNDS(BLOCK, LANES_GROUPS)
#else
#define SM_LANES_BOUNDS
#endif

/* Vector j of a row, for this thread's slot k (k < LANES_VECS) and lane. */
#define SM_LANE_VEC(k) (lane + (k) * lanes)

KDB_KERNEL void SM_LANES_BOUNDS
softmax_fwd_lanes(const KDB_GLOBAL kdb_vec4u* x, KDB_GLOBAL kdb_vec4u* y, SM_GEOMETRY, int xs0, int xs1, int xs2,
                  int xs3, int ys0, int ys1, int ys2, int ys3, int algorithm, float alpha, float beta, int lanes)
{
    KDB_SHARED(float, scratch, BLOCK);
    const int rows = SM_ROWS, vecs = SM_LEN / KDB_VEC;
    const int lane = KDB_LOCAL_ID_X & (lanes - 1), per_group = KDB_LOCAL_SIZE_X / lanes;
    const int step = KDB_NUM_GROUPS_X * per_group;
    /* The next row's vectors are read while this one's reductions run (a group takes several
     * rows: the solver sizes the grid to the GPU), so the loads of a thread never stop. */
    kdb_vec4u q[LANES_VECS];
    {
        const int r = KDB_GROUP_ID_X * per_group + KDB_LOCAL_ID_X / lanes;
        const long xb = r < rows ? sm_base(r, channel_mode, C, H, W, xs0, xs1, xs2, xs3) / KDB_VEC : 0;
#pragma unroll
        for (int k = 0; k < LANES_VECS; ++k)
            if (r < rows && SM_LANE_VEC(k) < vecs)
                q[k] = x[xb + SM_LANE_VEC(k)];
    }
    /* The loop's trip count is the same for the whole group: every thread reaches the reductions. */
    for (int first = KDB_GROUP_ID_X * per_group; first < rows; first += step) {
        const int r = first + KDB_LOCAL_ID_X / lanes, live = r < rows;
        const long yb = live ? sm_base(r, channel_mode, C, H, W, ys0, ys1, ys2, ys3) / KDB_VEC : 0;
        /* Each element converted to float once and its exponential taken once: on 16-bit types
         * the conversions and exponentials, not memory, were the limit. */
        float f[LANES_VECS * KDB_VEC], m = -3.402823466e38f;
#pragma unroll
        for (int k = 0; k < LANES_VECS; ++k)
            if (live && SM_LANE_VEC(k) < vecs) {
                kdb_unpack(q[k], f + k * KDB_VEC);
                for (int e = 0; e < KDB_VEC; ++e)
                    m = KDB_FMAXF(m, f[k * KDB_VEC + e]);
            }
        {
            const int rn = r + step;
            const long xn = rn < rows ? sm_base(rn, channel_mode, C, H, W, xs0, xs1, xs2, xs3) / KDB_VEC : 0;
#pragma unroll
            for (int k = 0; k < LANES_VECS; ++k)
                if (rn < rows && SM_LANE_VEC(k) < vecs)
                    q[k] = x[xn + SM_LANE_VEC(k)];
        }
        m = algorithm != 0 ? kdb_lanes_reduce(m, lanes, 0, scratch) : 0.0f;
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < LANES_VECS; ++k)
            if (live && SM_LANE_VEC(k) < vecs)
                for (int e = 0; e < KDB_VEC; ++e) {
                    /* After the max is taken off (accurate, log) the argument is <= 0: the hardware exponential. */
                    const float p = algorithm != 0 ? KDB_FAST_EXPF(f[k * KDB_VEC + e] - m) : KDB_EXPF(f[k * KDB_VEC + e]);
                    sum += p;
                    if (algorithm != 2)
                        f[k * KDB_VEC + e] = p;
                }
        sum = kdb_lanes_reduce(sum, lanes, 1, scratch);
        const float shift = algorithm == 2 ? m + KDB_LOGF(sum) : 0.0f, inv = 1.0f / sum;
#pragma unroll
        for (int k = 0; k < LANES_VECS; ++k)
            if (live && SM_LANE_VEC(k) < vecs) {
                float old[KDB_VEC], *v = f + k * KDB_VEC;
                if (beta != 0.0f)
                    kdb_unpack(y[yb + SM_LANE_VEC(k)], old);
                for (int e = 0; e < KDB_VEC; ++e) {
                    const float out = alpha * (algorithm == 2 ? v[e] - shift : v[e] * inv);
                    v[e] = beta == 0.0f ? out : out + beta * old[e];
                }
                y[yb + SM_LANE_VEC(k)] = kdb_pack(v);
            }
    }
}

/* y and dy share strides (s*); dx has its own (ds*). */
KDB_KERNEL void softmax_bwd_lanes(const KDB_GLOBAL kdb_vec4u* y, const KDB_GLOBAL kdb_vec4u* dy,
                                  KDB_GLOBAL kdb_vec4u* dx, SM_GEOMETRY, int s0, int s1, int s2, int s3, int ds0,
                                  int ds1, int ds2, int ds3, int algorithm, float alpha, float beta, int lanes)
{
    KDB_SHARED(float, scratch, BLOCK);
    const int rows = SM_ROWS, vecs = SM_LEN / KDB_VEC;
    const int lane = KDB_LOCAL_ID_X & (lanes - 1), per_group = KDB_LOCAL_SIZE_X / lanes;
    for (int first = KDB_GROUP_ID_X * per_group; first < rows; first += KDB_NUM_GROUPS_X * per_group) {
        const int r = first + KDB_LOCAL_ID_X / lanes, live = r < rows;
        const long b = live ? sm_base(r, channel_mode, C, H, W, s0, s1, s2, s3) / KDB_VEC : 0;
        const long db = live ? sm_base(r, channel_mode, C, H, W, ds0, ds1, ds2, ds3) / KDB_VEC : 0;
        kdb_vec4u qy[LANES_VECS], qg[LANES_VECS];
        float yv[KDB_VEC], g[KDB_VEC], dot = 0.0f;
#pragma unroll
        for (int k = 0; k < LANES_VECS; ++k)
            if (live && SM_LANE_VEC(k) < vecs) {
                qy[k] = y[b + SM_LANE_VEC(k)];
                qg[k] = dy[b + SM_LANE_VEC(k)];
                kdb_unpack(qy[k], yv);
                kdb_unpack(qg[k], g);
                for (int e = 0; e < KDB_VEC; ++e)
                    dot += algorithm == 2 ? g[e] : g[e] * yv[e];
            }
        dot = kdb_lanes_reduce(dot, lanes, 1, scratch);
#pragma unroll
        for (int k = 0; k < LANES_VECS; ++k)
            if (live && SM_LANE_VEC(k) < vecs) {
                float old[KDB_VEC];
                kdb_unpack(qy[k], yv);
                kdb_unpack(qg[k], g);
                if (beta != 0.0f)
                    kdb_unpack(dx[db + SM_LANE_VEC(k)], old);
                for (int e = 0; e < KDB_VEC; ++e) {
                    const float out = alpha * (algorithm == 2 ? g[e] - KDB_EXPF(yv[e]) * dot : (g[e] - dot) * yv[e]);
                    g[e] = beta == 0.0f ? out : out + beta * old[e];
                }
                dx[db + SM_LANE_VEC(k)] = kdb_pack(g);
            }
    }
}
