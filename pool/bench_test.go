package pool_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/memwall/memwall/pool"
)

// BenchmarkPair measures one free+alloc pair against a working set of 32
// live blocks, log-uniform 512 B–64 MiB, after a warm-up.
// Sizes and victims are drawn in advance, as memwall bench alloc does.
func BenchmarkPair(b *testing.B) {
	cs := configs()
	cs = append(cs, pool.Options{Name: "virtual-keep-bestfit", TargetRatio: pool.NoTarget})
	for _, o := range cs {
		b.Run(o.Name, func(b *testing.B) {
			d := newSim(b, false, 64<<30)
			p, err := pool.New(d, o)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			r := rand.New(rand.NewPCG(1, 2))
			lo, hi := math.Log(512), math.Log(64<<20)
			const n = 1 << 14
			sizes, victims := make([]uint64, n), make([]int, n)
			for i := range sizes {
				sizes[i] = uint64(math.Exp(lo + r.Float64()*(hi-lo)))
				victims[i] = r.IntN(32)
			}
			live := make([]pool.Block, 32)
			for i := range live {
				live[i], _ = p.Alloc(sizes[n-1-i], pool.AllocOptions{})
			}
			step := func(i int) {
				k := victims[i&(n-1)]
				if err := p.Free(live[k]); err != nil {
					b.Fatal(err)
				}
				var err error
				if live[k], err = p.Alloc(sizes[i&(n-1)], pool.AllocOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			for i := 0; i < 5000; i++ {
				step(i * 3)
			}
			calls := p.Stats().DeviceCalls()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				step(i)
			}
			b.ReportMetric(float64(p.Stats().DeviceCalls()-calls)/float64(b.N), "calls/op")
		})
	}
}

// BenchmarkSmallPair is the small-block fast path: free and allocate a
// 4 KiB block against a working set of 32, one goroutine or all.
func BenchmarkSmallPair(b *testing.B) {
	d := newSim(b, false, 8<<30)
	p, err := pool.New(d, pool.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	b.RunParallel(func(pb *testing.PB) {
		live := make([]pool.Block, 32)
		for i := range live {
			live[i], _ = p.Alloc(4096, pool.AllocOptions{})
		}
		i := 0
		for pb.Next() {
			k := i % len(live)
			i++
			if err := p.Free(live[k]); err != nil {
				b.Error(err)
				return
			}
			var err error
			if live[k], err = p.Alloc(4096, pool.AllocOptions{}); err != nil {
				b.Error(err)
				return
			}
		}
		for _, x := range live {
			_ = p.Free(x)
		}
	})
}

// BenchmarkCentralPair is the central path: blocks above the small-block
// classes, sizes drawn in advance, pages kept (no driver calls once warm).
func BenchmarkCentralPair(b *testing.B) {
	for _, mix := range []struct {
		name   string
		lo, hi float64
	}{{"1MiB", 1 << 20, 1 << 20}, {"random-256K-64M", 256 << 10, 64 << 20}} {
		for _, s := range []string{"bestfit", "tlsf"} {
			b.Run(mix.name+"/"+s, func(b *testing.B) {
				d := newSim(b, false, 64<<30)
				p, err := pool.New(d, pool.Options{Strategy: s, TargetRatio: pool.NoTarget})
				if err != nil {
					b.Fatal(err)
				}
				defer p.Close()
				r := rand.New(rand.NewPCG(1, 2))
				sizes := make([]uint64, 4096)
				for i := range sizes {
					sizes[i] = uint64(math.Exp(math.Log(mix.lo) + r.Float64()*(math.Log(mix.hi)-math.Log(mix.lo))))
				}
				live := make([]pool.Block, 32)
				for i := range live {
					live[i], _ = p.Alloc(sizes[i], pool.AllocOptions{})
				}
				step := func(i int) {
					k := (i * 7) & 31
					if err := p.Free(live[k]); err != nil {
						b.Fatal(err)
					}
					var err error
					if live[k], err = p.Alloc(sizes[i&4095], pool.AllocOptions{}); err != nil {
						b.Fatal(err)
					}
				}
				for i := 0; i < 10000; i++ {
					step(i)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					step(i)
				}
			})
		}
	}
}

// BenchmarkStats is the cost of a stats snapshot, which stops the
// per-processor caches (and, briefly, the world) to read them.
func BenchmarkStats(b *testing.B) {
	d := newSim(b, false, 8<<30)
	p, err := pool.New(d, pool.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	for i := 0; i < b.N; i++ {
		_ = p.Stats()
	}
}

// BenchmarkParallelPair is BenchmarkPair on 1, 4 and 16 goroutines at
// once, each with its own working set of 32 blocks (log-uniform
// 512 B–64 MiB, as memwall bench alloc's random mix) and its own request
// stream: the default (shards, hold time), the default with no hold time
// (eager: pages beyond the target move on the allocating goroutine), with
// one set of arenas, with 4 shards, and balancing free pages across
// shards, and keeping every page with and without shards. peak-GiB and
// peak/used are the pool's peak
// reserved bytes and their ratio to its peak used bytes: what the shards
// cost in memory. ns/op is wall time per pair over all goroutines;
// pairs/s is its inverse.
func BenchmarkParallelPair(b *testing.B) {
	for _, o := range []pool.Options{
		{Name: "default"},
		{Name: "eager", HoldTime: -1}, // pages beyond the target move on the allocating goroutine
		{Name: "oneshard", Shards: 1},
		{Name: "balanced"},           // shards give back each other's free pages above the target
		{Name: "shards4", Shards: 4}, // processors share shards: memory against speed
		{Name: "keep", TargetRatio: pool.NoTarget},
		{Name: "keep-oneshard", TargetRatio: pool.NoTarget, Shards: 1},
	} {
		for _, g := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("%s/g%d", o.Name, g), func(b *testing.B) {
				benchParallelPairs(b, o, g)
			})
		}
	}
}

func benchParallelPairs(b *testing.B, o pool.Options, goroutines int) {
	d := newSim(b, false, 64<<30)
	p, err := pool.New(d, o)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	if o.Name == "balanced" {
		pool.Balanced(p)
	}
	const n, live = 1 << 12, 32
	lo, hi := math.Log(512), math.Log(64<<20)
	type stream struct {
		sizes   [n]uint64
		victims [n]int
		live    [live]pool.Block
	}
	ss := make([]*stream, goroutines)
	for gi := range ss {
		s := &stream{}
		r := rand.New(rand.NewPCG(uint64(gi)+1, 2))
		for i := range s.sizes {
			s.sizes[i] = uint64(math.Exp(lo + r.Float64()*(hi-lo)))
			s.victims[i] = r.IntN(live)
		}
		for i := range s.live {
			if s.live[i], err = p.Alloc(s.sizes[n-1-i], pool.AllocOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		ss[gi] = s
	}
	run := func(s *stream, from, pairs int) error {
		for i := from; i < from+pairs; i++ {
			k := s.victims[i&(n-1)]
			if err := p.Free(s.live[k]); err != nil {
				return err
			}
			var err error
			if s.live[k], err = p.Alloc(s.sizes[i&(n-1)], pool.AllocOptions{}); err != nil {
				return err
			}
		}
		return nil
	}
	all := func(pairs int) {
		var wg sync.WaitGroup
		errs := make([]error, goroutines)
		for gi, s := range ss {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[gi] = run(s, gi*977, pairs)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	all(2000) // warm: the pool's footprint and its shards settle
	calls := p.Stats().DeviceCalls()
	per := max(1, b.N/goroutines)
	b.ResetTimer()
	all(per)
	b.StopTimer()
	total := float64(per * goroutines)
	b.ReportMetric(float64(p.Stats().DeviceCalls()-calls)/total, "calls/op")
	b.ReportMetric(total/b.Elapsed().Seconds(), "pairs/s")
	b.ReportMetric(float64(pool.ShardsMade(p)), "shards")
	st := p.Stats()
	b.ReportMetric(float64(st.PeakReservedBytes)/(1<<30), "peak-GiB")
	b.ReportMetric(float64(st.PeakReservedBytes)/float64(max(1, st.PeakUsedBytes)), "peak/used")
	for _, s := range ss {
		for _, x := range s.live {
			if err := p.Free(x); err != nil {
				b.Fatal(err)
			}
		}
	}
}
