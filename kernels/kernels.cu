// memwall's own GPU kernels.
//
// Compiled to PTX three times by scripts/build-ptx.sh: for compute_90
// (compute_80's code plus programmatic dependent launch: see pdl_enter), for
// compute_80 (bf16/f16 tensor cores through WMMA, cp.async) and for
// compute_70 (no bf16 hardware: bf16 is bit manipulation everywhere, and
// every GEMM runs on CUDA cores). All are embedded in the Go package
// kernels, which loads the newest one the GPU can run through the driver
// API. Every
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

// MEMWALL_SM80: tensor-core GEMM and cp.async are available (compute_80+).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MEMWALL_SM80 1
#else
#define MEMWALL_SM80 0
#endif

// MEMWALL_SM90: programmatic dependent launch (griddepcontrol, compute_90+).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MEMWALL_SM90 1
#else
#define MEMWALL_SM90 0
#endif

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

// ---------------------------------------------------------------------------
// Programmatic dependent launch (compute_90 module only; no-ops elsewhere).
// The Go side may launch any kernel of the compute_90 module so that it
// starts while the previous kernel on the stream still runs. So every
// kernel begins with pdl_enter: griddepcontrol.wait (return once every
// prerequisite grid has completed and its memory operations are visible),
// then griddepcontrol.launch_dependents (the next kernel's blocks may be
// scheduled once every block of this grid has issued it or exited; issuing
// it after the wait keeps the lookahead to one kernel). Nothing before the
// wait reads memory another kernel writes or writes any memory; launched
// without the attribute, both instructions return at once.

__device__ __forceinline__ void pdl_enter() {
#if MEMWALL_SM90
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Prefetches into L2 the 128-byte lines that hold the first
// min(bytes, cap & 0x1FFFFFFF) bytes at p, spread over the block's threads
// (bit 31 of cap: with the evict_last policy). A hint only: nothing lands
// in registers or L1, and L2 is the GPU's point of coherence, so it is
// correct whatever wrote the bytes and whenever; every line it touches holds
// a byte of the range, so it stays inside the allocation's pages.
__device__ __forceinline__ void prefetch_l2(const void* p, uint64_t bytes, uint32_t cap) {
#if MEMWALL_SM90
    bytes = min(bytes, (uint64_t)(cap & 0x1FFFFFFFu));
    if (bytes == 0) return;
    const bool last = (cap >> 31) != 0;
    const uint64_t end = (uint64_t)(uintptr_t)p + bytes;
    for (uint64_t l = ((uint64_t)(uintptr_t)p & ~(uint64_t)127) + 128 * (uint64_t)threadIdx.x; l < end;
         l += 128 * (uint64_t)blockDim.x) {
        if (last)
            asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; prefetch.global.L2::evict_last [g]; }" ::"l"(l));
        else
            asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; prefetch.global.L2 [g]; }" ::"l"(l));
    }
#else
    (void)p, (void)bytes, (void)cap;
#endif
}

// The GEMV prologue: prefetch up to pf bytes of the block's rows
// [r0, min(r0 + n, M)) of the row-major W (rowBytes per row) into L2 (W is
// read-only to the product, so this may run before the wait), then
// pdl_enter. Bit 30 of pf issues launch_dependents first instead (the next
// kernel may be scheduled before this one's wait returns: a deeper
// lookahead, for the sweep to compare; a second launch_dependents is a
// no-op). Bit 29 spreads the bytes over the rows instead: the first
// pf/rows bytes of each row, where each warp's first loads go.
__device__ __forceinline__ void gemv_enter(const void* W, uint64_t rowBytes, uint32_t M, uint64_t r0, uint64_t n,
                                           uint32_t pf) {
#if MEMWALL_SM90
    if (pf & 0x40000000u) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (r0 < M) {
        const uint64_t rows = min(r0 + n, (uint64_t)M) - r0;
        const char* base = static_cast<const char*>(W) + r0 * rowBytes;
        if (pf & 0x20000000u) {
            const uint64_t per = min(rowBytes, (uint64_t)(pf & 0x1FFFFFFFu) / rows);
            const uint64_t lines = (per + 127) / 128 + 1;  // a row's range may straddle one more line
            for (uint64_t i = threadIdx.x; per > 0 && i < rows * lines; i += blockDim.x) {
                const uint64_t r = i / lines, a = (uint64_t)(uintptr_t)(base + r * rowBytes);
                const uint64_t l = (a & ~(uint64_t)127) + 128 * (i % lines);
                if (l < a + per) {
                    if (pf >> 31)
                        asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; prefetch.global.L2::evict_last [g]; }" ::"l"(l));
                    else
                        asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; prefetch.global.L2 [g]; }" ::"l"(l));
                }
            }
        } else {
            prefetch_l2(base, rows * rowBytes, pf);
        }
    }
#else
    (void)W, (void)rowBytes, (void)M, (void)r0, (void)n, (void)pf;
#endif
    pdl_enter();
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
// GEMV: T <= kGemvMaxT tokens, the decode path: it must stream W at HBM
// speed. Each warp owns R consecutive rows of W (a block of 8 warps: 8R
// rows): memwall_gemv1_* (T = 1) has R = 1 and few registers, so more warps
// keep more bytes in flight; memwall_gemv_* (T <= 8) has R = 2, so X is
// loaded once per two rows. Lane l reads 16-byte vectors l,
// l+32, ... of each row with loads that bypass L1 (W is read once), eight
// of them in flight before the first is used, and multiplies them with the
// same vector of every token row of X (read through L1, where X stays hot).

const int kGemvMaxT = 8;


__device__ __forceinline__ uint4 ld_stream16(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

template <class Tr, int R, int MAXT>
__device__ __forceinline__ void gemv_vec_step(const uint4 (&wv)[R], const typename Tr::S* X,
                                              uint64_t c, uint32_t K, uint32_t T,
                                              float (&acc)[R][MAXT]) {
    float wf[R][Tr::kVec];
#pragma unroll
    for (int r = 0; r < R; ++r) Tr::unpack(wv[r], wf[r]);
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        if (t < (int)T) {
            const uint4* xr = reinterpret_cast<const uint4*>(X + (uint64_t)t * K);
            float xf[Tr::kVec];
            Tr::unpack(__ldg(xr + c), xf);
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int j = 0; j < Tr::kVec; ++j) acc[r][t] = fmaf(wf[r][j], xf[j], acc[r][t]);
        }
    }
}

template <class Tr, int R, int MAXT>
__device__ __forceinline__ void gemv_at(const typename Tr::S* __restrict__ W,
                                        const typename Tr::S* __restrict__ X, float* __restrict__ Y,
                                        uint32_t M, uint32_t K, uint32_t T, uint64_t m0) {
    const uint32_t lane = threadIdx.x & 31u;
    if (m0 >= M) return;  // whole warp leaves together; no block barrier follows
    if (T > (uint32_t)MAXT) T = MAXT;  // the launcher never asks for more
    // Rows past M repeat the last row (valid memory) and are not written.
    uint64_t rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = min(m0 + r, (uint64_t)M - 1);

    float acc[R][MAXT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < MAXT; ++t) acc[r][t] = 0.0f;

    if (K % Tr::kVec == 0 && aligned16(W) && aligned16(X)) {
        const uint64_t nvec = K / Tr::kVec;
        const uint4* w4[R];
#pragma unroll
        for (int r = 0; r < R; ++r) w4[r] = reinterpret_cast<const uint4*>(W + rows[r] * K);
        uint64_t c = lane;
        // U vectors of each row (eight 16-byte loads) in flight per lane.
        constexpr int U = 8 / R;
        for (; c + 32 * (U - 1) < nvec; c += 32 * U) {
            uint4 v[U][R];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int r = 0; r < R; ++r) v[u][r] = ld_stream16(w4[r] + c + 32 * u);
#pragma unroll
            for (int u = 0; u < U; ++u) gemv_vec_step<Tr, R, MAXT>(v[u], X, c + 32 * u, K, T, acc);
        }
        for (; c < nvec; c += 32) {
            uint4 v[R];
#pragma unroll
            for (int r = 0; r < R; ++r) v[r] = ld_stream16(w4[r] + c);
            gemv_vec_step<Tr, R, MAXT>(v, X, c, K, T, acc);
        }
    } else {
        for (uint32_t k = lane; k < K; k += 32) {
            float wk[R];
#pragma unroll
            for (int r = 0; r < R; ++r) wk[r] = Tr::load(W + rows[r] * K + k);
#pragma unroll
            for (int t = 0; t < MAXT; ++t) {
                if (t < (int)T) {
                    const float xk = Tr::load(X + (uint64_t)t * K + k);
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[r][t] = fmaf(wk[r], xk, acc[r][t]);
                }
            }
        }
    }

#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        if (t < (int)T) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float v = warp_sum(acc[r][t]);
                if (lane == 0 && m0 + r < M) Y[(uint64_t)t * M + m0 + r] = v;
            }
        }
    }
}

// gemv_at for the R rows of this warp: warp w of the grid takes rows
// w·R .. w·R+R-1 (grid ceil(M / (8R)) blocks of 8 warps).
template <class Tr, int R, int MAXT>
__device__ __forceinline__ void gemv(const typename Tr::S* __restrict__ W,
                                     const typename Tr::S* __restrict__ X, float* __restrict__ Y,
                                     uint32_t M, uint32_t K, uint32_t T) {
    const uint64_t w = (uint64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    gemv_at<Tr, R, MAXT>(W, X, Y, M, K, T, w * R);
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
                                          uint32_t T, uint64_t t0, uint64_t m0) {
    __shared__ float xs[kSimtK][kSimtTile + 4];  // xs[k][t]
    __shared__ float ws[kSimtK][kSimtTile + 4];  // ws[k][m]

    const int tid = threadIdx.x;
    const int tx = tid % 16;  // output columns (m) tx + 16*j
    const int ty = tid / 16;  // output rows (t) ty + 16*i

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

// The 128x128 tile of the 16-bit GEMM launch on CUDA cores (compute_70):
// four 64x64 sub-tiles, one after another.
template <class Tr>
__device__ __forceinline__ void gemm_simt_128(const typename Tr::S* __restrict__ W,
                                              const typename Tr::S* __restrict__ X,
                                              float* __restrict__ Y, uint32_t M, uint32_t K,
                                              uint32_t T) {
    for (int sub = 0; sub < 4; ++sub) {
        const uint64_t t0 = (uint64_t)blockIdx.y * 128 + (sub >> 1) * kSimtTile;
        const uint64_t m0 = (uint64_t)blockIdx.x * 128 + (sub & 1) * kSimtTile;
        if (t0 < T && m0 < M) gemm_simt<Tr>(W, X, Y, M, K, T, t0, m0);  // uniform per block
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

#if MEMWALL_SM80
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

#endif  // MEMWALL_SM80

#if MEMWALL_SM80
// Single-token GEMV with the weight rows streamed through shared memory by
// cp.async (compute_80): each lane keeps kGemv1Stages 16-byte vectors of its
// warp's row in flight without holding registers for them, so a warp has
// the whole pipeline's bytes outstanding while it multiplies the vector that
// landed. Lane l owns slot l of every stage (it reads only what it copied,
// so no barrier is needed); grid and result as gemv<Tr, 1, 1>.
const int kGemv1Stages = 8;

// Block blk of the product (rows 8·blk .. 8·blk+7).
template <class Tr>
__device__ __forceinline__ void gemv1_async_at(const typename Tr::S* __restrict__ W,
                                               const typename Tr::S* __restrict__ X,
                                               float* __restrict__ Y, uint32_t M, uint32_t K, uint64_t blk) {
    __shared__ __align__(16) uint4 ring[8][kGemv1Stages][32];  // [warp][stage][lane]: 32 KiB
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    if (K % Tr::kVec != 0 || !aligned16(W) || !aligned16(X) || blockDim.x != 256) {
        gemv_at<Tr, 1, 1>(W, X, Y, M, K, 1, blk * 8 + warp);
        return;
    }
    const uint64_t m = blk * 8 + warp;
    if (m >= M) return;
    const uint64_t nvec = K / Tr::kVec;
    const uint4* w4 = reinterpret_cast<const uint4*>(W + m * K);
    const uint4* x4 = reinterpret_cast<const uint4*>(X);
#pragma unroll
    for (int st = 0; st < kGemv1Stages; ++st) {
        const uint64_t c = lane + 32u * st;
        if (c < nvec) cp_async16(&ring[warp][st][lane], w4 + c, 16);
        cp_async_commit();  // one group per stage, empty or not
    }
    float acc = 0.0f;
    for (uint64_t i = 0, c = lane; c < nvec; ++i, c += 32) {
        cp_async_wait<kGemv1Stages - 1>();  // the group of vector c has landed
        const int st = (int)(i % kGemv1Stages);
        float wf[Tr::kVec], xf[Tr::kVec];
        Tr::unpack(ring[warp][st][lane], wf);
        Tr::unpack(__ldg(x4 + c), xf);
#pragma unroll
        for (int j = 0; j < Tr::kVec; ++j) acc = fmaf(wf[j], xf[j], acc);
        // The slot's value is used above, so its next copy cannot overtake the read.
        const uint64_t cn = c + 32u * kGemv1Stages;
        if (cn < nvec) cp_async16(&ring[warp][st][lane], w4 + cn, 16);
        cp_async_commit();
    }
    cp_async_wait<0>();
    acc = warp_sum(acc);
    if (lane == 0) Y[m] = acc;
}

template <class Tr>
__device__ __forceinline__ void gemv1_async(const typename Tr::S* __restrict__ W,
                                            const typename Tr::S* __restrict__ X,
                                            float* __restrict__ Y, uint32_t M, uint32_t K) {
    gemv1_async_at<Tr>(W, X, Y, M, K, blockIdx.x);
}
#endif  // MEMWALL_SM80

// ---------------------------------------------------------------------------
// Streamed GEMV (memwall_gemvs1_*, memwall_gemvs_*, memwall_gemvm_*): the
// decode products at HBM speed for every shape. Any grid works: block b
// takes the contiguous share [N*b/G, N*(b+1)/G) of the N rows (or 16-row
// groups), so the launcher sizes the grid to the GPU (a multiple of the SM
// count, every block resident at once) instead of to M, and no wave of
// blocks starts late. Inside a block the share is one flat sequence of work
// units (a row, or a row group, times a slice of K) cut into eight equal
// runs, one per warp: a warp streams across row ends with its loads in
// flight, short-M/long-K shapes split K over the warps (no atomics), and
// per-row partial sums meet in shared memory, summed in warp order (the
// result does not depend on timing). Shares larger than the shared buffer
// are done in passes.
//
// Vectors: a row is cut into 16-byte vectors of kVec elements, the last one
// zero-padded past K; with K a multiple of kVec and W, X 16-byte aligned
// they are single loads that bypass L1, else gathered element by element.

const int kGemvsWarps = 8;
const int kGemvsPart = 4096;  // floats of per-warp partial sums in shared memory (16 KiB)

// Vector c of a row of K elements gathered element by element (raw bits,
// zeros past K): the path of odd K and misaligned pointers, out of line so
// the unrolled fast loops stay small.
template <class Tr>
__device__ __noinline__ uint4 gemvs_gather(const typename Tr::S* row, uint64_t c, uint32_t K) {
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    const uint64_t k0 = c * Tr::kVec;
    const unsigned short* h = reinterpret_cast<const unsigned short*>(row);
    const unsigned int* f = reinterpret_cast<const unsigned int*>(row);
#pragma unroll
    for (int e = 0; e < Tr::kVec; ++e) {
        if (k0 + e < K) {
            if (sizeof(typename Tr::S) == 2)
                w[e >> 1] |= (uint32_t)__ldg(h + k0 + e) << (16 * (e & 1));
            else
                w[e] = __ldg(f + k0 + e);
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Vector c of a row of K elements (raw bits, zeros past K).
template <class Tr>
__device__ __forceinline__ uint4 gemvs_vec(const typename Tr::S* row, uint64_t c, uint32_t K, bool fast,
                                           bool stream) {
    if (!fast) return gemvs_gather<Tr>(row, c, K);
    const uint4* p = reinterpret_cast<const uint4*>(row) + c;
    return stream ? ld_stream16(p) : __ldg(p);
}

__device__ __forceinline__ void gemvs_share(uint64_t n, uint64_t& a, uint64_t& b) {
    a = n * blockIdx.x / gridDim.x;
    b = n * (blockIdx.x + 1) / gridDim.x;
}

// The combine of a pass of nr rows from rp: Y[t, rp + r] is the sum, in
// warp order, of the partials of the warps whose run of units (unit = a row
// times a slice, cpr slices a row) touched row r; part is [row][t][warp].
template <int MAXT>
__device__ __forceinline__ void gemvs_combine(const float* part, uint64_t units, uint64_t cpr, uint64_t nr,
                                              uint64_t rp, uint32_t M, uint32_t T, float* __restrict__ Y) {
    for (uint64_t e = threadIdx.x; e < nr * T; e += blockDim.x) {
        const uint64_t t = e / nr, r = e % nr;
        float s = 0.0f;
        for (uint32_t w = 0; w < kGemvsWarps; ++w) {
            const uint64_t wa = units * w / kGemvsWarps, wb = units * (w + 1) / kGemvsWarps;
            if (wa < (r + 1) * cpr && wb > r * cpr) s += part[(r * MAXT + t) * kGemvsWarps + w];
        }
        Y[t * M + rp + r] = s;
    }
}

// CUDA cores, T <= MAXT: a unit is one row times 32 vectors (one per lane,
// 512 contiguous bytes per warp load for 16-bit dtypes); U units in flight.
template <class Tr, int U, int MAXT>
__device__ __forceinline__ void gemvs(const typename Tr::S* __restrict__ W, const typename Tr::S* __restrict__ X,
                                      float* __restrict__ Y, uint32_t M, uint32_t K, uint32_t T) {
    __shared__ float part[kGemvsPart];  // [row][t][warp]
    constexpr uint64_t kRows = kGemvsPart / (MAXT * kGemvsWarps);
    if (T > (uint32_t)MAXT) T = MAXT;
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    const bool fast = K % Tr::kVec == 0 && aligned16(W) && aligned16(X);
    const uint64_t nvec = (K + Tr::kVec - 1) / Tr::kVec, cpr = (nvec + 31) / 32;
    uint64_t r0, r1;
    gemvs_share(M, r0, r1);
    for (uint64_t rp = r0; rp < r1; rp += kRows) {
        const uint64_t nr = min(kRows, r1 - rp), units = nr * cpr;
        const uint64_t ua = units * warp / kGemvsWarps, ub = units * (warp + 1) / kGemvsWarps;
        uint64_t lr = ua / cpr, lj = ua % cpr;  // next unit to load: row (in the pass), slice
        uint64_t cr = lr, cj = lj;              // next unit to consume
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (ua + u < ub) {
                const uint64_t c = lj * 32 + lane;
                if (c < nvec) v[u] = gemvs_vec<Tr>(W + (rp + lr) * K, c, K, fast, true);
                if (++lj == cpr) lj = 0, ++lr;
            }
        }
        float acc[MAXT];
#pragma unroll
        for (int t = 0; t < MAXT; ++t) acc[t] = 0.0f;
        for (uint64_t i = ua; i < ub; i += U) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (i + u < ub) {
                    const uint64_t c = cj * 32 + lane;
                    if (c < nvec) {
                        float wf[Tr::kVec];
                        Tr::unpack(v[u], wf);
#pragma unroll
                        for (int t = 0; t < MAXT; ++t) {
                            if (t < (int)T) {
                                float xf[Tr::kVec];
                                Tr::unpack(gemvs_vec<Tr>(X + (uint64_t)t * K, c, K, fast, false), xf);
#pragma unroll
                                for (int j = 0; j < Tr::kVec; ++j) acc[t] = fmaf(wf[j], xf[j], acc[t]);
                            }
                        }
                    }
                    if (i + u + U < ub) {
                        const uint64_t cl = lj * 32 + lane;
                        if (cl < nvec) v[u] = gemvs_vec<Tr>(W + (rp + lr) * K, cl, K, fast, true);
                        if (++lj == cpr) lj = 0, ++lr;
                    }
                    if (++cj == cpr) {  // row cr ends: its partial sum goes to shared memory
#pragma unroll
                        for (int t = 0; t < MAXT; ++t) {
                            const float s = warp_sum(acc[t]);
                            if (lane == 0) part[(cr * MAXT + t) * kGemvsWarps + warp] = s;
                            acc[t] = 0.0f;
                        }
                        cj = 0, ++cr;
                    }
                }
            }
        }
        if (cj != 0) {  // the run ended inside row cr
#pragma unroll
            for (int t = 0; t < MAXT; ++t) {
                const float s = warp_sum(acc[t]);
                if (lane == 0) part[(cr * MAXT + t) * kGemvsWarps + warp] = s;
            }
        }
        __syncthreads();
        gemvs_combine<MAXT>(part, units, cpr, nr, rp, M, T, Y);
        __syncthreads();  // part is reused by the next pass
    }
}

#if MEMWALL_SM80
template <bool BF>
__device__ __forceinline__ void gemvm_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
    if (BF) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

// Tensor cores (bf16, f16), T <= 8: a unit is a group of 16 rows times 8
// vectors (64 elements of K). Lane (g = lane/4, q = lane%4) loads vectors
// 2q and 2q+1 of rows g and g+8 (128 contiguous bytes per row and warp) and
// token g's same two vectors of X, and issues four mma.m16n8k16: a sum over
// k may take k in any order, so the 8 elements of the lane's vector fill
// its A slots (row g and g+8, k 2q..2q+1 and 2q+8..2q+9) of two mmas, and
// its B slots with X at the same k. T = 1..8 costs the same bytes; the
// tensor cores idle.
//
// RING (no entry uses it now: the sweep found it slower): the U units in
// flight are cp.async copies into the lane's own slots of a shared ring
// instead of registers (lane l reads only what it copied: no barrier), and
// the partial-sum buffer is halved, so that more blocks fit on an SM.
template <bool BF, int U, bool RING>
__device__ __forceinline__ void gemvm(const uint16_t* __restrict__ W, const uint16_t* __restrict__ X,
                                      float* __restrict__ Y, uint32_t M, uint32_t K, uint32_t T) {
    constexpr int kPart = RING ? kGemvsPart / 2 : kGemvsPart;
    __shared__ float part[kPart];  // [group][warp][t][16 rows]
    __shared__ __align__(16) uint4 ring[RING ? kGemvsWarps : 1][RING ? U : 1][4][32];
    constexpr uint64_t kGroups = kPart / (kGemvsWarps * 128);
    typedef BF16 Tr;  // loads only: both 16-bit dtypes load alike
    if (T == 0) return;
    if (T > 8u) T = 8u;
    const uint32_t lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3u;
    const bool fast = K % 8 == 0 && aligned16(W) && aligned16(X);
    const uint64_t nvec = (K + 7) / 8, cpr = (nvec + 7) / 8, ngroups = ((uint64_t)M + 15) / 16;
    const uint16_t* xg = X + (uint64_t)min(g, T - 1) * K;  // token g's row (lanes g >= T use zeros)
    uint64_t g0, g1;
    gemvs_share(ngroups, g0, g1);
    for (uint64_t gp = g0; gp < g1; gp += kGroups) {
        const uint64_t ng = min(kGroups, g1 - gp), units = ng * cpr;
        const uint64_t ua = units * warp / kGemvsWarps, ub = units * (warp + 1) / kGemvsWarps;
        uint64_t lr = ua / cpr, lj = ua % cpr, cr = lr, cj = lj;
        uint4 v[RING ? 1 : U][4];  // [unit][row g c0, row g c1, row g+8 c0, row g+8 c1]
        auto load = [&](int u) {
            const uint64_t m = (gp + lr) * 16 + g;
            const uint16_t* ra = W + min(m, (uint64_t)M - 1) * K;
            const uint16_t* rb = W + min(m + 8, (uint64_t)M - 1) * K;
            const uint64_t c = lj * 8 + 2 * q;
            if (RING) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
#pragma unroll
                    for (int r = 0; r < 2; ++r) {
                        const uint16_t* row = r ? rb : ra;
                        uint4* slot = &ring[warp][u][2 * r + h][lane];
                        if (c + h < nvec && fast)
                            cp_async16(slot, reinterpret_cast<const uint4*>(row) + c + h, 16);
                        else
                            *slot = c + h < nvec ? gemvs_gather<Tr>(row, c + h, K) : make_uint4(0, 0, 0, 0);
                    }
                }
            } else {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    v[u][h] = c + h < nvec ? gemvs_vec<Tr>(ra, c + h, K, fast, true) : make_uint4(0, 0, 0, 0);
                    v[u][2 + h] = c + h < nvec ? gemvs_vec<Tr>(rb, c + h, K, fast, true) : make_uint4(0, 0, 0, 0);
                }
            }
            if (++lj == cpr) lj = 0, ++lr;
        };
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (ua + u < ub) load(u);
            if (RING) cp_async_commit();  // one group per stage, empty or not
        }
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        auto flush = [&]() {
            float* p = part + (cr * kGemvsWarps + warp) * 128;
            // d0: (row g, token 2q), d1: (g, 2q+1), d2: (g+8, 2q), d3: (g+8, 2q+1).
            p[(2 * q) * 16 + g] = d[0];
            p[(2 * q + 1) * 16 + g] = d[1];
            p[(2 * q) * 16 + g + 8] = d[2];
            p[(2 * q + 1) * 16 + g + 8] = d[3];
            d[0] = d[1] = d[2] = d[3] = 0.0f;
        };
        for (uint64_t i = ua; i < ub; i += U) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (i + u < ub) {
                    const uint64_t c = cj * 8 + 2 * q;
                    uint4 x[2];
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        x[h] = g < T && c + h < nvec ? gemvs_vec<Tr>(xg, c + h, K, fast, false) : make_uint4(0, 0, 0, 0);
                    if (RING) cp_async_wait<U - 1>();  // the group of this unit has landed
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint4 a = RING ? ring[warp][u][h][lane] : v[RING ? 0 : u][h];
                        const uint4 b = RING ? ring[warp][u][2 + h][lane] : v[RING ? 0 : u][2 + h];
                        gemvm_mma<BF>(d, a.x, b.x, a.y, b.y, x[h].x, x[h].y);
                        gemvm_mma<BF>(d, a.z, b.z, a.w, b.w, x[h].z, x[h].w);
                    }
                    // The slots were read above, so their next copies cannot overtake the reads.
                    if (i + u + U < ub) load(u);
                    if (RING) cp_async_commit();
                    if (++cj == cpr) {
                        flush();
                        cj = 0, ++cr;
                    }
                }
            }
        }
        if (RING) cp_async_wait<0>();
        if (cj != 0) flush();
        __syncthreads();
        for (uint64_t e = threadIdx.x; e < ng * 128; e += blockDim.x) {
            const uint64_t r = e / 128, t = (e / 16) % 8, m = (gp + r) * 16 + e % 16;
            if (t >= T || m >= M) continue;
            float s = 0.0f;
            for (uint32_t w = 0; w < kGemvsWarps; ++w) {
                const uint64_t wa = units * w / kGemvsWarps, wb = units * (w + 1) / kGemvsWarps;
                if (wa < (r + 1) * cpr && wb > r * cpr) s += part[(r * kGemvsWarps + w) * 128 + e % 128];
            }
            Y[t * M + m] = s;
        }
        __syncthreads();
    }
}
#endif  // MEMWALL_SM80

