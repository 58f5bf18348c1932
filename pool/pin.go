package pool

import (
	"runtime"
	_ "unsafe" // for go:linkname
)

// The per-processor caches (cache.go) are reached while the goroutine is
// pinned to its processor (P): between procPin and procUnpin the goroutine
// cannot be preempted or moved, so no other goroutine touches that P's
// cache, and the fast path needs no lock and no atomic read-modify-write.
// This is how sync.Pool keeps its per-P caches. The runtime keeps both
// functions for packages that link to them (go.dev/issue/67401: "Do not
// remove or change the type signature").

//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// stopTheWorld returns once every processor has stopped at a point where
// it is not pinned. runtime.ReadMemStats stops the world to take its
// snapshot, and the runtime cannot stop a processor whose goroutine is
// pinned (pinning disables preemption), so when it returns every pinned
// section that began before the call has ended and its writes are visible
// to the caller. TestStopTheWorldWaitsForPinned checks this property of the
// runtime, so a Go release that changed it would fail the test suite
// rather than corrupt a pool.
func stopTheWorld() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
}
