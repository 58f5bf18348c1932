package pool

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestStopTheWorldWaitsForPinned checks the runtime property the caches
// rely on (pin.go): stopTheWorld does not return while a goroutine that
// pinned itself before the call is still pinned.
func TestStopTheWorldWaitsForPinned(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("needs two processors: the pinned goroutine and the caller")
	}
	for round := 0; round < 5; round++ {
		var pinned atomic.Bool
		var unpinnedAt atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			procPin()
			pinned.Store(true)
			// Busy for 20 ms while pinned; no calls that could block.
			start := time.Now()
			for time.Since(start) < 20*time.Millisecond {
			}
			unpinnedAt.Store(time.Now().UnixNano())
			procUnpin()
		}()
		for !pinned.Load() {
			runtime.Gosched()
		}
		stopTheWorld()
		returned := time.Now().UnixNano()
		<-done
		if u := unpinnedAt.Load(); u == 0 || returned < u {
			t.Fatalf("stopTheWorld returned %d ns before the pinned goroutine unpinned", u-returned)
		}
	}
}
