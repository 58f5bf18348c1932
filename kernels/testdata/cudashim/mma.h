#pragma once
// Shape-only stand-in for nvcuda::wmma (see cuda_shim.h).
namespace nvcuda {
namespace wmma {
struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    float x[8];
};
template <typename F, typename T>
__device__ void fill_fragment(F&, const T&);
template <typename F, typename T>
__device__ void load_matrix_sync(F&, const T*, unsigned);
template <typename F, typename T>
__device__ void store_matrix_sync(T*, const F&, unsigned, layout_t);
template <typename D, typename A, typename B, typename C>
__device__ void mma_sync(D&, const A&, const B&, const C&);
}  // namespace wmma
}  // namespace nvcuda
