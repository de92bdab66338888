/* kdb_compat.h: the kernel dialect. One kernel source, three compilers.
 *
 * A kdbkit kernel is plain C plus the macros below, and compiles unchanged as
 *   - CUDA C++ with NVRTC                       (__CUDACC__ / __CUDACC_RTC__ / __NVCC__)
 *   - HIP with hiprtc, or clang offline for amdgcn with -nogpulib -nogpuinc (__HIP__)
 *   - OpenCL C with PoCL or any OpenCL driver   (__OPENCL_VERSION__)
 *
 * The HIP branch uses clang attributes and builtins only, never the ROCm headers or device
 * libraries, because the offline build (clang -x hip -nogpulib -nogpuinc) has neither; the
 * same spelling also compiles under hiprtc, so there is one HIP branch.
 *
 * Vocabulary (x, y and z exist for every id and size):
 *   KDB_KERNEL            start of a kernel definition: `KDB_KERNEL void name(...)`; C linkage
 *                         in CUDA/HIP so that the symbol is `name`, not a mangled one
 *   KDB_DEVICE_FN         a helper function callable from kernels (static inline)
 *   KDB_BOUNDS(T, G)      after `KDB_KERNEL void`: launched with at most T threads per block,
 *                         and compiled so that G blocks fit a multiprocessor (registers capped
 *                         to fit); CUDA only (__launch_bounds__), nothing elsewhere
 *   KDB_GLOBAL            address space of a pointer argument to device memory
 *   KDB_RESTRICT          restrict qualifier for pointer arguments
 *   KDB_SHARED(T, n, N)   declare `T n[N]` in shared (CUDA/HIP) / local (OpenCL) memory, at
 *                         kernel scope; N must be a compile-time constant (use -D macros).
 *                         KDB_LOCAL(T, n, N) is the same, spelled the OpenCL way
 *   KDB_SHARED_PTR(T)     the type of a helper's parameter that points into such an array
 *   KDB_LOCAL_ID_X        thread index within its block   (threadIdx.x / get_local_id(0))
 *   KDB_GROUP_ID_X        block index within the grid     (blockIdx.x  / get_group_id(0))
 *   KDB_LOCAL_SIZE_X      threads per block               (blockDim.x  / get_local_size(0))
 *   KDB_NUM_GROUPS_X      blocks in the grid              (gridDim.x   / get_num_groups(0))
 *   KDB_GLOBAL_ID_X       KDB_GROUP_ID_X * KDB_LOCAL_SIZE_X + KDB_LOCAL_ID_X
 *   KDB_BARRIER           block-wide barrier that also orders shared/local memory
 *   KDB_EXPF KDB_SQRTF KDB_FMAXF KDB_FMINF KDB_FABSF KDB_FMAF   single-precision math
 *   KDB_FAST_EXPF(x)      e^x through the hardware's base-2 exponential (CUDA __expf, AMD
 *                         v_exp_f32, OpenCL native_exp): a few ulp for x <= 0, where softmax
 *                         takes it, instead of the accurate routine's many instructions
 *   KDB_FAST_EXP2F(x) KDB_FAST_RCPF(x)   2^x and 1 / x by the hardware's approximations (CUDA
 *                         ex2/rcp.approx.ftz, AMD v_exp_f32/v_rcp_f32, OpenCL native_exp2 and
 *                         native_recip): a relative error near 2^-22 on CUDA, one instruction each
 *   KDB_LOGF KDB_TANHF KDB_ERFF KDB_POWF(base, e)                 more of it (POWF: base > 0);
 *                         on amdgcn, where no device library is linked, tanh, erf and pow are
 *                         computed here from exp/log (error below 2e-7 absolute)
 *   KDB_HALF_TO_FLOAT(b) KDB_FLOAT_TO_HALF(f)   fp16 bits (unsigned short) <-> float, RNE
 *   KDB_BF16_TO_FLOAT(b) KDB_FLOAT_TO_BF16(f)   bfloat16 bits (unsigned short) <-> float, RNE
 *                         (16-bit types travel as their bits on every backend: one kernel
 *                         signature, and no fp16 extension needed on OpenCL)
 *   KDB_FLOAT_BITS(f) KDB_BITS_FLOAT(u)   a float's bits as unsigned int, and back
 *   kdb_vec4u             16 bytes as four unsigned ints (.x .y .z .w): a pointer to it reads or
 *                         writes 16 bytes in one access (the address must be 16-byte aligned)
 *   kdb_vec2u             8 bytes as two unsigned ints (.x .y), the same way (8-byte aligned)
 *   KDB_UNROLL            before a loop of constant trip count: unroll it wholly (where the
 *                         loop indexes a private array, that keeps the array in registers)
 *   KDB_HAS_SHUFFLE       1 where KDB_SHFL_XOR exists (CUDA, HIP), 0 on OpenCL
 *   KDB_SHFL_XOR(v, m)    the float v of the thread whose lane is this one's xor m (m < 32),
 *                         every thread of the 32 lanes taking part; kdb_reduce.h builds the
 *                         lane reductions on it, through local memory where it is missing
 *
 * Ids are `int` everywhere (OpenCL's size_t and HIP's unsigned builtins are cast), so that
 * index arithmetic with negative intermediate values behaves the same on every backend.
 */
