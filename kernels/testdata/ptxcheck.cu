// ptxcheck loads a kernels.ptx through the CUDA driver API, exactly as the Go
// package does (cuModuleLoadData on the PTX text), and checks every kernel
// on the GPU against host references; unless -quick is given it then times
// them. It is a host-only program (no device code of its own):
//
//   nvcc -O2 -std=c++17 -o ptxcheck kernels/testdata/ptxcheck.cu -lcuda
//   ./ptxcheck kernels/kernels.ptx [-quick]
//
// Launch shapes mirror kernels.go (matmulLaunch); keep the two in step.
// Exit status 0 means every check passed.
#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#define CK(x)                                                                    \
    do {                                                                         \
        CUresult r_ = (x);                                                       \
        if (r_ != CUDA_SUCCESS) {                                                \
            const char* s_ = "?";                                                \
            cuGetErrorString(r_, &s_);                                           \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, s_); \
            std::exit(1);                                                        \
        }                                                                        \
    } while (0)

static int passes = 0, failures = 0;

static void expect(bool ok, const char* what) {
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    ++(ok ? passes : failures);
}

// ---- host references -------------------------------------------------------

static uint32_t pattern(uint32_t seed, uint64_t i) {
    uint32_t x = ((uint32_t)i * 0x9E3779B1u) ^ seed;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return x;
}

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint64_t next_u64() {  // splitmix64
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float next_f32() { return (float)((next_u64() >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0); }

static float u2f(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static uint32_t f2u(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
static uint16_t f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }
static uint16_t f32_to_f16(float f) {  // inputs here are small normals
    uint32_t u = f2u(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xFF) - 127 + 15;
    uint32_t mant = u & 0x7FFFFFu;
    if (exp <= 0) return (uint16_t)sign;  // flush tiny values; the test avoids them
    uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return (uint16_t)h;
}
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FFu;
    if (exp == 0) return (sign ? -1.0f : 1.0f) * std::ldexp((float)mant, -24);
    if (exp == 31) return u2f(sign | 0x7F800000u | (mant << 13));
    return u2f(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

enum DT { F32, BF16, F16 };
static const char* dt_name[] = {"f32", "bf16", "f16"};
static size_t dt_size(DT d) { return d == F32 ? 4 : 2; }

// ---- kernels -------------------------------------------------------------

struct Kernels {
    CUmodule mod;
    CUfunction fill, check, spin, gemv[3], gemm[3];
};

static Kernels load(const char* path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        std::fprintf(stderr, "cannot read %s\n", path);
        std::exit(1);
    }
    std::stringstream ss;
    ss << in.rdbuf();
    std::string ptx = ss.str();
    char log[8192] = {0};
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void* vals[] = {log, (void*)(uintptr_t)sizeof(log)};
    Kernels k;
    CUresult r = cuModuleLoadDataEx(&k.mod, ptx.c_str(), 2, opts, vals);
    if (r != CUDA_SUCCESS) {
        std::fprintf(stderr, "cuModuleLoadDataEx: %d\n%s\n", (int)r, log);
        std::exit(1);
    }
    CK(cuModuleGetFunction(&k.fill, k.mod, "memwall_fill_u32"));
    CK(cuModuleGetFunction(&k.check, k.mod, "memwall_check_u32"));
    CK(cuModuleGetFunction(&k.spin, k.mod, "memwall_spin"));
    for (int d = 0; d < 3; ++d) {
        std::string gv = std::string("memwall_gemv_") + dt_name[d];
        std::string gm = std::string("memwall_gemm_") + dt_name[d];
        CK(cuModuleGetFunction(&k.gemv[d], k.mod, gv.c_str()));
        CK(cuModuleGetFunction(&k.gemm[d], k.mod, gm.c_str()));
    }
    return k;
}

static int sms = 0;

static void launch_fill(const Kernels& k, CUdeviceptr dst, uint64_t n, uint32_t seed) {
    uint64_t blocks = (n + 255) / 256, cap = (uint64_t)sms * 8;
    if (blocks > cap) blocks = cap;
    if (blocks == 0) blocks = 1;
    void* args[] = {&dst, &n, &seed};
    CK(cuLaunchKernel(k.fill, (unsigned)blocks, 1, 1, 256, 1, 1, 0, 0, args, nullptr));
}

static void launch_check(const Kernels& k, CUdeviceptr src, uint64_t n, uint32_t seed,
                         CUdeviceptr counter) {
    uint64_t blocks = (n + 255) / 256, cap = (uint64_t)sms * 8;
    if (blocks > cap) blocks = cap;
    if (blocks == 0) blocks = 1;
    void* args[] = {&src, &n, &seed, &counter};
    CK(cuLaunchKernel(k.check, (unsigned)blocks, 1, 1, 256, 1, 1, 0, 0, args, nullptr));
}

// Mirrors kernels.go: T <= 8 -> gemv (8 rows per 256-thread block);
// else gemm with 64x64 (f32) or 128x128 (bf16, f16) tiles.
static void launch_matmul(const Kernels& k, DT d, CUdeviceptr W, CUdeviceptr X, CUdeviceptr Y,
                          uint32_t M, uint32_t K, uint32_t T) {
    void* args[] = {&W, &X, &Y, &M, &K, &T};
    if (T <= 8) {
        uint32_t pf = 16384;  // the GEMV kernels' L2 prefetch bytes (compute_90 only)
        void* gargs[] = {&W, &X, &Y, &M, &K, &T, &pf};
        CK(cuLaunchKernel(k.gemv[d], (M + 7) / 8, 1, 1, 256, 1, 1, 0, 0, gargs, nullptr));
        return;
    }
    uint32_t tile = d == F32 ? 64 : 128;
    CK(cuLaunchKernel(k.gemm[d], (M + tile - 1) / tile, (T + tile - 1) / tile, 1, 256, 1, 1, 0,
                      0, args, nullptr));
}

// ---- checks --------------------------------------------------------------

static void check_fill(const Kernels& k) {
    const uint64_t n = 10000019;  // odd, not a multiple of the grid
    const uint32_t seed = 0xC0FFEEu;
    CUdeviceptr buf, counter;
    CK(cuMemAlloc(&buf, (n + 1) * 4));
    CK(cuMemAlloc(&counter, 8));
    CK(cuMemsetD32(buf, 0xDEADBEEFu, n + 1));
    launch_fill(k, buf, n, seed);
    std::vector<uint32_t> host(n + 1);
    CK(cuMemcpyDtoH(host.data(), buf, (n + 1) * 4));
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n; ++i) bad += host[i] != pattern(seed, i);
    expect(bad == 0, "fill: every word equals pattern(seed, i)");
    expect(host[n] == 0xDEADBEEFu, "fill: word n untouched");

    CK(cuMemsetD8(counter, 0, 8));
    launch_check(k, buf, n, seed, counter);
    unsigned long long cnt = 1;
    CK(cuMemcpyDtoH(&cnt, counter, 8));
    expect(cnt == 0, "check: 0 mismatches after fill");

    const uint64_t corrupt[] = {0, 1, 4096, n / 2, n - 1};
    for (uint64_t i : corrupt) CK(cuMemsetD32(buf + i * 4, ~pattern(seed, i), 1));
    CK(cuMemsetD8(counter, 0, 8));
    launch_check(k, buf, n, seed, counter);
    CK(cuMemcpyDtoH(&cnt, counter, 8));
    char msg[128];
    std::snprintf(msg, sizeof msg, "check: 5 corrupted words counted (got %llu)", cnt);
    expect(cnt == 5, msg);

    CK(cuMemsetD8(counter, 0, 8));
    launch_check(k, buf, n, seed ^ 1u, counter);
    CK(cuMemcpyDtoH(&cnt, counter, 8));
    std::snprintf(msg, sizeof msg, "check: wrong seed counts ~all words (got %llu of %llu)", cnt,
                  (unsigned long long)n);
    expect(cnt > n - 10, msg);
    CK(cuMemFree(buf));
    CK(cuMemFree(counter));
}

static void check_spin(const Kernels& k) {
    CUevent a, b;
    CK(cuEventCreate(&a, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&b, CU_EVENT_DEFAULT));
    uint64_t ns = 2000000;
    void* args[] = {&ns};
    CK(cuEventRecord(a, 0));
    CK(cuLaunchKernel(k.spin, 1, 1, 1, 1, 1, 1, 0, 0, args, nullptr));
    CK(cuEventRecord(b, 0));
    CK(cuEventSynchronize(b));
    float ms = 0;
    CK(cuEventElapsedTime(&ms, a, b));
    char msg[128];
    std::snprintf(msg, sizeof msg, "spin: 2 ms asked, %.3f ms measured", ms);
    expect(ms >= 1.99f && ms < 3.0f, msg);
}

struct MM {
    CUdeviceptr W, X, Y, base_w, base_x;
    std::vector<float> w, x;  // decoded inputs
};

static void encode(DT d, const std::vector<float>& src, std::vector<unsigned char>& out,
                   std::vector<float>& decoded) {
    out.resize(src.size() * dt_size(d));
    decoded.resize(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
        if (d == F32) {
            std::memcpy(&out[i * 4], &src[i], 4);
            decoded[i] = src[i];
        } else {
            uint16_t h = d == BF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
            std::memcpy(&out[i * 2], &h, 2);
            decoded[i] = d == BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
}

static void check_matmul(const Kernels& k, DT d, uint32_t M, uint32_t K, uint32_t T,
                         uint32_t misalign) {
    const size_t es = dt_size(d);
    std::vector<float> w(size_t(M) * K), x(size_t(T) * K), wd, xd;
    for (auto& v : w) v = next_f32();
    for (auto& v : x) v = next_f32();
    std::vector<unsigned char> wb, xb;
    encode(d, w, wb, wd);
    encode(d, x, xb, xd);
    const size_t guard = 64;  // floats after Y that must stay untouched
    CUdeviceptr W, X, Y;
    CK(cuMemAlloc(&W, wb.size() + 16));
    CK(cuMemAlloc(&X, xb.size() + 16));
    CK(cuMemAlloc(&Y, (size_t(T) * M + guard) * 4));
    if (!wb.empty()) CK(cuMemcpyHtoD(W + misalign, wb.data(), wb.size()));
    if (!xb.empty()) CK(cuMemcpyHtoD(X + misalign, xb.data(), xb.size()));
    CK(cuMemsetD32(Y, 0xFFFFFFFFu, size_t(T) * M + guard));  // NaN: unwritten outputs show
    launch_matmul(k, d, W + misalign, X + misalign, Y, M, K, T);
    CK(cuCtxSynchronize());
    std::vector<float> y(size_t(T) * M + guard);
    CK(cuMemcpyDtoH(y.data(), Y, y.size() * 4));
    CK(cuMemFree(W));
    CK(cuMemFree(X));
    CK(cuMemFree(Y));

    bool guard_ok = true;
    for (size_t i = size_t(T) * M; i < y.size(); ++i) guard_ok &= f2u(y[i]) == 0xFFFFFFFFu;
    bool finite = true;
    for (size_t i = 0; i < size_t(T) * M; ++i) finite &= std::isfinite(y[i]);
    // Every output when small, else 4096 sampled plus the four corners.
    double num = 0, den = 0;
    auto one = [&](uint64_t t, uint64_t m) {
        double ref = 0;
        for (uint64_t kk = 0; kk < K; ++kk) ref += (double)wd[m * K + kk] * (double)xd[t * K + kk];
        double diff = (double)y[t * M + m] - ref;
        num += diff * diff;
        den += ref * ref;
    };
    if (uint64_t(T) * M <= 200000) {
        for (uint64_t t = 0; t < T; ++t)
            for (uint64_t m = 0; m < M; ++m) one(t, m);
    } else {
        one(0, 0);
        one(0, M - 1);
        one(T - 1, 0);
        one(T - 1, M - 1);
        for (int s = 0; s < 4096; ++s) one(next_u64() % T, next_u64() % M);
    }
    double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    double tol = d == F32 ? 1e-5 : 1e-4;  // inputs are exact in the dtype: only f32 sums differ
    char msg[256];
    std::snprintf(msg, sizeof msg, "%s_%s M=%u K=%u T=%u misalign=%u: rel err %.2e (tol %.0e)%s%s",
                  T <= 8 ? "gemv" : "gemm", dt_name[d], M, K, T, misalign, rel, tol,
                  finite ? "" : " NON-FINITE OUTPUT", guard_ok ? "" : " WROTE PAST Y");
    expect(finite && guard_ok && rel <= tol, msg);
}

// ---- timing --------------------------------------------------------------

template <class F>
static float time_ms(F f, int iters) {
    CUevent a, b;
    CK(cuEventCreate(&a, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&b, CU_EVENT_DEFAULT));
    f();  // warm-up
    f();
    CK(cuEventRecord(a, 0));
    for (int i = 0; i < iters; ++i) f();
    CK(cuEventRecord(b, 0));
    CK(cuEventSynchronize(b));
    float ms = 0;
    CK(cuEventElapsedTime(&ms, a, b));
    CK(cuEventDestroy(a));
    CK(cuEventDestroy(b));
    return ms / iters;
}

static void bench(const Kernels& k) {
    {
        const uint64_t n = 1ull << 30;  // 4 GiB of words
        CUdeviceptr buf, counter;
        CK(cuMemAlloc(&buf, n * 4));
        CK(cuMemAlloc(&counter, 8));
        float ms = time_ms([&] { launch_fill(k, buf, n, 7); }, 10);
        std::printf("bench fill_u32 4 GiB: %.3f ms, %.0f GB/s\n", ms, n * 4 / ms / 1e6);
        CK(cuMemsetD8(counter, 0, 8));
        ms = time_ms([&] { launch_check(k, buf, n, 7, counter); }, 10);
        std::printf("bench check_u32 4 GiB: %.3f ms, %.0f GB/s\n", ms, n * 4 / ms / 1e6);
        CK(cuMemFree(buf));
        CK(cuMemFree(counter));
    }
    for (int d = 0; d < 3; ++d) {
        const uint32_t shapes[][3] = {{8192, 8192, 1}, {16384, 8192, 1}, {16384, 8192, 8},
                                      {4096, 4096, 1}, {28672, 8192, 1}};
        for (auto& s : shapes) {
            uint32_t M = s[0], K = s[1], T = s[2];
            size_t es = dt_size((DT)d);
            CUdeviceptr W, X, Y;
            CK(cuMemAlloc(&W, size_t(M) * K * es));
            CK(cuMemAlloc(&X, size_t(T) * K * es));
            CK(cuMemAlloc(&Y, size_t(T) * M * 4));
            CK(cuMemsetD8(W, 0x3c, size_t(M) * K * es));
            CK(cuMemsetD8(X, 0x3c, size_t(T) * K * es));
            float ms = time_ms([&] { launch_matmul(k, (DT)d, W, X, Y, M, K, T); }, 20);
            double bytes = double(M) * K * es + double(T) * K * es + double(T) * M * 4;
            std::printf("bench gemv_%s M=%u K=%u T=%u: %.1f us, %.0f GB/s\n", dt_name[d], M, K, T,
                        ms * 1e3, bytes / ms / 1e6);
            CK(cuMemFree(W));
            CK(cuMemFree(X));
            CK(cuMemFree(Y));
        }
    }
    for (int d = 0; d < 3; ++d) {
        const uint32_t shapes[][3] = {{4096, 4096, 4096}, {8192, 8192, 4096}, {11008, 4096, 4096}};
        for (auto& s : shapes) {
            uint32_t M = s[0], K = s[1], T = s[2];
            size_t es = dt_size((DT)d);
            CUdeviceptr W, X, Y;
            CK(cuMemAlloc(&W, size_t(M) * K * es));
            CK(cuMemAlloc(&X, size_t(T) * K * es));
            CK(cuMemAlloc(&Y, size_t(T) * M * 4));
            CK(cuMemsetD8(W, 0x3c, size_t(M) * K * es));
            CK(cuMemsetD8(X, 0x3c, size_t(T) * K * es));
            float ms = time_ms([&] { launch_matmul(k, (DT)d, W, X, Y, M, K, T); }, 5);
            std::printf("bench gemm_%s M=%u K=%u T=%u: %.3f ms, %.1f TFLOP/s\n", dt_name[d], M, K,
                        T, ms, 2.0 * M * K * T / ms / 1e9);
            CK(cuMemFree(W));
            CK(cuMemFree(X));
            CK(cuMemFree(Y));
        }
    }
}

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s kernels.ptx [-quick]\n", argv[0]);
        return 2;
    }
    bool quick = argc > 2 && std::strcmp(argv[2], "-quick") == 0;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    Kernels k = load(argv[1]);
    expect(true, "module loaded, 9 functions resolved");
    if (quick) sms = 4;  // small grids keep sanitizer runs short

    check_fill(k);
    check_spin(k);
    // Odd sizes on both paths; K % 8 != 0 and misaligned pointers take the
    // scalar / guarded-load paths; K = 0 must give zeros.
    const uint32_t shapes[][3] = {{1, 1, 1},       {37, 13, 1},     {1003, 999, 3},
                                  {1003, 1024, 8}, {1000, 4096, 1}, {517, 200, 9},
                                  {130, 77, 130},  {1003, 1024, 300}, {256, 512, 256},
                                  {64, 0, 3},      {64, 0, 20},     {3, 4104, 129}};
    for (int d = 0; d < 3; ++d) {
        for (auto& s : shapes) check_matmul(k, (DT)d, s[0], s[1], s[2], 0);
        check_matmul(k, (DT)d, 1003, 1024, 5, d == F32 ? 4 : 2);
        check_matmul(k, (DT)d, 1003, 1024, 200, d == F32 ? 4 : 2);
    }
    if (!quick) bench(k);
    std::printf("ptxcheck: %d passed, %d failed\n", passes, failures);
    return failures == 0 ? 0 : 1;
}