// ---------------------------------------------------------------------------
// Llama-layer kernels: helpers. Activations are float32; "dt" arguments are
// dtype codes (kDtF32, kDtBF16, kDtF16) of weights, caches and outputs.

const uint32_t kDtF32 = 0;
const uint32_t kDtBF16 = 1;
const uint32_t kDtF16 = 2;

// Round to nearest even, as kernels.F32ToBF16: NaN stays a quiet NaN.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ uint16_t f32_to_f16_bits(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float load_dt(const void* p, uint64_t i, uint32_t dt) {
    if (dt == kDtBF16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    if (dt == kDtF16) return f16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    return reinterpret_cast<const float*>(p)[i];
}

__device__ __forceinline__ void store_dt(void* p, uint64_t i, uint32_t dt, float v) {
    if (dt == kDtBF16) {
        reinterpret_cast<uint16_t*>(p)[i] = f32_to_bf16_bits(v);
    } else if (dt == kDtF16) {
        reinterpret_cast<uint16_t*>(p)[i] = f32_to_f16_bits(v);
    } else {
        reinterpret_cast<float*>(p)[i] = v;
    }
}

// v rounded to dtype dt's precision, as a float32.
__device__ __forceinline__ float round_dt(float v, uint32_t dt) {
    if (dt == kDtBF16) return bf16_to_f32(f32_to_bf16_bits(v));
    if (dt == kDtF16) return f16_to_f32(f32_to_f16_bits(v));
    return v;
}

__device__ __forceinline__ float warp_allsum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
    return v;
}

// Maximum over a block of up to 1024 threads; every thread gets it.
__device__ __forceinline__ float block_max(float v, float* scratch32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
    __syncthreads();  // scratch32 may still be read from a previous call
    if (lane == 0) scratch32[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    float t = -INFINITY;
    for (int w = 0; w < nw; ++w) t = fmaxf(t, scratch32[w]);
    return t;
}

// Sum over a block of up to 1024 threads; every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float* scratch32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    v = warp_allsum(v);
    __syncthreads();  // scratch32 may still be read from a previous call
    if (lane == 0) scratch32[warp] = v;
    __syncthreads();
    const int nw = (blockDim.x + 31) >> 5;
    float t = 0.0f;
    for (int w = 0; w < nw; ++w) t += scratch32[w];
    return t;
}

// ---------------------------------------------------------------------------
// Attention over the paged KV cache (flash-decoding layout). A block of
// kAttnWarps warps handles one kv head, up to kAttnHeads of its query heads,
// one query token t and one chunk of cached positions (grid.z = the split).
// Each warp takes every kAttnWarps-th position of the chunk: lane l holds
// elements [l*E, l*E+E) of the head, the warp reduces q.k with shuffles and
// keeps an online softmax (running max m, sum l, unnormalized acc) per
// query head; the warps then merge through shared memory. With one split
// the block writes the normalized output; with several it writes (m, l,
// acc[headDim]) to part[((t*nHeads + h)*splits + split)*(headDim+2)] and
// memwall_attn_combine merges the splits.

const int kAttnWarps = 8;
const int kAttnHeads = 8;  // query heads per block
const int kAttnMaxDim = 256;

struct AttnArgs {
    const float* q;
    const unsigned char* cache;
    const int32_t* table;
    uint32_t start, T, nHeads, kvHeads, headDim, blockTokens, layer, dt;
    uint64_t blockBytes;
    float scale;
    uint32_t chunk;
    float* part;
    void* out;
    uint32_t odt;
    uint32_t splits;  // of the context: gridDim.z, or fewer for the _at entries
};

template <class Tr, int E>
__device__ __forceinline__ void attn_load_row(const unsigned char* row, int lane, uint32_t hd,
                                              bool vec, float* out) {
    typedef typename Tr::S S;
    const S* p = reinterpret_cast<const S*>(row) + lane * E;
    constexpr int B = E * (int)sizeof(S);
    if (vec) {
        if constexpr (B % 16 == 0) {
#pragma unroll
            for (int i = 0; i < B / 16; ++i) {
                uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
                Tr::unpack(v, out + i * Tr::kVec);
            }
            return;
        } else if constexpr (B == 8) {
            uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
            float tmp[Tr::kVec];
            Tr::unpack(make_uint4(v.x, v.y, 0u, 0u), tmp);
#pragma unroll
            for (int j = 0; j < E; ++j) out[j] = tmp[j];
            return;
        } else if constexpr (B == 4) {
            uint32_t v = __ldg(reinterpret_cast<const unsigned int*>(p));
            float tmp[Tr::kVec];
            Tr::unpack(make_uint4(v, 0u, 0u, 0u), tmp);
#pragma unroll
            for (int j = 0; j < E; ++j) out[j] = tmp[j];
            return;
        }
    }
#pragma unroll
    for (int j = 0; j < E; ++j) {
        const uint32_t e = (uint32_t)lane * E + j;
        out[j] = e < hd ? Tr::load(p + j) : 0.0f;
    }
}

// Shared memory of memwall_attn, declared once in the kernel: static
// __shared__ arrays in the templates would be allocated once per
// instantiation.
struct AttnSmem {
    float sm[kAttnWarps], sl[kAttnWarps];
    float sacc[kAttnWarps][kAttnMaxDim];
};

template <class Tr, int E>
__device__ void attn_split(const AttnArgs& a, AttnSmem& sh) {
    float* sm = sh.sm;
    float* sl = sh.sl;
    float (*sacc)[kAttnMaxDim] = sh.sacc;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t G = a.nHeads / a.kvHeads;
    const uint32_t groups = (G + kAttnHeads - 1) / kAttnHeads;
    const uint32_t kvh = blockIdx.x / groups;
    const uint32_t hg = blockIdx.x % groups;
    const uint32_t h0 = kvh * G + hg * kAttnHeads;
    const int nh = (int)min((uint32_t)kAttnHeads, G - hg * kAttnHeads);
    const uint32_t t = blockIdx.y;
    const uint32_t hd = a.headDim;
    const uint64_t ctx = (uint64_t)a.start + t + 1;
    const uint64_t p0 = (uint64_t)blockIdx.z * a.chunk;
    const uint64_t p1 = min(ctx, p0 + a.chunk);
    const uint64_t elt = sizeof(typename Tr::S);
    const uint64_t rowBytes = (uint64_t)a.kvHeads * hd * elt;  // one position, all kv heads
    const uint64_t vOff = (uint64_t)a.blockTokens * rowBytes;   // V follows K in a layer
    const uint64_t layerOff = (uint64_t)a.layer * 2 * vOff + (uint64_t)kvh * hd * elt;
    const bool vec = hd == 32u * E && ((uintptr_t)a.cache & 15u) == 0 && (a.blockBytes & 15u) == 0 &&
                     (rowBytes & 15u) == 0;

    float q[kAttnHeads][E], acc[kAttnHeads][E], m[kAttnHeads], l[kAttnHeads];
#pragma unroll
    for (int g = 0; g < kAttnHeads; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < E; ++j) {
            const uint32_t e = (uint32_t)lane * E + j;
            acc[g][j] = 0.0f;
            q[g][j] = (g < nh && e < hd) ? a.q[((uint64_t)t * a.nHeads + h0 + g) * hd + e] : 0.0f;
        }
    }
    // The next position's K and V rows are loaded before this one's math.
    auto load = [&](uint64_t p, float (&k)[E], float (&v)[E]) {
        const uint64_t blk = (uint64_t)(uint32_t)a.table[p / a.blockTokens];
        const unsigned char* krow = a.cache + blk * a.blockBytes + layerOff + (p % a.blockTokens) * rowBytes;
        attn_load_row<Tr, E>(krow, lane, hd, vec, k);
        attn_load_row<Tr, E>(krow + vOff, lane, hd, vec, v);
    };
    float k[E], v[E];
    if (p0 + warp < p1) load(p0 + warp, k, v);
    for (uint64_t p = p0 + warp; p < p1; p += kAttnWarps) {
        float kn[E], vn[E];
        if (p + kAttnWarps < p1) load(p + kAttnWarps, kn, vn);
#pragma unroll
        for (int g = 0; g < kAttnHeads; ++g) {
            if (g < nh) {
                float d = 0.0f;
#pragma unroll
                for (int j = 0; j < E; ++j) d = fmaf(q[g][j], k[j], d);
                const float s = warp_allsum(d) * a.scale;
                const float mn = fmaxf(m[g], s);
                const float corr = expf(m[g] - mn);
                const float pe = expf(s - mn);
                m[g] = mn;
                l[g] = l[g] * corr + pe;
#pragma unroll
                for (int j = 0; j < E; ++j) acc[g][j] = fmaf(pe, v[j], acc[g][j] * corr);
            }
        }
#pragma unroll
        for (int j = 0; j < E; ++j) {
            k[j] = kn[j];
            v[j] = vn[j];
        }
    }

    const uint32_t splits = a.splits;
#pragma unroll
    for (int g = 0; g < kAttnHeads; ++g) {
        if (g >= nh) break;  // uniform over the block
        if (lane == 0) {
            sm[warp] = m[g];
            sl[warp] = l[g];
        }
#pragma unroll
        for (int j = 0; j < E; ++j) {
            const uint32_t e = (uint32_t)lane * E + j;
            if (e < hd) sacc[warp][e] = acc[g][j];
        }
        __syncthreads();
        const uint32_t e = threadIdx.x;
        if (e < hd) {
            float M = -INFINITY;
            for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm[w]);
            float L = 0.0f, A = 0.0f;
            if (M != -INFINITY) {
                for (int w = 0; w < kAttnWarps; ++w) {
                    const float c = sm[w] == -INFINITY ? 0.0f : expf(sm[w] - M);
                    L = fmaf(sl[w], c, L);
                    A = fmaf(sacc[w][e], c, A);
                }
            }
            const uint64_t h = h0 + g;
            if (splits == 1) {
                store_dt(a.out, ((uint64_t)t * a.nHeads + h) * hd + e, a.odt, A / L);
            } else {
                float* pr = a.part + (((uint64_t)t * a.nHeads + h) * splits + blockIdx.z) * (hd + 2);
                pr[2 + e] = A;
                if (e == 0) {
                    pr[0] = M;
                    pr[1] = L;
                }
            }
        }
        __syncthreads();
    }
}


template <int E>
__device__ __forceinline__ void attn_entry(const AttnArgs& a, AttnSmem& sh) {
    if (a.dt == kDtBF16) {
        attn_split<BF16, E>(a, sh);
    } else if (a.dt == kDtF16) {
        attn_split<F16, E>(a, sh);
    } else {
        attn_split<F32, E>(a, sh);
    }
}

// ---------------------------------------------------------------------------
// Decode attention (few tokens, long contexts): the split layout of
// memwall_attn_e* (grid (kvHeads, T, splits), block 256, same partials), but
// lanes take positions: each warp scores 32 positions at once (lane l: one
// position's K row, up to eight 16-byte loads in flight; q of every head of
// the group, pre-scaled to log2 units, in shared memory, loaded while the
// first block ids are), one online-softmax update per 32 positions and head,
// then P.V with lane l owning elements [l*E, l*E+E) and eight V rows in
// flight. Head dim 64 or 128, at most 8 query heads per kv head, rows
// 16-byte aligned. (A whole K row and 16 V rows in flight took 171
// registers, one block per SM instead of two: no faster at 512-2048
// positions on the H200, and twice as slow from 4096 on, where the splits
// fill more than one wave.)

struct DecodeSmem {
    float q[kAttnHeads][128];
    float sm[kAttnWarps], sl[kAttnWarps];
    float sacc[kAttnWarps][128];
};

