package hostmath

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// checkRun runs r.Run(n, grain) and checks that the parts cover [0, n)
// exactly once, start on grain boundaries and are never empty.
func checkRun(t *testing.T, r *Runner, n, grain int) {
	t.Helper()
	hits := make([]atomic.Int32, max(n, 0))
	var bad atomic.Value
	r.Run(n, grain, func(lo, hi int) {
		if lo >= hi || lo < 0 || hi > n || lo%max(grain, 1) != 0 || (hi != n && hi%max(grain, 1) != 0) {
			bad.Store([2]int{lo, hi})
			return
		}
		for i := lo; i < hi; i++ {
			hits[i].Add(1)
		}
	})
	if b := bad.Load(); b != nil {
		t.Fatalf("Run(%d, %d): part %v", n, grain, b)
	}
	for i := range hits {
		if h := hits[i].Load(); h != 1 {
			t.Fatalf("Run(%d, %d): unit %d covered %d times", n, grain, i, h)
		}
	}
}

func TestRunnerCovers(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, workers := range []int{1, 2, 3, 8, 17} {
		r := NewRunner(workers)
		for range 300 {
			n := rng.IntN(5000) - 5
			grain := rng.IntN(70)
			checkRun(t, r, n, grain)
			if rng.IntN(20) == 0 {
				// let the workers park, so the next Run must wake them
				time.Sleep(SpinFor + time.Duration(rng.IntN(300))*time.Microsecond)
			}
		}
		r.Close()
		checkRun(t, r, 1000, 3) // after Close: on the caller
		r.Close()
	}
	var nilRunner *Runner
	checkRun(t, nilRunner, 100, 7)
}

// Concurrent callers queue; each Run still covers its own range exactly.
func TestRunnerConcurrent(t *testing.T) {
	r := NewRunner(4)
	defer r.Close()
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range 200 {
				checkRun(t, r, rng.IntN(3000), 1+rng.IntN(16))
			}
		}()
	}
	wg.Wait()
}

// A slow part does not keep the others from taking the rest of the range:
// with one chunk stalled, the other workers finish everything else.
func TestRunnerLateWorker(t *testing.T) {
	r := NewRunner(4)
	defer r.Close()
	var stalled atomic.Bool
	var others, stalledHi atomic.Int64
	r.Run(1600, 1, func(lo, hi int) {
		if lo == 0 {
			stalled.Store(true)
			stalledHi.Store(int64(hi))
			deadline := time.Now().Add(2 * time.Second)
			for others.Load() < 1600-int64(hi) && time.Now().Before(deadline) {
				time.Sleep(100 * time.Microsecond)
			}
			return
		}
		others.Add(int64(hi - lo))
	})
	if !stalled.Load() {
		t.Fatal("the first chunk never ran")
	}
	if got, want := others.Load(), 1600-stalledHi.Load(); got != want {
		t.Fatalf("%d units ran beside the stalled chunk, want %d", got, want)
	}
}
