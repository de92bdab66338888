/* batchnorm_persistent.cu: spatial batch-norm training forward in one launch that reads each
 * input element from device memory once (the split solver reads x twice: once for the sums,
 * once to normalise).
 *
 * The groups form teams of `members` groups; a team takes one channel at a time (channels
 * team, team + teams, ...). Each member copies its chunk of the channel (up to `chunk` 16-byte
 * vectors of the channel's N planes) into shared memory while summing it, publishes its two
 * sums, issues the reads of its chunk of the team's next channel (into registers: they are in
 * flight during what follows), and waits: the last member to arrive combines the team's sums
 * into the channel's statistics (saved mean and inverse deviation, running mean and variance)
 * and the affine pair, and publishes them. Every member then normalises its chunk from shared
 * memory.
 * Waiting on other groups needs them resident at once: the solver launches cooperatively
 * (cuLaunchCooperativeKernel refuses a grid that could not be), so this is CUDA only.
 *
 * Sums are about the channel's first element (as bn_train_partial's), so a large mean does
 * not cancel the variance away.
 *
 * Options: the element type (kdb_data.h).
 * Arguments: partial holds 2 floats per group; sync 2 unsigned per channel, zero before the
 *   first launch and left zero by every launch; stats 2 floats per channel. Planes of HWv
 *   whole vectors, strides in vectors, every plane 16-byte aligned (the solver checks).
 * Launch: teams * members groups of BN_BLOCK threads, chunk (at most BN_BLOCK * BN_REGS)
 *   * 16 bytes of dynamic shared memory, cooperatively.
 */
#include "kdb_data.h"

#define BN_BLOCK 256
#define BN_REGS 8 /* vectors per thread in flight: a chunk is at most BN_BLOCK * BN_REGS vectors */

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
            q[u] = x[(long)n * xs0 + (long)c * xs1 + (g - n * HWv)];
        }
    }
}

extern "C" __global__ void __launch_bounds__(BN_BLOCK)
bn_train_persistent(const kdb_vec4u* __restrict__ x, kdb_vec4u* __restrict__ y, const float* __restrict__ scale,
                    const float* __restrict__ bias, float* running_mean, float* running_var, float* saved_mean,
                    float* saved_invstd, float* partial, unsigned int* sync, float* stats, int N, int C, int HWv,
                    int xs0, int xs1, int ys0, int ys1, int members, int chunk, int count, float eps, float factor,
                    int update_running)
{
    extern __shared__ kdb_vec4u stage[];
    __shared__ float sums[2][BN_BLOCK / 32];
    __shared__ float affine[2];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int member = blockIdx.x % members, team = blockIdx.x / members, teams = gridDim.x / members;
    const int total = N * HWv; /* vectors per channel */
    const int lo = member * chunk, hi = min(lo + chunk, total);
    kdb_vec4u q[BN_REGS], head;
    if (team < C) {
        head = x[(long)team * xs1];
        bn_load_chunk(q, x, team, lo, hi, HWv, xs0, xs1);
    }
    for (int c = team; c < C; c += teams) {
        /* The chunk arrived (its loads were issued a channel earlier): stage it, sum it. */
        float first[KDB_VEC];
        kdb_unpack(head, first);
        const float k = first[0];
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int u = 0; u < BN_REGS; ++u) {
            const int g = lo + t + u * BN_BLOCK;
            if (g < hi) {
                stage[g - lo] = q[u];
                float v[KDB_VEC];
                kdb_unpack(q[u], v);
#pragma unroll
                for (int e = 0; e < KDB_VEC; ++e) {
                    const float d = v[e] - k;
                    s1 += d;
                    s2 += d * d;
                }
            }
        }
        s1 = bn_warp_sum(s1);
        s2 = bn_warp_sum(s2);
        if (lane == 0) {
            sums[0][warp] = s1;
            sums[1][warp] = s2;
        }
        __syncthreads();
        if (t == 0) {
            s1 = s2 = 0.0f;
            for (int w = 0; w < BN_BLOCK / 32; ++w) {
                s1 += sums[0][w];
                s2 += sums[1][w];
            }
            partial[2 * blockIdx.x] = s1;
            partial[2 * blockIdx.x + 1] = s2;
            __threadfence(); /* the sums are visible before the arrival is */
            if (atomicAdd(sync + 2 * c, 1u) == (unsigned int)members - 1) {
                /* The last to arrive: the channel's statistics from the team's sums. */
                __threadfence();
                const volatile float* p = partial + 2 * team * members;
                float t1 = 0.0f, t2 = 0.0f;
                for (int m = 0; m < members; ++m) {
                    t1 += p[2 * m];
                    t2 += p[2 * m + 1];
                }
                const float shifted = t1 / count;
                const float var = fmaxf(t2 / count - shifted * shifted, 0.0f);
                const float mean = k + shifted, invstd = 1.0f / sqrtf(var + eps);
                saved_mean[c] = mean;
                saved_invstd[c] = invstd;
                if (update_running) {
                    const float unbiased = count > 1 ? var * count / (count - 1) : var;
                    running_mean[c] = (1.0f - factor) * running_mean[c] + factor * mean;
                    running_var[c] = (1.0f - factor) * running_var[c] + factor * unbiased;
                }
                const float a = scale[c] * invstd;
                stats[2 * c] = a;
                stats[2 * c + 1] = bias[c] - a * mean;
                __threadfence();
                atomicAdd(sync + 2 * c, 1u); /* members + 1: published */
            }
        }
        /* The next channel's reads go out before the wait, so they overlap it and the writes. */
        const int next = c + teams;
        if (next < C) {
            head = x[(long)next * xs1];
            bn_load_chunk(q, x, next, lo, hi, HWv, xs0, xs1);
        }
        if (t == 0) {
            const volatile unsigned int* arrivals = sync + 2 * c;
            while (*arrivals != (unsigned int)members + 1)
                __nanosleep(32);
            __threadfence();
            const volatile float* ab = stats + 2 * c;
            affine[0] = ab[0];
            affine[1] = ab[1];
        }
        __syncthreads();
        const float a = affine[0], b = affine[1];
#pragma unroll
        for (int u = 0; u < BN_REGS; ++u) {
            const int g = lo + t + u * BN_BLOCK;
            if (g < hi) {
                const int n = g / HWv;
                float v[KDB_VEC];
                kdb_unpack(stage[g - lo], v);
#pragma unroll
                for (int e = 0; e < KDB_VEC; ++e)
                    v[e] = a * v[e] + b;
                y[(long)n * ys0 + (long)c * ys1 + (g - n * HWv)] = kdb_pack(v);
            }
        }
        if (t == 0 && atomicAdd(sync + 2 * c + 1, 1u) == (unsigned int)members - 1) {
            /* The last to leave: every member is past its wait, so the counters can go back to
             * zero for the next launch. */
            sync[2 * c] = 0u;
            sync[2 * c + 1] = 0u;
        }
        __syncthreads(); /* the stage and the affine pair are free for the next channel */
    }
}
