package ordered

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunOrderAndBound(t *testing.T) {
	for _, workers := range []int{0, 1, 3, 8} {
		var inFlight, most atomic.Int64
		var got []int
		err := Run(context.Background(), 200, workers, func(i int) error {
			n := inFlight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			if i%7 == 0 {
				time.Sleep(time.Millisecond) // finish out of order
			}
			return nil
		}, func(i int) error {
			got = append(got, i)
			inFlight.Add(-1)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range got {
			if v != i {
				t.Fatalf("%d workers: write %d got job %d", workers, i, v)
			}
		}
		if len(got) != 200 || most.Load() > int64(InFlight(workers)) {
			t.Errorf("%d workers: %d writes, %d in flight at most (bound %d)", workers, len(got), most.Load(), InFlight(workers))
		}
	}
}

func TestRunErrors(t *testing.T) {
	boom := errors.New("boom")
	var writes atomic.Int64
	err := Run(context.Background(), 100, 4, func(i int) error {
		if i == 30 {
			return boom
		}
		return nil
	}, func(i int) error { writes.Add(1); return nil })
	if !errors.Is(err, boom) || writes.Load() != 30 {
		t.Errorf("work error: %v after %d writes, want boom after 30", err, writes.Load())
	}
	err = Run(context.Background(), 100, 4, func(int) error { return nil }, func(i int) error {
		if i == 5 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("write error: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Run(ctx, 100, 4, func(int) error { return nil }, func(int) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	err = Run(ctx, 1000, 2, func(int) error { return nil }, func(i int) error {
		if i == 10 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled midway: %v", err)
	}
}
