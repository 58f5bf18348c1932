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
				i := r.IntN(len(live))
				if err := p.Free(live[i]); err != nil {
					t.Fatal(err)
				}
				live = append(live[:i], live[i+1:]...)
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
