/* gemm_wgmma.cu: the Hopper GEMM (sm_90a wgmma), fp16 or bf16 in, fp32 accumulation.
 *
 * C = alpha * A B^T + beta * C for row-major A (M x K) and Bt (N x K): both operands K-major,
 * the layout wgmma reads from shared memory without transposing. A problem whose B is K x N
 * (not transposed) gets it transposed first into the solver's workspace (gemm_transpose).
 * Built only for sm_90 GPUs, with --gpu-architecture=sm_90a (wgmma exists nowhere else).
 *
 * Options: -DKDB_TYPE_FP16 or -DKDB_TYPE_BF16 (required), --gpu-architecture=sm_90a.
 * Launch (gemm_wgmma): blocks of 256 threads (two warpgroups, each 64 rows of the block's
 * 128 x 128 tile of C), grid (N / 128, M / 128, batch), taken in groups of 8 tile rows;
 * M, N multiples of 128, K of 64, lda, ldbt, ldc of 8, every matrix 16-byte aligned;
 * 6 * 32 KiB + 1 KiB of dynamic shared memory: 6 buffers of A's and Bt's 128 x 64 tiles,
 * each row of 128 bytes stored with the 128-byte swizzle (16-byte chunk c of row r at chunk
 * c ^ (r % 8)), filled by 16-byte cp.async.
 * Launch (gemm_transpose): blocks of 32 x 8 threads, grid (N / 32, K / 32, batch).
 */
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)
#error "gemm_wgmma.cu is CUDA only"
#endif

#include "tc_types.h"

#define WG_MMA "wgmma.mma_async.sync.aligned.m64n128k16.f32." TC_TYPE "." TC_TYPE

#define WG_BM 128
#define WG_BN 128
#define WG_BK 64
#define WG_STAGES 6
#define WG_AHEAD (WG_STAGES - 2) /* copies ahead: two buffers are being read */
#define WG_TILE_BYTES (128 * 128) /* 128 rows of 64 halves */
#define WG_GROUP_M 8

__device__ __forceinline__ unsigned int wg_smem(const void* p) { return (unsigned int)__cvta_generic_to_shared(p); }

/* A K-major operand in shared memory with the 128-byte swizzle: start address, leading byte
 * offset unused (1), 1024 bytes between groups of 8 rows, swizzle mode 1. */
