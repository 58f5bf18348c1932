package bench

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/device/vulkan"
	"github.com/memwall/memwall/pool"
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

// TestInterleave runs random workloads through interleave on the fake
// driver's clock: after the warm-up, every window runs the pool's side
// (of one to four goroutines) and then the driver's batches on the
// window's first WindowAnchorPairs; each window's ratio is its median pool
// batch over its median driver batch, and the result's figures follow
// from the batches and the windows' times. A driver failure at a random
// call returns the error with every live handle freed and the allocator
// released.
func TestInterleave(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 200; trial++ {
		live, windows, n := 1+r.IntN(40), 1+r.IntN(12), 1+r.IntN(4)
		w := workload(Mix{Min: 512, Max: 64 << 20}, r.Uint64(), live, r.IntN(50), windows*WindowPoolPairs)
		f := newFakeDriver(t)
		fail := trial%3 == 0
		if fail {
			f.failAt = 1 + r.IntN(2*(live+w.Warmup+windows*WindowAnchorPairs))
		}
		per := n * WindowPoolPairs / BatchPairs
		var order []int // pool windows; -1 where the driver was called since the last
		lastCalls := 0
		var spent time.Duration
		poolWindow := func(k int, into []float64) ([]float64, time.Duration, error) {
			if f.calls != lastCalls {
				order = append(order, -1)
			}
			order = append(order, k)
			lastCalls = f.calls
			for b := 0; b < per; b++ {
				into = append(into, float64(100+r.IntN(300)))
			}
			dt := time.Duration(1+r.IntN(1000)) * time.Microsecond
			spent += dt
			return into, dt, nil
		}
		pb, ab, ratios, poolTime, err := interleave(f, true, w, windows, f.now, poolWindow)
		if len(f.live) != 0 || f.released != 1 {
			t.Fatalf("trial %d: %d handles live and %d releases after the run (err %v)", trial, len(f.live), f.released, err)
		}
		if fail {
			if !errors.Is(err, errFake) {
				t.Fatalf("trial %d: failing call %d of %d: err %v", trial, f.failAt, f.calls, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		aper := WindowAnchorPairs / BatchPairs
		if len(pb) != windows*per || len(ab) != windows*aper || len(ratios) != windows || poolTime != spent {
			t.Fatalf("trial %d: %d pool batches, %d driver batches, %d ratios for %d windows; pool time %v of %v",
				trial, len(pb), len(ab), len(ratios), windows, poolTime, spent)
		}
		// The warm-up ran on the driver before the first pool window; then
		// each window: the pool's side, then the driver's.
		want := []int{}
		for k := 0; k < windows; k++ {
			if k > 0 || live+w.Warmup > 0 {
				want = append(want, -1)
			}
			want = append(want, k)
		}
		if fmt.Sprint(order) != fmt.Sprint(want) {
			t.Fatalf("trial %d: order %v, want %v", trial, order, want)
		}
		// The driver's batches are its pairs' cost on the fake clock, and
		// it was asked the sizes of the pairs each window names.
		pair := float64(fakeAllocCost + fakeFreeCost)
		for k, a := range ab {
			if a != pair {
				t.Fatalf("trial %d: driver batch %d took %v a pair, want %v", trial, k, a, pair)
			}
		}
		for k := range ratios {
			first := w.Warmup + k*WindowPoolPairs
			got := f.allocs[live+w.Warmup+k*WindowAnchorPairs : live+w.Warmup+(k+1)*WindowAnchorPairs]
			if fmt.Sprint(got) != fmt.Sprint(w.Sizes[first:first+WindowAnchorPairs]) {
				t.Fatalf("trial %d: window %d asked the driver %v, want %v", trial, k, got, w.Sizes[first:first+WindowAnchorPairs])
			}
			win := append([]float64(nil), pb[k*per:(k+1)*per]...)
			if want := quantile(win, 0.5) / pair; ratios[k] != want {
				t.Fatalf("trial %d: window %d ratio %v, want %v", trial, k, ratios[k], want)
			}
		}
		var res InterleavedResult
		res.fill(append([]float64(nil), pb...), append([]float64(nil), ab...), append([]float64(nil), ratios...), poolTime)
		if res.Windows != windows || res.PoolPairs != len(pb)*BatchPairs || res.AnchorPairs != windows*WindowAnchorPairs ||
			res.P50Ratio != res.PoolBatchP50ns/pair || res.ThroughputRatio != res.PoolPairsPerSec/res.AnchorPairsPerSec ||
			math.Abs(res.AnchorPairsPerSec-1e9/pair) > 1e-9*res.AnchorPairsPerSec ||
			math.Abs(res.PoolPairsPerSec-float64(res.PoolPairs)/poolTime.Seconds()) > 1e-9*res.PoolPairsPerSec ||
			res.WindowRatioP50 > res.WindowRatioP90 {
			t.Fatalf("trial %d: result %+v", trial, res)
		}
	}
}

// TestPoolWindows runs the pool's side of interleaved windows on a
// simulated device with one to five goroutines: every window times every
// goroutine's batches, the pool holds exactly the working sets' bytes
// after each window, the window's time is its slowest goroutine's, and a
// failure of one goroutine's pool (a device that runs out of memory) is
// returned naming it, with nothing left held after close.
func TestPoolWindows(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 12; trial++ {
		n, live, windows := 1+r.IntN(5), 1+r.IntN(16), 1+r.IntN(3)
		o := sim.DefaultOptions()
		o.Backing = false
		d := sim.New(o)
		p, err := pool.New(d, pool.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ws := make([]AllocWorkload, n)
		for gi := range ws {
			ws[gi] = workload(Mix{Min: 512, Max: 8 << 20}, uint64(trial*10+gi), live, r.IntN(100), windows*WindowPoolPairs)
		}
		pw, err := newPoolWindows(p, ws)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k < windows; k++ {
			times, dt, err := pw.window(k, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(times) != n*WindowPoolPairs/BatchPairs {
				t.Fatalf("trial %d window %d: %d batch times for %d goroutines", trial, k, len(times), n)
			}
			var longest time.Duration
			for gi := range ws {
				longest = max(longest, pw.spent[gi])
			}
			if dt != longest || dt <= 0 {
				t.Fatalf("trial %d window %d: window time %v, slowest goroutine %v", trial, k, dt, longest)
			}
			// Every goroutine's working set: its sizes as of this window's
			// last pair.
			var want uint64
			for _, w := range ws {
				sizes := append([]uint64(nil), w.Initial...)
				last := w.Warmup + (k+1)*WindowPoolPairs
				for i := 0; i < last; i++ {
					sizes[w.Victims[i]] = w.Sizes[i]
				}
				for _, s := range sizes {
					want += s
				}
			}
			if got := p.Stats().RequestedBytes; got != want {
				t.Fatalf("trial %d window %d: pool holds %d requested bytes, the working sets %d", trial, k, got, want)
			}
		}
		pw.close()
		if st := p.Stats(); st.UsedBytes != 0 {
			t.Fatalf("trial %d: %d bytes still used after close", trial, st.UsedBytes)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// A pool that cannot hold the working sets: the goroutine that ran out
	// is named.
	o := sim.DefaultOptions()
	o.Backing = false
	o.TotalBytes = 64 << 20
	p, err := pool.New(sim.New(o), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ws := []AllocWorkload{workload(Mix{Min: 1 << 20, Max: 1 << 20}, 1, 4, 0, WindowPoolPairs),
		workload(Mix{Min: 48 << 20, Max: 48 << 20}, 2, 2, 0, WindowPoolPairs)}
	if _, err := newPoolWindows(p, ws); err == nil || !strings.Contains(err.Error(), "goroutine 1") {
		t.Fatalf("working sets of 4 MiB and 96 MiB on 64 MiB: err %v", err)
	}
	if st := p.Stats(); st.UsedBytes != 0 {
		t.Fatalf("%d bytes still used after the failed start", st.UsedBytes)
	}
	_ = p.Close()
}
