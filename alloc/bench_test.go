package alloc_test

import (
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/memwall/memwall/alloc"
)

// benchLive is the number of live blocks held in steady state.
const benchLive = 1000

// BenchmarkAllocFree measures one Free of a random live block followed by
// one Alloc (alignment 256, as a device pool asks), with benchLive blocks
// live, over a 1 TiB range (offsets only: nothing is mapped). ns/op is the
// pair; p50-ns and p99-ns are percentiles of 20,000 individually timed
// pairs after the timed loop (each includes ~20-40 ns of clock reads);
// cpu-ns/op is the thread's CPU time per pair in the timed loop, which,
// unlike ns/op, does not count time lost to other processes on a shared
// machine (Linux only).
func BenchmarkAllocFree(b *testing.B) {
	mixes := []struct {
		name string
		size func(r *rand.Rand, maxAlloc uint64) uint64
	}{
		{"4KiB", func(*rand.Rand, uint64) uint64 { return 4 * KiB }},
		{"1MiB", func(*rand.Rand, uint64) uint64 { return MiB }},
		{"random512B-64MiB", func(r *rand.Rand, maxAlloc uint64) uint64 {
			// Log-uniform, rounded to 256 B; capped at what the strategy
			// accepts (slab: its largest class).
			return min(maxAlloc, max(512, (gpuSize(r, 64*MiB)+255)&^255))
		}},
	}
	for _, name := range alloc.Strategies() {
		for _, mix := range mixes {
			b.Run(name+"/"+mix.name, func(b *testing.B) {
				a, err := alloc.New(name, 1<<40)
				if err != nil {
					b.Fatal(err)
				}
				maxAlloc := a.Stats().MaxAlloc
				r := rand.New(rand.NewPCG(1, 2))
				if mix.size(r, alloc.MaxCapacity) > maxAlloc {
					b.Skipf("%s accepts at most %d bytes", name, maxAlloc)
				}
				const n = 1 << 14
				sizes := make([]uint64, n)
				victims := make([]int, n)
				for i := range sizes {
					sizes[i] = mix.size(r, maxAlloc)
					victims[i] = r.IntN(benchLive)
				}
				live := make([]uint64, benchLive)
				for i := range live {
					blk, err := a.Alloc(sizes[i], 256)
					if err != nil {
						b.Fatal(err)
					}
					live[i] = blk.Offset
				}
				pair := func(i int) {
					j := victims[i&(n-1)]
					if err := a.Free(live[j]); err != nil {
						b.Fatal(err)
					}
					blk, err := a.Alloc(sizes[(i+benchLive)&(n-1)], 256)
					if err != nil {
						b.Fatal(err)
					}
					live[j] = blk.Offset
				}
				for i := 0; i < 4*n; i++ { // reach steady state
					pair(i)
				}
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				cpu0, cpuOK := threadCPU()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					pair(i)
				}
				b.StopTimer()
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/op")
				if cpu1, ok := threadCPU(); ok && cpuOK {
					b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
				}
				lat := make([]time.Duration, 20_000)
				for i := range lat {
					t0 := time.Now()
					pair(i)
					lat[i] = time.Since(t0)
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
				if err := alloc.Check(a); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// BenchmarkHandlePair is the pool's central pair on the allocator alone:
// FreeHandle of a random one of 32 live blocks and AllocHandle of its
// replacement, log-uniform 512 B–64 MiB rounded to 256 B, as the pool's
// blocks are.
func BenchmarkHandlePair(b *testing.B) {
	for _, name := range []string{"bestfit", "tlsf"} {
		b.Run(name, func(b *testing.B) {
			a, err := alloc.New(name, 1<<40)
			if err != nil {
				b.Fatal(err)
			}
			h := a.(alloc.HandleAllocator)
			r := rand.New(rand.NewPCG(1, 2))
			const n = 1 << 14
			sizes, victims := make([]uint64, n), make([]int, n)
			lo, hi := math.Log(512), math.Log(64<<20)
			for i := range sizes {
				sizes[i] = (uint64(math.Exp(lo+r.Float64()*(hi-lo))) + 255) &^ 255
				victims[i] = r.IntN(32)
			}
			live := make([]alloc.Handle, 32)
			offs := make([]uint64, 32)
			for i := range live {
				var blk alloc.Block
				if blk, live[i], err = h.AllocHandle(sizes[n-1-i], 256); err != nil {
					b.Fatal(err)
				}
				offs[i] = blk.Offset
			}
			pair := func(i int) {
				k := victims[i&(n-1)]
				if _, err := h.FreeHandle(live[k], offs[k]); err != nil {
					b.Fatal(err)
				}
				blk, hd, err := h.AllocHandle(sizes[i&(n-1)], 256)
				if err != nil {
					b.Fatal(err)
				}
				live[k], offs[k] = hd, blk.Offset
			}
			for i := 0; i < 4*n; i++ {
				pair(i)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				pair(i)
			}
		})
	}
}