template <class Tr, int D, int GH>
__device__ void attn_decode(const AttnArgs& a, DecodeSmem& sh) {
    typedef typename Tr::S S;
    constexpr int E = D / 32;                           // output elements per lane
    constexpr int VEC = Tr::kVec;                       // elements per 16-byte load
    constexpr int NV = D / VEC;                         // 16-byte loads per K row
    constexpr int KB = NV < 8 ? NV : 8;                 // K loads in flight
    constexpr int VR = 8;                               // V rows in flight
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t G = a.nHeads / a.kvHeads;
    const uint32_t kvh = blockIdx.x;
    const uint32_t h0 = kvh * G;
    const int nh = (int)G;
    const uint32_t t = blockIdx.y;
    // (mod 2^32: memwall_attn_decode_rows sets start = pos[t] - t; positions
    // are below 2^31)
    const uint64_t ctx = (uint64_t)(uint32_t)(a.start + t) + 1;
    const uint64_t p0 = (uint64_t)blockIdx.z * a.chunk;
    const uint64_t p1 = min(ctx, p0 + a.chunk);
    const uint64_t elt = sizeof(S);
    const uint64_t rowBytes = (uint64_t)a.kvHeads * D * elt;
    const uint64_t vOff = (uint64_t)a.blockTokens * rowBytes;
    const uint64_t layerOff = (uint64_t)a.layer * 2 * vOff + (uint64_t)kvh * D * elt;
    const float sc = a.scale * 1.4426950408889634f;
    // The first group's block ids load while q goes to shared memory (two
    // round trips in flight instead of one after the other).
    const uint64_t base0 = p0 + (uint64_t)warp * 32;
    uint32_t blk0 = 0;
    if (base0 + lane < p1) blk0 = (uint32_t)a.table[(base0 + lane) / a.blockTokens];

    for (int i = threadIdx.x; i < GH * D; i += blockDim.x) {
        const int g = i / D, d = i % D;
        sh.q[g][d] = g < nh ? a.q[((uint64_t)t * a.nHeads + h0 + g) * D + d] * sc : 0.0f;
    }
    __syncthreads();

    float m[GH], l[GH], acc[GH][E];
#pragma unroll
    for (int g = 0; g < GH; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < E; ++j) acc[g][j] = 0.0f;
    }
    for (uint64_t base = base0; base < p1; base += kAttnWarps * 32) {
        const uint64_t p = base + lane;
        const bool valid = p < p1;
        const int n = (int)min((uint64_t)32, p1 - base);  // valid positions of this group
        const unsigned char* krow = a.cache;
        if (valid) {
            const uint64_t blk = base == base0 ? blk0 : (uint64_t)(uint32_t)a.table[p / a.blockTokens];
            krow = a.cache + blk * a.blockBytes + layerOff + (p % a.blockTokens) * rowBytes;
        }
        float s[GH];
#pragma unroll
        for (int g = 0; g < GH; ++g) s[g] = 0.0f;
        if (valid) {
            const uint4* k4 = reinterpret_cast<const uint4*>(krow);
#pragma unroll
            for (int c0 = 0; c0 < NV; c0 += KB) {
                uint4 kv[KB];
#pragma unroll
                for (int c = 0; c < KB; ++c) kv[c] = __ldg(k4 + c0 + c);
#pragma unroll
                for (int c = 0; c < KB; ++c) {
                    float kf[VEC];
                    Tr::unpack(kv[c], kf);
#pragma unroll
                    for (int g = 0; g < GH; ++g) {
                        if (g < nh) {
                            const float* qg = &sh.q[g][(c0 + c) * VEC];
#pragma unroll
                            for (int j = 0; j < VEC; ++j) s[g] = fmaf(qg[j], kf[j], s[g]);
                        }
                    }
                }
            }
        }
        // Online softmax over the group's positions, per head (log2 units).
#pragma unroll
        for (int g = 0; g < GH; ++g) {
            if (g < nh) {
                float mx = valid ? s[g] : -INFINITY;
#pragma unroll
                for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, off));
                const float mn = fmaxf(m[g], mx);  // finite: lane 0's position is valid
                const float corr = exp2f(m[g] - mn);
                const float pg = valid ? exp2f(s[g] - mn) : 0.0f;
                l[g] = l[g] * corr + warp_allsum(pg);
                m[g] = mn;
                s[g] = pg;
#pragma unroll
                for (int j = 0; j < E; ++j) acc[g][j] *= corr;
            }
        }
        // P.V: VR V rows in flight; lane owns elements [lane*E, lane*E+E).
        const unsigned long long vaddr = (unsigned long long)(krow + vOff);
        for (int j0 = 0; j0 < n; j0 += VR) {
            float vf[VR][E];
#pragma unroll
            for (int jj = 0; jj < VR; ++jj) {
                const unsigned long long va = __shfl_sync(0xFFFFFFFFu, vaddr, (j0 + jj) & 31);
                if (j0 + jj < n) {
                    attn_load_row<Tr, E>(reinterpret_cast<const unsigned char*>(va), lane, D, true, vf[jj]);
                } else {
#pragma unroll
                    for (int e = 0; e < E; ++e) vf[jj][e] = 0.0f;
                }
            }
#pragma unroll
            for (int jj = 0; jj < VR; ++jj) {
#pragma unroll
                for (int g = 0; g < GH; ++g) {
                    if (g < nh) {
                        const float pj = __shfl_sync(0xFFFFFFFFu, s[g], (j0 + jj) & 31);
#pragma unroll
                        for (int e = 0; e < E; ++e) acc[g][e] = fmaf(pj, vf[jj][e], acc[g][e]);
                    }
                }
            }
        }
    }

    // Merge the warps (log2 units); partials are written in natural-log units
    // like memwall_attn_e*.
    const uint32_t splits = a.splits;
#pragma unroll
    for (int g = 0; g < GH; ++g) {
        if (g >= nh) break;  // uniform over the block
        if (lane == 0) {
            sh.sm[warp] = m[g];
            sh.sl[warp] = l[g];
        }
#pragma unroll
        for (int j = 0; j < E; ++j) sh.sacc[warp][lane * E + j] = acc[g][j];
        __syncthreads();
        const uint32_t e = threadIdx.x;
        if (e < D) {
            float M = -INFINITY;
            for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sh.sm[w]);
            float L = 0.0f, A = 0.0f;
            if (M != -INFINITY) {
                for (int w = 0; w < kAttnWarps; ++w) {
                    const float c = sh.sm[w] == -INFINITY ? 0.0f : exp2f(sh.sm[w] - M);
                    L = fmaf(sh.sl[w], c, L);
                    A = fmaf(sh.sacc[w][e], c, A);
                }
            }
            const uint64_t h = h0 + g;
            if (splits == 1) {
                store_dt(a.out, ((uint64_t)t * a.nHeads + h) * D + e, a.odt, A / L);
            } else {
                float* pr = a.part + (((uint64_t)t * a.nHeads + h) * splits + blockIdx.z) * (D + 2);
                pr[2 + e] = A;
                if (e == 0) {
                    pr[0] = M * 0.6931471805599453f;  // log2 units -> natural
                    pr[1] = L;
                }
            }
        }
        __syncthreads();
    }
}

// attn_decode for the block's query heads per kv head: the loops over
// heads are unrolled to the fewest of 1, 2, 4, 8 that cover them, so that
// a multi-head model's step runs an eighth of the code of an 8-head group
// (the whole unrolled body for 8 heads did not stay in the instruction
// cache: ~17 us a 32-position pass on the H200). The arithmetic of each
// head is the same whichever covers it.
template <class Tr, int D>
__device__ __forceinline__ void attn_decode_heads(const AttnArgs& a, DecodeSmem& sh) {
    const uint32_t G = a.nHeads / a.kvHeads;
    if (G == 1) {
        attn_decode<Tr, D, 1>(a, sh);
    } else if (G <= 2) {
        attn_decode<Tr, D, 2>(a, sh);
    } else if (G <= 4) {
        attn_decode<Tr, D, 4>(a, sh);
    } else {
        attn_decode<Tr, D, 8>(a, sh);
    }
}

// attn_decode_entry runs attn_decode_heads for a's head dim and cache dtype.
__device__ __forceinline__ void attn_decode_entry(const AttnArgs& a, DecodeSmem& sh) {
    if (a.headDim == 128) {
        if (a.dt == kDtBF16) {
            attn_decode_heads<BF16, 128>(a, sh);
        } else {
            attn_decode_heads<F16, 128>(a, sh);
        }
    } else {
        if (a.dt == kDtBF16) {
            attn_decode_heads<BF16, 64>(a, sh);
        } else {
            attn_decode_heads<F16, 64>(a, sh);
        }
    }
}

// ---------------------------------------------------------------------------
// Flash attention for prefill (compute_80: mma.sync on bf16/f16 tensor
// cores). A block of 4 warps takes 64 query tokens of one query head; warp w
// owns query rows 16w..16w+15. Q is rounded to the cache dtype and kept in
// registers as mma A fragments. The cached positions are walked in tiles of
// 64: K is staged row-major in shared memory with cp.async, V transposed
// (Vt[d][position]) with plain loads, so every mma B fragment is a 32-bit
// shared load. S = Q.K^T (f32), causal mask, online softmax in the log2
// domain (f32), P rounded to the cache dtype and reused from the S
// registers as the A fragments of O += P.V (f32). Fragment layouts are the
// PTX ISA's for mma.m16n8k16 (groupID = lane/4, tig = lane%4).

#if MEMWALL_SM80
const int kFlashBr = 64;  // query rows per block
const int kFlashBc = 64;  // positions per tile
const int kFlashThreads = 128;

__device__ __forceinline__ uint32_t pack_dt2(float lo, float hi, uint32_t dt) {
    if (dt == kDtBF16) return (uint32_t)f32_to_bf16_bits(lo) | ((uint32_t)f32_to_bf16_bits(hi) << 16);
    return (uint32_t)f32_to_f16_bits(lo) | ((uint32_t)f32_to_f16_bits(hi) << 16);
}

template <bool BF>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if (BF) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Shared bytes of flash_attn<D>: Ks (which also stages Q), then Vt.
__host__ __device__ constexpr int flash_smem_bytes(int D) { return (kFlashBc * (D + 8) + D * (kFlashBc + 8)) * 2; }

template <int D, bool BF>
__device__ void flash_attn(const AttnArgs& a, uint16_t* smem) {
    constexpr int LDK = D + 8;          // Ks row (halves): 16-byte multiple, conflict-free
    constexpr int LDV = kFlashBc + 8;   // Vt row (halves)
    constexpr int KC = D / 16;          // k-chunks of Q.K^T
    constexpr int NT = D / 8;           // n-tiles of O
    constexpr int CH = D / 8;           // 16-byte chunks per K/V row
    uint16_t* Ks = smem;                // [kFlashBc][LDK]
    uint16_t* Vt = smem + kFlashBc * LDK;  // [D][LDV]

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tig = lane & 3;
    const uint32_t h = blockIdx.y;
    const uint32_t G = a.nHeads / a.kvHeads;
    const uint32_t kvh = h / G;
    const uint32_t qtile = gridDim.x - 1 - blockIdx.x;  // longest rows first
    const uint64_t t0 = (uint64_t)qtile * kFlashBr;
    const uint64_t ctxEnd = (uint64_t)a.start + a.T;
    const uint64_t elt = 2;
    const uint64_t rowBytes = (uint64_t)a.kvHeads * D * elt;
    const uint64_t vOff = (uint64_t)a.blockTokens * rowBytes;
    const uint64_t layerOff = (uint64_t)a.layer * 2 * vOff + (uint64_t)kvh * D * elt;

    // Q (f32) -> cache dtype -> Ks staging -> A fragments in registers.
    for (int c = tid; c < kFlashBr * D / 4; c += kFlashThreads) {
        const int r = c / (D / 4), d4 = (c % (D / 4)) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t0 + r < a.T) v = *reinterpret_cast<const float4*>(a.q + ((t0 + r) * a.nHeads + h) * D + d4);
        uint32_t* dst = reinterpret_cast<uint32_t*>(Ks + r * LDK + d4);
        dst[0] = pack_dt2(v.x, v.y, a.dt);
        dst[1] = pack_dt2(v.z, v.w, a.dt);
    }
    __syncthreads();
    uint32_t qa[KC][4];
    {
        const uint16_t* q0 = Ks + (warp * 16 + g) * LDK + tig * 2;
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
            qa[kc][0] = *reinterpret_cast<const uint32_t*>(q0 + kc * 16);
            qa[kc][1] = *reinterpret_cast<const uint32_t*>(q0 + 8 * LDK + kc * 16);
            qa[kc][2] = *reinterpret_cast<const uint32_t*>(q0 + kc * 16 + 8);
            qa[kc][3] = *reinterpret_cast<const uint32_t*>(q0 + 8 * LDK + kc * 16 + 8);
        }
    }
    __syncthreads();

    float o[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float sc = a.scale * 1.4426950408889634f;
    const uint64_t qp0 = (uint64_t)a.start + t0 + warp * 16 + g;  // this thread's rows: qp0, qp0 + 8
    const uint64_t tLast = min(t0 + kFlashBr, (uint64_t)a.T) - 1;
    const uint64_t ntiles = ((uint64_t)a.start + tLast) / kFlashBc + 1;

    for (uint64_t j = 0; j < ntiles; ++j) {
        const uint64_t p0 = j * kFlashBc;
        // K tile, row-major, cp.async (zero-filled past the context).
        for (int c = tid; c < kFlashBc * CH; c += kFlashThreads) {
            const int r = c / CH, ch = c % CH;
            const uint64_t p = p0 + r;
            const bool ok = p < ctxEnd;
            const unsigned char* src = a.cache;
            if (ok) {
                const uint64_t blk = (uint64_t)(uint32_t)a.table[p / a.blockTokens];
                src = a.cache + blk * a.blockBytes + layerOff + (p % a.blockTokens) * rowBytes + ch * 16;
            }
            cp_async16(Ks + r * LDK + ch * 8, src, ok ? 16u : 0u);
        }
        cp_async_commit();
        // V tile, transposed into Vt[d][position].
        for (int c = tid; c < kFlashBc * CH; c += kFlashThreads) {
            const int r = c % kFlashBc, ch = c / kFlashBc;
            const uint64_t p = p0 + r;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (p < ctxEnd) {
                const uint64_t blk = (uint64_t)(uint32_t)a.table[p / a.blockTokens];
                v = __ldg(reinterpret_cast<const uint4*>(a.cache + blk * a.blockBytes + layerOff + vOff +
                                                         (p % a.blockTokens) * rowBytes + ch * 16));
            }
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                Vt[(ch * 8 + 2 * i) * LDV + r] = (uint16_t)(w[i] & 0xFFFFu);
                Vt[(ch * 8 + 2 * i + 1) * LDV + r] = (uint16_t)(w[i] >> 16);
            }
        }
        cp_async_wait<0>();
        __syncthreads();

        // S = Q.K^T for this warp's 16 rows x 64 positions.
        float s[kFlashBc / 8][4];
#pragma unroll
        for (int nt = 0; nt < kFlashBc / 8; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            const uint16_t* k0 = Ks + (nt * 8 + g) * LDK + tig * 2;
#pragma unroll
            for (int kc = 0; kc < KC; ++kc) {
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(k0 + kc * 16);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(k0 + kc * 16 + 8);
                mma16816<BF>(s[nt], qa[kc], b0, b1);
            }
        }
        // Mask, scale to log2 units, row maxima (a row lives in 4 lanes).
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < kFlashBc / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint64_t kp = p0 + nt * 8 + tig * 2 + (e & 1);
                const uint64_t qp = qp0 + (e >> 1) * 8;
                const float v = kp <= qp ? s[nt][e] * sc : -INFINITY;
                s[nt][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        }
        float corr[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFFu, mx[i], 2));
            // Every row has position 0 <= its own position: mx is finite.
            corr[i] = exp2f(m[i] - mx[i]);
            m[i] = mx[i];
            l[i] *= corr[i];
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            o[nt][0] *= corr[0];
            o[nt][1] *= corr[0];
            o[nt][2] *= corr[1];
            o[nt][3] *= corr[1];
        }
#pragma unroll
        for (int nt = 0; nt < kFlashBc / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = exp2f(s[nt][e] - m[e >> 1]);
                s[nt][e] = p;
                l[e >> 1] += p;
            }
        }
        // O += P.V: P's accumulator layout is the A fragment layout.
#pragma unroll
        for (int kc = 0; kc < kFlashBc / 16; ++kc) {
            uint32_t pa[4];
            pa[0] = pack_dt2(s[2 * kc][0], s[2 * kc][1], a.dt);
            pa[1] = pack_dt2(s[2 * kc][2], s[2 * kc][3], a.dt);
            pa[2] = pack_dt2(s[2 * kc + 1][0], s[2 * kc + 1][1], a.dt);
            pa[3] = pack_dt2(s[2 * kc + 1][2], s[2 * kc + 1][3], a.dt);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint16_t* v0 = Vt + (nt * 8 + g) * LDV + kc * 16 + tig * 2;
                const uint32_t b0 = *reinterpret_cast<const uint32_t*>(v0);
                const uint32_t b1 = *reinterpret_cast<const uint32_t*>(v0 + 8);
                mma16816<BF>(o[nt], pa, b0, b1);
            }
        }
        __syncthreads();  // Ks and Vt are rewritten for the next tile
    }

#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xFFFFFFFFu, l[i], 1);
        l[i] += __shfl_xor_sync(0xFFFFFFFFu, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const uint64_t t = t0 + warp * 16 + g + 8 * i;
        if (t >= a.T) continue;
        const float inv = 1.0f / l[i];
        const uint64_t base = (t * a.nHeads + h) * D;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const uint64_t d = nt * 8 + tig * 2;
            store_dt(a.out, base + d, a.odt, o[nt][2 * i] * inv);
            store_dt(a.out, base + d + 1, a.odt, o[nt][2 * i + 1] * inv);
        }
    }
}
#endif  // MEMWALL_SM80

}  // namespace

// ---------------------------------------------------------------------------
// Entry points.

// dst[i] = pattern(seed, i) for i < n. Any grid; grid-stride loop.
extern "C" __global__ void memwall_fill_u32(uint32_t* dst, uint64_t n, uint32_t seed) {
    pdl_enter();
    const uint64_t stride = grid_threads();
    for (uint64_t i = global_thread(); i < n; i += stride) dst[i] = pattern(seed, i);
}

// *mismatches += number of i < n with src[i] != pattern(seed, i). Any grid
// with blockDim.x a multiple of 32 and at most 1024; one atomic per block
// that found a mismatch.
extern "C" __global__ void memwall_check_u32(const uint32_t* src, uint64_t n, uint32_t seed,
                                             unsigned long long* mismatches) {
    pdl_enter();
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
    pdl_enter();
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    uint64_t start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(256);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanoseconds);
}

// Y[t, m] = sum_k W[m, k] * X[t, k] for T <= 8: block of 256 threads, two
// rows of W per warp, grid.x = ceil(M / 16). memwall_gemv1_*: T = 1, one
// row per warp, grid.x = ceil(M / 8). Every GEMV entry takes pf last: the
// bytes of its block's rows of W that it prefetches into L2 before waiting
// for the previous kernel (compute_90; see gemv_enter).
#define MEMWALL_GEMV_ENTRY(NAME, S, RPB, BOUNDS, BODY)                                            \
    extern "C" __global__ void BOUNDS NAME(const S* W, const S* X, float* Y,                     \
                                                           uint32_t M, uint32_t K, uint32_t T,    \
                                                           uint32_t pf) {                         \
        gemv_enter(W, (uint64_t)K * sizeof(S), M, (uint64_t)blockIdx.x * (RPB), (RPB), pf);       \
        BODY;                                                                                     \
    }

MEMWALL_GEMV_ENTRY(memwall_gemv_f32, float, 16, __launch_bounds__(256), (gemv<F32, 2, kGemvMaxT>(W, X, Y, M, K, T)))
MEMWALL_GEMV_ENTRY(memwall_gemv_bf16, uint16_t, 16, __launch_bounds__(256), (gemv<BF16, 2, kGemvMaxT>(W, X, Y, M, K, T)))
MEMWALL_GEMV_ENTRY(memwall_gemv_f16, uint16_t, 16, __launch_bounds__(256), (gemv<F16, 2, kGemvMaxT>(W, X, Y, M, K, T)))

// memwall_gemv1_*: the cp.async ring on compute_80 and newer, eight loads in
// flight in registers on compute_70.
template <class Tr>
__device__ __forceinline__ void gemv1(const typename Tr::S* __restrict__ W, const typename Tr::S* __restrict__ X,
                                      float* __restrict__ Y, uint32_t M, uint32_t K, uint32_t T) {
#if MEMWALL_SM80
    gemv1_async<Tr>(W, X, Y, M, K);
#else
    gemv<Tr, 1, 1>(W, X, Y, M, K, T);
#endif
}

