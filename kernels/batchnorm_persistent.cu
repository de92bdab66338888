/* batchnorm_persistent.cu: spatial batch-norm training forward in one launch that reads each
 * input element from device memory once (the split solver reads x twice: once for the sums,
 * once to normalise).
 *
 * The groups form teams of `members` groups; a team takes one channel at a time (channels
 * team, team + teams, ...). Each member copies its chunk of the channel (up to `chunk` 16-byte
 * vectors of the channel's N planes) into one of two shared-memory stages while summing it,
 * issues the reads of its chunk of the team's next channel (into registers: in flight during
 * what follows) and publishes its two sums. Only then does it wait, and for the channel
 * before: it reads every member's sums of that channel itself and normalises the channel from
 * the other stage. So a team's meeting is one store and one read away, hidden behind a whole
 * channel's reads.
 *
 * A member publishes each sum in one 64-bit store together with a tag: the channel's
 * generation (gen[c], how many launches have finished it) plus one. A reader waits until
 * every member's two words carry the tag it expects, so no fence, atomic or counter sits on
 * the way, and a stale pair (from an earlier launch) never passes. The team's member 0 writes
 * the saved and running statistics and, having seen every member's sums (so every member has
 * read gen[c] already), moves gen[c] on for the next launch.
 *
 * Waiting on other groups needs them resident at once: the solver launches cooperatively
 * (cuLaunchCooperativeKernel refuses a grid that could not be), so this is CUDA only.
 * x is read and y written with the evict-first hint (ld/st .cs; fp32 88 -> 85 us on the H100,
 * scripts/probe_bn_training.py): neither is used again from the caches.
 * Sums are about the channel's first element (as bn_train_partial's), so a large mean does
 * not cancel the variance away.
 *
 * Options: the element type (kdb_data.h).
 * Arguments: pairs, 2 x 64-bit words per channel and member, zero before the first launch;
 *   gen, one unsigned per channel, zero before the first launch. Planes of HWv whole vectors,
 *   strides in vectors, every plane 16-byte aligned (the solver checks).
 * Launch: teams * members groups of BN_BLOCK threads, (2 * chunk + members) * 16 bytes of
 *   dynamic shared memory (chunk at most BN_BLOCK * BN_REGS), cooperatively.
 */
#include "kdb_data.h"

#define BN_BLOCK 256
#ifndef BN_REGS
#define BN_REGS 8 /* vectors per thread in flight: a chunk is at most BN_BLOCK * BN_REGS vectors */
#endif
/* -DBN_MIN_GROUPS=g: registers capped so that g groups fit a multiprocessor (compare_bn_teams.py). */
#ifdef BN_MIN_GROUPS
#define BN_BOUNDS __launch_bounds__(BN_BLOCK, BN_MIN_GROUPS)
#else
#define BN_BOUNDS __launch_bounds__(BN_BLOCK)
#endif

/* -DBN_TRACE: a last argument `trace` takes, per group, the global timer (ns) at the kernel's
 * start and at each stage of its first BN_TRACE_ROUNDS channels (scripts/probe_bn_training.py). */
#ifdef BN_TRACE
#define BN_TRACE_ROUNDS 15
#define BN_TRACE_ARG , unsigned long long* trace
/* After the counts: each group's multiprocessor. */
#define BN_MARK_SM()                                                                                            \
    do {                                                                                                       \
        unsigned int sm;                                                                                       \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));                                                       \
        if (t == 0)                                                                                            \
            trace[gridDim.x * (5 * BN_TRACE_ROUNDS + 2) + blockIdx.x] = sm;                                   \
    } while (0)
#define BN_MARK(slot)                                                                                          \
    do {                                                                                                       \
        if (t == 0 && (slot) < 4 * BN_TRACE_ROUNDS + 2) {                                                      \
            unsigned long long now;                                                                            \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));                                            \
            trace[blockIdx.x * (4 * BN_TRACE_ROUNDS + 2) + (slot)] = now;                                     \
        }                                                                                                      \
    } while (0)
