package bench_test

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memwall/memwall/bench"
	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
)

// TestTransferOnSim checks the link measurement against the simulator's
// configured bandwidths: pinned copies at the pinned rate, pageable at the
// pageable rate (within the per-copy latency), and every case verified.
func TestTransferOnSim(t *testing.T) {
	o := sim.DefaultOptions()
	d := sim.New(o)
	rep, err := bench.Transfer(context.Background(), d, bench.TransferOptions{Bytes: 8 << 20, Reps: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 5 {
		t.Fatalf("%d results, want 5", len(rep.Results))
	}
	pin, _ := rep.Get("h2d_pinned")
	pag, _ := rep.Get("h2d_pageable")
	d2h, _ := rep.Get("d2h_pinned")
	if math.Abs(pin.GBps-25)/25 > 0.02 || math.Abs(d2h.GBps-25)/25 > 0.02 {
		t.Fatalf("pinned H2D %.2f, D2H %.2f GB/s; the simulator runs pinned copies at 25", pin.GBps, d2h.GBps)
	}
	if math.Abs(pag.GBps-8)/8 > 0.02 {
		t.Fatalf("pageable H2D %.2f GB/s; the simulator runs pageable copies at 8", pag.GBps)
	}
	if pin.Worst > pin.GBps || pin.GBps > pin.Best {
		t.Fatalf("median %.2f outside [worst %.2f, best %.2f]", pin.GBps, pin.Worst, pin.Best)
	}
}

func TestAllocOnSim(t *testing.T) {
	o := sim.DefaultOptions()
	o.Backing = false
	d := sim.New(o)
	rep, err := bench.Alloc(context.Background(), d, bench.AllocOptions{
		Mixes:      []bench.Mix{{Name: "fixed 4KiB", Min: 4096, Max: 4096}, {Name: "random", Min: 512, Max: 8 << 20}},
		Strategies: []string{"bestfit"},
		Policies:   []bench.Policy{{Name: "keep", Options: pool.Options{TargetRatio: pool.NoTarget}}},
		Goroutines: []int{1, 4},
		Pairs:      500,
	})
	if err != nil {
		t.Fatal(err)
	}
	// 2 mixes × 1 policy × 2 goroutine counts; the simulator has no driver
	// allocator to time, so no anchor rows.
	if len(rep.Results) != 4 || len(rep.Interleaved) != 0 {
		t.Fatalf("%d results and %d interleaved, want 4 and none", len(rep.Results), len(rep.Interleaved))
	}
	for _, r := range rep.Results {
		if r.Allocator == "cuMemAlloc" || r.Allocator == "cuMemAllocAsync" {
			t.Fatalf("the simulator has no driver allocator, yet %s was timed", r.Allocator)
		}
		if r.Pairs != 500*r.Goroutines || r.P50ns <= 0 || r.P99ns < r.P50ns || r.AllocP50ns <= 0 {
			t.Fatalf("result %+v", r)
		}
		if r.Mix == "fixed 4KiB" && r.DeviceCalls != 0 {
			t.Fatalf("a warm pool made %d driver calls on fixed 4 KiB blocks", r.DeviceCalls)
		}
	}
}

// fakeAnchor is a simulated device with a driver allocator whose pairs
// take at least fakePair (each call spins half of it): enough to check
// which anchor rows Alloc produces and that the rows for several goroutines
// time them concurrently.
type fakeAnchor struct {
	*sim.Device
	inFlight, most atomic.Int32
	next           atomic.Uint64
}

const fakePair = time.Microsecond

func spin(d time.Duration) {
	for t0 := time.Now(); time.Since(t0) < d; {
	}
}

func (f *fakeAnchor) DriverAllocator(async bool) (func(uint64) (uint64, error), func(uint64) error, func() error, error) {
	n := f.inFlight.Add(1)
	for {
		m := f.most.Load()
		if n <= m || f.most.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(20 * time.Millisecond) // long enough for the other goroutines to start
	alloc := func(uint64) (uint64, error) { spin(fakePair / 2); return f.next.Add(1), nil }
	free := func(uint64) error { spin(fakePair / 2); return nil }
	return alloc, free, func() error { f.inFlight.Add(-1); return nil }, nil
}

// TestAllocDriverRows checks the driver's rows: on one goroutine, the
// working set and the same sizes freed at once; on more, one row per
// goroutine count, timed on that many goroutines at once, with the
// throughput of all of them.
func TestAllocDriverRows(t *testing.T) {
	o := sim.DefaultOptions()
	o.Backing = false
	d := &fakeAnchor{Device: sim.New(o)}
	var progress, total int
	rep, err := bench.Alloc(context.Background(), d, bench.AllocOptions{
		Mixes:       []bench.Mix{{Name: "fixed 4KiB", Min: 4096, Max: 4096}},
		Strategies:  []string{"bestfit"},
		Policies:    []bench.Policy{{Name: "keep", Options: pool.Options{TargetRatio: pool.NoTarget}}},
		Goroutines:  []int{1, 4},
		Pairs:       320,
		DriverPairs: 320,
		Progress:    func(done, all int, _ string) { progress, total = done, all },
	})
	if err != nil {
		t.Fatal(err)
	}
	if progress != total {
		t.Fatalf("progress stopped at %d of %d", progress, total)
	}
	rows := map[string]bench.LatencyResult{}
	for _, r := range rep.Results {
		rows[fmt.Sprintf("%s/%d/%d", r.Allocator, r.Goroutines, r.Live)] = r
	}
	for _, name := range []string{"cuMemAlloc", "cuMemAllocAsync"} {
		for _, key := range []string{name + "/1/32", name + " (freed at once)/1/0", name + "/4/32"} {
			r, ok := rows[key]
			if !ok {
				t.Fatalf("no row %s among %v", key, rows)
			}
			if r.Note != "" || r.BatchP50ns < float64(fakePair) || r.P50ns < float64(fakePair) || r.PairsPerSec <= 0 {
				t.Fatalf("row %s: %+v", key, r)
			}
		}
		// Throughput counts the batched pairs only, each at least fakePair
		// long: one goroutine makes at most 1e9/fakePair pairs a second
		// (the pairs timed one by one, with their clock reads, do not
		// count).
		if r := rows[name+"/1/32"]; r.PairsPerSec > 1e9/float64(fakePair)*1.0001 {
			t.Fatalf("%s on 1 goroutine: %.0f pairs/s, more than its pairs allow", name, r.PairsPerSec)
		}
		r := rows[name+"/4/32"]
		if r.Pairs != 4*320 {
			t.Fatalf("%s on 4 goroutines timed %d pairs one by one, want %d", name, r.Pairs, 4*320)
		}
		// 4 goroutines × 320 pairs of at least 1 µs each: the longest
		// goroutine took 320 µs or more, so at most 4 M pairs/s.
		if r.PairsPerSec > 4e6*1.0001 {
			t.Fatalf("%s on 4 goroutines: %.0f pairs/s, more than the 4e6 its pairs allow", name, r.PairsPerSec)
		}
	}
	// Every row with a batch p50 carries its ratio to the async anchor's
	// on one goroutine (what "vs async" prints), the anchor itself 1.
	async := rows["cuMemAllocAsync/1/32"].BatchP50ns
	for key, r := range rows {
		if want := r.BatchP50ns / async; r.BatchP50ns > 0 && math.Abs(r.VsAnchor-want) > 1e-12*want {
			t.Fatalf("row %s: vs anchor %v, want %v", key, r.VsAnchor, want)
		}
	}
	if m := d.most.Load(); m != 4 {
		t.Fatalf("at most %d driver timings ran at once, want the 4 goroutines'", m)
	}
	// The pool on 1 and 4 goroutines interleaved with the async anchor on
	// one: the driver's 320 pairs in windows of WindowAnchorPairs, the
	// pool's WindowPoolPairs a window on each goroutine.
	if len(rep.Interleaved) != 2 {
		t.Fatalf("%d interleaved rows, want 2", len(rep.Interleaved))
	}
	for i, il := range rep.Interleaved {
		g := []int{1, 4}[i]
		if il.Pool != "memwall bestfit/keep" || il.Anchor != "cuMemAllocAsync" || il.Goroutines != g || il.Windows != 320/bench.WindowAnchorPairs ||
			il.PoolPairs != g*il.Windows*bench.WindowPoolPairs || il.AnchorPairs != il.Windows*bench.WindowAnchorPairs || il.Note != "" ||
			il.AnchorPairsPerSec > 1e9/float64(fakePair)*1.0001 || il.PoolPairsPerSec/il.AnchorPairsPerSec != il.ThroughputRatio ||
			il.AnchorBatchP50ns < float64(fakePair) || il.PoolBatchP50ns <= 0 || il.P50Ratio != il.PoolBatchP50ns/il.AnchorBatchP50ns ||
			il.ThroughputRatio <= 0 || il.WindowRatioP50 <= 0 || il.WindowRatioP90 < il.WindowRatioP50 {
			t.Fatalf("interleaved row %+v", il)
		}
	}
}

// TestAllocBusyDevice: on a device another process mostly holds (little
// free memory, the total unchanged) the working sets shrink to fit what is
// free, so the benchmark runs instead of running out of memory.
func TestAllocBusyDevice(t *testing.T) {
	o := sim.DefaultOptions()
	o.Backing = false
	var cfg fault.Config
	d := fault.Wrap(sim.New(o), &cfg)
	live := func() int {
		rep, err := bench.Alloc(context.Background(), d, bench.AllocOptions{
			Mixes:      []bench.Mix{{Name: "fixed 64MiB", Min: 64 << 20, Max: 64 << 20}},
			Strategies: []string{"bestfit"},
			Policies:   []bench.Policy{{Name: "keep", Options: pool.Options{TargetRatio: pool.NoTarget}}},
			Goroutines: []int{1}, Pairs: 200,
		})
		if err != nil {
			t.Fatal(err)
		}
		return rep.Results[0].Live
	}
	idle := live()
	cfg.Set(fault.Rules{FreeLimit: 512 << 20}) // 8 blocks of 64 MiB free
	if busy := live(); busy >= idle || busy*(64<<20) > 512<<20 {
		t.Fatalf("working set %d blocks with 512 MiB free (%d on the idle device)", busy, idle)
	}
}
