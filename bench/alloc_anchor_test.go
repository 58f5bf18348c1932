package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/vulkan"
)

// Both drivers are anchors: a signature that drifts from DriverAnchor's
// would otherwise only drop their rows from `memwall bench alloc`.
var (
	_ DriverAnchor = (*cuda.Device)(nil)
	_ DriverAnchor = (*vulkan.Device)(nil)
)

// fakeDriver is an allocator whose calls cost a fixed time on a fake
// clock, and which checks what it is asked: every free names a live
// handle, and it can fail its n-th call.
type fakeDriver struct {
	t          *testing.T
	clock      time.Duration
	next       uint64
	live       map[uint64]uint64 // handle -> size
	calls      int
	failAt     int // the call that fails (1-based; 0 = none)
	released   int
	allocs     []uint64 // sizes asked, in order
	freedSlots []uint64 // handles freed, in order
}

const (
	fakeAllocCost = 300 * time.Nanosecond
	fakeFreeCost  = 200 * time.Nanosecond
)

var errFake = errors.New("fake driver failure")

func newFakeDriver(t *testing.T) *fakeDriver {
	return &fakeDriver{t: t, live: map[uint64]uint64{}}
}

func (f *fakeDriver) now() time.Time { return time.Unix(0, 0).Add(f.clock) }

func (f *fakeDriver) alloc(size uint64) (uint64, error) {
	f.calls++
	f.clock += fakeAllocCost
	if f.calls == f.failAt {
		return 0, errFake
	}
	f.next++
	f.live[f.next] = size
	f.allocs = append(f.allocs, size)
	return f.next, nil
}

func (f *fakeDriver) free(h uint64) error {
	f.calls++
	f.clock += fakeFreeCost
	if _, ok := f.live[h]; !ok {
		f.t.Fatalf("free of handle %d, which is not live", h)
	}
	delete(f.live, h)
	f.freedSlots = append(f.freedSlots, h)
	if f.calls == f.failAt {
		return errFake
	}
	return nil
}

func (f *fakeDriver) DriverAllocator(async bool) (func(uint64) (uint64, error), func(uint64) error, func() error, error) {
	return f.alloc, f.free, func() error { f.released++; return nil }, nil
}

// randomWorkload draws a workload with or without a working set.
func randomWorkload(r *rand.Rand) AllocWorkload {
	var w AllocWorkload
	live := 0
	if r.IntN(3) > 0 {
		live = 1 + r.IntN(8)
	}
	for range live {
		w.Initial = append(w.Initial, uint64(1+r.IntN(1<<20)))
	}
	n := r.IntN(200)
	for range n {
		w.Sizes = append(w.Sizes, uint64(1+r.IntN(1<<20)))
		if live > 0 {
			w.Victims = append(w.Victims, r.IntN(live))
		}
	}
	w.Warmup = r.IntN(n + 1)
	return w
}

// TestTimePairs runs random workloads through timePairs on a fake clock:
// each pair frees the block in its victim's slot (the handle allocated
// last there) and allocates its size; the times are exactly the calls'
// costs: one per whole batch, or the allocation and the free apart.
func TestTimePairs(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for iter := 0; iter < 2000; iter++ {
		w := randomWorkload(r)
		split := r.IntN(2) == 0
		batch := 1
		if !split {
			batch = 1 + r.IntN(20)
		}
		f := newFakeDriver(t)
		var live []uint64
		for _, s := range w.Initial {
			h, _ := f.alloc(s)
			live = append(live, h)
		}
		slots := append([]uint64(nil), live...)
		a, fr, after, err := timePairs(w, f.alloc, f.free, live, f.now, split, batch)
		if err != nil {
			t.Fatal(err)
		}
		timed := len(w.Sizes) - w.Warmup
		pair := fakeAllocCost + fakeFreeCost
		switch {
		case split:
			if len(a) != timed || len(fr) != timed {
				t.Fatalf("%d timed pairs: %d allocation and %d free times", timed, len(a), len(fr))
			}
			for i := range a {
				if a[i] != fakeAllocCost || fr[i] != fakeFreeCost {
					t.Fatalf("pair %d: alloc %v free %v, want %v and %v", i, a[i], fr[i], fakeAllocCost, fakeFreeCost)
				}
			}
		default:
			if len(a) != timed/batch || fr == nil || len(fr) != 0 {
				t.Fatalf("%d timed pairs in batches of %d: %d times (and %d frees)", timed, batch, len(a), len(fr))
			}
			for i := range a {
				if a[i] != time.Duration(batch)*pair {
					t.Fatalf("batch %d: %v, want %v", i, a[i], time.Duration(batch)*pair)
				}
			}
		}
		// Replay the workload's slots: the frees named the right handles.
		k := 0
		for i := range w.Sizes {
			if len(slots) > 0 {
				v := w.Victims[i]
				if f.freedSlots[k] != slots[v] {
					t.Fatalf("pair %d freed handle %d, slot %d held %d", i, f.freedSlots[k], v, slots[v])
				}
				slots[v] = uint64(len(w.Initial) + i + 1)
			}
			k++
		}
		if len(after) != len(f.live) {
			t.Fatalf("%d handles returned live, the driver holds %d", len(after), len(f.live))
		}
		for _, h := range after {
			if _, ok := f.live[h]; !ok {
				t.Fatalf("handle %d returned live is not", h)
			}
		}
	}
}

