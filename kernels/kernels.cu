// memwall's own GPU kernels.
//
// Compiled to PTX by scripts/build-ptx.sh (nvcc -ptx, compute_90), embedded in
// the Go package kernels and loaded at run time through the driver API. Every
// kernel is extern "C" so its PTX entry name is the plain name below; the Go
// side (kernels.go) resolves exactly these names, and a Go test checks that
// this file defines each of them.
//
// Conventions:
//   - element counts are uint64_t, matrix dimensions uint32_t;
//   - all index arithmetic that can exceed 2^32 is done in 64 bits;
//   - matrices are row-major: W is M x K (a PyTorch Linear weight [out, in]),
//     X is T x K in the weight dtype, Y is T x M float32:
//         Y[t, m] = sum_k W[m, k] * X[t, k]    (float32 accumulation);
//   - 16-bit dtypes travel as raw uint16_t bit patterns and are widened to
//     float32 exactly (bf16: a shift; f16: cvt.f32.f16).

#include <stdint.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>

namespace {

// ---------------------------------------------------------------------------
// Fill / check pattern. The Go function kernels.Pattern is the specification.

__device__ __forceinline__ uint32_t pattern(uint32_t seed, uint64_t i) {
    uint32_t x = ((uint32_t)i * 0x9E3779B1u) ^ seed;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return x;
}

__device__ __forceinline__ uint64_t global_thread() {
    return (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ uint64_t grid_threads() {
    return (uint64_t)gridDim.x * blockDim.x;
}

// ---------------------------------------------------------------------------
// Element conversions.

__device__ __forceinline__ float bf16_to_f32(uint32_t h) {
    return __uint_as_float((h & 0xFFFFu) << 16);
}

__device__ __forceinline__ float f16_to_f32(uint32_t h) {
    float f;
    unsigned short s = (unsigned short)(h & 0xFFFFu);
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
    return f;
}

// Traits per dtype: S is the storage type, kVec the elements in 16 bytes,
// load converts one element, unpack converts one 16-byte vector.
struct F32 {
    typedef float S;
    static const int kVec = 4;
    static __device__ __forceinline__ float load(const S* p) { return __ldg(p); }
    static __device__ __forceinline__ void unpack(uint4 v, float* out) {
        out[0] = __uint_as_float(v.x);
        out[1] = __uint_as_float(v.y);
        out[2] = __uint_as_float(v.z);
        out[3] = __uint_as_float(v.w);
    }
};

struct BF16 {
    typedef uint16_t S;
    static const int kVec = 8;
    static __device__ __forceinline__ float load(const S* p) { return bf16_to_f32(__ldg(p)); }
    static __device__ __forceinline__ void unpack(uint4 v, float* out) {
        // Little-endian: the low half of each word is the earlier element.
        out[0] = __uint_as_float(v.x << 16);
        out[1] = __uint_as_float(v.x & 0xFFFF0000u);
        out[2] = __uint_as_float(v.y << 16);
        out[3] = __uint_as_float(v.y & 0xFFFF0000u);
        out[4] = __uint_as_float(v.z << 16);
        out[5] = __uint_as_float(v.z & 0xFFFF0000u);
        out[6] = __uint_as_float(v.w << 16);
        out[7] = __uint_as_float(v.w & 0xFFFF0000u);
    }
};

struct F16 {
    typedef uint16_t S;
    static const int kVec = 8;
    static __device__ __forceinline__ float load(const S* p) { return f16_to_f32(__ldg(p)); }
    static __device__ __forceinline__ void unpack(uint4 v, float* out) {
        out[0] = f16_to_f32(v.x);
        out[1] = f16_to_f32(v.x >> 16);
        out[2] = f16_to_f32(v.y);
        out[3] = f16_to_f32(v.y >> 16);
        out[4] = f16_to_f32(v.z);
        out[5] = f16_to_f32(v.z >> 16);
        out[6] = f16_to_f32(v.w);
        out[7] = f16_to_f32(v.w >> 16);
    }
};

__device__ __forceinline__ bool aligned16(const void* p) {
    return ((uintptr_t)p & 15u) == 0;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, off);
    return v;
}

// ---------------------------------------------------------------------------
// GEMV: T <= kGemvMaxT tokens. One warp per weight row m; the warp streams
// the row once (16-byte loads when K and the pointers allow) and multiplies
// it with every token row of X, which stays hot in L1/L2.

const int kGemvMaxT = 8;

template <class Tr>
__device__ __forceinline__ void gemv_vec_step(uint4 wv, const typename Tr::S* X, uint64_t c,
                                              uint32_t K, uint32_t T, float* acc) {
    float wf[Tr::kVec];
    Tr::unpack(wv, wf);
#pragma unroll
    for (int t = 0; t < kGemvMaxT; ++t) {
        if (t < (int)T) {
            const uint4* xr = reinterpret_cast<const uint4*>(X + (uint64_t)t * K);
            float xf[Tr::kVec];
            Tr::unpack(__ldg(xr + c), xf);
#pragma unroll
            for (int j = 0; j < Tr::kVec; ++j) acc[t] = fmaf(wf[j], xf[j], acc[t]);
        }
    }
}

template <class Tr>
__device__ __forceinline__ void gemv(const typename Tr::S* __restrict__ W,
                                     const typename Tr::S* __restrict__ X, float* __restrict__ Y,
                                     uint32_t M, uint32_t K, uint32_t T) {
    const uint32_t lane = threadIdx.x & 31u;
    const uint64_t m = (uint64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (m >= M) return;  // whole warp leaves together; no block barrier follows
    if (T > (uint32_t)kGemvMaxT) T = kGemvMaxT;  // the launcher never asks for more

    float acc[kGemvMaxT];
#pragma unroll
    for (int t = 0; t < kGemvMaxT; ++t) acc[t] = 0.0f;

    const typename Tr::S* w = W + m * K;
    if (K % Tr::kVec == 0 && aligned16(W) && aligned16(X)) {
        const uint64_t nvec = K / Tr::kVec;
        const uint4* w4 = reinterpret_cast<const uint4*>(w);
        uint64_t c = lane;
        // Four independent 16-byte weight loads in flight per lane.
        for (; c + 96 < nvec; c += 128) {
            uint4 w0 = __ldg(w4 + c);
            uint4 w1 = __ldg(w4 + c + 32);
            uint4 w2 = __ldg(w4 + c + 64);
            uint4 w3 = __ldg(w4 + c + 96);
            gemv_vec_step<Tr>(w0, X, c, K, T, acc);
            gemv_vec_step<Tr>(w1, X, c + 32, K, T, acc);
            gemv_vec_step<Tr>(w2, X, c + 64, K, T, acc);
            gemv_vec_step<Tr>(w3, X, c + 96, K, T, acc);
        }
        for (; c < nvec; c += 32) gemv_vec_step<Tr>(__ldg(w4 + c), X, c, K, T, acc);
    } else {
        for (uint32_t k = lane; k < K; k += 32) {
            const float wk = Tr::load(w + k);
#pragma unroll
            for (int t = 0; t < kGemvMaxT; ++t) {
                if (t < (int)T) acc[t] = fmaf(wk, Tr::load(X + (uint64_t)t * K + k), acc[t]);
            }
        }
    }

#pragma unroll
    for (int t = 0; t < kGemvMaxT; ++t) {
        if (t < (int)T) {
            const float v = warp_sum(acc[t]);
            if (lane == 0) Y[(uint64_t)t * M + m] = v;
        }
    }
}

// ---------------------------------------------------------------------------
// GEMM, CUDA cores (f32): 64x64 output tile (tokens x rows) per 256-thread
// block, 16-deep K slices staged transposed in shared memory, 4x4 outputs
// per thread.

const int kSimtTile = 64;
const int kSimtK = 16;
const int kSimtThreads = 256;

template <class Tr>
__device__ __forceinline__ void gemm_simt(const typename Tr::S* __restrict__ W,
                                          const typename Tr::S* __restrict__ X,
                                          float* __restrict__ Y, uint32_t M, uint32_t K,
                                          uint32_t T) {
    __shared__ float xs[kSimtK][kSimtTile + 4];  // xs[k][t]
    __shared__ float ws[kSimtK][kSimtTile + 4];  // ws[k][m]

    const int tid = threadIdx.x;
    const int tx = tid % 16;  // output columns (m) tx + 16*j
    const int ty = tid / 16;  // output rows (t) ty + 16*i
    const uint64_t t0 = (uint64_t)blockIdx.y * kSimtTile;
    const uint64_t m0 = (uint64_t)blockIdx.x * kSimtTile;

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (uint64_t k0 = 0; k0 < K; k0 += kSimtK) {
        // 64 rows x 16 k of each operand: 1024 elements, 4 per thread;
        // consecutive threads read consecutive k (coalesced 16-element runs).
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const int e = tid + l * kSimtThreads;
            const int r = e / kSimtK;
            const int kk = e % kSimtK;
            const uint64_t k = k0 + kk;
            const uint64_t t = t0 + r;
            const uint64_t m = m0 + r;
            xs[kk][r] = (t < T && k < K) ? Tr::load(X + t * K + k) : 0.0f;
            ws[kk][r] = (m < M && k < K) ? Tr::load(W + m * K + k) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kSimtK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint64_t t = t0 + ty + 16 * i;
        if (t >= T) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint64_t m = m0 + tx + 16 * j;
            if (m < M) Y[t * M + m] = acc[i][j];
        }
    }
}

// ---------------------------------------------------------------------------
// GEMM, tensor cores (bf16, f16): WMMA 16x16x16 fragments, f32 accumulators.
// A block of 8 warps computes a 128x128 output tile (tokens x rows); warp w
// owns tokens 64*(w/4).. and rows 32*(w%4).., i.e. 4x2 fragments. K advances
// in 32-deep slices, double-buffered in shared memory with cp.async when K
// is a multiple of 8 and the pointers are 16-byte aligned, else with plain
// guarded loads. Out-of-range rows and columns are zero-filled; the epilogue
// stages each fragment through shared memory and writes only valid outputs.

const int kMmaTile = 128;
const int kMmaK = 32;
const int kMmaLd = kMmaK + 8;  // padded row (halves): 80 bytes, keeps 16-byte alignment
const int kMmaThreads = 256;
const int kMmaStageHalves = kMmaTile * kMmaLd;          // one operand, one stage
const int kMmaSmemBytes = 2 * 2 * kMmaStageHalves * 2;  // 2 operands x 2 stages

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
                 "l"(gmem), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Loads rows [r0, r0+128) x k [k0, k0+32) of a rows x K matrix into a
// 128 x kMmaLd shared tile, zero-filling outside the matrix.
__device__ __forceinline__ void mma_load_tile(uint16_t* dst, const uint16_t* __restrict__ src,
                                              uint64_t r0, uint32_t rows, uint64_t k0, uint32_t K,
                                              bool vec) {
    const int tid = threadIdx.x;
    // 128 rows x 4 chunks of 8 halves = 512 chunks, 2 per thread.
#pragma unroll
    for (int l = 0; l < 2; ++l) {
        const int c = tid + l * kMmaThreads;
        const int r = c >> 2;
        const int kc = (c & 3) * 8;
        const uint64_t row = r0 + r;
        const uint64_t k = k0 + kc;
        uint16_t* d = dst + r * kMmaLd + kc;
        if (vec) {
            const bool ok = row < rows && k < K;  // K % 8 == 0: a chunk is all in or all out
            cp_async16(d, ok ? (const void*)(src + row * K + k) : (const void*)src, ok ? 16u : 0u);
        } else {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                d[j] = (row < rows && k + j < K) ? src[row * K + k + j] : (uint16_t)0;
            }
        }
    }
}

template <typename H>
__device__ __forceinline__ void gemm_wmma(const uint16_t* __restrict__ W,
                                          const uint16_t* __restrict__ X, float* __restrict__ Y,
                                          uint32_t M, uint32_t K, uint32_t T) {
    using namespace nvcuda;
    __shared__ __align__(128) unsigned char smem[kMmaSmemBytes];
    uint16_t* xs = reinterpret_cast<uint16_t*>(smem);  // [2][128][kMmaLd]
    uint16_t* ws = xs + 2 * kMmaStageHalves;             // [2][128][kMmaLd]

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int wt = (warp >> 2) * 64;  // warp's first token within the tile
    const int wm = (warp & 3) * 32;   // warp's first row within the tile
    const uint64_t t0 = (uint64_t)blockIdx.y * kMmaTile;
    const uint64_t m0 = (uint64_t)blockIdx.x * kMmaTile;
    const bool vec = (K % 8 == 0) && aligned16(W) && aligned16(X);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    const uint64_t nk = ((uint64_t)K + kMmaK - 1) / kMmaK;
    if (nk > 0) {
        mma_load_tile(xs, X, t0, T, 0, K, vec);
        mma_load_tile(ws, W, m0, M, 0, K, vec);
        cp_async_commit();
    }
    for (uint64_t kt = 0; kt < nk; ++kt) {
        const int cur = (int)(kt & 1);
        if (kt + 1 < nk) {
            const int nxt = cur ^ 1;
            mma_load_tile(xs + nxt * kMmaStageHalves, X, t0, T, (kt + 1) * kMmaK, K, vec);
            mma_load_tile(ws + nxt * kMmaStageHalves, W, m0, M, (kt + 1) * kMmaK, K, vec);
            cp_async_commit();
            cp_async_wait<1>();  // the current stage has landed
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();

        const H* xa = reinterpret_cast<const H*>(xs + cur * kMmaStageHalves);
        const H* wb = reinterpret_cast<const H*>(ws + cur * kMmaStageHalves);
#pragma unroll
        for (int kk = 0; kk < kMmaK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, H, wmma::row_major> a[4];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, H, wmma::col_major> b[2];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                wmma::load_matrix_sync(a[i], xa + (wt + 16 * i) * kMmaLd + kk, kMmaLd);
#pragma unroll
            for (int j = 0; j < 2; ++j)
                wmma::load_matrix_sync(b[j], wb + (wm + 16 * j) * kMmaLd + kk, kMmaLd);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();  // the stage may be overwritten by the next prefetch
    }

    // Epilogue: each warp stages one 16x16 fragment at a time in its own
    // 1 KiB slice of the (now idle) shared buffer, then writes valid outputs.
    float* stage = reinterpret_cast<float*>(smem) + warp * 256;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
#pragma unroll
            for (int e = lane; e < 256; e += 32) {
                const uint64_t t = t0 + wt + 16 * i + (e >> 4);
                const uint64_t m = m0 + wm + 16 * j + (e & 15);
                if (t < T && m < M) Y[t * M + m] = stage[e];
            }
            __syncwarp();
        }
    }
}

}  // namespace

