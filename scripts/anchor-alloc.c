// anchor-alloc: the driver's allocators timed from C, with no Go binding in
// the way, as the native anchor for `memwall bench alloc`. For each size mix
// of the bench (log-uniform 512 B-64 MiB, fixed 4 KiB, 1 MiB, 64 MiB) it
// times alloc+free pairs of cuMemAllocAsync/cuMemFreeAsync on one stream
// (the driver's stream-ordered pool) and of cuMemAlloc/cuMemFree: each pair
// on its own (a clock read before and after) and in batches of 16 pairs
// timed together. Build and run on a machine with the CUDA driver:
//   nvcc -O2 -o anchor-alloc scripts/anchor-alloc.c -lcuda && ./anchor-alloc
// Output: one JSON object per line.
#include <cuda.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define BATCH 16

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double quantile(double *xs, int n, double q) {
  qsort(xs, n, sizeof(double), cmp);
  int i = (int)ceil(q * n) - 1;
  if (i < 0) i = 0;
  if (i >= n) i = n - 1;
  return xs[i];
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double uniform(void) {
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}

static void check(CUresult r, const char *what) {
  if (r != CUDA_SUCCESS) {
    const char *s = "?";
    cuGetErrorString(r, &s);
    fprintf(stderr, "anchor-alloc: %s: %s\n", what, s);
    exit(1);
  }
}

static void pair(int async, size_t size, CUstream s) {
  CUdeviceptr p;
  if (async) {
    check(cuMemAllocAsync(&p, size, s), "cuMemAllocAsync");
    check(cuMemFreeAsync(p, s), "cuMemFreeAsync");
  } else {
    check(cuMemAlloc(&p, size), "cuMemAlloc");
    check(cuMemFree(p), "cuMemFree");
  }
}

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  CUstream s;
  check(cuInit(0), "cuInit");
  check(cuDeviceGet(&dev, 0), "cuDeviceGet");
  check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  check(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  struct { const char *name; double lo, hi; } mixes[] = {
      {"random 512B-64MiB", 512, 64 << 20}, {"fixed 4KiB", 4096, 4096},
      {"fixed 1MiB", 1 << 20, 1 << 20}, {"fixed 64MiB", 64 << 20, 64 << 20}};
  // The cost of the clock itself, for the record.
  double t[4096];
  for (int i = 0; i < 4096; i++) { double a = now_ns(); t[i] = now_ns() - a; }
  printf("{\"timer_overhead_ns\": %.1f}\n", quantile(t, 4096, 0.5));
  for (int m = 0; m < 4; m++) {
    for (int async = 1; async >= 0; async--) {
      int n = async ? 4000 : 400;
      size_t *sizes = malloc(n * sizeof(size_t));
      double *one = malloc(n * sizeof(double)), *batch = malloc(n / BATCH * sizeof(double));
      for (int i = 0; i < n; i++) {
        double lo = log(mixes[m].lo), hi = log(mixes[m].hi);
        sizes[i] = (size_t)exp(lo + uniform() * (hi - lo));
      }
      for (int i = 0; i < n / 4; i++) pair(async, sizes[i], s);  // warm up
      for (int i = 0; i < n; i++) {
        double a = now_ns();
        pair(async, sizes[i], s);
        one[i] = now_ns() - a;
      }
      for (int b = 0; b < n / BATCH; b++) {
        double a = now_ns();
        for (int j = 0; j < BATCH; j++) pair(async, sizes[b * BATCH + j], s);
        batch[b] = (now_ns() - a) / BATCH;
      }
      check(cuStreamSynchronize(s), "cuStreamSynchronize");
      printf("{\"allocator\": \"%s (C)\", \"mix\": \"%s\", \"pairs\": %d, \"batch_p50_ns\": %.1f, "
             "\"p50_ns\": %.1f, \"p99_ns\": %.1f}\n",
             async ? "cuMemAllocAsync" : "cuMemAlloc", mixes[m].name, n, quantile(batch, n / BATCH, 0.5),
             quantile(one, n, 0.5), quantile(one, n, 0.99));
      free(sizes); free(one); free(batch);
    }
  }
  return 0;
}
