"""A corpus of distinct, real sm_90 cubins compiled with NVRTC, for ``scripts/bench_kdb.py``.

The sources are generated CUDA C kernels of the kinds a DNN library ships: one-kernel tensor
ops (fill, copy, scale, add, cast, bias add), elementwise
activations (forward and backward) in f32/f64/f16/bf16/int8, reductions through shared
memory (and warp shuffles), tiled GEMMs with different block tiles, per-thread micro-tiles
and K-unroll factors, direct 2D convolutions with different filter sizes, strides and
output tiles, and row softmax. Each family is one source template specialised with ``-D``
options, MIOpen style; every (template, options) pair is one ``.cu.o`` "program".
No headers are included beyond what NVRTC has built in (f16/bf16 are stored as
``unsigned short`` and converted with PTX ``cvt`` / bit operations).

Compiling takes about 25 s on two cores, so cubins are cached one file per spec under
``--corpus-dir`` (default ``/tmp/kdbkit-bench-corpus``, outside the repository), keyed by a
hash of source, options, arch and NVRTC version. Identical cubins from different specs are
dropped so every corpus entry is distinct.

    python scripts/cubin_corpus.py [--corpus-dir DIR] [--jobs N]   # build or refresh, print a summary
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ARCH = "sm_90"
DEFAULT_DIR = Path(os.environ.get("KDB_BENCH_CORPUS", "/tmp/kdbkit-bench-corpus"))
GENERATOR_VERSION = 1
SEED = 20240611

# ----------------------------------------------------------------------------------------
# Sources
# ----------------------------------------------------------------------------------------

PRELUDE = r"""
#ifndef DTYPE
#define DTYPE 0
#endif
#if DTYPE == 0
typedef float T; typedef float ACC;
__device__ __forceinline__ ACC ld(const T* p, long i) { return p[i]; }
__device__ __forceinline__ void st(T* p, long i, ACC v) { p[i] = v; }
#elif DTYPE == 1
typedef double T; typedef double ACC;
__device__ __forceinline__ ACC ld(const T* p, long i) { return p[i]; }
__device__ __forceinline__ void st(T* p, long i, ACC v) { p[i] = v; }
#elif DTYPE == 2
typedef unsigned short T; typedef float ACC;
__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ ACC ld(const T* p, long i) { return h2f(p[i]); }
__device__ __forceinline__ void st(T* p, long i, ACC v) { p[i] = f2h(v); }
#elif DTYPE == 3
typedef unsigned short T; typedef float ACC;
__device__ __forceinline__ float b2f(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ unsigned short f2b(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
__device__ __forceinline__ ACC ld(const T* p, long i) { return b2f(p[i]); }
__device__ __forceinline__ void st(T* p, long i, ACC v) { p[i] = f2b(v); }
#elif DTYPE == 4
typedef signed char T; typedef float ACC;
#ifndef QSCALE
#define QSCALE 0.0625f
#endif
__device__ __forceinline__ ACC ld(const T* p, long i) { return (float)p[i] * QSCALE; }
__device__ __forceinline__ void st(T* p, long i, ACC v) {
    float q = rintf(v / QSCALE); q = fminf(fmaxf(q, -128.f), 127.f); p[i] = (signed char)q;
}
#endif
"""

NEURON = PRELUDE + r"""
// MIOpenNeuron-like activations; OP picks the function, VEC elements per thread per step.
__device__ __forceinline__ ACC act(ACC x, ACC alpha, ACC beta, ACC gamma) {
#if OP == 0
    return x > ACC(0) ? x : ACC(0);                                   // relu
#elif OP == 1
    return x > ACC(0) ? x : alpha * x;                                // leaky relu
#elif OP == 2
    return x > ACC(0) ? x : alpha * (exp(x) - ACC(1));                // elu
#elif OP == 3
    return ACC(0.5) * x * (ACC(1) + tanh(ACC(0.7978845608) * (x + ACC(0.044715) * x * x * x)));  // gelu tanh
#elif OP == 4
    return ACC(0.5) * x * (ACC(1) + erf(x * ACC(0.7071067811865476)));  // gelu erf
#elif OP == 5
    return ACC(1) / (ACC(1) + exp(-x));                               // sigmoid
#elif OP == 6
    return x / (ACC(1) + exp(-x));                                    // silu
#elif OP == 7
    return tanh(x);                                                   // tanh
#elif OP == 8
    return x > ACC(20) ? x : log1p(exp(x));                           // softplus
#elif OP == 9
    return x * tanh(x > ACC(20) ? x : log1p(exp(x)));                 // mish
#elif OP == 10
    return x * fmin(fmax(x + ACC(3), ACC(0)), ACC(6)) / ACC(6);       // hardswish
#elif OP == 11
    return fmin(fmax(alpha * x + beta, ACC(0)), ACC(1));              // hardsigmoid
#elif OP == 12
    return alpha * pow(fabs(beta * x), gamma);                        // power (MIOpen POWER)
#else
    return fmin(fmax(x, alpha), beta);                                // clipped relu
#endif
}

__device__ __forceinline__ ACC dact(ACC x, ACC y, ACC dy, ACC alpha, ACC beta, ACC gamma) {
#if OP == 0
    return x > ACC(0) ? dy : ACC(0);
#elif OP == 1
    return x > ACC(0) ? dy : alpha * dy;
#elif OP == 2
    return x > ACC(0) ? dy : dy * (y + alpha);
#elif OP == 5
    return dy * y * (ACC(1) - y);
#elif OP == 6
    { ACC s = ACC(1) / (ACC(1) + exp(-x)); return dy * (s + x * s * (ACC(1) - s)); }
#elif OP == 7
    return dy * (ACC(1) - y * y);
#elif OP == 8
    return dy / (ACC(1) + exp(-x));
#else
    { ACC h = x * ACC(1e-3) + ACC(1e-6); return dy * (act(x + h, alpha, beta, gamma) - act(x - h, alpha, beta, gamma)) / (h + h); }
#endif
}

extern "C" __global__ void __launch_bounds__(BLOCK)
neuron_fwd(const T* __restrict__ x, T* __restrict__ y, long n, ACC alpha, ACC beta, ACC gamma) {
    const long stride = (long)gridDim.x * BLOCK * VEC;
    for (long i = ((long)blockIdx.x * BLOCK + threadIdx.x) * VEC; i < n; i += stride) {
        ACC v[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) v[k] = (i + k < n) ? ld(x, i + k) : ACC(0);
#pragma unroll
        for (int k = 0; k < VEC; ++k) if (i + k < n) st(y, i + k, act(v[k], alpha, beta, gamma));
    }
}

#if MLO_NEURON_BWD
extern "C" __global__ void __launch_bounds__(BLOCK)
neuron_bwd(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
           long n, ACC alpha, ACC beta, ACC gamma) {
    const long stride = (long)gridDim.x * BLOCK * VEC;
    for (long i = ((long)blockIdx.x * BLOCK + threadIdx.x) * VEC; i < n; i += stride) {
#pragma unroll
        for (int k = 0; k < VEC; ++k)
            if (i + k < n) st(dx, i + k, dact(ld(x, i + k), ld(y, i + k), ld(dy, i + k), alpha, beta, gamma));
    }
}
#endif
"""

TENSOR_OPS = PRELUDE + r"""
// MIOpenTensorKernels-like one-kernel programs: fill, copy, scale, add, cast to f32, bias add.
extern "C" __global__ void __launch_bounds__(BLOCK)
tensor_op(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, float* __restrict__ f, long n,
          ACC alpha, ACC beta) {
    for (long i = (long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (long)gridDim.x * BLOCK) {
#if OP == 0
        st(c, i, alpha);
#elif OP == 1
        c[i] = a[i];
#elif OP == 2
        st(c, i, alpha * ld(a, i));
#elif OP == 3
        st(c, i, alpha * ld(a, i) + beta * ld(b, i));
#elif OP == 4
        f[i] = (float)ld(a, i);
#else
        st(c, i, ld(a, i) + ld(b, i % CHANNELS));
#endif
    }
}
"""

REDUCE = PRELUDE + r"""
// Shared-memory tree reductions: whole tensor (two passes) and along rows.
#if OP == 0
#define INIT ACC(0)
#define PRE(v) (v)
#define COMB(a, b) ((a) + (b))
#define POST(v, n) (v)
#elif OP == 1
#define INIT ACC(-1e30)
#define PRE(v) (v)
#define COMB(a, b) fmax((a), (b))
#define POST(v, n) (v)
#elif OP == 2
#define INIT ACC(1e30)
#define PRE(v) (v)
#define COMB(a, b) fmin((a), (b))
#define POST(v, n) (v)
#elif OP == 3
#define INIT ACC(0)
#define PRE(v) (v)
#define COMB(a, b) ((a) + (b))
#define POST(v, n) ((v) / ACC(n))
#elif OP == 4
#define INIT ACC(0)
#define PRE(v) ((v) * (v))
#define COMB(a, b) ((a) + (b))
#define POST(v, n) sqrt(v)
#else
#define INIT ACC(0)
#define PRE(v) fabs(v)
#define COMB(a, b) fmax((a), (b))
#define POST(v, n) (v)
#endif

__device__ __forceinline__ ACC block_reduce(ACC v, ACC* s) {
    const int tid = threadIdx.x;
    s[tid] = v;
    __syncthreads();
#if USE_SHFL
#pragma unroll
    for (int off = BLOCK / 2; off >= 32; off >>= 1) {
        if (tid < off) s[tid] = COMB(s[tid], s[tid + off]);
        __syncthreads();
    }
    if (tid < 32) {
        v = s[tid];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = COMB(v, __shfl_down_sync(0xffffffffu, v, o));
    }
#else
#pragma unroll
    for (int off = BLOCK / 2; off > 0; off >>= 1) {
        if (tid < off) s[tid] = COMB(s[tid], s[tid + off]);
        __syncthreads();
    }
    v = s[0];
#endif
    return v;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
reduce_partial(const T* __restrict__ x, ACC* __restrict__ partial, long n) {
    __shared__ ACC s[BLOCK];
    ACC acc = INIT;
    const long step = (long)gridDim.x * BLOCK * UNROLL;
    for (long i = (long)blockIdx.x * BLOCK * UNROLL + threadIdx.x; i < n; i += step) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            long j = i + (long)u * BLOCK;
            if (j < n) acc = COMB(acc, PRE(ld(x, j)));
        }
    }
    acc = block_reduce(acc, s);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
reduce_final(const ACC* __restrict__ partial, T* __restrict__ out, int m, long n) {
    __shared__ ACC s[BLOCK];
    ACC acc = INIT;
    for (int i = threadIdx.x; i < m; i += BLOCK) acc = COMB(acc, partial[i]);
    acc = block_reduce(acc, s);
    if (threadIdx.x == 0) st(out, 0, POST(acc, n));
}

extern "C" __global__ void __launch_bounds__(BLOCK)
reduce_rows(const T* __restrict__ x, T* __restrict__ out, int rows, int cols) {
    __shared__ ACC s[BLOCK];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        ACC acc = INIT;
        for (int c = threadIdx.x; c < cols; c += BLOCK) acc = COMB(acc, PRE(ld(x, (long)r * cols + c)));
        acc = block_reduce(acc, s);
        if (threadIdx.x == 0) st(out, r, POST(acc, cols));
        __syncthreads();
    }
}
"""

GEMM = PRELUDE + r"""
// Tiled GEMM C = alpha * op(A) op(B) + beta * C with a BM x BN block tile, BK deep, and a
// TM x TN register micro-tile per thread; KUNROLL unrolls the inner k loop.
#define NT ((BM / TM) * (BN / TN))
constexpr int kUnroll = KUNROLL;

extern "C" __global__ void __launch_bounds__(NT)
gemm(int M, int N, int K, ACC alpha, const T* __restrict__ A, int lda, const T* __restrict__ B, int ldb,
     ACC beta, T* __restrict__ C, int ldc, const T* __restrict__ bias) {
    __shared__ ACC As[BK][BM + PAD];
    __shared__ ACC Bs[BK][BN + PAD];
    const int tid = threadIdx.x;
    const int tx = tid % (BN / TN), ty = tid / (BN / TN);
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    ACC acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = ACC(0);

    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
        for (int e0 = 0; e0 < BM * BK; e0 += NT) {
            const int e = e0 + tid;
            if (e < BM * BK) {
#if TRANS_A
                const int r = e % BM, c = e / BM;
                const int gr = bm + r, gc = k0 + c;
                As[c][r] = (gr < M && gc < K) ? ld(A, (long)gc * lda + gr) : ACC(0);
#else
                const int r = e / BK, c = e % BK;
                const int gr = bm + r, gc = k0 + c;
                As[c][r] = (gr < M && gc < K) ? ld(A, (long)gr * lda + gc) : ACC(0);
#endif
            }
        }
#pragma unroll
        for (int e0 = 0; e0 < BN * BK; e0 += NT) {
            const int e = e0 + tid;
            if (e < BN * BK) {
#if TRANS_B
                const int r = e / BK, c = e % BK;
                const int gr = k0 + c, gc = bn + r;
                Bs[c][r] = (gr < K && gc < N) ? ld(B, (long)gc * ldb + gr) : ACC(0);
#else
                const int c = e / BN, r = e % BN;
                const int gr = k0 + c, gc = bn + r;
                Bs[c][r] = (gr < K && gc < N) ? ld(B, (long)gr * ldb + gc) : ACC(0);
#endif
            }
        }
        __syncthreads();
#pragma unroll kUnroll
        for (int k = 0; k < BK; ++k) {
            ACC a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[k][ty * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int r = bm + ty * TM + i;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int c = bn + tx * TN + j;
            if (r < M && c < N) {
                ACC v = alpha * acc[i][j];
#if !BETA_ZERO
                v = fma(beta, ld(C, (long)r * ldc + c), v);
#endif
#if EPILOGUE == 1
                v += ld(bias, c);
#elif EPILOGUE == 2
                v = fmax(v + ld(bias, c), ACC(0));
#endif
                st(C, (long)r * ldc + c, v);
            }
        }
    }
}
"""

CONV = PRELUDE + r"""
// Direct NCHW convolution, MIOpenConvDirUni style: each thread computes MLO_OUT_TILE0
// outputs along a row; filters for MLO_N_IN_TILES input channels are staged in shared memory.
#define FW MLO_FILTER_SIZE0
#define FH MLO_FILTER_SIZE1
#define SW MLO_FILTER_STRIDE0
#define SH MLO_FILTER_STRIDE1
#define PW MLO_FILTER_PAD0
#define PH MLO_FILTER_PAD1
#define OWT MLO_OUT_TILE0
#define CT MLO_N_IN_TILES

extern "C" __global__ void __launch_bounds__(MLO_GRP_SZ)
conv2d_fwd(const T* __restrict__ in, const T* __restrict__ wei, const T* __restrict__ bias, T* __restrict__ out,
           int C, int H, int W, int K, int OH, int OW) {
    __shared__ ACC wsh[CT][FH][FW];
    const int nk = blockIdx.z;               // n * K + k
    const int k = nk % K, n = nk / K;
    const int ow_tiles = (OW + OWT - 1) / OWT;
    const int t = blockIdx.x * MLO_GRP_SZ + threadIdx.x;
    const int oh = t / ow_tiles, ow0 = (t % ow_tiles) * OWT;
    ACC acc[OWT];
#pragma unroll
    for (int o = 0; o < OWT; ++o) acc[o] = ACC(0);
    for (int c0 = 0; c0 < C; c0 += CT) {
        __syncthreads();
        for (int e = threadIdx.x; e < CT * FH * FW; e += MLO_GRP_SZ) {
            const int cc = e / (FH * FW), f = e % (FH * FW);
            wsh[cc][f / FW][f % FW] = (c0 + cc < C) ? ld(wei, ((long)k * C + c0 + cc) * FH * FW + f) : ACC(0);
        }
        __syncthreads();
        if (oh < OH) {
#pragma unroll
            for (int cc = 0; cc < CT; ++cc) {
                const T* src = in + ((long)n * C + c0 + cc) * H * W;
#pragma unroll
                for (int fh = 0; fh < FH; ++fh) {
                    const int ih = oh * SH - PH + fh;
                    const bool hok = ih >= 0 && ih < H && c0 + cc < C;
#pragma unroll
                    for (int fw = 0; fw < FW; ++fw) {
                        const ACC wv = wsh[cc][fh][fw];
#pragma unroll
                        for (int o = 0; o < OWT; ++o) {
                            const int iw = (ow0 + o) * SW - PW + fw;
                            if (hok && iw >= 0 && iw < W) acc[o] = fma(ld(src, (long)ih * W + iw), wv, acc[o]);
                        }
                    }
                }
            }
        }
    }
    if (oh < OH) {
#pragma unroll
        for (int o = 0; o < OWT; ++o) {
            if (ow0 + o < OW) {
                ACC v = acc[o];
#if MLO_CONV_BIAS
                v += ld(bias, k);
#endif
#if MLO_FUSE_RELU
                v = fmax(v, ACC(0));
#endif
                st(out, (((long)n * K + k) * OH + oh) * OW + ow0 + o, v);
            }
        }
    }
}
"""

SOFTMAX = PRELUDE + r"""
// Row softmax (LOG=1: log-softmax), one block per row. COLS > 0 keeps the row in
// registers (COLS / BLOCK values per thread); COLS == 0 is the generic three-pass kernel.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float block_max(float v, float* s) {
    v = warp_max(v);
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < BLOCK / 32 ? s[threadIdx.x] : -1e30f;
    v = warp_max(v);
    __syncthreads();
    return v;
}
__device__ __forceinline__ float block_sum(float v, float* s) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
    __syncthreads();
    v = threadIdx.x < BLOCK / 32 ? s[threadIdx.x] : 0.f;
    v = warp_sum(v);
    __syncthreads();
    return v;
}