MEMWALL_GEMV_ENTRY(memwall_gemv1_f32, float, 8, __launch_bounds__(256), (gemv1<F32>(W, X, Y, M, K, T)))
MEMWALL_GEMV_ENTRY(memwall_gemv1_bf16, uint16_t, 8, __launch_bounds__(256), (gemv1<BF16>(W, X, Y, M, K, T)))
MEMWALL_GEMV_ENTRY(memwall_gemv1_f16, uint16_t, 8, __launch_bounds__(256), (gemv1<F16>(W, X, Y, M, K, T)))

// Up to three T = 1 products that share X, in one launch (q, k and v; gate
// and up): blocks 0 .. ceil(M0/8)-1 take product 0 as memwall_gemv1_* would,
// the next ceil(M1/8) product 1, then product 2; grid: the sum. Every target
// runs the register-pipelined row-per-warp code (gemv_at<Tr, 1, 1>: eight
// loads in flight per lane at 32 registers, full occupancy): the cp.async
// ring's 32 KiB of shared memory and 48 registers per block hold an SM to
// five blocks (q/k/v 4096+1024+1024 on the H200: 65% of the copy on the
// ring, 79% on the register code; gate/up 14336×2 97%). The Set launches it
// plainly, without prefetch, on the compute_90 module too: overlapped, the
// register code lost 8-13 points on the H200 and the ring (held to 40
// registers for six blocks per SM) lost more. Both codes sum each lane's
// vectors in the same order, so results equal memwall_gemv1_*'s bit for
// bit on every target.
template <class Tr>
__device__ __forceinline__ void gemv1_group(const typename Tr::S* X, uint32_t K, const typename Tr::S* W0,
                                            float* Y0, uint32_t M0, const typename Tr::S* W1, float* Y1,
                                            uint32_t M1, const typename Tr::S* W2, float* Y2, uint32_t M2,
                                            uint32_t pf) {
    uint64_t blk = blockIdx.x;
    const uint64_t b0 = ((uint64_t)M0 + 7) / 8, b1 = ((uint64_t)M1 + 7) / 8;
    const typename Tr::S* W = W0;
    float* Y = Y0;
    uint32_t M = M0;
    if (blk >= b0 + b1) {
        blk -= b0 + b1, W = W2, Y = Y2, M = M2;
    } else if (blk >= b0) {
        blk -= b0, W = W1, Y = Y1, M = M1;
    }
    gemv_enter(W, (uint64_t)K * sizeof(typename Tr::S), M, blk * 8, 8, pf);
    gemv_at<Tr, 1, 1>(W, X, Y, M, K, 1, blk * 8 + (threadIdx.x >> 5));
}

#define MEMWALL_GEMVG1_ENTRY(NAME, S, TR)                                                                        \
    extern "C" __global__ void __launch_bounds__(256) NAME(const S* X, uint32_t K, const S* W0, float* Y0,       \
                                                           uint32_t M0, const S* W1, float* Y1, uint32_t M1,     \
                                                           const S* W2, float* Y2, uint32_t M2, uint32_t pf) {   \
        gemv1_group<TR>(X, K, W0, Y0, M0, W1, Y1, M1, W2, Y2, M2, pf);                                           \
    }

MEMWALL_GEMVG1_ENTRY(memwall_gemvg1_f32, float, F32)
MEMWALL_GEMVG1_ENTRY(memwall_gemvg1_bf16, uint16_t, BF16)
MEMWALL_GEMVG1_ENTRY(memwall_gemvg1_f16, uint16_t, F16)

// memwall_gemvm_*: T <= 8 over any grid.x >= 1, on tensor cores for
// bf16/f16 on compute_80 and newer (block b: 16-row groups
// [G·b/grid, G·(b+1)/grid) of the G = ceil(M/16)), else the CUDA-core
// streamed kernel (rows [M·b/grid, M·(b+1)/grid)).
__device__ __forceinline__ void gemvm_enter(const void* W, uint32_t M, uint32_t K, uint32_t elt, uint32_t rowsPer,
                                            uint32_t pf) {
    uint64_t a, b;
    gemvs_share(((uint64_t)M + rowsPer - 1) / rowsPer, a, b);
    gemv_enter(W, (uint64_t)K * elt, M, a * rowsPer, (b - a) * rowsPer, pf);
}

extern "C" __global__ void __launch_bounds__(256) memwall_gemvm_f32(
    const float* W, const float* X, float* Y, uint32_t M, uint32_t K, uint32_t T, uint32_t pf) {
    gemvm_enter(W, M, K, 4, 1, pf);
    gemvs<F32, 4, kGemvMaxT>(W, X, Y, M, K, T);
}

extern "C" __global__ void __launch_bounds__(256) memwall_gemvm_bf16(
    const uint16_t* W, const uint16_t* X, float* Y, uint32_t M, uint32_t K, uint32_t T, uint32_t pf) {
#if MEMWALL_SM80
    gemvm_enter(W, M, K, 2, 16, pf);
    gemvm<true, 2, false>(W, X, Y, M, K, T);
#else
    gemvm_enter(W, M, K, 2, 1, pf);
    gemvs<BF16, 4, kGemvMaxT>(W, X, Y, M, K, T);
#endif
}

extern "C" __global__ void __launch_bounds__(256) memwall_gemvm_f16(
    const uint16_t* W, const uint16_t* X, float* Y, uint32_t M, uint32_t K, uint32_t T, uint32_t pf) {
#if MEMWALL_SM80
    gemvm_enter(W, M, K, 2, 16, pf);
    gemvm<false, 2, false>(W, X, Y, M, K, T);
#else
    gemvm_enter(W, M, K, 2, 1, pf);
    gemvs<F16, 4, kGemvMaxT>(W, X, Y, M, K, T);
#endif
}

// Same product for any T: block of 256 threads; f32 uses 64x64 tiles
// (grid ceil(M/64) x ceil(T/64)), bf16 and f16 128x128 tiles
// (grid ceil(M/128) x ceil(T/128)).
extern "C" __global__ void __launch_bounds__(256) memwall_gemm_f32(
    const float* W, const float* X, float* Y, uint32_t M, uint32_t K, uint32_t T) {
    pdl_enter();
    gemm_simt<F32>(W, X, Y, M, K, T, (uint64_t)blockIdx.y * kSimtTile,
                   (uint64_t)blockIdx.x * kSimtTile);
}

extern "C" __global__ void __launch_bounds__(256) memwall_gemm_bf16(
    const uint16_t* W, const uint16_t* X, float* Y, uint32_t M, uint32_t K, uint32_t T) {
    pdl_enter();
#if MEMWALL_SM80
    gemm_wmma<__nv_bfloat16>(W, X, Y, M, K, T);
#else
    gemm_simt_128<BF16>(W, X, Y, M, K, T);
#endif
}

extern "C" __global__ void __launch_bounds__(256) memwall_gemm_f16(
    const uint16_t* W, const uint16_t* X, float* Y, uint32_t M, uint32_t K, uint32_t T) {
    pdl_enter();
#if MEMWALL_SM80
    gemm_wmma<__half>(W, X, Y, M, K, T);
#else
    gemm_simt_128<F16>(W, X, Y, M, K, T);
#endif
}

// ---------------------------------------------------------------------------
// Llama-layer entry points. Row kernels (embed, rmsnorm, combine) loop over
// rows from blockIdx.x by gridDim.x; element kernels are grid-stride; any
// grid is correct for them. Block: 256 threads unless stated.

// out[t, i] = float(table[ids[t], i]) for t < T, i < H; wdt: the table's
// dtype code. ids must index rows of the table.
extern "C" __global__ void __launch_bounds__(256) memwall_embed(
    const void* table, uint32_t wdt, const int32_t* ids, float* out, uint32_t T, uint32_t H) {
    pdl_enter();
    for (uint64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const uint64_t row = (uint64_t)(uint32_t)ids[t] * H;
        for (uint32_t i = threadIdx.x; i < H; i += blockDim.x)
            out[t * H + i] = load_dt(table, row + i, wdt);
    }
}