/* After every group's marks, per group and round: how many members' sums the early copy missed. */
#define BN_COUNT(round, n)                                                                                      \
    do {                                                                                                       \
        if (t == 0 && (round) < BN_TRACE_ROUNDS)                                                               \
            trace[gridDim.x * (4 * BN_TRACE_ROUNDS + 2) + blockIdx.x * BN_TRACE_ROUNDS + (round)] = (n);     \
    } while (0)
#else
#define BN_TRACE_ARG
#define BN_MARK_SM() do { } while (0)
#define BN_MARK(slot) do { } while (0)
#define BN_COUNT(round, n) do { } while (0)
#endif

__device__ __forceinline__ float bn_warp_sum(float v)
{
    for (int m = 16; m > 0; m >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

/* This thread's vectors of a chunk [lo, hi) of channel c, into registers (loads only issued). */
__device__ __forceinline__ void bn_load_chunk(kdb_vec4u* q, const kdb_vec4u* __restrict__ x, int c, int lo, int hi,
                                              int HWv, int xs0, int xs1)
{
#pragma unroll
    for (int u = 0; u < BN_REGS; ++u) {
        const int g = lo + threadIdx.x + u * BN_BLOCK;
        if (g < hi) {
            const int n = g / HWv;
            q[u] = __ldcs(x + (long)n * xs0 + (long)c * xs1 + (g - n * HWv)); /* evict first: read once */
        }
    }
}

/* Stage this thread's vectors of the chunk (arrived in q) at stage[0..) and sum them about k. */
__device__ __forceinline__ void bn_stage_and_sum(kdb_vec4u* __restrict__ stage, const kdb_vec4u* q, int lo, int hi,
                                                 float k, float* s1, float* s2)
{
#pragma unroll
    for (int u = 0; u < BN_REGS; ++u) {
        const int g = lo + threadIdx.x + u * BN_BLOCK;
        if (g < hi) {
            stage[g - lo] = q[u];
            float v[KDB_VEC];
            kdb_unpack(q[u], v);
#pragma unroll
            for (int e = 0; e < KDB_VEC; ++e) {
                const float d = v[e] - k;
                *s1 += d;
                *s2 += d * d;
            }
        }
    }
}

/* y's chunk [lo, hi) of channel c: a * staged + b. */
__device__ __forceinline__ void bn_write_chunk(kdb_vec4u* __restrict__ y, const kdb_vec4u* __restrict__ stage, int c,
                                               int lo, int hi, int HWv, int ys0, int ys1, float a, float b)
{
#pragma unroll
    for (int u = 0; u < BN_REGS; ++u) {
        const int g = lo + threadIdx.x + u * BN_BLOCK;
        if (g < hi) {
            const int n = g / HWv;
            float v[KDB_VEC];
            kdb_unpack(stage[g - lo], v);
#pragma unroll
            for (int e = 0; e < KDB_VEC; ++e)
                v[e] = a * v[e] + b;
            __stcs(y + (long)n * ys0 + (long)c * ys1 + (g - n * HWv), kdb_pack(v)); /* evict first */
        }
    }
}

/* A sum and its tag in one word: one store publishes both. */
__device__ __forceinline__ unsigned long long bn_tagged(float v, unsigned int tag)
{
    return ((unsigned long long)tag << 32) | __float_as_uint(v);
}

/* Warp 0: every member's tagged pair of a channel (pairs[2 m], pairs[2 m + 1]) copied to
 * copy[2 m..] by the lane that reads it later. On sm_80 and later the copies are asynchronous
 * (cp.async, through the L2 only): issued before the next chunk's reads, they do not queue
 * behind them, and no register holds them meanwhile. */
__device__ __forceinline__ void bn_fetch_pairs(unsigned long long* copy, const unsigned long long* pairs, int members)
{
    for (int m = threadIdx.x; m < members; m += 32) {
#if __CUDA_ARCH__ >= 800
        const unsigned int to = (unsigned int)__cvta_generic_to_shared(copy + 2 * m);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(pairs + 2 * m) : "memory");
#else
        const volatile unsigned long long* pair = pairs + 2 * m;
        copy[2 * m] = pair[0];
        copy[2 * m + 1] = pair[1];
#endif
    }
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

/* Warp 0: the team's two sums of a channel, from the copies bn_fetch_pairs made, each pair
 * read again from pairs until it carries `tag` (its member had not published yet); every lane
 * gets them. */
__device__ __forceinline__ void bn_team_sums(const unsigned long long* copy, const unsigned long long* pairs,
                                             int members, unsigned int tag, float* s1, float* s2, int* late)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
    float t1 = 0.0f, t2 = 0.0f;
    int stale = 0; /* pairs whose copy was not yet the channel's (BN_TRACE counts them) */
    for (int m = threadIdx.x; m < members; m += 32) {
        const volatile unsigned long long* pair = pairs + 2 * m;
        unsigned long long a = copy[2 * m], b = copy[2 * m + 1];
        stale += (unsigned int)(a >> 32) != tag || (unsigned int)(b >> 32) != tag;
        while ((unsigned int)(a >> 32) != tag || (unsigned int)(b >> 32) != tag) {
            __nanosleep(64);
            a = pair[0];
            b = pair[1];
        }
        t1 += __uint_as_float((unsigned int)a);
        t2 += __uint_as_float((unsigned int)b);
    }
    *s1 = bn_warp_sum(t1);
    *s2 = bn_warp_sum(t2);
    *late = (int)bn_warp_sum((float)stale);
}

/* Warp 0 of a member: the statistics of channel `before` from the team's sums (copied first
 * where FETCH), its affine pair into shared memory; member 0 also writes the saved and running
 * statistics and moves the channel's generation on. (A macro: it uses most of the kernel's
 * arguments and locals.) */
#define BN_CHANNEL_STATS(FETCH)                                                                                 \
    do {                                                                                                       \
        float t1, t2;                                                                                          \
        int late;                                                                                              \
        if (FETCH)                                                                                             \
            bn_fetch_pairs(copies, pairs + 2 * (long)before * members, members);                              \
        bn_team_sums(copies, pairs + 2 * (long)before * members, members, tag_before, &t1, &t2, &late);       \
        BN_COUNT(round, late);                                                                                 \
        if (lane == 0) {                                                                                       \
            const float shifted = t1 / count;                                                                  \
            const float var = fmaxf(t2 / count - shifted * shifted, 0.0f);                                     \
            const float mean = k_before + shifted, invstd = 1.0f / sqrtf(var + eps);                          \
            const float a = scale[before] * invstd;                                                           \
            affine[0] = a;                                                                                     \
            affine[1] = bias[before] - a * mean;                                                               \
            if (member == 0) {                                                                                 \
                saved_mean[before] = mean;                                                                     \
                saved_invstd[before] = invstd;                                                                 \
                if (update_running) {                                                                          \
                    const float unbiased = count > 1 ? var * count / (count - 1) : var;                       \
                    running_mean[before] = (1.0f - factor) * running_mean[before] + factor * mean;            \
                    running_var[before] = (1.0f - factor) * running_var[before] + factor * unbiased;          \
                }                                                                                              \
                gen[before] = tag_before; /* every member has read the old generation */                       \
            }                                                                                                  \
        }                                                                                                      \
    } while (0)

extern "C" __global__ void BN_BOUNDS
bn_train_persistent(const kdb_vec4u* __restrict__ x, kdb_vec4u* __restrict__ y, const float* __restrict__ scale,
                    const float* __restrict__ bias, float* running_mean, float* running_var, float* saved_mean,
                    float* saved_invstd, unsigned long long* pairs, unsigned int* gen, int N, int C, int HWv, int xs0,
                    int xs1, int ys0, int ys1, int members, int chunk, int count, float eps, float factor,
                    int update_running BN_TRACE_ARG)
{
    extern __shared__ kdb_vec4u stages[]; /* two of chunk vectors each, then copies of the team's pairs */
    unsigned long long* copies = (unsigned long long*)(stages + 2 * chunk);
    __shared__ float sums[2][BN_BLOCK / 32];
    __shared__ float affine[2];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int member = blockIdx.x % members, team = blockIdx.x / members, teams = gridDim.x / members;
    const int total = N * HWv; /* vectors per channel */
    const int lo = member * chunk, hi = min(lo + chunk, total);
    kdb_vec4u q[BN_REGS], head;
    float k = 0.0f, k_before = 0.0f;               /* the channel's first element, and the channel before's */
    unsigned int tag = 0u, tag_next = 0u, tag_before = 0u; /* the tags they are published with */
    int round = 0, stage = 0;
    BN_MARK(0);
    BN_MARK_SM();
    if (team < C) {
        head = x[(long)team * xs1];
        tag_next = *(volatile unsigned int*)(gen + team) + 1u;
        bn_load_chunk(q, x, team, lo, hi, HWv, xs0, xs1);
    }
    for (int c = team, before = -1; c < C || before >= 0; before = c < C ? c : -1, c += teams, stage ^= 1) {
        if (c < C) {
            /* The chunk arrived (its loads were issued a channel earlier): stage it, sum it. */
            float first[KDB_VEC];
            kdb_unpack(head, first);
            k = first[0];
            tag = tag_next;
            float s1 = 0.0f, s2 = 0.0f;
            bn_stage_and_sum(stages + stage * chunk, q, lo, hi, k, &s1, &s2);
            s1 = bn_warp_sum(s1);
            s2 = bn_warp_sum(s2);
            if (lane == 0) {
                sums[0][warp] = s1;
                sums[1][warp] = s2;
            }
            __syncthreads();
            BN_MARK(1 + 4 * round); /* staged and summed */
            if (t == 0) { /* the sums go out before the loads, which may stall their issue */
                s1 = s2 = 0.0f;
                for (int w = 0; w < BN_BLOCK / 32; ++w) {
                    s1 += sums[0][w];
                    s2 += sums[1][w];
                }
                volatile unsigned long long* mine = pairs + 2 * ((long)c * members + member);
                mine[0] = bn_tagged(s1, tag);
                mine[1] = bn_tagged(s2, tag);
            }
            BN_MARK(2 + 4 * round); /* arrived */
            if (before >= 0 && warp == 0)
                bn_fetch_pairs(copies, pairs + 2 * (long)before * members, members);
            /* The next channel's reads, in flight during the meeting and the writes. */
            const int next = c + teams;
            if (next < C) {
                head = x[(long)next * xs1];
                tag_next = *(volatile unsigned int*)(gen + next) + 1u; /* read before publishing */
                bn_load_chunk(q, x, next, lo, hi, HWv, xs0, xs1);
            }
        }
        if (before >= 0) {
            /* The channel before: its statistics from the team's sums, then its outputs from the
             * other stage. */
            if (warp == 0)
                BN_CHANNEL_STATS(c >= C);
            __syncthreads();
            BN_MARK(3 + 4 * round); /* the statistics seen */
            bn_write_chunk(y, stages + (stage ^ 1) * chunk, before, lo, hi, HWv, ys0, ys1, affine[0], affine[1]);
            BN_MARK(4 + 4 * round); /* writes issued */
        }
        k_before = k;
        tag_before = tag;
        ++round;
        __syncthreads(); /* the stage just written from and the affine pair are free again */
    }
    BN_MARK(4 * BN_TRACE_ROUNDS + 1);
}