// ---------------------------------------------------------------------------
// Entry points.

// dst[i] = pattern(seed, i) for i < n. Any grid; grid-stride loop.
extern "C" __global__ void memwall_fill_u32(uint32_t* dst, uint64_t n, uint32_t seed) {
    const uint64_t stride = grid_threads();
    for (uint64_t i = global_thread(); i < n; i += stride) dst[i] = pattern(seed, i);
}

// *mismatches += number of i < n with src[i] != pattern(seed, i). Any grid
// with blockDim.x a multiple of 32 and at most 1024; one atomic per block
// that found a mismatch.
extern "C" __global__ void memwall_check_u32(const uint32_t* src, uint64_t n, uint32_t seed,
                                             unsigned long long* mismatches) {
    __shared__ unsigned long long warp_counts[32];
    const uint64_t stride = grid_threads();
    unsigned long long bad = 0;
    for (uint64_t i = global_thread(); i < n; i += stride) bad += (src[i] != pattern(seed, i));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) bad += __shfl_down_sync(0xFFFFFFFFu, bad, off);
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    if (lane == 0) warp_counts[warp] = bad;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long total = 0;
        const int nwarps = (blockDim.x + 31) >> 5;
        for (int w = 0; w < nwarps; ++w) total += warp_counts[w];
        if (total != 0) atomicAdd(mismatches, total);
    }
}