// out[t, i] = odt(n * w[i]) with n = x[t, i] * rsqrt(mean_i x[t, :]^2 + eps),
// n rounded to odt first when odt is not f32 (HF LlamaRMSNorm: the
// normalized value is cast to the model dtype, then multiplied by the weight
// in that dtype).
//
// With y non-null, first the residual (Set.ResidualRMSNorm): x[t, i] =
// rdt(x[t, i] + rdt(y[t, i])) is written back to x (rdt: a dtype code;
// f32 rounds nothing), and the norm is of that x: the same bits as Round(y),
// Add(x, y), Round(x), RMSNorm(x) (y itself is left as it is).
extern "C" __global__ void __launch_bounds__(256) memwall_rmsnorm(
    float* x, const void* w, uint32_t wdt, void* out, uint32_t odt, uint32_t T, uint32_t H,
    float eps, const float* y, uint32_t rdt) {
    // The weight is only hinted into L2 before the wait (another kernel
    // could have written it); x is read after it.
    if (blockIdx.x == 0) prefetch_l2(w, (uint64_t)H * (wdt == kDtF32 ? 4 : 2), 0x3FFFFFFFu);
    pdl_enter();
    __shared__ float red[32];
    // Rows of up to kNormRegs·blockDim elements stay in registers: each
    // thread's loads of x, then of w, are all in flight at once (a decode
    // step's one row is otherwise a chain of dependent round trips). The
    // sums run in the same order either way.
    constexpr int kNormRegs = 16;
    for (uint64_t t = blockIdx.x; t < T; t += gridDim.x) {
        float* row = x + t * H;
        const float* yrow = y != nullptr ? y + t * H : nullptr;
        float ss = 0.0f;
        if (H <= kNormRegs * blockDim.x) {
            float v[kNormRegs], wv[kNormRegs];
#pragma unroll
            for (int j = 0; j < kNormRegs; ++j) {
                const uint32_t i = threadIdx.x + j * blockDim.x;
                v[j] = i < H ? row[i] : 0.0f;
            }
            if (yrow != nullptr) {
                float yv[kNormRegs];
#pragma unroll
                for (int j = 0; j < kNormRegs; ++j) {
                    const uint32_t i = threadIdx.x + j * blockDim.x;
                    yv[j] = i < H ? yrow[i] : 0.0f;
                }
#pragma unroll
                for (int j = 0; j < kNormRegs; ++j) {
                    const uint32_t i = threadIdx.x + j * blockDim.x;
                    if (i < H) {
                        v[j] = round_dt(v[j] + round_dt(yv[j], rdt), rdt);
                        row[i] = v[j];
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < kNormRegs; ++j) {
                const uint32_t i = threadIdx.x + j * blockDim.x;
                wv[j] = i < H ? load_dt(w, i, wdt) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < kNormRegs; ++j) ss = fmaf(v[j], v[j], ss);  // +0 past H: no change
            ss = block_sum(ss, red);
            const float r = rsqrtf(ss / (float)H + eps);
#pragma unroll
            for (int j = 0; j < kNormRegs; ++j) {
                const uint32_t i = threadIdx.x + j * blockDim.x;
                if (i < H) store_dt(out, t * H + i, odt, round_dt(v[j] * r, odt) * wv[j]);
            }
            continue;
        }
        for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
            float xi = row[i];
            if (yrow != nullptr) {
                xi = round_dt(xi + round_dt(yrow[i], rdt), rdt);
                row[i] = xi;  // read back below by this same thread
            }
            ss = fmaf(xi, xi, ss);
        }
        ss = block_sum(ss, red);
        const float r = rsqrtf(ss / (float)H + eps);
        for (uint32_t i = threadIdx.x; i < H; i += blockDim.x) {
            const float n = round_dt(row[i] * r, odt);
            store_dt(out, t * H + i, odt, n * load_dt(w, i, wdt));
        }
    }
}

// rope_pair rotates the pair (a, b) by the angle whose cosine and sine are
// c and s: for rdt bf16/f16 in HF's order in that dtype (a, b, c and s
// rounded to rdt, then rdt(rdt(a*c) - rdt(b*s)) and rdt(rdt(b*c) +
// rdt(a*s))); for f32 each product and sum rounded on its own, never
// fused (as hostmath.RopePairIn computes it), so that every kernel that
// rotates a pair gets the same bits from the same inputs.
__device__ __forceinline__ void rope_pair(float a, float b, float c, float s, uint32_t rdt, float* x, float* y) {
    if (rdt != kDtF32) {
        a = round_dt(a, rdt), b = round_dt(b, rdt), c = round_dt(c, rdt), s = round_dt(s, rdt);
        *x = round_dt(round_dt(a * c, rdt) - round_dt(b * s, rdt), rdt);
        *y = round_dt(round_dt(b * c, rdt) + round_dt(a * s, rdt), rdt);
    } else {
        *x = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        *y = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
}

// Rotates x (T x nHeads x headDim float32, in place) by angle
// pos[t] * invFreq[i] for pair i < headDim/2: pairs (i, i + headDim/2) when
// interleaved == 0 (HF rotate_half), (2i, 2i+1) otherwise (GGUF). cos and
// sin are float32 (sincosf of the float32 angle).
extern "C" __global__ void __launch_bounds__(256) memwall_rope(
    float* x, const int32_t* pos, const float* invFreq, uint32_t T, uint32_t nHeads,
    uint32_t headDim, uint32_t flags) {
    pdl_enter();
    // flags bit 0: interleaved pairs; bits 1-2: a dtype code rdt. For rdt
    // bf16/f16, HF's order in that dtype: x, cos and sin rounded to rdt,
    // then rdt(rdt(a*c) - rdt(b*s)) and rdt(rdt(b*c) + rdt(a*s)).
    const uint32_t interleaved = flags & 1u, rdt = (flags >> 1) & 3u;
    const uint32_t half = headDim / 2;
    const uint64_t n = (uint64_t)T * nHeads * half;
    const uint64_t stride = grid_threads();
    for (uint64_t p = global_thread(); p < n; p += stride) {
        const uint32_t i = (uint32_t)(p % half);
        const uint64_t th = p / half;  // t * nHeads + h
        const uint64_t t = th / nHeads;
        float s, c;
        sincosf((float)pos[t] * invFreq[i], &s, &c);
        float* base = x + th * headDim;
        const uint32_t ia = interleaved ? 2 * i : i;
        const uint32_t ib = interleaved ? 2 * i + 1 : i + half;
        rope_pair(base[ia], base[ib], c, s, rdt, &base[ia], &base[ib]);
    }
}

// RoPE of Q or K rows in GGUF's order into HF's: src (T x nHeads x
// headDim float32) holds each head's HF elements i and i + headDim/2 at
// 2i and 2i + 1 (llama.cpp's permutation of the Q and K weight rows); dst
// gets the head in HF's order, rotated as memwall_rope rotates it with
// interleaved == 0 (flags bits 1-2: the rounding dtype, as there). The same
// bits as putting the rows back in HF's order and then memwall_rope, in one
// pass. src and dst do not overlap; src is 8-byte aligned.
extern "C" __global__ void __launch_bounds__(256) memwall_rope_gguf(
    const float* src, float* dst, const int32_t* pos, const float* invFreq, uint32_t T, uint32_t nHeads,
    uint32_t headDim, uint32_t flags) {
    pdl_enter();
    const uint32_t rdt = (flags >> 1) & 3u;
    const uint32_t half = headDim / 2;
    const uint64_t n = (uint64_t)T * nHeads * half;
    const uint64_t stride = grid_threads();
    for (uint64_t p = global_thread(); p < n; p += stride) {
        const uint32_t i = (uint32_t)(p % half);
        const uint64_t th = p / half;  // t * nHeads + h
        const uint64_t t = th / nHeads;
        float s, c;
        sincosf((float)pos[t] * invFreq[i], &s, &c);
        const float2 ab = reinterpret_cast<const float2*>(src + th * headDim)[i];
        float* out = dst + th * headDim;
        rope_pair(ab.x, ab.y, c, s, rdt, &out[i], &out[i + half]);
    }
}

// out[i] = odt(silu(g[i]) * u[i]); for odt other than f32, silu(g[i]) is
// rounded to odt before the product (HF: act_fn(gate) * up in the model
// dtype).
// rdt (Set.SiluMulIn): g and u are first rounded to that dtype code (f32:
// not at all), as Round(g), Round(u) before SiluMul would (g and u in memory
// stay as they are).
extern "C" __global__ void __launch_bounds__(256) memwall_silumul(
    const float* g, const float* u, void* out, uint32_t odt, uint32_t rdt, uint64_t n) {
    pdl_enter();
    const uint64_t stride = grid_threads();
    for (uint64_t i = global_thread(); i < n; i += stride) {
        const float x = round_dt(g[i], rdt);
        const float s = round_dt(x / (1.0f + expf(-x)), odt);
        store_dt(out, i, odt, s * round_dt(u[i], rdt));
    }
}

// x[i] += y[i].
extern "C" __global__ void __launch_bounds__(256) memwall_add(float* x, const float* y, uint64_t n) {
    pdl_enter();
    const uint64_t stride = grid_threads();
    for (uint64_t i = global_thread(); i < n; i += stride) x[i] += y[i];
}

// out[i] = odt(x[i]).
extern "C" __global__ void __launch_bounds__(256) memwall_cast(
    const float* x, void* out, uint32_t odt, uint64_t n) {
    pdl_enter();
    const uint64_t stride = grid_threads();
    for (uint64_t i = global_thread(); i < n; i += stride) store_dt(out, i, odt, x[i]);
}

// x[i] = float(dt(x[i])): rounds float32 values to dt's precision in place.
extern "C" __global__ void __launch_bounds__(256) memwall_round(float* x, uint32_t dt, uint64_t n) {
    pdl_enter();
    const uint64_t stride = grid_threads();
    for (uint64_t i = global_thread(); i < n; i += stride) x[i] = round_dt(x[i], dt);
}

// Writes rows t < T of k and v (T x kvHeads x headDim float32) at positions
// start + t of layer `layer` of the paged cache, converted to dt:
// position p lives in block table[p / blockTokens], slot p % blockTokens, at
// block*blockBytes + ((layer*2 + kv)*blockTokens + slot)*kvHeads*headDim*elt
// + head*headDim*elt. With rowPos (memwall_kvwrite_rows), row t is one token
// of its own sequence instead: position rowPos[t], block table table +
// t*perSeq.
__device__ __forceinline__ void kvwrite_rows(
    const float* k, const float* v, unsigned char* cache, const int32_t* table, uint32_t start,
    uint32_t T, uint32_t blockTokens, uint32_t kvHeads, uint32_t headDim, uint32_t layer,
    uint32_t dt, uint64_t blockBytes, const int32_t* rowPos = nullptr, uint32_t perSeq = 0) {
    const uint64_t rowElems = (uint64_t)kvHeads * headDim;
    const uint64_t n = (uint64_t)T * rowElems;
    const uint64_t elt = dt == kDtF32 ? 4 : 2;
    const uint64_t stride = grid_threads();
    for (uint64_t i = global_thread(); i < n; i += stride) {
        const uint64_t t = i / rowElems, r = i % rowElems;
        const uint64_t p = rowPos ? (uint64_t)(uint32_t)rowPos[t] : (uint64_t)start + t;
        const int32_t* tab = rowPos ? table + t * perSeq : table;
        const uint64_t blk = (uint64_t)(uint32_t)tab[p / blockTokens];
        const uint64_t slot = p % blockTokens;
        unsigned char* kb = cache + blk * blockBytes +
                            (((uint64_t)layer * 2 * blockTokens + slot) * rowElems) * elt;
        unsigned char* vb = kb + (uint64_t)blockTokens * rowElems * elt;
        store_dt(kb, r, dt, k[i]);
        store_dt(vb, r, dt, v[i]);
    }
}

extern "C" __global__ void __launch_bounds__(256) memwall_kvwrite(
    const float* k, const float* v, unsigned char* cache, const int32_t* table, uint32_t start,
    uint32_t T, uint32_t blockTokens, uint32_t kvHeads, uint32_t headDim, uint32_t layer,
    uint32_t dt, uint64_t blockBytes) {
    pdl_enter();
    kvwrite_rows(k, v, cache, table, start, T, blockTokens, kvHeads, headDim, layer, dt, blockBytes);
}

// Attention, one split of the cached positions per grid.z: grid
// (kvHeads * ceil((nHeads/kvHeads)/8), T, splits), block 256. See
// attn_split. chunk: positions per split; part: splits > 1 only. One entry
// per elements-per-lane E (headDim <= 32E), so each gets its own register
// allocation: memwall_attn_e1 (headDim <= 32), _e2 (<= 64), _e4 (<= 128),
// _e8 (<= 256).
extern "C" __global__ void __launch_bounds__(256, 2) memwall_attn_e1(
    const float* q, const unsigned char* cache, const int32_t* table, uint32_t start, uint32_t T,
    uint32_t nHeads, uint32_t kvHeads, uint32_t headDim, uint32_t blockTokens, uint32_t layer,
    uint32_t dt, uint64_t blockBytes, float scale, uint32_t chunk, float* part, void* out,
    uint32_t odt) {
    pdl_enter();
    __shared__ AttnSmem sh;
    attn_entry<1>(AttnArgs{q, cache, table, start, T, nHeads, kvHeads, headDim, blockTokens, layer,
                           dt, blockBytes, scale, chunk, part, out, odt, gridDim.z},
                  sh);
}

extern "C" __global__ void __launch_bounds__(256, 2) memwall_attn_e2(
    const float* q, const unsigned char* cache, const int32_t* table, uint32_t start, uint32_t T,
    uint32_t nHeads, uint32_t kvHeads, uint32_t headDim, uint32_t blockTokens, uint32_t layer,
    uint32_t dt, uint64_t blockBytes, float scale, uint32_t chunk, float* part, void* out,
    uint32_t odt) {
    pdl_enter();
    __shared__ AttnSmem sh;
    attn_entry<2>(AttnArgs{q, cache, table, start, T, nHeads, kvHeads, headDim, blockTokens, layer,
                           dt, blockBytes, scale, chunk, part, out, odt, gridDim.z},
                  sh);
}

extern "C" __global__ void __launch_bounds__(256, 2) memwall_attn_e4(
    const float* q, const unsigned char* cache, const int32_t* table, uint32_t start, uint32_t T,
    uint32_t nHeads, uint32_t kvHeads, uint32_t headDim, uint32_t blockTokens, uint32_t layer,
    uint32_t dt, uint64_t blockBytes, float scale, uint32_t chunk, float* part, void* out,
    uint32_t odt) {
    pdl_enter();
    __shared__ AttnSmem sh;
    attn_entry<4>(AttnArgs{q, cache, table, start, T, nHeads, kvHeads, headDim, blockTokens, layer,
                           dt, blockBytes, scale, chunk, part, out, odt, gridDim.z},
                  sh);
}

extern "C" __global__ void __launch_bounds__(256) memwall_attn_e8(
    const float* q, const unsigned char* cache, const int32_t* table, uint32_t start, uint32_t T,
    uint32_t nHeads, uint32_t kvHeads, uint32_t headDim, uint32_t blockTokens, uint32_t layer,
    uint32_t dt, uint64_t blockBytes, float scale, uint32_t chunk, float* part, void* out,
    uint32_t odt) {
    pdl_enter();
    __shared__ AttnSmem sh;
    attn_entry<8>(AttnArgs{q, cache, table, start, T, nHeads, kvHeads, headDim, blockTokens, layer,
                           dt, blockBytes, scale, chunk, part, out, odt, gridDim.z},
                  sh);
}

// Merges the splits of memwall_attn: out[row, e] = sum_s acc_s[e] c_s /
// sum_s l_s c_s with c_s = exp(m_s - max_s m_s), row = t*nHeads + h < rows.
// splits <= 1024.
struct CombineSmem {
    float c[1024], cl[1024];
    float red[32];
};

// attn_combine_row merges row's splits partials at pr (splits of
// headDim + 2 floats) into out's row; every thread of the block calls it.
__device__ __forceinline__ void attn_combine_row(const float* pr, void* out, uint32_t odt, uint64_t row,
                                                 uint32_t headDim, uint32_t splits, CombineSmem& sh) {
    float* c = sh.c;
    float* cl = sh.cl;
    float* red = sh.red;
    const uint64_t stride = headDim + 2;
    {
        // Every split's m and l at once (one round trip), then the block max.
        float mloc = -INFINITY;
        for (uint32_t s = threadIdx.x; s < splits; s += blockDim.x) {
            const float ms = pr[s * stride];
            cl[s] = pr[s * stride + 1];
            c[s] = ms;
            mloc = fmaxf(mloc, ms);
        }
        const float M = block_max(mloc, red);  // its barriers also publish c
        float Lp = 0.0f;
        for (uint32_t s = threadIdx.x; s < splits; s += blockDim.x) {
            const float ms = c[s];
            const float cs = ms == -INFINITY ? 0.0f : expf(ms - M);
            c[s] = cs;
            Lp = fmaf(cl[s], cs, Lp);
        }
        const float L = block_sum(Lp, red);  // its barriers also publish c
        for (uint32_t e = threadIdx.x; e < headDim; e += blockDim.x) {
            const float* pe = pr + 2 + e;
            float A = 0.0f;
#pragma unroll 8
            for (uint32_t s = 0; s < splits; ++s) A = fmaf(pe[s * stride], c[s], A);
            store_dt(out, row * headDim + e, odt, A / L);
        }
        __syncthreads();  // c is rewritten for the next row
    }
}

__device__ __forceinline__ void attn_combine(const float* part, void* out, uint32_t odt, uint32_t rows,
                                             uint32_t headDim, uint32_t splits, CombineSmem& sh) {
    for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x)
        attn_combine_row(part + row * splits * (headDim + 2), out, odt, row, headDim, splits, sh);
}

extern "C" __global__ void __launch_bounds__(256) memwall_attn_combine(
    const float* part, void* out, uint32_t odt, uint32_t rows, uint32_t headDim,
    uint32_t splits) {
    pdl_enter();
    __shared__ CombineSmem sh;
    attn_combine(part, out, odt, rows, headDim, splits, sh);
}

// Prefill attention on tensor cores (compute_80; the compute_70 module
// traps): grid (ceil(T/64), nHeads), block 128; headDim 64 or 128, cache
// dtype bf16 or f16, cache, blockBytes and rows 16-byte aligned. Same
// arguments as memwall_attn (chunk and part unused). Q and P are rounded to
// the cache dtype for the products; the softmax is f32.
extern "C" __global__ void __launch_bounds__(128) memwall_attn_flash(
    const float* q, const unsigned char* cache, const int32_t* table, uint32_t start, uint32_t T,
    uint32_t nHeads, uint32_t kvHeads, uint32_t headDim, uint32_t blockTokens, uint32_t layer,
    uint32_t dt, uint64_t blockBytes, float scale, uint32_t chunk, float* part, void* out,
    uint32_t odt) {
    pdl_enter();
#if MEMWALL_SM80
    const AttnArgs a{q,     cache, table,      start,        T,    nHeads, kvHeads, headDim,
                     blockTokens, layer, dt, blockBytes, scale, chunk, part, out, odt, gridDim.z};
    __shared__ __align__(16) uint16_t smem[flash_smem_bytes(128) / 2];
    if (headDim == 128) {
        if (dt == kDtBF16) {
            flash_attn<128, true>(a, smem);
        } else {
            flash_attn<128, false>(a, smem);
        }
    } else {
        if (dt == kDtBF16) {
            flash_attn<64, true>(a, smem);
        } else {
            flash_attn<64, false>(a, smem);
        }
    }
#else
    __trap();
#endif
}

// Decode attention, lanes over positions (see attn_decode): the grid, block
// and arguments of memwall_attn_e*, for head dim 64 or 128, a bf16 or f16
// cache (f32 caches take memwall_attn_e*), at most 8 query heads per kv
// head, cache rows 16-byte aligned.
extern "C" __global__ void __launch_bounds__(256) memwall_attn_decode(
    const float* q, const unsigned char* cache, const int32_t* table, uint32_t start, uint32_t T,
    uint32_t nHeads, uint32_t kvHeads, uint32_t headDim, uint32_t blockTokens, uint32_t layer,
    uint32_t dt, uint64_t blockBytes, float scale, uint32_t chunk, float* part, void* out,
    uint32_t odt) {
    pdl_enter();
    __shared__ DecodeSmem sh;
    const AttnArgs a{q,     cache, table,      start,        T,    nHeads, kvHeads, headDim,
                     blockTokens, layer, dt, blockBytes, scale, chunk, part, out, odt, gridDim.z};
    attn_decode_entry(a, sh);
}

// ---------------------------------------------------------------------------
// Step-state variants, for a decode step captured once as a graph and
// replayed per token: the same kernels with the first position read from
// device memory (pos[0], the step's positions buffer, filled by a copy
// queued before them) instead of a launch argument, and the context split
// computed on the device from it. They compute exactly what the entries
// above compute for start = pos[0]: the split rule below is
// kernels.PlanAttention's, given its per-launch cap (kernels.attnSplitCap:
// 1 when the (kv head, token) blocks already fill the GPU, else the splits
// that would), so the plain and the captured step give the same bits.
// grid.z is the most splits any context up to the longest can take; blocks
// past the context's own splits return at once.

const uint32_t kAttnMinChunk = 128;  // kernels.minChunk

// attn_split_rule splits a context of ctx positions under cap
// (kernels.attnSplits): a.chunk and a.splits.
__device__ __forceinline__ void attn_split_rule(AttnArgs& a, uint64_t ctx, uint32_t cap) {
    uint64_t splits = 1;
    if (cap > 1 && ctx > kAttnMinChunk) splits = min((uint64_t)cap, (ctx + kAttnMinChunk - 1) / kAttnMinChunk);
    const uint64_t chunk = (ctx + splits - 1) / splits;
    a.chunk = (uint32_t)chunk;
    a.splits = (uint32_t)((ctx + chunk - 1) / chunk);
}

// attn_at_args sets a.start, a.chunk and a.splits from pos[0] and the cap,
// and reports whether this block's split is one of them.
__device__ __forceinline__ bool attn_at_args(AttnArgs& a, const int32_t* pos, uint32_t cap) {
    a.start = (uint32_t)pos[0];
    attn_split_rule(a, (uint64_t)a.start + a.T, cap);
    return blockIdx.z < a.splits;
}

// memwall_kvwrite_at: memwall_kvwrite at start = pos[0].
extern "C" __global__ void __launch_bounds__(256) memwall_kvwrite_at(
    const float* k, const float* v, unsigned char* cache, const int32_t* table, const int32_t* pos,
    uint32_t T, uint32_t blockTokens, uint32_t kvHeads, uint32_t headDim, uint32_t layer,
    uint32_t dt, uint64_t blockBytes) {
    pdl_enter();
    kvwrite_rows(k, v, cache, table, (uint32_t)pos[0], T, blockTokens, kvHeads, headDim, layer, dt, blockBytes);
}

// memwall_attn_at_e<E>, memwall_attn_decode_at: memwall_attn_e<E> and
// memwall_attn_decode with start and chunk replaced by pos and cap.
#define MEMWALL_ATTN_AT_ENTRY(NAME, BOUNDS, SMEM, BODY)                                                    \
    extern "C" __global__ void BOUNDS NAME(                                                               \
        const float* q, const unsigned char* cache, const int32_t* table, const int32_t* pos, uint32_t T, \
        uint32_t nHeads, uint32_t kvHeads, uint32_t headDim, uint32_t blockTokens, uint32_t layer,         \
        uint32_t dt, uint64_t blockBytes, float scale, uint32_t cap, float* part, void* out,               \
        uint32_t odt) {                                                                                    \
        pdl_enter();                                                                                       \
        __shared__ SMEM sh;                                                                                \
        AttnArgs a{q,     cache,      table, 0u,   T,   nHeads, kvHeads, headDim, blockTokens,             \
                   layer, dt,         blockBytes, scale, 0u, part, out,     odt,     1u};                  \
        if (!attn_at_args(a, pos, cap)) return;                                                            \
        BODY;                                                                                              \
    }

MEMWALL_ATTN_AT_ENTRY(memwall_attn_at_e1, __launch_bounds__(256, 2), AttnSmem, (attn_entry<1>(a, sh)))
MEMWALL_ATTN_AT_ENTRY(memwall_attn_at_e2, __launch_bounds__(256, 2), AttnSmem, (attn_entry<2>(a, sh)))
MEMWALL_ATTN_AT_ENTRY(memwall_attn_at_e4, __launch_bounds__(256, 2), AttnSmem, (attn_entry<4>(a, sh)))
MEMWALL_ATTN_AT_ENTRY(memwall_attn_at_e8, __launch_bounds__(256), AttnSmem, (attn_entry<8>(a, sh)))
MEMWALL_ATTN_AT_ENTRY(memwall_attn_decode_at, __launch_bounds__(256), DecodeSmem, (attn_decode_entry(a, sh)))

// memwall_attn_combine_at: memwall_attn_combine with the splits of the
// context pos[0] + T under cap (attn_at_args' rule); one split means the
// attention kernel wrote out itself, and this one returns.
extern "C" __global__ void __launch_bounds__(256) memwall_attn_combine_at(
    const float* part, void* out, uint32_t odt, uint32_t rows, uint32_t headDim, const int32_t* pos,
    uint32_t T, uint32_t cap) {
    pdl_enter();
    __shared__ CombineSmem sh;
    AttnArgs a{};
    a.T = T;
    attn_at_args(a, pos, cap);
    if (a.splits <= 1) return;
    attn_combine(part, out, odt, rows, headDim, a.splits, sh);
}

// ---------------------------------------------------------------------------
// Rows of many sequences, for a batched step: row t (< T) is one token of its
// own sequence, at position pos[t], with block table tables + t*perSeq. Each
// row computes what memwall_kvwrite and memwall_attn_decode compute for that
// sequence alone at T = 1 (its context split under cap as attn_at_args
// splits it), so one launch serves every decoding sequence of the step.
// The partials of row t's splits lie at part + (t*nHeads*gridDim.z +
// h*splits_t + s)*(headDim + 2); memwall_attn_combine_rows merges them.

extern "C" __global__ void __launch_bounds__(256) memwall_kvwrite_rows(
    const float* k, const float* v, unsigned char* cache, const int32_t* tables, const int32_t* pos,
    uint32_t T, uint32_t blockTokens, uint32_t kvHeads, uint32_t headDim, uint32_t layer,
    uint32_t dt, uint64_t blockBytes, uint32_t perSeq) {
    pdl_enter();
    kvwrite_rows(k, v, cache, tables, 0u, T, blockTokens, kvHeads, headDim, layer, dt, blockBytes, pos, perSeq);
}

// memwall_attn_decode_rows: grid (kvHeads, T, the most splits of any row),
// block 256; memwall_attn_decode_at's arguments with tables for table and
// perSeq last.
extern "C" __global__ void __launch_bounds__(256) memwall_attn_decode_rows(
    const float* q, const unsigned char* cache, const int32_t* tables, const int32_t* pos, uint32_t T,
    uint32_t nHeads, uint32_t kvHeads, uint32_t headDim, uint32_t blockTokens, uint32_t layer,
    uint32_t dt, uint64_t blockBytes, float scale, uint32_t cap, float* part, void* out,
    uint32_t odt, uint32_t perSeq) {
    pdl_enter();
    __shared__ DecodeSmem sh;
    const uint32_t t = blockIdx.y;
    const uint32_t p = (uint32_t)pos[t];
    AttnArgs a{q,     cache, tables + (uint64_t)t * perSeq, 0u,   T,   nHeads, kvHeads, headDim, blockTokens,
               layer, dt,    blockBytes,                    scale, 0u, part, out,     odt,     1u};
    attn_split_rule(a, (uint64_t)p + 1, cap);
    if (blockIdx.z >= a.splits) return;
    a.start = p - t;  // attn_decode's context of row t is start + t + 1
    a.part = part + (uint64_t)t * nHeads * (gridDim.z - a.splits) * (headDim + 2);
    attn_decode_entry(a, sh);
}

// memwall_attn_combine_rows: the rows' splits merged, rows = T*nHeads
// (row r: token r / nHeads); zmax is the attention launch's grid.z. A row
// of one split was written by the attention kernel itself.
extern "C" __global__ void __launch_bounds__(256) memwall_attn_combine_rows(
    const float* part, void* out, uint32_t odt, uint32_t rows, uint32_t headDim, const int32_t* pos,
    uint32_t T, uint32_t cap, uint32_t zmax) {
    pdl_enter();
    __shared__ CombineSmem sh;
    const uint32_t nh = rows / T;
    for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const uint64_t t = row / nh, h = row % nh;
        AttnArgs a{};
        attn_split_rule(a, (uint64_t)(uint32_t)pos[t] + 1, cap);
        if (a.splits <= 1) continue;  // uniform over the block
        attn_combine_row(part + (t * nh * zmax + h * a.splits) * (headDim + 2), out, odt, row, headDim, a.splits, sh);
    }
}

// ===========================================================================
// Products and embedding lookups over block-quantized weights (GGUF/ggml
// layouts, as package format/quant reads them), float32 activations.
//
// memwall_qmatmul_<type>(W, X, Y, M, K, T): Y[t][m] = Σ_k w[m][k]·X[t][k]
// for m < M, t < T, W's row m the K/blockElems blocks of its type (K any
// for f16w/bf16w); one warp per row (8 rows a block of 256 threads). The
// warp walks the row's 32-element chunks together, lane l dequantizing
// element l of each (QElem), so that a warp's loads of quants, of
// activations and of the block's scales are each one run of consecutive
// bytes (or one address for all lanes): the memory system sees whole
// sectors, not 32 scattered bytes per instruction. Each element is
// dequantized once per tile of kQTile tokens; partial sums are reduced with
// warp shuffles. memwall_qembed_<type>(table, ids, out, T, H): out[t] is
// row ids[t] of the table dequantized, a block a token, threads over
// elements.
//
// The dequantized values are ggml's bit for bit: each product and sum is
// rounded as format/quant rounds it (__fmul_rn/__fsub_rn, no contraction
// into an FMA). W need only be 2-byte aligned (a Q8_0 block is 34 bytes):
// it is read a byte at a time (bf16w/f16w two bytes at a time).

constexpr uint32_t kQTile = 8;

__device__ __forceinline__ uint32_t qb(const uint8_t* p, uint32_t i) { return __ldg(p + i); }

__device__ __forceinline__ float qf16(const uint8_t* p) { return f16_to_f32(qb(p, 0) | qb(p, 1) << 8); }

__device__ __forceinline__ uint32_t qle32(const uint8_t* p) {
    return qb(p, 0) | qb(p, 1) << 8 | qb(p, 2) << 16 | qb(p, 3) << 24;
}

// Q4_K's and Q5_K's 6-bit scale and min of sub-block j (ggml's
// get_scale_min_k4).
__device__ __forceinline__ void q_scale_min_k4(const uint8_t* q, uint32_t j, uint32_t& sc, uint32_t& m) {
    if (j < 4) {
        sc = qb(q, j) & 63;
        m = qb(q, j + 4) & 63;
    } else {
        sc = (qb(q, j + 4) & 0xF) | (qb(q, j - 4) >> 6) << 4;
        m = (qb(q, j + 4) >> 4) | (qb(q, j) >> 6) << 4;
    }
}

// Sub-block s's scale and min in a Q4_K or Q5_K block b, as the
// dequantizer applies them: d·sc and dmin·m (format/quant's subScale).
__device__ __forceinline__ void q_sub_scale(const uint8_t* b, uint32_t s, float& d1, float& m1) {
    uint32_t sc, mn;
    q_scale_min_k4(b + 4, s, sc, mn);
    d1 = __fmul_rn(qf16(b), (float)sc);
    m1 = __fmul_rn(qf16(b + 2), (float)mn);
}