#ifndef KDB_COMPAT_H
#define KDB_COMPAT_H

#if defined(__OPENCL_VERSION__)
/* ---------------------------------------------------------------- OpenCL C */
#define KDB_BACKEND_OPENCL 1
#if defined(cl_khr_fp64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable /* lets -DKDB_DTYPE=double build before OpenCL 3.0 */
#endif
#define KDB_KERNEL __kernel
#define KDB_DEVICE_FN static inline
#define KDB_BOUNDS(threads, groups)
#define KDB_GLOBAL __global
#define KDB_RESTRICT restrict
#define KDB_SHARED(type, name, n) __local type name[n]
#define KDB_SHARED_PTR(type) __local type*

#define KDB_LOCAL_ID_X ((int)get_local_id(0))
#define KDB_LOCAL_ID_Y ((int)get_local_id(1))
#define KDB_LOCAL_ID_Z ((int)get_local_id(2))
#define KDB_GROUP_ID_X ((int)get_group_id(0))
#define KDB_GROUP_ID_Y ((int)get_group_id(1))
#define KDB_GROUP_ID_Z ((int)get_group_id(2))
#define KDB_LOCAL_SIZE_X ((int)get_local_size(0))
#define KDB_LOCAL_SIZE_Y ((int)get_local_size(1))
#define KDB_LOCAL_SIZE_Z ((int)get_local_size(2))
#define KDB_NUM_GROUPS_X ((int)get_num_groups(0))
#define KDB_NUM_GROUPS_Y ((int)get_num_groups(1))
#define KDB_NUM_GROUPS_Z ((int)get_num_groups(2))

#define KDB_BARRIER barrier(CLK_LOCAL_MEM_FENCE)

#define KDB_EXPF(x) exp((float)(x))
#define KDB_FAST_EXPF(x) native_exp((float)(x))
#define KDB_FAST_EXP2F(x) native_exp2((float)(x))
#define KDB_FAST_RCPF(x) native_recip((float)(x))
#define KDB_SQRTF(x) sqrt((float)(x))
#define KDB_FMAXF(a, b) fmax((float)(a), (float)(b))
#define KDB_FMINF(a, b) fmin((float)(a), (float)(b))
#define KDB_FABSF(x) fabs((float)(x))
#define KDB_FMAF(a, b, c) fma((float)(a), (float)(b), (float)(c))
#define KDB_LOGF(x) log((float)(x))
#define KDB_TANHF(x) tanh((float)(x))
#define KDB_ERFF(x) erf((float)(x))
#define KDB_POWF(a, b) pow((float)(a), (float)(b))