__device__ __forceinline__ unsigned long long wg_descriptor(unsigned int address)
{
    return (unsigned long long)((address & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}

__device__ __forceinline__ void wg_mma(float* d, unsigned long long a, unsigned long long b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" WG_MMA " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(a), "l"(b), "r"(1)); /* scale-d 1: D += A B */
}

extern "C" __global__ void __launch_bounds__(256)
gemm_wgmma(const unsigned short* A, const unsigned short* Bt, unsigned short* C, int M, int N, int K, int lda, int ldbt,
           int ldc, long stride_a, long stride_bt, long stride_c, float alpha, float beta)
{
    extern __shared__ __align__(16) unsigned char wg_raw[];
    /* Swizzled tiles must start on 1024 bytes: the launch asks for 1 KiB more than the tiles. */
    const unsigned int raw = wg_smem(wg_raw), base = (raw + 1023u) & ~1023u;
    unsigned char* tiles = wg_raw + (base - raw);
    const int tiles_m = gridDim.y, tiles_n = gridDim.x, id = blockIdx.y * tiles_n + blockIdx.x;
    const int first_m = (id / (WG_GROUP_M * tiles_n)) * WG_GROUP_M;
    const int rows_here = min(tiles_m - first_m, WG_GROUP_M);
    const int tile_m = first_m + (id % rows_here), tile_n = (id % (WG_GROUP_M * tiles_n)) / rows_here;
    const unsigned short* a = A + blockIdx.z * stride_a + (long)tile_m * WG_BM * lda;
    const unsigned short* b = Bt + blockIdx.z * stride_bt + (long)tile_n * WG_BN * ldbt;
    unsigned short* c = C + blockIdx.z * stride_c;
    const int t = threadIdx.x, warpgroup = t / 128, warp = (t % 128) / 32, lane = t % 32;

    /* Each thread copies 4 of A's and 4 of Bt's 1024 16-byte chunks per stage. */
    auto stage = [&](int buf, int k0) {
        unsigned char* as = tiles + buf * 2 * WG_TILE_BYTES;
        unsigned char* bs = as + WG_TILE_BYTES;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int chunk = t + q * 256, r = chunk / 8, col = chunk % 8;
            const unsigned int at = r * 128 + ((col ^ (r & 7)) << 4);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(wg_smem(as + at)),
                         "l"(a + (long)r * lda + k0 + col * 8));
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(wg_smem(bs + at)),
                         "l"(b + (long)r * ldbt + k0 + col * 8));
        }
    };

    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i)
        d[i] = 0.0f;
    /* Copies run WG_AHEAD steps ahead; one step's multiplies stay in flight while the next
     * step's are issued, so the buffer a copy refills is the one read two steps back. */
    const int steps = K / WG_BK;
    for (int s = 0; s < WG_AHEAD; ++s) {
        if (s < steps)
            stage(s, s * WG_BK);
        asm volatile("cp.async.commit_group;");
    }
    for (int step = 0; step < steps; ++step) {
        asm volatile("cp.async.wait_group %0;" ::"n"(WG_AHEAD - 1));
        /* cp.async wrote through the generic proxy; wgmma reads through the async one. */
        asm volatile("fence.proxy.async.shared::cta;");
        __syncthreads(); /* every warpgroup's step - 2 multiplies are done (wait_group 1 below) */
        const int next = step + WG_AHEAD;
        if (next < steps)
            stage(next % WG_STAGES, next * WG_BK);
        asm volatile("cp.async.commit_group;");
        const unsigned int as = base + (step % WG_STAGES) * 2 * WG_TILE_BYTES;
        const unsigned long long da = wg_descriptor(as + warpgroup * 64 * 128);
        const unsigned long long db = wg_descriptor(as + WG_TILE_BYTES);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; ++kk)
            wg_mma(d, da + 2 * kk, db + 2 * kk); /* 16 halves on: 32 bytes, 2 in the descriptor's units */
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    asm volatile("cp.async.wait_group 0;");
    /* d[4j + 0..3]: rows r and r + 8, columns 8j + 2 * (lane % 4) and the next. */
    const int r0 = tile_m * WG_BM + warpgroup * 64 + warp * 16 + lane / 4, c0 = tile_n * WG_BN + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const long o = (long)(r0 + 8 * half) * ldc + c0 + 8 * j;
            float v0 = alpha * d[4 * j + 2 * half], v1 = alpha * d[4 * j + 2 * half + 1];
            if (beta != 0.0f) {
                v0 += beta * tc_to_float(c[o]);
                v1 += beta * tc_to_float(c[o + 1]);
            }
            *(unsigned int*)(c + o) = (unsigned int)tc_from_float(v0) | ((unsigned int)tc_from_float(v1) << 16);
        }
}

/* Bt[n][k] = B[k][n] per batch, through 32 x 32 tiles in shared memory. */
extern "C" __global__ void __launch_bounds__(256)
gemm_transpose(const unsigned short* B, unsigned short* Bt, int K, int N, int ldb, long stride_b)
{
    __shared__ unsigned short tile[32][33];
    const unsigned short* src = B + blockIdx.z * stride_b;
    unsigned short* dst = Bt + (long)blockIdx.z * N * K;
    const int k0 = blockIdx.y * 32, n0 = blockIdx.x * 32;
#pragma unroll
    for (int i = threadIdx.y; i < 32; i += 8)
        tile[i][threadIdx.x] = src[(long)(k0 + i) * ldb + n0 + threadIdx.x];
    __syncthreads();
#pragma unroll
    for (int i = threadIdx.y; i < 32; i += 8)
        dst[(long)(n0 + i) * K + k0 + threadIdx.x] = tile[threadIdx.x][i];
}
