package pool_test

import (
	"fmt"
	"os"
	"slices"
	"testing"
	"time"
)

// TestMapCost measures the driver's cost of one growth step of a virtual
// arena at several handle sizes: cuMemCreate, cuMemMap + cuMemSetAccess,
// cuMemUnmap and cuMemRelease of one handle of n bytes (one call each,
// whatever n). Replay charges multi-page handles from these figures
// (trace/replay.H200Costs). It runs only on the GPU
// (MEMWALL_TEST_DEVICE=cuda): the simulator's calls cost nothing.
func TestMapCost(t *testing.T) {
	if os.Getenv("MEMWALL_TEST_DEVICE") != "cuda" {
		t.Skip("measures the driver: set MEMWALL_TEST_DEVICE=cuda on a GPU machine")
	}
	d := newSim(t, false, 0)
	gran := d.Info().Granularity
	if gran == 0 {
		gran = 2 << 20
	}
	const reps = 12
	t.Logf("%-9s %10s %10s %10s %10s  (median of %d, µs)", "handle", "create", "map+access", "unmap", "release", reps)
	for _, n := range []uint64{gran, 2 * gran, 4 * gran, 8 * gran, 16 * gran, 32 * gran, 64 * gran, 128 * gran} {
		va, err := d.Reserve(n)
		if err != nil {
			t.Fatalf("reserve %d: %v", n, err)
		}
		var cr, mp, um, rl []time.Duration
		for range reps {
			t0 := time.Now()
			h, err := d.CreatePhysical(n)
			t1 := time.Now()
			if err != nil {
				t.Fatalf("create %d: %v", n, err)
			}
			if err := d.Map(va, n, h); err != nil {
				t.Fatalf("map %d: %v", n, err)
			}
			t2 := time.Now()
			if err := d.Unmap(va, n); err != nil {
				t.Fatalf("unmap %d: %v", n, err)
			}
			t3 := time.Now()
			if err := d.ReleasePhysical(h); err != nil {
				t.Fatalf("release %d: %v", n, err)
			}
			t4 := time.Now()
			cr, mp, um, rl = append(cr, t1.Sub(t0)), append(mp, t2.Sub(t1)), append(um, t3.Sub(t2)), append(rl, t4.Sub(t3))
		}
		if err := d.Unreserve(va, n); err != nil {
			t.Fatalf("unreserve: %v", err)
		}
		t.Logf("%-9s %10.1f %10.1f %10.1f %10.1f", fmt.Sprintf("%dMiB", n>>20), us(cr), us(mp), us(um), us(rl))
	}
}

// us is the median of ds in microseconds.
func us(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Microsecond)
}