extern "C" __global__ void __launch_bounds__(BLOCK)
softmax_fwd(const T* __restrict__ x, T* __restrict__ y, int rows, int cols) {
    __shared__ float s[32];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + (long)r * cols;
        T* yr = y + (long)r * cols;
#if COLS > 0
        constexpr int E = (COLS + BLOCK - 1) / BLOCK;
        float v[E];
        float m = -1e30f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int c = e * BLOCK + threadIdx.x;
            v[e] = c < COLS ? (float)ld(xr, c) : -1e30f;
            m = fmaxf(m, v[e]);
        }
        m = block_max(m, s);
        float sum = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) { v[e] = __expf(v[e] - m); sum += (e * BLOCK + threadIdx.x < COLS) ? v[e] : 0.f; }
        sum = block_sum(sum, s);
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int c = e * BLOCK + threadIdx.x;
#if LOG
            if (c < COLS) st(yr, c, __logf(v[e]) - __logf(sum));
#else
            if (c < COLS) st(yr, c, v[e] / sum);
#endif
        }
#else
        float m = -1e30f;
        for (int c = threadIdx.x; c < cols; c += BLOCK) m = fmaxf(m, (float)ld(xr, c));
        m = block_max(m, s);
        float sum = 0.f;
        for (int c = threadIdx.x; c < cols; c += BLOCK) sum += __expf((float)ld(xr, c) - m);
        sum = block_sum(sum, s);
        for (int c = threadIdx.x; c < cols; c += BLOCK) {
#if LOG
            st(yr, c, (float)ld(xr, c) - m - __logf(sum));
#else
            st(yr, c, __expf((float)ld(xr, c) - m) / sum);
#endif
        }
