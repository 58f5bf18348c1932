// Minimal stand-ins for the CUDA toolkit headers, used only to let clang
// syntax-check kernels.cu on a machine without the toolkit
// (scripts/build-ptx.sh --clang-check). Declarations only: nothing here is
// compiled by nvcc, and the PTX clang emits from it is thrown away.
#pragma once
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#define __align__(n) __attribute__((aligned(n)))
#include "__clang_cuda_builtin_vars.h"

typedef __SIZE_TYPE__ size_t;
struct __attribute__((aligned(16))) uint4 {
    unsigned int x, y, z, w;
};

__device__ float __uint_as_float(unsigned int);
__device__ float fmaf(float, float, float);
__device__ float __ldg(const float*);
__device__ unsigned short __ldg(const unsigned short*);
__device__ uint4 __ldg(const uint4*);
__device__ float __shfl_down_sync(unsigned int, float, unsigned int, int = 32);
__device__ unsigned long long __shfl_down_sync(unsigned int, unsigned long long, unsigned int,
                                               int = 32);
__device__ unsigned long long atomicAdd(unsigned long long*, unsigned long long);
__device__ void __nanosleep(unsigned int);
__device__ void __syncthreads();
__device__ void __syncwarp(unsigned int = 0xFFFFFFFFu);
__device__ size_t __cvta_generic_to_shared(const void*);

// Used by the Llama-layer kernels.
struct __attribute__((aligned(8))) uint2 {
    unsigned int x, y;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
#define INFINITY __builtin_huge_valf()
__device__ unsigned int __float_as_uint(float);
__device__ uint4 make_uint4(unsigned int, unsigned int, unsigned int, unsigned int);
__device__ float4 make_float4(float, float, float, float);
__device__ uint2 __ldg(const uint2*);
__device__ unsigned int __ldg(const unsigned int*);
__device__ float __shfl_xor_sync(unsigned int, float, int, int = 32);
__device__ float __shfl_sync(unsigned int, float, int, int = 32);
__device__ unsigned long long __shfl_sync(unsigned int, unsigned long long, int, int = 32);
__device__ float fmaxf(float, float);
__device__ float expf(float);
__device__ float exp2f(float);
__device__ float rsqrtf(float);
__device__ void sincosf(float, float*, float*);
__device__ void __trap();
__device__ unsigned long long min(unsigned long long, unsigned long long);
__device__ unsigned int min(unsigned int, unsigned int);
__device__ unsigned long min(unsigned long, unsigned long);

// Used by the quantized products.
__device__ unsigned char __ldg(const unsigned char*);
__device__ float __fmul_rn(float, float);
__device__ float __fadd_rn(float, float);
__device__ float __fsub_rn(float, float);

// Used by the wide-load quantized products.
struct __attribute__((aligned(8))) float2 {
    float x, y;
};
__device__ float4 __ldg(const float4*);
__device__ float2 __ldg(const float2*);

// Used by the 8-bit-activation products.
struct __attribute__((aligned(16))) int4 {
    int x, y, z, w;
};
struct __attribute__((aligned(8))) int2 {
    int x, y;
};
__device__ float fabsf(float);
__device__ float fminf(float, float);
__device__ float rintf(float);
__device__ float __fdiv_rn(float, float);
__device__ int __dp4a(int, int, int);
__device__ unsigned int __funnelshift_r(unsigned int, unsigned int, unsigned int);
__device__ uint2 make_uint2(unsigned int, unsigned int);