/* fp16 <-> float in integer and float arithmetic on values: no fp16 extension, and no private
 * variable whose address goes to vload_half/vstore_half_rte. PoCL 3.0 (PyPI's, LLVM 14) gets
 * such an address wrong in a kernel with a barrier inside a loop: the library call, not
 * inlined before its work-group passes, received the address of the last work-item's copy
 * (&bits[255] for groups of 256) while each work-item read its own, never written (pooling's
 * band kernel, layer norm, softmax, direct convolution, batch norm training: fp16 garbage). */
static inline float kdb_half_to_float(ushort h)
{
    const uint sign = (uint)(h & 0x8000u) << 16, em = h & 0x7fffu;
    if (em < 0x0400u) /* zero or subnormal: em * 2^-24, exact (a normal float) */
        return as_float(sign | as_uint((float)em * 5.9604644775390625e-8f));
    /* Rebias the exponent by 127 - 15; Inf and NaN (exponent 31) to exponent 255, payload kept. */
    return as_float(sign | ((em << 13) + (em >= 0x7c00u ? 0x70000000u : 0x38000000u)));
}
static inline ushort kdb_float_to_half(float f)
{
    const uint u = as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* Inf, NaN (a quiet NaN) */
        return (ushort)(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (a >= 0x47800000u) /* 65536 and up: Inf (65520 up to it round there below) */
        return (ushort)(sign | 0x7c00u);
    if (a < 0x38800000u) /* below 2^-14: a subnormal or zero; adding 0.5 (ulp 2^-24) rounds to nearest even */
        return (ushort)(sign | (as_uint(as_float(a) + 0.5f) - 0x3f000000u));
    /* Rebias by 15 - 127 and round the 13 dropped bits to nearest even (a carry may reach Inf). */
    return (ushort)(sign | ((a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13));
}
#define KDB_HALF_TO_FLOAT(b) kdb_half_to_float((ushort)(b))
#define KDB_FLOAT_TO_HALF(f) kdb_float_to_half((float)(f))
#define KDB_FLOAT_BITS(f) as_uint((float)(f))
#define KDB_BITS_FLOAT(u) as_float((uint)(u))
typedef uint4 kdb_vec4u;
typedef uint2 kdb_vec2u;
#define KDB_HAS_SHUFFLE 0 /* sub_group_shuffle_xor is an optional extension; kdb_reduce.h falls back */

#elif defined(__HIP__) || defined(__HIPCC_RTC__)
/* ---------------------------------------------------------------- HIP / amdgcn */
#define KDB_BACKEND_HIP 1
#define KDB_KERNEL extern "C" __attribute__((global))
#define KDB_BOUNDS(threads, groups)
#define KDB_DEVICE_FN static __attribute__((device)) inline __attribute__((always_inline))
#define KDB_GLOBAL
#define KDB_RESTRICT __restrict__
#define KDB_SHARED(type, name, n) __attribute__((shared)) type name[n]
#define KDB_SHARED_PTR(type) type*

#define KDB_LOCAL_ID_X ((int)__builtin_amdgcn_workitem_id_x())
#define KDB_LOCAL_ID_Y ((int)__builtin_amdgcn_workitem_id_y())
#define KDB_LOCAL_ID_Z ((int)__builtin_amdgcn_workitem_id_z())
#define KDB_GROUP_ID_X ((int)__builtin_amdgcn_workgroup_id_x())
#define KDB_GROUP_ID_Y ((int)__builtin_amdgcn_workgroup_id_y())
#define KDB_GROUP_ID_Z ((int)__builtin_amdgcn_workgroup_id_z())
#define KDB_LOCAL_SIZE_X ((int)__builtin_amdgcn_workgroup_size_x())
#define KDB_LOCAL_SIZE_Y ((int)__builtin_amdgcn_workgroup_size_y())
#define KDB_LOCAL_SIZE_Z ((int)__builtin_amdgcn_workgroup_size_z())
/* grid_size is the total number of work-items (HSA dispatch packet), not of groups. */
#define KDB_NUM_GROUPS_X ((int)(__builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x()))
#define KDB_NUM_GROUPS_Y ((int)(__builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y()))
#define KDB_NUM_GROUPS_Z ((int)(__builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z()))

/* What HIP's __syncthreads() expands to: release fence, s_barrier, acquire fence. */
#define KDB_BARRIER                                          \
    do {                                                     \
        __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); \
        __builtin_amdgcn_s_barrier();                        \
        __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup"); \
    } while (0)

#define KDB_EXPF(x) __builtin_expf(x)
#define KDB_FAST_EXPF(x) __builtin_exp2f((x) * 1.4426950408889634f)
#define KDB_FAST_EXP2F(x) __builtin_amdgcn_exp2f(x)
#define KDB_FAST_RCPF(x) __builtin_amdgcn_rcpf(x)
#define KDB_SQRTF(x) __builtin_sqrtf(x)
#define KDB_FMAXF(a, b) __builtin_fmaxf((a), (b))
#define KDB_FMINF(a, b) __builtin_fminf((a), (b))
#define KDB_FABSF(x) __builtin_fabsf(x)
#define KDB_FMAF(a, b, c) __builtin_fmaf((a), (b), (c))
#define KDB_LOGF(x) __builtin_logf(x)
/* tanhf, erff and powf would be calls into ROCm's device library, which offline builds do not
 * link (the code-object checks refuse the undefined symbol): built from exp/log here. */
static __attribute__((device)) inline float kdb_tanhf(float x)
{
    const float e = __builtin_expf(-2.0f * __builtin_fabsf(x));
    return __builtin_copysignf((1.0f - e) / (1.0f + e), x);
}
static __attribute__((device)) inline float kdb_erff(float x)
{
    /* Abramowitz & Stegun 7.1.26: absolute error below 1.5e-7. */
    const float a = __builtin_fabsf(x), t = 1.0f / (1.0f + 0.3275911f * a);
    const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
    return __builtin_copysignf(1.0f - poly * __builtin_expf(-a * a), x);
}
#define KDB_TANHF(x) kdb_tanhf(x)
#define KDB_ERFF(x) kdb_erff(x)
#define KDB_POWF(a, b) __builtin_exp2f((b) * __builtin_log2f(a))
#define KDB_HALF_TO_FLOAT(b) ((float)__builtin_bit_cast(_Float16, (unsigned short)(b)))
#define KDB_FLOAT_TO_HALF(f) __builtin_bit_cast(unsigned short, (_Float16)(f))
#define KDB_FLOAT_BITS(f) __builtin_bit_cast(unsigned int, (float)(f))
#define KDB_BITS_FLOAT(u) __builtin_bit_cast(float, (unsigned int)(u))
typedef unsigned int kdb_vec4u __attribute__((ext_vector_type(4)));
typedef unsigned int kdb_vec2u __attribute__((ext_vector_type(2)));
#define KDB_HAS_SHUFFLE 1
/* What HIP's __shfl_xor does: ds_bpermute from lane ^ m (m < 32 stays within a wave32 half). */
static __attribute__((device)) inline float kdb_shfl_xor(float v, int m)
{
    const int lane = (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
    return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute((lane ^ m) << 2, __builtin_bit_cast(int, v)));
}
#define KDB_SHFL_XOR(v, m) kdb_shfl_xor((float)(v), (m))

#elif defined(__CUDACC__) || defined(__CUDACC_RTC__) || defined(__NVCC__)
/* ---------------------------------------------------------------- CUDA (NVRTC, nvcc) */
#define KDB_BACKEND_CUDA 1
#define KDB_KERNEL extern "C" __global__
#define KDB_BOUNDS(threads, groups) __launch_bounds__(threads, groups)
#define KDB_DEVICE_FN static __device__ __forceinline__
#define KDB_GLOBAL
#define KDB_RESTRICT __restrict__
#define KDB_SHARED(type, name, n) __shared__ type name[n]
#define KDB_SHARED_PTR(type) type*

#define KDB_LOCAL_ID_X ((int)threadIdx.x)
#define KDB_LOCAL_ID_Y ((int)threadIdx.y)
#define KDB_LOCAL_ID_Z ((int)threadIdx.z)
#define KDB_GROUP_ID_X ((int)blockIdx.x)
#define KDB_GROUP_ID_Y ((int)blockIdx.y)
#define KDB_GROUP_ID_Z ((int)blockIdx.z)
#define KDB_LOCAL_SIZE_X ((int)blockDim.x)
#define KDB_LOCAL_SIZE_Y ((int)blockDim.y)
#define KDB_LOCAL_SIZE_Z ((int)blockDim.z)
#define KDB_NUM_GROUPS_X ((int)gridDim.x)
#define KDB_NUM_GROUPS_Y ((int)gridDim.y)
#define KDB_NUM_GROUPS_Z ((int)gridDim.z)

#define KDB_BARRIER __syncthreads()

#define KDB_EXPF(x) expf(x)
#define KDB_FAST_EXPF(x) __expf(x)
#define KDB_FAST_EXP2F(x) kdb_fast_exp2f(x)
#define KDB_FAST_RCPF(x) kdb_fast_rcpf(x)
#define KDB_SQRTF(x) sqrtf(x)
#define KDB_FMAXF(a, b) fmaxf((a), (b))
#define KDB_FMINF(a, b) fminf((a), (b))
#define KDB_FABSF(x) fabsf(x)
#define KDB_FMAF(a, b, c) fmaf((a), (b), (c))
#define KDB_LOGF(x) logf(x)
#define KDB_TANHF(x) tanhf(x)
#define KDB_ERFF(x) erff(x)
#define KDB_POWF(a, b) powf((a), (b))

/* PTX conversions: no cuda_fp16.h, so NVRTC needs no header folder for 16-bit types. */
static __device__ __forceinline__ float kdb_half_to_float(unsigned short bits)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
}
static __device__ __forceinline__ unsigned short kdb_float_to_half(float f)
{
    unsigned short bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(f));
    return bits;
}
#define KDB_HALF_TO_FLOAT(b) kdb_half_to_float((unsigned short)(b))
#define KDB_FLOAT_TO_HALF(f) kdb_float_to_half((float)(f))
static __device__ __forceinline__ float kdb_fast_exp2f(float x)
{
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
static __device__ __forceinline__ float kdb_fast_rcpf(float x)
{
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
#define KDB_FLOAT_BITS(f) __float_as_uint((float)(f))
#define KDB_BITS_FLOAT(u) __uint_as_float((unsigned int)(u))
typedef uint4 kdb_vec4u; /* NVRTC's built-in vector types */
typedef uint2 kdb_vec2u;
#define KDB_HAS_SHUFFLE 1
#define KDB_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (float)(v), (m))

#else
#error "kdb_compat.h: unknown compiler; expected OpenCL C, HIP (clang/hiprtc) or CUDA (NVRTC/nvcc)"
#endif

#define KDB_LOCAL(type, name, n) KDB_SHARED(type, name, n)
/* Unroll the loop that follows, also where a macro writes it (no #pragma in a macro). */
#define KDB_UNROLL _Pragma("unroll")

#define KDB_GLOBAL_ID_X (KDB_GROUP_ID_X * KDB_LOCAL_SIZE_X + KDB_LOCAL_ID_X)
#define KDB_GLOBAL_ID_Y (KDB_GROUP_ID_Y * KDB_LOCAL_SIZE_Y + KDB_LOCAL_ID_Y)
#define KDB_GLOBAL_ID_Z (KDB_GROUP_ID_Z * KDB_LOCAL_SIZE_Z + KDB_LOCAL_ID_Z)

/* bfloat16 is the top half of a float; rounding to nearest even, NaN kept a (quiet) NaN. */
#define KDB_BF16_TO_FLOAT(b) KDB_BITS_FLOAT(((unsigned int)(unsigned short)(b)) << 16)
#define KDB_FLOAT_TO_BF16(f) kdb_float_to_bf16(KDB_FLOAT_BITS(f))
KDB_DEVICE_FN unsigned short kdb_float_to_bf16(unsigned int u)
{
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#endif /* KDB_COMPAT_H */