#endif
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK)
softmax_bwd(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int rows, int cols) {
    __shared__ float s[32];
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const long base = (long)r * cols;
        float dot = 0.f;
        for (int c = threadIdx.x; c < cols; c += BLOCK)
#if LOG
            dot += (float)ld(dy, base + c);
#else
            dot += (float)ld(dy, base + c) * (float)ld(y, base + c);
#endif
        dot = block_sum(dot, s);
        for (int c = threadIdx.x; c < cols; c += BLOCK)
#if LOG
            st(dx, base + c, (float)ld(dy, base + c) - __expf((float)ld(y, base + c)) * dot);
#else
            st(dx, base + c, (float)ld(y, base + c) * ((float)ld(dy, base + c) - dot));
#endif
    }
}
"""

SOURCES = {
    "tensor_ops.cu.o": TENSOR_OPS,
    "neuron_elementwise.cu.o": NEURON,
    "reduce_shared.cu.o": REDUCE,
    "gemm_tiled.cu.o": GEMM,
    "conv2d_direct.cu.o": CONV,
    "softmax.cu.o": SOFTMAX,
}

# ----------------------------------------------------------------------------------------
# Specs: which -D options each family is specialised with
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    kernel_name: str      # the "program" (kern_db.kernel_name)
    defines: tuple[tuple[str, int | str], ...]

    @property
    def options(self) -> str:
        """The -D options as a MIOpen-style option string (kern_db.kernel_args stem)."""
        return " ".join(f"-D{k}={v}" for k, v in self.defines)

    def key(self, nvrtc_version: str) -> str:
        h = hashlib.sha256()
        for part in (str(GENERATOR_VERSION), ARCH, nvrtc_version, self.kernel_name, SOURCES[self.kernel_name],
                     self.options):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:24]


def _neuron_specs() -> list[Spec]:
    out = []
    for op, dtype, vec, block, bwd in itertools.product(range(14), (0, 1, 2, 3, 4), (1, 2, 4, 8), (256, 512), (0, 1)):
        out.append(Spec("neuron_elementwise.cu.o", (("OP", op), ("DTYPE", dtype), ("VEC", vec), ("BLOCK", block),
                                                    ("MLO_NEURON_BWD", bwd))))
    return out


def _tensor_specs() -> list[Spec]:
    out = []
    for op, dtype, block, ch in itertools.product(range(6), (0, 1, 2, 3, 4), (128, 256, 512, 1024), (64, 256)):
        if op != 5 and ch != 64:
            continue
        out.append(Spec("tensor_ops.cu.o", (("OP", op), ("DTYPE", dtype), ("BLOCK", block), ("CHANNELS", ch))))
    return out


def _reduce_specs() -> list[Spec]:
    out = []
    for op, dtype, block, shfl, unroll in itertools.product(range(6), (0, 1, 2, 3), (128, 256, 512, 1024), (0, 1),
                                                             (1, 2, 4)):
        out.append(Spec("reduce_shared.cu.o", (("OP", op), ("DTYPE", dtype), ("BLOCK", block), ("USE_SHFL", shfl),
                                               ("UNROLL", unroll))))
    return out


def _gemm_specs() -> list[Spec]:
    out = []
    for bm, bn, bk, tm, tn, ku, ta, tb, dtype, epi in itertools.product(
            (32, 64, 128), (32, 64, 128), (8, 16, 32), (2, 4, 8), (2, 4, 8), (1, 2, 4, 8), (0, 1), (0, 1),
            (0, 1, 2), (0, 1, 2)):
        nt = (bm // tm) * (bn // tn)
        smem = bk * (bm + bn + 2) * (8 if dtype == 1 else 4)
        if not 64 <= nt <= 512 or smem > 40 * 1024 or ku > bk:
            continue
        if tm * tn * bk * (2 if dtype == 1 else 1) > 2048:   # keep ptxas time and spills in check
            continue
        out.append(Spec("gemm_tiled.cu.o", (("BM", bm), ("BN", bn), ("BK", bk), ("TM", tm), ("TN", tn),
                                            ("KUNROLL", ku), ("TRANS_A", ta), ("TRANS_B", tb), ("DTYPE", dtype),
                                            ("BETA_ZERO", int(epi == 0)), ("EPILOGUE", epi), ("PAD", 1))))
    return out


def _conv_specs() -> list[Spec]:
    out = []
    for f, s, owt, ct, grp, dtype, bias, relu in itertools.product(
            (1, 3, 5, 7, 9, 11), (1, 2, 4), (1, 2, 4, 8), (1, 2, 4, 8), (64, 128, 256), (0, 2, 3), (0, 1), (0, 1)):
        work = f * f * owt * ct
        if work > 256 or (s == 4 and f < 5):
            continue
        out.append(Spec("conv2d_direct.cu.o", (
            ("MLO_FILTER_SIZE0", f), ("MLO_FILTER_SIZE1", f), ("MLO_FILTER_STRIDE0", s), ("MLO_FILTER_STRIDE1", s),
            ("MLO_FILTER_PAD0", f // 2), ("MLO_FILTER_PAD1", f // 2), ("MLO_OUT_TILE0", owt),
            ("MLO_N_IN_TILES", ct), ("MLO_GRP_SZ", grp), ("DTYPE", dtype), ("MLO_CONV_BIAS", bias),
            ("MLO_FUSE_RELU", relu))))
    return out


def _softmax_specs() -> list[Spec]:
    out = []
    for cols, block, log, dtype in itertools.product((0, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
                                                     (128, 256, 512, 1024), (0, 1), (0, 2, 3)):
        if cols and cols // block > 32:
            continue
        out.append(Spec("softmax.cu.o", (("COLS", cols), ("BLOCK", block), ("LOG", log), ("DTYPE", dtype))))
    return out


# How many of each family's candidates go into the corpus (a seeded sample of each).
# Small elementwise/reduction/softmax modules are the many, GEMM/conv modules the big ones.
DEFAULT_MIX = {"tensor_ops.cu.o": 50, "neuron_elementwise.cu.o": 80, "reduce_shared.cu.o": 60,
               "softmax.cu.o": 50, "gemm_tiled.cu.o": 100, "conv2d_direct.cu.o": 100}


def all_specs(mix: dict[str, int] | None = None, scale: float = 1.0) -> list[Spec]:
    mix = mix or DEFAULT_MIX
    rng = random.Random(SEED)
    families = {"tensor_ops.cu.o": _tensor_specs(), "neuron_elementwise.cu.o": _neuron_specs(),
                "reduce_shared.cu.o": _reduce_specs(),
                "softmax.cu.o": _softmax_specs(), "gemm_tiled.cu.o": _gemm_specs(),
                "conv2d_direct.cu.o": _conv_specs()}
    chosen = []
    for name, cands in families.items():
        k = min(len(cands), max(1, round(mix[name] * scale)))
        chosen.extend(sorted(rng.sample(cands, k), key=lambda s: s.options))
    return chosen


# ----------------------------------------------------------------------------------------
# NVRTC
# ----------------------------------------------------------------------------------------


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc
    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return f"{major}.{minor}"


def _check(err, what: str, prog=None) -> None:
    from cuda.bindings import nvrtc
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = ""
        if prog is not None:
            e, n = nvrtc.nvrtcGetProgramLogSize(prog)
            if e == nvrtc.nvrtcResult.NVRTC_SUCCESS and n > 1:
                buf = b" " * n
                if nvrtc.nvrtcGetProgramLog(prog, buf)[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS:
                    log = buf.rstrip(b"\0 ").decode(errors="replace")
        raise RuntimeError(f"{what} failed: {err!r}\n{log}")


def compile_cubin(source: str, name: str, options: list[str]) -> bytes:
    """Compile one CUDA C source to an sm_90 cubin with NVRTC; every return code is checked."""
    from cuda.bindings import nvrtc
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={ARCH}".encode(), b"--std=c++17"] + [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _check(err, f"nvrtcCompileProgram({name} {' '.join(options)})", prog)
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize", prog)
        buf = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
        _check(err, "nvrtcGetCUBIN", prog)
    finally:
        (err,) = nvrtc.nvrtcDestroyProgram(prog)
        _check(err, "nvrtcDestroyProgram")
    if buf[:4] != b"\x7fELF":
        raise RuntimeError(f"{name}: NVRTC returned something that is not an ELF cubin")
    return bytes(buf)


def _compile_job(job: tuple[Spec, str]) -> tuple[Spec, bytes, float]:
    spec, _ = job
    t0 = time.perf_counter()
    cubin = compile_cubin(SOURCES[spec.kernel_name], spec.kernel_name.replace(".cu.o", ".cu"),
                          [f"-D{k}={v}" for k, v in spec.defines])
    return spec, cubin, time.perf_counter() - t0


# ----------------------------------------------------------------------------------------
# The corpus
# ----------------------------------------------------------------------------------------


@dataclass
class CorpusEntry:
    kernel_name: str
    options: str
    cubin: bytes


@dataclass
class Corpus:
    entries: list[CorpusEntry]
    info: dict  # provenance and size distribution, for the benchmark's JSON


def build_corpus(corpus_dir: Path = DEFAULT_DIR, jobs: int | None = None, scale: float = 1.0,
                 log=print) -> Corpus:
    """Compile (or load from cache) the corpus; returns distinct cubins and a description."""
    corpus_dir = Path(corpus_dir)
    (corpus_dir / "cubins").mkdir(parents=True, exist_ok=True)
    version = nvrtc_version()
    specs = all_specs(scale=scale)
    keyed = [(s, s.key(version)) for s in specs]
    missing = [(s, k) for s, k in keyed if not (corpus_dir / "cubins" / f"{k}.cubin").is_file()]
    compile_s = 0.0
    t0 = time.perf_counter()
    if missing:
        jobs = jobs or os.cpu_count() or 1
        log(f"compiling {len(missing)} of {len(specs)} cubins with NVRTC {version} on {jobs} processes "
            f"(cache: {corpus_dir}) ...")
        ctx = mp.get_context("spawn")  # NVRTC state is per process; spawn keeps children clean
        done = 0
        with ctx.Pool(jobs) as pool:
            for spec, cubin, dt in pool.imap_unordered(_compile_job, missing, chunksize=1):
                key = spec.key(version)
                tmp = corpus_dir / "cubins" / f".{key}.tmp"
                tmp.write_bytes(cubin)
                os.replace(tmp, corpus_dir / "cubins" / f"{key}.cubin")
                compile_s += dt
                done += 1
                if done % 50 == 0 or done == len(missing):
                    log(f"  {done}/{len(missing)} compiled ({time.perf_counter() - t0:.0f} s)")
    wall = time.perf_counter() - t0
    seen: set[bytes] = set()
    entries: list[CorpusEntry] = []
    dup = 0
    for spec, key in keyed:
        cubin = (corpus_dir / "cubins" / f"{key}.cubin").read_bytes()
        digest = hashlib.sha256(cubin).digest()
        if digest in seen:
            dup += 1
            continue
        seen.add(digest)
        entries.append(CorpusEntry(spec.kernel_name, spec.options, cubin))
    sizes = sorted(len(e.cubin) for e in entries)
    by_family: dict[str, list[int]] = {}
    for e in entries:
        by_family.setdefault(e.kernel_name, []).append(len(e.cubin))

    def pct(xs: list[int], q: float) -> int:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]

    info = {
        "source": ("generated CUDA C kernels (tensor fill/copy/scale/cast ops, elementwise activations fwd/bwd "
                   "in f32/f64/f16/bf16/int8, "
                   "shared-memory reductions, tiled GEMMs, direct 2D convolutions, row softmax) specialised "
                   "with -D options and compiled with NVRTC to real cubins; see scripts/cubin_corpus.py"),
        "compiler": f"NVRTC {version}", "arch": ARCH, "nvrtc_options": f"--gpu-architecture={ARCH} --std=c++17 -D...",
        "specs": len(specs), "distinct_cubins": len(entries), "duplicate_cubins_dropped": dup,
        "compiled_this_run": len(missing), "compile_wall_s": round(wall, 2), "compile_cpu_s": round(compile_s, 2),
        "cache_dir": str(corpus_dir),
        "size_bytes": {"total": sum(sizes), "min": sizes[0], "p10": pct(sizes, .10), "p25": pct(sizes, .25),
                       "median": pct(sizes, .5), "mean": round(sum(sizes) / len(sizes)), "p75": pct(sizes, .75),
                       "p90": pct(sizes, .90), "max": sizes[-1]},
        "by_family": {k: {"count": len(v), "min": min(v), "median": pct(v, .5), "max": max(v), "total": sum(v)}
                      for k, v in by_family.items()},
        "sizes": sizes,
    }
    return Corpus(entries, info)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the default number of specs")
    args = ap.parse_args(argv)
    corpus = build_corpus(args.corpus_dir, args.jobs, args.scale, log=lambda m: print(m, file=sys.stderr))
    info = dict(corpus.info)
    info.pop("sizes")
    json.dump(info, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