// One thread spins until the global timer has advanced by nanoseconds.
extern "C" __global__ void memwall_spin(uint64_t nanoseconds) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    uint64_t start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(256);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanoseconds);
}

// Y[t, m] = sum_k W[m, k] * X[t, k] for T <= 8: block of 256 threads, one
// warp per row m, grid.x = ceil(M / 8).
extern "C" __global__ void __launch_bounds__(256) memwall_gemv_f32(
    const float* W, const float* X, float* Y, uint32_t M, uint32_t K, uint32_t T) {
    gemv<F32>(W, X, Y, M, K, T);
}

extern "C" __global__ void __launch_bounds__(256) memwall_gemv_bf16(
    const uint16_t* W, const uint16_t* X, float* Y, uint32_t M, uint32_t K, uint32_t T) {
    gemv<BF16>(W, X, Y, M, K, T);
}

extern "C" __global__ void __launch_bounds__(256) memwall_gemv_f16(
    const uint16_t* W, const uint16_t* X, float* Y, uint32_t M, uint32_t K, uint32_t T) {
    gemv<F16>(W, X, Y, M, K, T);
}

// Same product for any T: block of 256 threads; f32 uses 64x64 tiles
// (grid ceil(M/64) x ceil(T/64)), bf16 and f16 128x128 tiles
// (grid ceil(M/128) x ceil(T/128)).
extern "C" __global__ void __launch_bounds__(256) memwall_gemm_f32(
    const float* W, const float* X, float* Y, uint32_t M, uint32_t K, uint32_t T) {
    gemm_simt<F32>(W, X, Y, M, K, T);
}

extern "C" __global__ void __launch_bounds__(256) memwall_gemm_bf16(
    const uint16_t* W, const uint16_t* X, float* Y, uint32_t M, uint32_t K, uint32_t T) {
    gemm_wmma<__nv_bfloat16>(W, X, Y, M, K, T);
}

extern "C" __global__ void __launch_bounds__(256) memwall_gemm_f16(
    const uint16_t* W, const uint16_t* X, float* Y, uint32_t M, uint32_t K, uint32_t T) {
    gemm_wmma<__half>(W, X, Y, M, K, T);
}
