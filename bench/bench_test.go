package bench_test

import (
	"context"
	"math"
	"testing"

	"github.com/memwall/memwall/bench"
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
		Policies:   []bench.Policy{{Name: "keep", Options: pool.Options{TargetRatio: -1}}},
		Goroutines: []int{1, 4},
		Pairs:      500,
	})
	if err != nil {
		t.Fatal(err)
	}
	// 2 mixes × 1 policy × 2 goroutine counts; the simulator has no driver
	// allocator to time, so no anchor rows.
	if len(rep.Results) != 4 {
		t.Fatalf("%d results, want 4", len(rep.Results))
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