// TestAnchorTimesFailure fails a random driver call of random workloads:
// the error comes back, every block the driver handed out is freed exactly
// once (fakeDriver fails the test on a second free), and the allocator is
// released once.
func TestAnchorTimesFailure(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for iter := 0; iter < 2000; iter++ {
		w := randomWorkload(r)
		f := newFakeDriver(t)
		calls := 2*len(w.Initial) + 2*len(w.Sizes) // the working set's frees at the end too
		f.failAt = 1 + r.IntN(calls+1)             // sometimes none of the calls
		var err error
		switch r.IntN(3) {
		case 0:
			_, err = anchorPairTimes(f, w, false)
		case 1:
			_, err = anchorBatchTimes(f, w, false, 1+r.IntN(20))
		default:
			_, _, err = anchorAllocTimes(f, w, false)
		}
		if f.failAt <= calls && !errors.Is(err, errFake) {
			t.Fatalf("call %d of %d failed, the run returned %v", f.failAt, calls, err)
		}
		if f.failAt > calls && err != nil {
			t.Fatal(err)
		}
		if len(f.live) != 0 || f.released != 1 {
			t.Fatalf("after the run: %d blocks live, released %d times", len(f.live), f.released)
		}
	}
}

// TestAnchorTimesInvalid refuses bad workloads before any driver call.
func TestAnchorTimesInvalid(t *testing.T) {
	good := AllocWorkload{Initial: []uint64{1, 2}, Sizes: []uint64{3, 4}, Victims: []int{0, 1}, Warmup: 1}
	bad := map[string]AllocWorkload{
		"victim outside":   {Initial: good.Initial, Sizes: good.Sizes, Victims: []int{0, 2}},
		"negative victim":  {Initial: good.Initial, Sizes: good.Sizes, Victims: []int{-1, 0}},
		"victims short":    {Initial: good.Initial, Sizes: good.Sizes, Victims: []int{0}},
		"warm-up long":     {Sizes: good.Sizes, Warmup: 3},
		"warm-up negative": {Sizes: good.Sizes, Warmup: -1},
	}
	for name, w := range bad {
		f := newFakeDriver(t)
		if _, err := anchorPairTimes(f, w, false); !errors.Is(err, device.ErrInvalid) || f.calls != 0 {
			t.Errorf("%s: %v after %d calls, want ErrInvalid before any", name, err, f.calls)
		}
	}
	f := newFakeDriver(t)
	if _, err := anchorBatchTimes(f, good, false, 0); !errors.Is(err, device.ErrInvalid) || f.calls != 0 {
		t.Errorf("batch of 0: %v, want ErrInvalid", err)
	}
	if _, err := anchorPairTimes(f, good, false); err != nil {
		t.Errorf("good workload: %v", err)
	}
}

// TestAnchorOnGPU runs the anchor's two request streams (a working set
// with a victim freed before each allocation, and allocations freed at
// once) through both of CUDA's driver allocators when
// MEMWALL_TEST_DEVICE=cuda: every timed pair yields a positive time and
// every block is freed (the device's free memory comes back).
func TestAnchorOnGPU(t *testing.T) {
	if os.Getenv("MEMWALL_TEST_DEVICE") != "cuda" {
		t.Skip("MEMWALL_TEST_DEVICE=cuda runs the driver anchor on the GPU")
	}
	d, err := cuda.Open(cuda.Options{})
	if err != nil {
		t.Fatalf("MEMWALL_TEST_DEVICE=cuda: %v", err)
	}
	defer d.Close()
	before, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	w := AllocWorkload{Initial: []uint64{32 << 20, 48 << 20, 4096}, Warmup: 2}
	for i := 0; i < 34; i++ {
		w.Sizes = append(w.Sizes, uint64(512+i*100_003))
		w.Victims = append(w.Victims, i%3)
	}
	for _, async := range []bool{false, true} {
		for _, ws := range []AllocWorkload{w, {Sizes: w.Sizes, Warmup: 2}} {
			name := fmt.Sprintf("async %v, live %d", async, len(ws.Initial))
			pairs, err := anchorPairTimes(d, ws, async)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			batches, err := anchorBatchTimes(d, ws, async, 16)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			a, f, err := anchorAllocTimes(d, ws, async)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if len(pairs) != 32 || len(batches) != 2 || len(a) != 32 || len(f) != 32 {
				t.Errorf("%s: %d pairs, %d batches, %d/%d split times; want 32, 2, 32/32", name, len(pairs), len(batches), len(a), len(f))
			}
			for _, x := range append(append(pairs, batches...), a...) {
				if x <= 0 {
					t.Fatalf("%s: non-positive time %v", name, x)
				}
			}
		}
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	after, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	if after+16<<20 < before {
		t.Errorf("free device memory %d after the anchor runs, %d before: blocks leaked", after, before)
	}
}
