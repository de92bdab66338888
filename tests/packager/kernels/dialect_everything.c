/* dialect_everything.c: one kernel that uses every macro of kernels/kdb_compat.h.
 *
 * tests/packager/test_dialect_coverage.py fails when kdb_compat.h defines a KDB_ macro that
 * this file does not use, so every macro of the dialect is compiled for each AMD target (and
 * with NVRTC and OpenCL where they are installed) before a real kernel relies on it.
 *
 *   y[j]      = clamp(shape(x[j]) + max(s, p), lo, hi) for every j < n (a grid-stride loop over
 *               the flattened 3-D grid), s the x the next thread of the block staged in shared
 *               memory, p the s of the lane xor 1 (s itself where the backend cannot shuffle),
 *               that float's bits round-tripped through a 16-byte vector
 *   groups[g] = g, the flattened 3-D group id, passed through local memory by thread 0
 *
 * Options: -DBLOCK=<n> (default 64): the shared array's length; blocks may be larger.
 * Launch: any 3-D block and grid; groups needs one int per group.
 */
#include "kdb_compat.h"

#ifndef BLOCK
#define BLOCK 64
#endif

KDB_DEVICE_FN float shape(float v)
{
    /* Every single-precision math macro; none may become a library call on amdgcn. */
    const float magnitude = KDB_SQRTF(KDB_FABSF(v));
    const float curve = KDB_TANHF(v) + KDB_ERFF(v) + KDB_LOGF(1.0f + magnitude) + KDB_POWF(1.0f + magnitude, 0.5f);
    /* The 16-bit conversions, each round trip through its bits. */
    const float rounded = KDB_HALF_TO_FLOAT(KDB_FLOAT_TO_HALF(curve)) + KDB_BF16_TO_FLOAT(KDB_FLOAT_TO_BF16(curve));
    const float same = KDB_BITS_FLOAT(KDB_FLOAT_BITS(rounded));
    return KDB_FMAF(magnitude, 0.5f, KDB_EXPF(KDB_FMINF(v, 0.0f))) + same + KDB_FAST_EXPF(-magnitude) +
           KDB_FAST_EXP2F(-magnitude) * KDB_FAST_RCPF(1.0f + magnitude);
}

/* A helper reading shared memory through a pointer. */
KDB_DEVICE_FN float neighbour(KDB_SHARED_PTR(float) stage, int lid, int staged)
{
    return stage[(lid + 1) % staged];
}

KDB_KERNEL void KDB_BOUNDS(1024, 1)
dialect_everything(const KDB_GLOBAL float* KDB_RESTRICT x, KDB_GLOBAL float* KDB_RESTRICT y,
                   KDB_GLOBAL int* KDB_RESTRICT groups, int n, float lo, float hi)
{
    KDB_SHARED(float, stage, BLOCK);
    KDB_LOCAL(int, block_group, 1);
    const int threads = KDB_LOCAL_SIZE_X * KDB_LOCAL_SIZE_Y * KDB_LOCAL_SIZE_Z;
    const int staged = threads < BLOCK ? threads : BLOCK;
    const int lid = (KDB_LOCAL_ID_Z * KDB_LOCAL_SIZE_Y + KDB_LOCAL_ID_Y) * KDB_LOCAL_SIZE_X + KDB_LOCAL_ID_X;
    const int group = (KDB_GROUP_ID_Z * KDB_NUM_GROUPS_Y + KDB_GROUP_ID_Y) * KDB_NUM_GROUPS_X + KDB_GROUP_ID_X;
    const int width = KDB_NUM_GROUPS_X * KDB_LOCAL_SIZE_X;
    const int height = KDB_NUM_GROUPS_Y * KDB_LOCAL_SIZE_Y;
    const int grid_threads = width * height * KDB_NUM_GROUPS_Z * KDB_LOCAL_SIZE_Z;
    const int i = (KDB_GLOBAL_ID_Z * height + KDB_GLOBAL_ID_Y) * width + KDB_GLOBAL_ID_X;

    if (lid == 0)
        block_group[0] = group;
    if (lid < staged)
        stage[lid] = i < n ? x[i] : 0.0f;
    /* Every thread reaches the barrier: no return before it. */
    KDB_BARRIER;
    const float s = neighbour(stage, lid, staged);
#if KDB_HAS_SHUFFLE
    const float swapped = KDB_SHFL_XOR(s, 1); /* every thread of the group is here */
#else
    const float swapped = s;
#endif
    kdb_vec4u bits;
    bits.x = KDB_FLOAT_BITS(swapped);
    bits.y = bits.z = bits.w = 0u;
    KDB_UNROLL for (int u = 0; u < 2; ++u) /* lanes z and w stay 0 */
        bits.z |= bits.w << u;
    const float p = KDB_BITS_FLOAT(bits.x | bits.w | bits.z);
    for (int j = i; j < n; j += grid_threads)
        y[j] = KDB_FMINF(KDB_FMAXF(shape(x[j]) + KDB_FMAXF(s, p), lo), hi);
    if (lid == 0)
        groups[group] = block_group[0];
}