// QElem<kind>::get(row, c, l, K): element 32c+l of the row, dequantized
// (0 past K, which only f16w/bf16w rows can reach).
enum QKind { kQ8_0, kQ4_0, kQ5_0, kQ5_1, kQ4_K, kQ5_K, kQ6_K, kQF16, kQBF16 };

template <int kind>
struct QElem;

template <>
struct QElem<kQ8_0> {
    static __device__ __forceinline__ float get(const uint8_t* row, uint32_t c, uint32_t l, uint32_t) {
        const uint8_t* b = row + 34ull * c;
        return __fmul_rn((float)(int8_t)qb(b, 2 + l), qf16(b));
    }
};

// Q4_0, Q5_0 and Q5_1: element l < 16 is the low nibble of byte l, the
// others the high nibble of byte l − 16; Q5's fifth bit l is bit l of qh.
template <>
struct QElem<kQ4_0> {
    static __device__ __forceinline__ float get(const uint8_t* row, uint32_t c, uint32_t l, uint32_t) {
        const uint8_t* b = row + 18ull * c;
        const uint32_t q = (qb(b, 2 + (l & 15)) >> (l & 16 ? 4 : 0)) & 0xF;
        return __fmul_rn((float)((int)q - 8), qf16(b));
    }
};

template <>
struct QElem<kQ5_0> {
    static __device__ __forceinline__ float get(const uint8_t* row, uint32_t c, uint32_t l, uint32_t) {
        const uint8_t* b = row + 22ull * c;
        const uint32_t h = ((qle32(b + 2) >> l) & 1) << 4;
        const uint32_t q = ((qb(b, 6 + (l & 15)) >> (l & 16 ? 4 : 0)) & 0xF) | h;
        return __fmul_rn((float)((int)q - 16), qf16(b));
    }
};

template <>
struct QElem<kQ5_1> {
    static __device__ __forceinline__ float get(const uint8_t* row, uint32_t c, uint32_t l, uint32_t) {
        const uint8_t* b = row + 24ull * c;
        const uint32_t h = ((qle32(b + 4) >> l) & 1) << 4;
        const uint32_t q = ((qb(b, 8 + (l & 15)) >> (l & 16 ? 4 : 0)) & 0xF) | h;
        return __fadd_rn(__fmul_rn((float)q, qf16(b)), qf16(b + 2));
    }
};

// Q4_K (144-byte blocks) and, with k5, Q5_K (176 bytes: a 32-byte plane of
// fifth bits at 16, the nibbles at 48): chunk c is sub-block c % 8 of block
// c / 8, the low or high nibbles of 32 bytes.
template <bool k5>
__device__ __forceinline__ float q_k45_get(const uint8_t* row, uint32_t c, uint32_t l) {
    const uint8_t* b = row + (k5 ? 176ull : 144ull) * (c / 8);
    const uint32_t s = c % 8;
    float d1, m1;
    q_sub_scale(b, s, d1, m1);
    uint32_t q = (qb(b + (k5 ? 48 : 16) + 32 * (s / 2), l) >> ((s & 1) * 4)) & 0xF;
    if (k5) q |= ((qb(b + 16, l) >> s) & 1) << 4;
    return __fsub_rn(__fmul_rn(d1, (float)q), m1);
}

template <>
struct QElem<kQ4_K> {
    static __device__ __forceinline__ float get(const uint8_t* row, uint32_t c, uint32_t l, uint32_t) {
        return q_k45_get<false>(row, c, l);
    }
};

template <>
struct QElem<kQ5_K> {
    static __device__ __forceinline__ float get(const uint8_t* row, uint32_t c, uint32_t l, uint32_t) {
        return q_k45_get<true>(row, c, l);
    }
};

// Q6_K (210 bytes): chunk c is sub-block s = c % 8 of block c / 8, elements
// 128·(s/4) + 32·(s%4) + l: four low bits from ql, two high from qh, a
// signed scale per 16 elements.
template <>
struct QElem<kQ6_K> {
    static __device__ __forceinline__ float get(const uint8_t* row, uint32_t c, uint32_t l, uint32_t) {
        const uint8_t* b = row + 210ull * (c / 8);
        const uint32_t s = c % 8, n = s / 4, g = s % 4;
        const uint32_t lo = (qb(b + 64 * n + 32 * (g & 1), l) >> ((g >> 1) * 4)) & 0xF;
        const uint32_t hi = (qb(b + 128 + 32 * n, l) >> (2 * g)) & 3;
        const float ds = __fmul_rn(qf16(b + 208), (float)(int8_t)qb(b + 192 + 8 * n + 2 * g, l / 16));
        return __fmul_rn(ds, (float)((int)(lo | hi << 4) - 32));
    }
};

template <>
struct QElem<kQF16> {
    static __device__ __forceinline__ float get(const uint8_t* row, uint32_t c, uint32_t l, uint32_t K) {
        const uint32_t k = 32 * c + l;
        return k < K ? f16_to_f32(__ldg(reinterpret_cast<const uint16_t*>(row) + k)) : 0.0f;
    }
};

template <>
struct QElem<kQBF16> {
    static __device__ __forceinline__ float get(const uint8_t* row, uint32_t c, uint32_t l, uint32_t K) {
        const uint32_t k = 32 * c + l;
        return k < K ? bf16_to_f32(__ldg(reinterpret_cast<const uint16_t*>(row) + k)) : 0.0f;
    }
};

// The bytes of a K-element row of kind (K a whole number of its blocks).
template <int kind>
__device__ __forceinline__ uint64_t q_row_bytes(uint32_t K) {
    switch (kind) {
        case kQ8_0: return 34ull * (K / 32);
        case kQ4_0: return 18ull * (K / 32);
        case kQ5_0: return 22ull * (K / 32);
        case kQ5_1: return 24ull * (K / 32);
        case kQ4_K: return 144ull * (K / 256);
        case kQ5_K: return 176ull * (K / 256);
        case kQ6_K: return 210ull * (K / 256);
        default: return 2ull * K;
    }
}

template <int kind>
__device__ __forceinline__ void qmatmul(const uint8_t* W, const float* X, float* Y, uint32_t M, uint32_t K,
                                        uint32_t T) {
    const uint32_t lane = threadIdx.x % 32;
    const uint64_t m = (uint64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (m >= M) return;
    const uint8_t* row = W + m * q_row_bytes<kind>(K);
    const uint32_t chunks = (K + 31) / 32;
    for (uint32_t t0 = 0; t0 < T; t0 += kQTile) {
        const uint32_t nt = min(kQTile, T - t0);
        float acc[kQTile];
#pragma unroll
        for (uint32_t j = 0; j < kQTile; j++) acc[j] = 0.0f;
#pragma unroll 4
        for (uint32_t c = 0; c < chunks; c++) {
            const uint32_t k = 32 * c + lane;
            const float w = QElem<kind>::get(row, c, lane, K);
            if (k < K) {  // false only in the last chunk of an f16w/bf16w row
                const float* x = X + (uint64_t)t0 * K + k;
#pragma unroll
                for (uint32_t j = 0; j < kQTile; j++)
                    if (j < nt) acc[j] = fmaf(w, __ldg(x + (uint64_t)j * K), acc[j]);
            }
        }
#pragma unroll
        for (uint32_t j = 0; j < kQTile; j++) {
            float s = acc[j];
#pragma unroll
            for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
            if (lane == 0 && j < nt) Y[(uint64_t)(t0 + j) * M + m] = s;
        }
    }
}

// Wide-load paths for the two types a Q4_K_M file is made of. The chunk
// walk above issues a byte load per quant and per scale byte (seven to ten
// load instructions per 32 elements), and the H200 measured it bound by
// those instructions: 22 tokens/s on a 7B Q4_K_M, 90 GB/s. Here a warp
// takes a whole 256-element block per step and each lane 8 of its
// elements: one 4-byte load of quants (Q4_K) or three 2-byte loads (Q6_K),
// the block's scales as broadcast words, the activations as float4/float2.
// The dequantized values are the chunk walk's, rounded the same way; only
// the order of the float32 sum differs.

// Byte i of the 12 Q4_K/Q5_K scale bytes held as three little-endian words.
__device__ __forceinline__ uint32_t q_scale_byte(const uint32_t (&w)[3], uint32_t i) {
    return (w[i / 4] >> (8 * (i % 4))) & 0xFF;
}

// ggml's get_scale_min_k4 over the scale words.
__device__ __forceinline__ void q_scale_min_w(const uint32_t (&w)[3], uint32_t j, uint32_t& sc, uint32_t& m) {
    if (j < 4) {
        sc = q_scale_byte(w, j) & 63;
        m = q_scale_byte(w, j + 4) & 63;
    } else {
        sc = (q_scale_byte(w, j + 4) & 0xF) | (q_scale_byte(w, j - 4) >> 6) << 4;
        m = (q_scale_byte(w, j + 4) >> 4) | (q_scale_byte(w, j) >> 6) << 4;
    }
}

// The warp's partial sums acc[j] reduced and written as Y[t0 + j][m].
__device__ __forceinline__ void q_store(const float (&acc)[kQTile], float* Y, uint32_t M, uint64_t m, uint32_t t0,
                                        uint32_t nt, uint32_t lane) {
#pragma unroll
    for (uint32_t j = 0; j < kQTile; j++) {
        float s = acc[j];
#pragma unroll
        for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
        if (lane == 0 && j < nt) Y[(uint64_t)(t0 + j) * M + m] = s;
    }
}

// Q4_K with W 4-byte and X 16-byte aligned: lane l takes quant bytes
// 4l..4l+3 of each block, the low nibbles elements 64(l/8) + 4(l%8) + i of
// sub-block 2(l/8), the high nibbles the same 32 further on, sub-block
// 2(l/8) + 1.
__device__ __forceinline__ void qmatmul_q4k_wide(const uint8_t* W, const float* X, float* Y, uint32_t M, uint32_t K,
                                                 uint32_t T) {
    const uint32_t lane = threadIdx.x % 32;
    const uint64_t m = (uint64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (m >= M) return;
    const uint32_t nb = K / 256, g = lane / 8, e0 = 64 * g + 4 * (lane % 8);
    const uint32_t* row = reinterpret_cast<const uint32_t*>(W + m * 144ull * nb);
    for (uint32_t t0 = 0; t0 < T; t0 += kQTile) {
        const uint32_t nt = min(kQTile, T - t0);
        float acc[kQTile];
#pragma unroll
        for (uint32_t j = 0; j < kQTile; j++) acc[j] = 0.0f;
#pragma unroll 2
        for (uint32_t b = 0; b < nb; b++) {
            const uint32_t* blk = row + 36 * b;  // 144 bytes
            const uint32_t h = __ldg(blk);
            const uint32_t sw[3] = {__ldg(blk + 1), __ldg(blk + 2), __ldg(blk + 3)};
            const uint32_t q = __ldg(blk + 4 + lane);
            const float d = f16_to_f32(h & 0xFFFF), dmin = f16_to_f32(h >> 16);
            uint32_t sc, mn;
            q_scale_min_w(sw, 2 * g, sc, mn);
            const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)mn);
            q_scale_min_w(sw, 2 * g + 1, sc, mn);
            const float dh = __fmul_rn(d, (float)sc), mh = __fmul_rn(dmin, (float)mn);
            float w[8];
#pragma unroll
            for (uint32_t i = 0; i < 4; i++) {
                w[i] = __fsub_rn(__fmul_rn(dl, (float)((q >> (8 * i)) & 0xF)), ml);
                w[4 + i] = __fsub_rn(__fmul_rn(dh, (float)((q >> (8 * i + 4)) & 0xF)), mh);
            }
            const float* x = X + (uint64_t)t0 * K + 256ull * b + e0;
#pragma unroll
            for (uint32_t j = 0; j < kQTile; j++) {
                if (j < nt) {
                    const float4 lo = __ldg(reinterpret_cast<const float4*>(x + (uint64_t)j * K));
                    const float4 hi = __ldg(reinterpret_cast<const float4*>(x + (uint64_t)j * K + 32));
                    float a = acc[j];
                    a = fmaf(w[0], lo.x, a);
                    a = fmaf(w[1], lo.y, a);
                    a = fmaf(w[2], lo.z, a);
                    a = fmaf(w[3], lo.w, a);
                    a = fmaf(w[4], hi.x, a);
                    a = fmaf(w[5], hi.y, a);
                    a = fmaf(w[6], hi.z, a);
                    a = fmaf(w[7], hi.w, a);
                    acc[j] = a;
                }
            }
        }
        q_store(acc, Y, M, m, t0, nt, lane);
    }
}

// Q4_K with W and X 16-byte aligned (the usual case: tensors and arena
// buffers start on 16 bytes, and a 144-byte block keeps it): eight lanes a
// block, four blocks a step, lane u = l%8 taking quant bytes 16u..16u+15
// as one 16-byte load, the block's header (d, dmin, the 12 scale bytes) as
// one broadcast 16-byte load, and its 32 activations as eight float4s.
// Four times the bytes in flight per warp of the 4-byte path below, and
// the scale decoding spread over 32 elements instead of 8.
__device__ __forceinline__ void qmatmul_q4k_wide16(const uint8_t* W, const float* X, float* Y, uint32_t M,
                                                   uint32_t K, uint32_t T) {
    const uint32_t lane = threadIdx.x % 32;
    const uint64_t m = (uint64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (m >= M) return;
    const uint32_t nb = K / 256, u = lane % 8, g = u / 2, e0 = 64 * g + 16 * (u % 2);
    const uint4* row = reinterpret_cast<const uint4*>(W + m * 144ull * nb);
    for (uint32_t t0 = 0; t0 < T; t0 += kQTile) {
        const uint32_t nt = min(kQTile, T - t0);
        float acc[kQTile];
#pragma unroll
        for (uint32_t j = 0; j < kQTile; j++) acc[j] = 0.0f;
        for (uint32_t b = lane / 8; b < nb; b += 4) {
            const uint4* blk = row + 9 * b;  // 144 bytes
            const uint4 hd = __ldg(blk);
            const uint4 q = __ldg(blk + 1 + u);
            const float d = f16_to_f32(hd.x & 0xFFFF), dmin = f16_to_f32(hd.x >> 16);
            const uint32_t sw[3] = {hd.y, hd.z, hd.w};
            uint32_t sc, mn;
            q_scale_min_w(sw, 2 * g, sc, mn);
            const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)mn);
            q_scale_min_w(sw, 2 * g + 1, sc, mn);
            const float dh = __fmul_rn(d, (float)sc), mh = __fmul_rn(dmin, (float)mn);
            const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
            float wl[16], wh[16];
#pragma unroll
            for (uint32_t i = 0; i < 16; i++) {
                const uint32_t v = (qw[i / 4] >> (8 * (i % 4))) & 0xFF;
                wl[i] = __fsub_rn(__fmul_rn(dl, (float)(v & 0xF)), ml);
                wh[i] = __fsub_rn(__fmul_rn(dh, (float)(v >> 4)), mh);
            }
            const float* x = X + (uint64_t)t0 * K + 256ull * b + e0;
#pragma unroll
            for (uint32_t j = 0; j < kQTile; j++) {
                if (j < nt) {
                    const float4* xv = reinterpret_cast<const float4*>(x + (uint64_t)j * K);
                    float a = acc[j];
#pragma unroll
                    for (uint32_t k = 0; k < 4; k++) {
                        const float4 lo = __ldg(xv + k), hi = __ldg(xv + 8 + k);
                        a = fmaf(wl[4 * k], lo.x, a);
                        a = fmaf(wl[4 * k + 1], lo.y, a);
                        a = fmaf(wl[4 * k + 2], lo.z, a);
                        a = fmaf(wl[4 * k + 3], lo.w, a);
                        a = fmaf(wh[4 * k], hi.x, a);
                        a = fmaf(wh[4 * k + 1], hi.y, a);
                        a = fmaf(wh[4 * k + 2], hi.z, a);
                        a = fmaf(wh[4 * k + 3], hi.w, a);
                    }
                    acc[j] = a;
                }
            }
        }
        q_store(acc, Y, M, m, t0, nt, lane);
    }
}

