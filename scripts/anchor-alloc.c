// anchor-alloc: the driver's allocators timed from C, with no Go binding in
// the way, as the native anchor for `memwall bench alloc`. For each size mix
// of the bench (log-uniform 512 B-64 MiB, fixed 4 KiB, 1 MiB, 64 MiB) it
// times free+alloc pairs of cuMemAllocAsync/cuMemFreeAsync on one stream
// (the driver's stream-ordered pool) and of cuMemAlloc/cuMemFree, on the
// bench's kind of request stream: 32 blocks kept live, each pair freeing a
// random one of them and allocating its replacement ("live": 32); and with
// each block freed right after its allocation ("live": 0). Each pair is
// timed on its own (a clock read before and after) and in batches of 16
// pairs timed together. Build and run on a machine with the CUDA driver:
//   nvcc -O2 -o anchor-alloc scripts/anchor-alloc.c -lcuda && ./anchor-alloc [WORD...]
// With words (random, 4KiB, 1MiB, 64MiB), only the mixes whose names hold
// one of them are timed; ANCHOR_PAIRS sets the cuMemAllocAsync pairs per
// measurement (default 4000; cuMemAlloc takes 400). Output: one JSON
// object per line.
#include <cuda.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

#define LIVE 32
static CUdeviceptr alloc1(int async, size_t size, CUstream s) {
  CUdeviceptr p;
  if (async) check(cuMemAllocAsync(&p, size, s), "cuMemAllocAsync");
  else check(cuMemAlloc(&p, size), "cuMemAlloc");
  return p;
}
static void free1(int async, CUdeviceptr p, CUstream s) {
  if (async) check(cuMemFreeAsync(p, s), "cuMemFreeAsync");
  else check(cuMemFree(p), "cuMemFree");
}
// pair frees live[victim] and allocates size in its place, or, with no
// working set (live == NULL), allocates size and frees it at once.
static void pair(int async, CUdeviceptr *live, int victim, size_t size, CUstream s) {
  if (live) {
    free1(async, live[victim], s);
    live[victim] = alloc1(async, size, s);
  } else {
    free1(async, alloc1(async, size, s), s);
  }
}

int main(int argc, char **argv) {
  CUdevice dev;
  CUcontext ctx;
  CUstream s;
  int async_pairs = 4000;
  if (getenv("ANCHOR_PAIRS")) async_pairs = atoi(getenv("ANCHOR_PAIRS"));
  if (async_pairs < 4 * BATCH) {
    fprintf(stderr, "anchor-alloc: ANCHOR_PAIRS=%s: need at least %d\n", getenv("ANCHOR_PAIRS"), 4 * BATCH);
    return 2;
  }
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
    int want = argc < 2;
    for (int a = 1; a < argc; a++) want |= strstr(mixes[m].name, argv[a]) != NULL;
    if (!want) continue;
    double lo = log(mixes[m].lo), hi = log(mixes[m].hi);
    for (int async = 1; async >= 0; async--) {
      for (int ws = 1; ws >= 0; ws--) {
        int n = async ? async_pairs : 400;
        size_t *sizes = malloc(n * sizeof(size_t));
        int *victims = malloc(n * sizeof(int));
        double *one = malloc(n * sizeof(double)), *batch = malloc(n / BATCH * sizeof(double));
        CUdeviceptr live[LIVE], *lp = ws ? live : NULL;
        for (int i = 0; i < n; i++) {
          sizes[i] = (size_t)exp(lo + uniform() * (hi - lo));
          victims[i] = (int)(uniform() * LIVE) % LIVE;
        }
        for (int i = 0; ws && i < LIVE; i++) live[i] = alloc1(async, (size_t)exp(lo + uniform() * (hi - lo)), s);
        for (int i = 0; i < n / 4; i++) pair(async, lp, victims[i], sizes[i], s);  // warm up
        for (int i = 0; i < n; i++) {
          double a = now_ns();
          pair(async, lp, victims[i], sizes[i], s);
          one[i] = now_ns() - a;
        }
        for (int b = 0; b < n / BATCH; b++) {
          double a = now_ns();
          for (int j = 0; j < BATCH; j++) pair(async, lp, victims[b * BATCH + j], sizes[b * BATCH + j], s);
          batch[b] = (now_ns() - a) / BATCH;
        }
        for (int i = 0; ws && i < LIVE; i++) free1(async, live[i], s);
        check(cuStreamSynchronize(s), "cuStreamSynchronize");
        printf("{\"allocator\": \"%s (C)\", \"mix\": \"%s\", \"live\": %d, \"pairs\": %d, \"batch_p50_ns\": %.1f, "
               "\"p50_ns\": %.1f, \"p99_ns\": %.1f}\n",
               async ? "cuMemAllocAsync" : "cuMemAlloc", mixes[m].name, ws ? LIVE : 0, n, quantile(batch, n / BATCH, 0.5),
               quantile(one, n, 0.5), quantile(one, n, 0.99));
        free(sizes); free(victims); free(one); free(batch);
      }
    }
  }
  return 0;
}
