package pool_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
)

// priorityDevice records the priority of every allocation made through
// AllocPriority (and -1 for plain Alloc calls).
type priorityDevice struct {
	device.Device
	mu    sync.Mutex
	calls []float32
}

func (d *priorityDevice) Alloc(size uint64) (device.Ptr, error) {
	d.mu.Lock()
	d.calls = append(d.calls, -1)
	d.mu.Unlock()
	return d.Device.Alloc(size)
}

func (d *priorityDevice) AllocPriority(size uint64, prio float32) (device.Ptr, error) {
	d.mu.Lock()
	d.calls = append(d.calls, prio)
	d.mu.Unlock()
	return d.Device.Alloc(size)
}

// TestPriorityReachesDevice: every chunk a GrowChunks pool takes, at
// Warmup and while random allocations make it grow, goes to AllocPriority
// with Options.Priority; with Priority 0, or on a device without
// AllocPriority, every chunk goes to Alloc.
func TestPriorityReachesDevice(t *testing.T) {
	for _, prio := range []float32{0, pool.PurposePriority(pool.Activations), pool.PurposePriority(pool.Weights)} {
		d := &priorityDevice{Device: newSim(t, false, 1<<30)}
		p, err := pool.New(d, pool.Options{Growth: pool.GrowChunks, ChunkBytes: 4 << 20, Warmup: 4 << 20, Priority: prio, Cache: pool.CacheOff})
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(uint64(prio*10), 3))
		var live []pool.Block
		for range 300 {
			if len(live) > 0 && r.IntN(3) == 0 {
				live = freeRandom(t, p, r, live)
				continue
			}
			b, err := p.Alloc(1+r.Uint64N(3<<20), pool.AllocOptions{Purpose: pool.Weights})
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, b)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if len(d.calls) < 2 {
			t.Fatalf("priority %v: %d chunk allocations, want growth", prio, len(d.calls))
		}
		want := prio
		if prio == 0 {
			want = -1
		}
		for i, c := range d.calls {
			if c != want {
				t.Fatalf("priority %v: chunk %d allocated with %v, want %v (calls %v)", prio, i, c, want, d.calls)
			}
		}
	}
	if pool.PurposePriority(pool.Weights) != 1 || pool.PurposePriority(pool.Activations) != 0.5 || pool.PurposePriority(pool.KV) != 0.5 {
		t.Error("PurposePriority: want weights 1.0, the rest 0.5")
	}
}

// A pool of weights on a Vulkan device takes its chunks at memory priority
// 1.0: under memory pressure the driver keeps them resident before the
// chunks of an activations pool (0.5, the default).
func ExamplePurposePriority() {
	weights := pool.Options{Name: "weights", Growth: pool.GrowChunks, Priority: pool.PurposePriority(pool.Weights)}
	activations := pool.Options{Name: "activations", Growth: pool.GrowChunks, Priority: pool.PurposePriority(pool.Activations)}
	fmt.Println(weights.Priority, activations.Priority)
	// Output: 1 0.5
}

// TestPriorityByPurpose: under PriorityByPurpose every chunk a request
// takes for itself (above ChunkBytes/2) goes to AllocPriority with its
// block's purpose's priority, over random sizes, purposes and frees, with
// and without the processor caches; a shared chunk keeps Options.Priority
// (plain Alloc at 0).
func TestPriorityByPurpose(t *testing.T) {
	const chunk = 4 << 20
	purposes := []pool.Purpose{pool.Weights, pool.KV, pool.Activations, pool.Staging, pool.Other}
	for _, cache := range []pool.CacheMode{pool.CacheOff, pool.CachePerProcessor} {
		d := &priorityDevice{Device: newSim(t, false, 1<<30)}
		p, err := pool.New(d, pool.Options{Growth: pool.GrowChunks, ChunkBytes: chunk, PriorityByPurpose: true, Cache: cache})
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(uint64(cache), 9))
		var live []pool.Block
		own := 0
		for i := range 400 {
			if len(live) > 0 && r.IntN(3) == 0 {
				live = freeRandom(t, p, r, live)
				continue
			}
			size := 1 + r.Uint64N(6<<20)
			purpose := purposes[r.IntN(len(purposes))]
			d.mu.Lock()
			before := len(d.calls)
			d.mu.Unlock()
			b, err := p.Alloc(size, pool.AllocOptions{Purpose: purpose})
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, b)
			d.mu.Lock()
			calls := d.calls[before:]
			d.mu.Unlock()
			if len(calls) == 0 {
				continue
			}
			want := float32(-1)
			if size+256 > chunk/2 {
				want, own = pool.PurposePriority(purpose), own+1
			}
			if len(calls) != 1 || calls[0] != want {
				t.Fatalf("cache %v, alloc %d (%d bytes, %v): chunk allocations %v, want one at %v", cache, i, size, purpose, calls, want)
			}
		}
		if own < 20 {
			t.Fatalf("cache %v: only %d chunks of their own", cache, own)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// freeRandom frees one of live at random and returns the rest.
func freeRandom(t *testing.T, p *pool.Pool, r *rand.Rand, live []pool.Block) []pool.Block {
	t.Helper()
	k := r.IntN(len(live))
	if err := p.Free(live[k]); err != nil {
		t.Fatal(err)
	}
	return append(live[:k], live[k+1:]...)
}
