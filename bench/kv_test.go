package bench_test

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/memwall/memwall/bench"
	"github.com/memwall/memwall/device/sim"
)

// TestKVOnSim runs the KV measurement small: every operation timed at two
// sizes, and both swap layouts verified on the simulator, whose copies cost
// a fixed latency each: the per-layer layout's many small copies must come
// out slower than the cache's one copy per block, and the cache's swap close
// to the link.
func TestKVOnSim(t *testing.T) {
	d := sim.New(sim.DefaultOptions())
	rep, err := bench.KV(context.Background(), bench.KVOptions{Blocks: []int{1000, 4000}, Ops: 5000,
		SwapBytes: 64 << 20, Reps: 2, Device: d})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Ops) != 2 {
		t.Fatalf("%d op results", len(rep.Ops))
	}
	for _, r := range rep.Ops {
		for name, v := range map[string]float64{"alloc": r.AllocNs, "free": r.FreeNs, "fork": r.ForkNs, "touch": r.TouchNs} {
			if !(v > 0) || math.IsInf(v, 0) {
				t.Errorf("%d blocks: %s %v ns", r.Blocks, name, v)
			}
		}
	}
	if len(rep.Swap) != 2 {
		t.Fatalf("%d swap results", len(rep.Swap))
	}
	cache, per := rep.Swap[0], rep.Swap[1]
	if !cache.Verified || !per.Verified {
		t.Fatal("swap bytes not verified")
	}
	if per.OutGBps >= cache.OutGBps || per.InGBps >= cache.InGBps {
		t.Errorf("per-layer %.1f/%.1f GB/s not below the cache layout's %.1f/%.1f", per.OutGBps, per.InGBps, cache.OutGBps, cache.InGBps)
	}
	if rep.SwapOverLink < 0.9 || rep.SwapOverLink > 1.01 {
		t.Errorf("swap over link %.3f (cache %+v, link %.1f/%.1f)", rep.SwapOverLink, cache, rep.LinkD2HGBps, rep.LinkH2DGBps)
	}
	t.Logf("%+v", rep)
}

// TestKVMinBlocks: every pool size from MinKVBlocks up times its
// operations (sizes drawn at random), and one block fewer is refused by
// name before any work.
func TestKVMinBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	sizes := []int{bench.MinKVBlocks}
	for range 4 {
		sizes = append(sizes, bench.MinKVBlocks+r.IntN(4*bench.MinKVBlocks))
	}
	if _, err := bench.KV(context.Background(), bench.KVOptions{Blocks: sizes, Ops: 1000}); err != nil {
		t.Fatalf("blocks %v: %v", sizes, err)
	}
	_, err := bench.KV(context.Background(), bench.KVOptions{Blocks: []int{bench.MinKVBlocks - 1}, Ops: 1000})
	if err == nil || !strings.Contains(err.Error(), "at least 1000") {
		t.Fatalf("%d blocks: %v, want the minimum named", bench.MinKVBlocks-1, err)
	}
}
