package pool

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkHost times the primitives the pool's paths are made of, so that
// pair latencies on different hosts can be compared: a compare-and-swap
// (one per free), an uncontended lock and unlock (one per trip to the
// arenas), a pin and unpin of the processor (one or two per operation),
// and a clock read (the benchmarks' timer).
func BenchmarkHost(b *testing.B) {
	b.Run("cas", func(b *testing.B) {
		var x atomic.Uint64
		for i := 0; i < b.N; i++ {
			x.CompareAndSwap(uint64(i), uint64(i+1))
		}
	})
	b.Run("lock-unlock", func(b *testing.B) {
		var mu sync.Mutex
		n := 0
		for i := 0; i < b.N; i++ {
			mu.Lock()
			n++
			mu.Unlock()
		}
		_ = n
	})
	b.Run("pin-unpin", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			procPin()
			procUnpin()
		}
	})
	b.Run("clock", func(b *testing.B) {
		var t time.Time
		for i := 0; i < b.N; i++ {
			t = time.Now()
		}
		_ = t
	})
}