// Q6_K with X 8-byte aligned (W 2-byte, as always): lanes 0–15 take the
// block's first 128 elements, 16–31 the second; lane l's positions are
// p = 2(l%16) and p + 1 of each of the four 32-element groups, read as
// 2-byte pairs of ql (two) and qh (one).
__device__ __forceinline__ void qmatmul_q6k_wide(const uint8_t* W, const float* X, float* Y, uint32_t M, uint32_t K,
                                                 uint32_t T) {
    const uint32_t lane = threadIdx.x % 32;
    const uint64_t m = (uint64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (m >= M) return;
    const uint32_t nb = K / 256, n = lane / 16, p = 2 * (lane % 16);
    const uint8_t* row = W + m * 210ull * nb;
    for (uint32_t t0 = 0; t0 < T; t0 += kQTile) {
        const uint32_t nt = min(kQTile, T - t0);
        float acc[kQTile];
#pragma unroll
        for (uint32_t j = 0; j < kQTile; j++) acc[j] = 0.0f;
#pragma unroll 2
        for (uint32_t b = 0; b < nb; b++) {
            const uint8_t* blk = row + 210ull * b;
            const uint16_t* h = reinterpret_cast<const uint16_t*>(blk);
            const uint32_t qa = __ldg(h + (64 * n + p) / 2), qb2 = __ldg(h + (64 * n + 32 + p) / 2);
            const uint32_t qh = __ldg(h + (128 + 32 * n + p) / 2);
            const float d = f16_to_f32(__ldg(h + 104));
            const uint8_t* scp = blk + 192 + 8 * n + p / 16;
            float ds[4];
#pragma unroll
            for (uint32_t k = 0; k < 4; k++) ds[k] = __fmul_rn(d, (float)(int8_t)qb(scp, 2 * k));
            float w[8];  // w[2k + i]: group k, position p + i
#pragma unroll
            for (uint32_t i = 0; i < 2; i++) {
                const uint32_t l0 = (qa >> (8 * i)) & 0xFF, l1 = (qb2 >> (8 * i)) & 0xFF, hh = (qh >> (8 * i)) & 0xFF;
                const uint32_t q[4] = {(l0 & 0xF) | (hh & 3) << 4, (l1 & 0xF) | ((hh >> 2) & 3) << 4,
                                       (l0 >> 4) | ((hh >> 4) & 3) << 4, (l1 >> 4) | ((hh >> 6) & 3) << 4};
#pragma unroll
                for (uint32_t k = 0; k < 4; k++) w[2 * k + i] = __fmul_rn(ds[k], (float)((int)q[k] - 32));
            }
            const float* x = X + (uint64_t)t0 * K + 256ull * b + 128 * n + p;
#pragma unroll
            for (uint32_t j = 0; j < kQTile; j++) {
                if (j < nt) {
                    float a = acc[j];
#pragma unroll
                    for (uint32_t k = 0; k < 4; k++) {
                        const float2 v = __ldg(reinterpret_cast<const float2*>(x + (uint64_t)j * K + 32 * k));
                        a = fmaf(w[2 * k], v.x, a);
                        a = fmaf(w[2 * k + 1], v.y, a);
                    }
                    acc[j] = a;
                }
            }
        }
        q_store(acc, Y, M, m, t0, nt, lane);
    }
}

// ===========================================================================
// Decode products over 8-bit activations: memwall_q8mv(X, K, T, then three
// products (W, Y, M, kind)) computes, for each product with M > 0 and each
// token t < T in turn, Y[t][m] ≈ Σ_k w[m][k]·X[t][k] for m < M with X[t]
// quantized to 8 bits, the way llama.cpp's MMVQ kernels multiply: each
// 32-element chunk c of X[t] becomes d_c = amax_c/127 and q_k =
// rint(x_k·(127/amax_c)) (round half to even, clamped to ±127; 0 when
// amax_c = 0; a NaN in the chunk makes d_c NaN), and the product is the
// integer dot of the weights' quants with q, scaled by the blocks' scales
// and d_c:
//   Y[t][m] = Σ_c d_c · Σ_{k∈c} w[m][k]·q_k   (w as format/quant dequantizes it)
// up to float32 rounding of that sum's terms (the kernel scales integer
// dots — Q4_K: d·sc·Σq·x − dmin·m·Σx per sub-block — instead of rounding
// each w·q). Against the float product the activations' rounding moves Y
// by at most Σ_c d_c/2·Σ_{k∈c}|w[m][k]|. kind is kQ4_K or kQ6_K; the
// products share X and K (a layer's q, k, v or gate, up: one launch).
//
// Why: a float32 product must dequantize every weight to a float and do one
// FMA per weight; the H200 measured it bound by those instructions (a 7B
// Q4_K_M at 575 GB/s of quantized bytes, 4 TB/s available). Here __dp4a
// multiplies four quants by four activations in one instruction and the
// nibble masks take two more per four weights.
//
// Layout: a block of 256 threads is two groups of four warps, each group
// GR rows; a group's 32·4 lanes take its rows' 256-element
// blocks kQ8Slots at a time, eight lanes a block (lane u = l%8 takes 32 of
// its elements), the warps of a group side by side along K. Each lane loads
// its 32 activations, quantizes them in registers (the lanes that share a
// chunk exchange their maxima), and multiplies them into all the group's
// rows; the weights of the first half of the rows are loaded before the
// activations, the second half's before the first half's arithmetic. Partial
// sums meet in shared memory. No staging and no barrier before the
// arithmetic: the first step's loads all leave at once. W 16-byte aligned
// for Q4_K (a 144-byte block keeps it), 2-byte for Q6_K; X 4-byte aligned
// (16-byte: float4 loads).

// GR, a template parameter, is the rows a group takes (8: memwall_q8mv,
// 4: memwall_q8mv_r4, fewer registers and twice the blocks); H = GR/2.
constexpr uint32_t kQ8Slots = 16;  // 256-element blocks a group takes a step

// a NaN-propagating max of |v| into a (fmaxf drops a NaN)
__device__ __forceinline__ float q8_absmax(float a, float v) {
    const float b = fabsf(v);
    return (b > a || b != b) ? b : a;
}

__device__ __forceinline__ uint32_t q8_round(float v, float id) {
    const float r = rintf(__fmul_rn(v, id));
    return (uint32_t)((int)fminf(fmaxf(r, -127.0f), 127.0f) & 0xFF);
}

// Quantizes this lane's N activations v of a 32-element chunk that L
// consecutive lanes share (every lane of the warp calls it) into q, four
// to a word; returns d_c.
template <int N, int L>
__device__ __forceinline__ float q8_quant(const float (&v)[N], uint32_t (&q)[N / 4]) {
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < N; i++) a = q8_absmax(a, v[i]);
#pragma unroll
    for (int o = 1; o < L; o *= 2) a = q8_absmax(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
    const float d = __fdiv_rn(a, 127.0f);
    const float id = a > 0.0f ? __fdiv_rn(127.0f, a) : 0.0f;
#pragma unroll
    for (int i = 0; i < N / 4; i++)
        q[i] = q8_round(v[4 * i], id) | q8_round(v[4 * i + 1], id) << 8 | q8_round(v[4 * i + 2], id) << 16 |
               q8_round(v[4 * i + 3], id) << 24;
    return d;
}

// N floats at p (4-byte aligned; 16-byte when v4), or zeros when !ok.
template <int N>
__device__ __forceinline__ void q8_ldx(const float* p, bool v4, bool ok, float (&v)[N]) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
        float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (ok && v4)
            f = __ldg(reinterpret_cast<const float4*>(p + i));
        else if (ok)
            f = make_float4(__ldg(p + i), __ldg(p + i + 1), __ldg(p + i + 2), __ldg(p + i + 3));
        v[i] = f.x, v[i + 1] = f.y, v[i + 2] = f.z, v[i + 3] = f.w;
    }
}

// Σ of the signed bytes of the words.
template <int N>
__device__ __forceinline__ int q8_sum(const uint32_t (&q)[N]) {
    int s = 0;
#pragma unroll
    for (int i = 0; i < N; i++) s = __dp4a(0x01010101, (int)q[i], s);
    return s;
}

// Q4_K: lane u takes quant bytes 16u..16u+15 of a block (one 16-byte
// load): their low nibbles are elements e0 + i (e0 = 64g + 16h, g = u/2,
// h = u%2, i < 16: sub-block 2g), their high nibbles e0 + 32 + i
// (sub-block 2g + 1); the block's header (d, dmin, 12 scale bytes) is one
// 16-byte load the eight lanes share.
template <uint32_t H>
struct Q4KRows {
    uint4 hd[H], q[H];
};

template <uint32_t H>
__device__ __forceinline__ void q4k_load(const uint4* row0, uint64_t rowVecs, uint32_t rows, uint32_t b, uint32_t u,
                                         bool ok, Q4KRows<H>& s) {
#pragma unroll
    for (uint32_t r = 0; r < H; r++) {
        const uint4* blk = row0 + min(r, rows - 1) * rowVecs + 9 * b;
        s.hd[r] = ok ? __ldg(blk) : make_uint4(0, 0, 0, 0);
        s.q[r] = ok ? __ldg(blk + 1 + u) : make_uint4(0, 0, 0, 0);
    }
}

struct Q4KAct {
    uint32_t l[4], h[4];
    float dl, dh, sl, sh;
};

__device__ __forceinline__ void q4k_act(const float* x, bool v4, uint32_t b, uint32_t u, bool ok, Q4KAct& a) {
    float lo[16], hi[16];
    const float* p = x + 256ull * b + 64 * (u / 2) + 16 * (u % 2);
    q8_ldx(p, v4, ok, lo);
    q8_ldx(p + 32, v4, ok, hi);
    a.dl = q8_quant<16, 2>(lo, a.l);
    a.dh = q8_quant<16, 2>(hi, a.h);
    a.sl = (float)q8_sum(a.l);
    a.sh = (float)q8_sum(a.h);
}

template <uint32_t H>
__device__ __forceinline__ void q4k_mul(const Q4KRows<H>& s, const Q4KAct& a, uint32_t u, float* acc) {
    const uint32_t g = u / 2;
#pragma unroll
    for (uint32_t r = 0; r < H; r++) {
        const uint4 hd = s.hd[r], q = s.q[r];
        const float d = f16_to_f32(hd.x & 0xFFFF), dmin = f16_to_f32(hd.x >> 16);
        const uint32_t sw[3] = {hd.y, hd.z, hd.w};
        uint32_t sc, mn;
        q_scale_min_w(sw, 2 * g, sc, mn);
        const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)mn);
        q_scale_min_w(sw, 2 * g + 1, sc, mn);
        const float dh = __fmul_rn(d, (float)sc), mh = __fmul_rn(dmin, (float)mn);
        const uint32_t qw[4] = {q.x, q.y, q.z, q.w};
        int il = 0, ih = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            il = __dp4a((int)(qw[i] & 0x0F0F0F0Fu), (int)a.l[i], il);
            ih = __dp4a((int)((qw[i] >> 4) & 0x0F0F0F0Fu), (int)a.h[i], ih);
        }
        acc[r] += a.dl * (dl * (float)il - ml * a.sl) + a.dh * (dh * (float)ih - mh * a.sh);
    }
}

// Q6_K: lane u takes elements 128n + 32j + p + i of a block (n = u/4,
// p = 8(u%4), j < 4, i < 8): eight bytes of ql at 64n + p and at
// 64n + 32 + p (low nibbles for j = 0, 1, high for j = 2, 3), eight of qh
// at 128 + 32n + p (two bits a j), and scales 8n + 2j + (u%4)/2. A block is
// 210 bytes, so a row's blocks are only 2-byte aligned: 8-byte runs are
// read as the aligned words that hold them and shifted into place.
template <uint32_t H>
struct Q6KRows {
    uint2 l0[H], l1[H], h[H];
    uint32_t sc[H];  // the lane's four int8 scales, j = 0..3
    float d[H];
};

// The 8 bytes at p (2-byte aligned) as two little-endian words; reads the
// aligned words that hold them (up to 4 bytes past the run, inside the
// block for every run q6k_load reads).
__device__ __forceinline__ uint2 q8_ld8(const uint8_t* p) {
    const uint32_t* a = reinterpret_cast<const uint32_t*>((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = ((uint32_t)(uintptr_t)p & 2u) * 8;
    const uint32_t w0 = __ldg(a), w1 = __ldg(a + 1), w2 = __ldg(a + 2);
    return make_uint2(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh));
}

template <uint32_t H>
__device__ __forceinline__ void q6k_load(const uint8_t* row0, uint64_t rowBytes, uint32_t rows, uint32_t b,
                                         uint32_t u, bool ok, Q6KRows<H>& s) {
    const uint32_t n = u / 4, p = 8 * (u % 4), o = (u % 4) / 2;
#pragma unroll
    for (uint32_t r = 0; r < H; r++) {
        if (!ok) {
            s.l0[r] = s.l1[r] = s.h[r] = make_uint2(0, 0);
            s.sc[r] = 0, s.d[r] = 0.0f;
            continue;
        }
        const uint8_t* blk = row0 + min(r, rows - 1) * rowBytes + 210ull * b;
        s.l0[r] = q8_ld8(blk + 64 * n + p);
        s.l1[r] = q8_ld8(blk + 64 * n + 32 + p);
        s.h[r] = q8_ld8(blk + 128 + 32 * n + p);
        // scale 2j + o of the eight at 192 + 8n: byte o of the pair j
        const uint16_t* sc = reinterpret_cast<const uint16_t*>(blk + 192 + 8 * n);
        uint32_t w = 0;
#pragma unroll
        for (uint32_t j = 0; j < 4; j++) w |= ((uint32_t)(__ldg(sc + j) >> (8 * o)) & 0xFF) << (8 * j);
        s.sc[r] = w;
        s.d[r] = f16_to_f32(__ldg(reinterpret_cast<const uint16_t*>(blk + 208)));
    }
}

struct Q6KAct {
    uint32_t q[4][2];
    float d[4];
    int s32[4];  // 32·Σq of each j (the quants' offset)
};

__device__ __forceinline__ void q6k_act(const float* x, bool v4, uint32_t b, uint32_t u, bool ok, Q6KAct& a) {
    const float* p = x + 256ull * b + 128 * (u / 4) + 8 * (u % 4);
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) {
        float v[8];
        q8_ldx(p + 32 * j, v4, ok, v);
        a.d[j] = q8_quant<8, 4>(v, a.q[j]);
        a.s32[j] = 32 * q8_sum(a.q[j]);
    }
}

template <uint32_t H>
__device__ __forceinline__ void q6k_mul(const Q6KRows<H>& s, const Q6KAct& a, float* acc) {
#pragma unroll
    for (uint32_t r = 0; r < H; r++) {
        float sum = 0.0f;
#pragma unroll
        for (uint32_t j = 0; j < 4; j++) {
            const uint2 lo = j & 1 ? s.l1[r] : s.l0[r];
            const uint32_t ls = (j >> 1) * 4;
            const uint32_t v0 = ((lo.x >> ls) & 0x0F0F0F0Fu) | (((s.h[r].x >> (2 * j)) & 0x03030303u) << 4);
            const uint32_t v1 = ((lo.y >> ls) & 0x0F0F0F0Fu) | (((s.h[r].y >> (2 * j)) & 0x03030303u) << 4);
            const int iq = __dp4a((int)v0, (int)a.q[j][0], __dp4a((int)v1, (int)a.q[j][1], 0)) - a.s32[j];
            const float ds = __fmul_rn(s.d[r], (float)(int8_t)((s.sc[r] >> (8 * j)) & 0xFF));
            sum += a.d[j] * (ds * (float)iq);
        }
        acc[r] += sum;
    }
}

// One product's rows [m0, m0 + rows) (rows ≤ GR) for token x: the group's
// partial sums into acc. slot = the lane's block within a step.
template <int kind, uint32_t GR>
__device__ __forceinline__ void q8mv_rows(const uint8_t* W, uint64_t rb, uint64_t m0, uint32_t rows, const float* x,
                                          bool v4, uint32_t nb, uint32_t slot, uint32_t u, float (&acc)[GR]) {
    constexpr uint32_t kQ8Half = GR / 2;
    const uint8_t* row0 = W + m0 * rb;
    for (uint32_t b0 = 0; b0 < nb; b0 += kQ8Slots) {
        const uint32_t b = b0 + slot;
        const bool ok = b < nb;
        if constexpr (kind == kQ4_K) {
            const uint4* r0 = reinterpret_cast<const uint4*>(row0);
            Q4KRows<kQ8Half> w0, w1;
            Q4KAct a;
            q4k_load(r0, rb / 16, rows, b, u, ok, w0);
            q4k_act(x, v4, b, u, ok, a);
            q4k_load(r0 + kQ8Half * (rb / 16), rb / 16, rows > kQ8Half ? rows - kQ8Half : 1, b, u,
                     ok && rows > kQ8Half, w1);
            if (ok) {
                q4k_mul(w0, a, u, acc);
                q4k_mul(w1, a, u, acc + kQ8Half);
            }
        } else {
            Q6KRows<kQ8Half> w0, w1;
            Q6KAct a;
            q6k_load(row0, rb, rows, b, u, ok, w0);
            q6k_act(x, v4, b, u, ok, a);
            q6k_load(row0 + kQ8Half * rb, rb, rows > kQ8Half ? rows - kQ8Half : 1, b, u, ok && rows > kQ8Half, w1);
            if (ok) {
                q6k_mul(w0, a, acc);
                q6k_mul(w1, a, acc + kQ8Half);
            }
        }
    }
}

struct Q8Product {
    const void* W;
    float* Y;
    uint32_t M, kind;
};

template <uint32_t GR>
__device__ __forceinline__ void q8mv_group(const float* X, uint32_t K, uint32_t T, const void* W0, float* Y0,
                                           uint32_t M0, uint32_t k0, const void* W1, float* Y1, uint32_t M1,
                                           uint32_t k1, const void* W2, float* Y2, uint32_t M2, uint32_t k2) {
    constexpr uint32_t kQ8GroupRows = GR, kQ8Rows = 2 * GR;
    __shared__ float red[8][GR];
    // this block's product and its block within it (selects, not an
    // indexed array: that would live in local memory)
    const uint32_t n0 = (M0 + kQ8Rows - 1) / kQ8Rows, n1 = (M1 + kQ8Rows - 1) / kQ8Rows;
    uint32_t blk = blockIdx.x;
    Q8Product p = {W0, Y0, M0, k0};
    if (blk >= n0 + n1) {
        p = {W2, Y2, M2, k2};
        blk -= n0 + n1;
    } else if (blk >= n0) {
        p = {W1, Y1, M1, k1};
        blk -= n0;
    }
    const uint32_t nb = K / 256;
    const uint64_t rb = (p.kind == kQ4_K ? 144ull : 210ull) * nb;
    gemv_enter(p.W, rb, p.M, (uint64_t)blk * kQ8Rows, kQ8Rows, (16u << 10) | 0x20000000u);
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, u = lane % 8;
    const uint32_t slot = 4 * (warp % 4) + lane / 8;
    const uint64_t m0 = (uint64_t)blk * kQ8Rows + kQ8GroupRows * (warp / 4);
    const uint32_t rows = m0 < p.M ? (uint32_t)min((uint64_t)kQ8GroupRows, p.M - m0) : 0;
    const bool v4 = ((uintptr_t)X & 15u) == 0 && K % 4 == 0;
    for (uint32_t t = 0; t < T; t++) {
        float acc[kQ8GroupRows];
#pragma unroll
        for (uint32_t r = 0; r < kQ8GroupRows; r++) acc[r] = 0.0f;
        if (rows > 0) {  // (uniform over a group: its warps' shuffles stay whole)
            const float* x = X + (uint64_t)t * K;
            const uint8_t* w = static_cast<const uint8_t*>(p.W);
            if (p.kind == kQ4_K)
                q8mv_rows<kQ4_K, GR>(w, rb, m0, rows, x, v4, nb, slot, u, acc);
            else
                q8mv_rows<kQ6_K, GR>(w, rb, m0, rows, x, v4, nb, slot, u, acc);
        }
#pragma unroll
        for (uint32_t r = 0; r < kQ8GroupRows; r++) {
            float s = acc[r];
#pragma unroll
            for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
            if (lane == 0) red[warp][r] = s;
        }
        __syncthreads();
        if (threadIdx.x < kQ8Rows) {
            const uint32_t g = threadIdx.x / kQ8GroupRows, r = threadIdx.x % kQ8GroupRows;
            const uint64_t m = (uint64_t)blk * kQ8Rows + threadIdx.x;
            if (m < p.M)
                p.Y[(uint64_t)t * p.M + m] = red[4 * g][r] + red[4 * g + 1][r] + red[4 * g + 2][r] + red[4 * g + 3][r];
        }
        __syncthreads();
    }
}

#define MEMWALL_Q8MV_ENTRY(NAME, GR)                                                                         \
    extern "C" __global__ void __launch_bounds__(256)                                                    \
        NAME(const float* X, uint32_t K, uint32_t T, const void* W0, float* Y0, uint32_t M0, uint32_t k0,  \
             const void* W1, float* Y1, uint32_t M1, uint32_t k1, const void* W2, float* Y2, uint32_t M2,  \
             uint32_t k2) {                                                                               \
        q8mv_group<GR>(X, K, T, W0, Y0, M0, k0, W1, Y1, M1, k1, W2, Y2, M2, k2);                         \
    }

MEMWALL_Q8MV_ENTRY(memwall_q8mv, 8)
MEMWALL_Q8MV_ENTRY(memwall_q8mv_r4, 4)


// memwall_q8mvs_<type>(W, X, Y, M, K, T), Q4_K and Q6_K: the same product
// as memwall_q8mv (the same activations, the same integer dots; only the
// float32 order of the sum differs) for one product, laid out otherwise: a
// block of 256 threads takes kQ8SRows consecutive rows, a warp
// kQ8SRowsPerWarp of them side by side along all of K; the block first
// stages X[t] (up to kQ8SSlab elements at a time) quantized into shared
// memory, its first step's weights already loaded, then each warp walks its
// rows' blocks four at a time with the next step's weights loaded before
// the current step's arithmetic. Fewer registers than memwall_q8mv and
// every block reads X once for 32 rows; but a launch per product, and a
// barrier before the arithmetic. Set.SetQ8Layout chooses.

constexpr uint32_t kQ8SSlab = 16384;      // activations staged at a time
constexpr uint32_t kQ8SRowsPerWarp = 4;
constexpr uint32_t kQ8SRows = 8 * kQ8SRowsPerWarp;  // rows a block

struct Q8SStage {
    int8_t q[kQ8SSlab];      // the slab's quantized activations
    float d[kQ8SSlab / 32];  // d_c per 32-element chunk
};


__device__ __forceinline__ int q8s_round(float v, float id) {
    const float r = rintf(__fmul_rn(v, id));
    return (int)fminf(fmaxf(r, -127.0f), 127.0f);
}

