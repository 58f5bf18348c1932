package pool

import (
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"
)

func TestBucketBounds(t *testing.T) {
	for ns := uint64(0); ns < 1<<20; ns += 1 + ns/7 {
		b := bucketOf(ns)
		if up := bucketUpper(b); up < ns {
			t.Fatalf("value %d in bucket %d whose upper bound is %d", ns, b, up)
		}
		if b > 0 && bucketUpper(b-1) >= ns {
			t.Fatalf("value %d fits in an earlier bucket %d (upper %d)", ns, b-1, bucketUpper(b-1))
		}
	}
}

func TestQuantileWithinOneBucket(t *testing.T) {
	var h Histogram
	r := rand.New(rand.NewPCG(1, 2))
	vals := make([]float64, 20000)
	for i := range vals {
		v := time.Duration(r.ExpFloat64() * 500)
		vals[i] = float64(v)
		h.Observe(v)
	}
	sort.Float64s(vals)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		exact := vals[int(q*float64(len(vals)))-1]
		got := float64(h.Quantile(q))
		if got < exact || got > exact*1.125+1 {
			t.Errorf("q%.2f = %.0f, exact %.0f: off by more than a bucket", q, got, exact)
		}
	}
	if h.Count() != uint64(len(vals)) {
		t.Fatalf("count %d, want %d", h.Count(), len(vals))
	}
}

func TestConcurrentObserve(t *testing.T) {
	var h Histogram
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				h.Observe(time.Duration(i))
			}
		}()
	}
	wg.Wait()
	if h.Count() != 8000 {
		t.Fatalf("count %d, want 8000", h.Count())
	}
	if got := h.Buckets([]time.Duration{time.Hour})[0]; got != 8000 {
		t.Fatalf("cumulative bucket %d, want 8000", got)
	}
}