// Quantizes x[0, n) (n a multiple of 256) into st; every thread of the
// block calls it. Eight lanes share a 32-element chunk, four elements each.
__device__ __forceinline__ void q8s_stage(const float* x, uint32_t n, Q8SStage& st) {
    const bool v4 = ((uintptr_t)x & 15u) == 0;
    for (uint32_t i = 4 * threadIdx.x; i < n; i += 4 * blockDim.x) {
        float v0, v1, v2, v3;
        if (v4) {
            const float4 f = __ldg(reinterpret_cast<const float4*>(x + i));
            v0 = f.x, v1 = f.y, v2 = f.z, v3 = f.w;
        } else {
            v0 = __ldg(x + i), v1 = __ldg(x + i + 1), v2 = __ldg(x + i + 2), v3 = __ldg(x + i + 3);
        }
        float a = q8_absmax(q8_absmax(q8_absmax(q8_absmax(0.0f, v0), v1), v2), v3);
#pragma unroll
        for (int o = 1; o < 8; o *= 2) a = q8_absmax(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
        const float d = __fdiv_rn(a, 127.0f);
        const float id = a > 0.0f ? __fdiv_rn(127.0f, a) : 0.0f;
        const uint32_t p = (uint32_t)(q8s_round(v0, id) & 0xFF) | (uint32_t)(q8s_round(v1, id) & 0xFF) << 8 |
                           (uint32_t)(q8s_round(v2, id) & 0xFF) << 16 | (uint32_t)(q8s_round(v3, id) & 0xFF) << 24;
        *reinterpret_cast<uint32_t*>(st.q + i) = p;
        if ((threadIdx.x & 7u) == 0) st.d[i / 32] = d;
    }
}

// Σ of the 16 (int4) or 8 (int2) signed bytes.
__device__ __forceinline__ int q8s_sum16(const int4 v) {
    return __dp4a(0x01010101, v.x, __dp4a(0x01010101, v.y, __dp4a(0x01010101, v.z, __dp4a(0x01010101, v.w, 0))));
}

__device__ __forceinline__ int q8s_sum8(const int2 v) {
    return __dp4a(0x01010101, v.x, __dp4a(0x01010101, v.y, 0));
}

// The warp's sums acc[r] reduced; lane 0 writes Y[m0 + r] for rows < M.
__device__ __forceinline__ void q8s_store(const float (&acc)[kQ8SRowsPerWarp], float* Y, uint32_t M, uint64_t m0,
                                         uint32_t lane) {
#pragma unroll
    for (uint32_t r = 0; r < kQ8SRowsPerWarp; r++) {
        float s = acc[r];
#pragma unroll
        for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
        if (lane == 0 && m0 + r < M) Y[m0 + r] = s;
    }
}

// Q4_K: lane u takes quant bytes 16u..16u+15 of each block (one 16-byte
// load): the low nibbles are elements 64g + 16h + i of the block (g = u/2,
// h = u%2, i < 16: sub-block 2g), the high nibbles the same 32 further on
// (sub-block 2g + 1); the block's header (d, dmin, 12 scale bytes) is one
// 16-byte load all eight lanes share.
struct Q4KSStep {
    uint4 hd[kQ8SRowsPerWarp], q[kQ8SRowsPerWarp];
};

__device__ __forceinline__ void q4ks_load(const uint4* const* rows, uint32_t b, uint32_t u,
                                         Q4KSStep& s) {
#pragma unroll
    for (uint32_t r = 0; r < kQ8SRowsPerWarp; r++) {
        s.hd[r] = __ldg(rows[r] + 9 * b);
        s.q[r] = __ldg(rows[r] + 9 * b + 1 + u);
    }
}

__device__ __forceinline__ void q4ks_step(const Q4KSStep& s, const Q8SStage& st, uint32_t b, uint32_t u,
                                         float (&acc)[kQ8SRowsPerWarp]) {
    const uint32_t g = u / 2, e = 256 * b + 64 * g + 16 * (u % 2);
    const int4 xl = *reinterpret_cast<const int4*>(st.q + e);
    const int4 xh = *reinterpret_cast<const int4*>(st.q + e + 32);
    const float dxl = st.d[8 * b + 2 * g], dxh = st.d[8 * b + 2 * g + 1];
    const float sxl = (float)q8s_sum16(xl), sxh = (float)q8s_sum16(xh);
#pragma unroll
    for (uint32_t r = 0; r < kQ8SRowsPerWarp; r++) {
        const uint4 hd = s.hd[r], q = s.q[r];
        const float d = f16_to_f32(hd.x & 0xFFFF), dmin = f16_to_f32(hd.x >> 16);
        const uint32_t sw[3] = {hd.y, hd.z, hd.w};
        uint32_t sc, mn;
        q_scale_min_w(sw, 2 * g, sc, mn);
        const float dl = __fmul_rn(d, (float)sc), ml = __fmul_rn(dmin, (float)mn);
        q_scale_min_w(sw, 2 * g + 1, sc, mn);
        const float dh = __fmul_rn(d, (float)sc), mh = __fmul_rn(dmin, (float)mn);
        const int il = __dp4a((int)(q.x & 0x0F0F0F0Fu), xl.x,
                              __dp4a((int)(q.y & 0x0F0F0F0Fu), xl.y,
                                     __dp4a((int)(q.z & 0x0F0F0F0Fu), xl.z, __dp4a((int)(q.w & 0x0F0F0F0Fu), xl.w, 0))));
        const int ih = __dp4a((int)((q.x >> 4) & 0x0F0F0F0Fu), xh.x,
                              __dp4a((int)((q.y >> 4) & 0x0F0F0F0Fu), xh.y,
                                     __dp4a((int)((q.z >> 4) & 0x0F0F0F0Fu), xh.z,
                                            __dp4a((int)((q.w >> 4) & 0x0F0F0F0Fu), xh.w, 0))));
        acc[r] += dxl * (dl * (float)il - ml * sxl) + dxh * (dh * (float)ih - mh * sxh);
    }
}

// Q6_K: lane u takes elements 128n + 32j + p + i of each block (n = u/4,
// p = 8(u%4), j < 4, i < 8): eight bytes of ql at 64n + p and at
// 64n + 32 + p (low nibbles j = 0, 1, high nibbles j = 2, 3), eight of qh at
// 128 + 32n + p (two bits a j), and the scales 8n + 2j + (u%4)/2. A block is
// 210 bytes, so a row's blocks are only 2-byte aligned: 8-byte runs are
// read as aligned words and shifted into place.
struct Q6KSStep {
    uint2 l0[kQ8SRowsPerWarp], l1[kQ8SRowsPerWarp], h[kQ8SRowsPerWarp];
    uint32_t sc[kQ8SRowsPerWarp];  // the four int8 scales j = 0..3
    float d[kQ8SRowsPerWarp];
};


__device__ __forceinline__ void q6ks_load(const uint8_t* const* rows, uint32_t b, uint32_t u,
                                         Q6KSStep& s) {
    const uint32_t n = u / 4, p = 8 * (u % 4), o = (u % 4) / 2;
#pragma unroll
    for (uint32_t r = 0; r < kQ8SRowsPerWarp; r++) {
        const uint8_t* blk = rows[r] + 210ull * b;
        s.l0[r] = q8_ld8(blk + 64 * n + p);
        s.l1[r] = q8_ld8(blk + 64 * n + 32 + p);
        s.h[r] = q8_ld8(blk + 128 + 32 * n + p);
        const uint16_t* sc = reinterpret_cast<const uint16_t*>(blk + 192 + 8 * n);
        // scale 2j + o of the eight at 192 + 8n: byte o of the pair j
        const uint32_t s0 = __ldg(sc) >> (8 * o), s1 = __ldg(sc + 1) >> (8 * o);
        const uint32_t s2 = __ldg(sc + 2) >> (8 * o), s3 = __ldg(sc + 3) >> (8 * o);
        s.sc[r] = (s0 & 0xFF) | (s1 & 0xFF) << 8 | (s2 & 0xFF) << 16 | (s3 & 0xFF) << 24;
        s.d[r] = f16_to_f32(__ldg(reinterpret_cast<const uint16_t*>(blk + 208)));
    }
}

__device__ __forceinline__ void q6ks_step(const Q6KSStep& s, const Q8SStage& st, uint32_t b, uint32_t u,
                                         float (&acc)[kQ8SRowsPerWarp]) {
    const uint32_t n = u / 4, p = 8 * (u % 4);
    int2 x[4];
    float dx[4];
    int sx[4];
#pragma unroll
    for (uint32_t j = 0; j < 4; j++) {
        x[j] = *reinterpret_cast<const int2*>(st.q + 256 * b + 128 * n + 32 * j + p);
        dx[j] = st.d[8 * b + 4 * n + j];
        sx[j] = 32 * q8s_sum8(x[j]);
    }
#pragma unroll
    for (uint32_t r = 0; r < kQ8SRowsPerWarp; r++) {
        float a = 0.0f;
#pragma unroll
        for (uint32_t j = 0; j < 4; j++) {
            const uint2 lo = j & 1 ? s.l1[r] : s.l0[r];
            const uint32_t ls = (j >> 1) * 4;
            const uint32_t v0 = ((lo.x >> ls) & 0x0F0F0F0Fu) | (((s.h[r].x >> (2 * j)) & 0x03030303u) << 4);
            const uint32_t v1 = ((lo.y >> ls) & 0x0F0F0F0Fu) | (((s.h[r].y >> (2 * j)) & 0x03030303u) << 4);
            const int iq = __dp4a((int)v0, x[j].x, __dp4a((int)v1, x[j].y, 0)) - sx[j];
            const float ds = __fmul_rn(s.d[r], (float)(int8_t)((s.sc[r] >> (8 * j)) & 0xFF));
            a += dx[j] * (ds * (float)iq);
        }
        acc[r] += a;
    }
}

// The product for one weight type: Step/load/step are the type's.
template <int kind>
__device__ __forceinline__ void q8mvs(const uint8_t* W, const float* X, float* Y, uint32_t M, uint32_t K, uint32_t T) {
    __shared__ __align__(16) Q8SStage st;
    const uint32_t lane = threadIdx.x % 32, u = lane % 8;
    const uint64_t m0 = (uint64_t)blockIdx.x * kQ8SRows + (threadIdx.x / 32) * kQ8SRowsPerWarp;
    const uint32_t nb = K / 256;
    const uint64_t rb = (kind == kQ4_K ? 144ull : 210ull) * nb;
    gemv_enter(W, rb, M, (uint64_t)blockIdx.x * kQ8SRows, kQ8SRows, (16u << 10) | 0x20000000u);
    const uint8_t* rows[kQ8SRowsPerWarp];
#pragma unroll
    for (uint32_t r = 0; r < kQ8SRowsPerWarp; r++) rows[r] = W + min(m0 + r, (uint64_t)M - 1) * rb;
    for (uint32_t t = 0; t < T; t++) {
        float acc[kQ8SRowsPerWarp];
#pragma unroll
        for (uint32_t r = 0; r < kQ8SRowsPerWarp; r++) acc[r] = 0.0f;
        for (uint32_t k0 = 0; k0 < K; k0 += kQ8SSlab) {
            const uint32_t n = min(kQ8SSlab, K - k0), b0 = k0 / 256, bn = n / 256;
            uint32_t b = lane / 8;
            if constexpr (kind == kQ4_K) {
                const uint4* rw[kQ8SRowsPerWarp];
#pragma unroll
                for (uint32_t r = 0; r < kQ8SRowsPerWarp; r++) rw[r] = reinterpret_cast<const uint4*>(rows[r]) + 9 * b0;
                Q4KSStep cur;
                if (b < bn) q4ks_load(rw, b, u, cur);  // before the staging: its latency overlaps
                __syncthreads();                      // the previous slab is consumed
                q8s_stage(X + (uint64_t)t * K + k0, n, st);
                __syncthreads();
                while (b < bn) {
                    Q4KSStep next;
                    if (b + 4 < bn) q4ks_load(rw, b + 4, u, next);
                    q4ks_step(cur, st, b, u, acc);
                    cur = next;
                    b += 4;
                }
            } else {
                const uint8_t* rw[kQ8SRowsPerWarp];
#pragma unroll
                for (uint32_t r = 0; r < kQ8SRowsPerWarp; r++) rw[r] = rows[r] + 210ull * b0;
                Q6KSStep cur;
                if (b < bn) q6ks_load(rw, b, u, cur);
                __syncthreads();
                q8s_stage(X + (uint64_t)t * K + k0, n, st);
                __syncthreads();
                while (b < bn) {
                    Q6KSStep next;
                    if (b + 4 < bn) q6ks_load(rw, b + 4, u, next);
                    q6ks_step(cur, st, b, u, acc);
                    cur = next;
                    b += 4;
                }
            }
        }
        q8s_store(acc, Y + (uint64_t)t * M, M, m0, lane);
    }
}

#define MEMWALL_Q8MVS_ENTRY(NAME, kind)                                                                 \
    extern "C" __global__ void __launch_bounds__(256) NAME(const void* W, const float* X, float* Y,      \
                                                           uint32_t M, uint32_t K, uint32_t T) {        \
        q8mvs<kind>(static_cast<const uint8_t*>(W), X, Y, M, K, T);                                     \
    }

MEMWALL_Q8MVS_ENTRY(memwall_q8mvs_q4_k, kQ4_K)
MEMWALL_Q8MVS_ENTRY(memwall_q8mvs_q6_k, kQ6_K)

template <int kind>
__device__ __forceinline__ void qembed(const uint8_t* table, const int32_t* ids, float* out, uint32_t T,
                                       uint32_t H) {
    for (uint64_t t = blockIdx.x; t < T; t += gridDim.x) {
        const uint8_t* row = table + (uint64_t)(uint32_t)ids[t] * q_row_bytes<kind>(H);
        for (uint32_t k = threadIdx.x; k < H; k += blockDim.x)
            out[t * H + k] = QElem<kind>::get(row, k / 32, k % 32, H);
    }
}

// qdequant writes rows [0, M) of the quantized K-column matrix W as bf16
// (round to nearest even of ggml's float32 values): the weight operand of
// a prefill product through the matrix library (Set.MatmulDequant). A
// thread a 32-element chunk (the block scales read once, not once an
// element), written as four 16-byte stores; threads over consecutive
// chunks of a row, so a warp reads and writes runs of consecutive bytes.
// f16w/bf16w rows, whose K need not be a multiple of 32, go an element a
// thread.
template <int kind>
__device__ __forceinline__ void qdequant(const uint8_t* W, uint16_t* out, uint32_t M, uint32_t K) {
    const uint64_t stride = grid_threads();
    if (kind == kQF16 || kind == kQBF16) {
        const uint64_t n = (uint64_t)M * K;
        for (uint64_t i = global_thread(); i < n; i += stride) {
            const uint64_t r = i / K;
            const uint32_t k = (uint32_t)(i % K);
            out[i] = f32_to_bf16_bits(QElem<kind>::get(W + r * q_row_bytes<kind>(K), k / 32, k % 32, K));
        }
        return;
    }
    const uint32_t chunks = K / 32;
    const uint64_t n = (uint64_t)M * chunks;
    for (uint64_t i = global_thread(); i < n; i += stride) {
        const uint64_t r = i / chunks;
        const uint32_t c = (uint32_t)(i % chunks);
        const uint8_t* row = W + r * q_row_bytes<kind>(K);
        uint4* o = reinterpret_cast<uint4*>(out + r * K + 32ull * c);
#pragma unroll
        for (uint32_t v = 0; v < 4; ++v) {
            uint32_t w[4];
#pragma unroll
            for (uint32_t j = 0; j < 4; ++j) {
                const uint32_t l = 8 * v + 2 * j;
                w[j] = (uint32_t)f32_to_bf16_bits(QElem<kind>::get(row, c, l, K)) |
                       (uint32_t)f32_to_bf16_bits(QElem<kind>::get(row, c, l + 1, K)) << 16;
            }
            o[v] = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

#define MEMWALL_QMATMUL_ENTRY(NAME, kind)                                                              \
    extern "C" __global__ void __launch_bounds__(256) NAME(const void* W, const float* X, float* Y,      \
                                                           uint32_t M, uint32_t K, uint32_t T) {        \
        pdl_enter();                                                                                   \
        const uint8_t* w = static_cast<const uint8_t*>(W);                                             \
        if (kind == kQ4_K && ((uintptr_t)W & 15u) == 0 && ((uintptr_t)X & 15u) == 0)                   \
            qmatmul_q4k_wide16(w, X, Y, M, K, T);                                                      \
        else if (kind == kQ4_K && ((uintptr_t)W & 3u) == 0 && ((uintptr_t)X & 15u) == 0)               \
            qmatmul_q4k_wide(w, X, Y, M, K, T);                                                        \
        else if (kind == kQ6_K && ((uintptr_t)X & 7u) == 0)                                            \
            qmatmul_q6k_wide(w, X, Y, M, K, T);                                                        \
        else                                                                                           \
            qmatmul<kind>(w, X, Y, M, K, T);                                                           \
    }
#define MEMWALL_QEMBED_ENTRY(NAME, kind)                                                               \
    extern "C" __global__ void __launch_bounds__(256) NAME(const void* table, const int32_t* ids,       \
                                                           float* out, uint32_t T, uint32_t H) {        \
        pdl_enter();                                                                                   \
        qembed<kind>(static_cast<const uint8_t*>(table), ids, out, T, H);                              \
    }

#define MEMWALL_QDEQUANT_ENTRY(NAME, kind)                                                             \
    extern "C" __global__ void __launch_bounds__(256) NAME(const void* W, uint16_t* out, uint32_t M,    \
                                                           uint32_t K) {                                \
        pdl_enter();                                                                                   \
        qdequant<kind>(static_cast<const uint8_t*>(W), out, M, K);                                     \
    }

MEMWALL_QMATMUL_ENTRY(memwall_qmatmul_q8_0, kQ8_0)
MEMWALL_QEMBED_ENTRY(memwall_qembed_q8_0, kQ8_0)
MEMWALL_QDEQUANT_ENTRY(memwall_qdequant_q8_0, kQ8_0)
MEMWALL_QMATMUL_ENTRY(memwall_qmatmul_q4_0, kQ4_0)
MEMWALL_QEMBED_ENTRY(memwall_qembed_q4_0, kQ4_0)
MEMWALL_QDEQUANT_ENTRY(memwall_qdequant_q4_0, kQ4_0)
MEMWALL_QMATMUL_ENTRY(memwall_qmatmul_q5_0, kQ5_0)
MEMWALL_QEMBED_ENTRY(memwall_qembed_q5_0, kQ5_0)
MEMWALL_QDEQUANT_ENTRY(memwall_qdequant_q5_0, kQ5_0)
MEMWALL_QMATMUL_ENTRY(memwall_qmatmul_q5_1, kQ5_1)
MEMWALL_QEMBED_ENTRY(memwall_qembed_q5_1, kQ5_1)
MEMWALL_QDEQUANT_ENTRY(memwall_qdequant_q5_1, kQ5_1)
MEMWALL_QMATMUL_ENTRY(memwall_qmatmul_q4_k, kQ4_K)
MEMWALL_QEMBED_ENTRY(memwall_qembed_q4_k, kQ4_K)
MEMWALL_QDEQUANT_ENTRY(memwall_qdequant_q4_k, kQ4_K)
MEMWALL_QMATMUL_ENTRY(memwall_qmatmul_q5_k, kQ5_K)
MEMWALL_QEMBED_ENTRY(memwall_qembed_q5_k, kQ5_K)
MEMWALL_QDEQUANT_ENTRY(memwall_qdequant_q5_k, kQ5_K)
MEMWALL_QMATMUL_ENTRY(memwall_qmatmul_q6_k, kQ6_K)
MEMWALL_QEMBED_ENTRY(memwall_qembed_q6_k, kQ6_K)
MEMWALL_QDEQUANT_ENTRY(memwall_qdequant_q6_k, kQ6_K)
MEMWALL_QMATMUL_ENTRY(memwall_qmatmul_f16w, kQF16)
MEMWALL_QEMBED_ENTRY(memwall_qembed_f16w, kQF16)
MEMWALL_QDEQUANT_ENTRY(memwall_qdequant_f16w, kQF16)
MEMWALL_QMATMUL_ENTRY(memwall_qmatmul_bf16w, kQBF16)
MEMWALL_QEMBED_ENTRY(memwall_qembed_bf16w, kQBF16)
MEMWALL_QDEQUANT_ENTRY(memwall_qdequant_bf16w, kQBF16)
