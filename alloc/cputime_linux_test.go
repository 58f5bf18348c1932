//go:build linux

package alloc_test

import (
	"syscall"
	"time"
)

// threadCPU returns the CPU time consumed by the calling OS thread, which
// the caller must have locked (runtime.LockOSThread). Unlike wall time it
// does not grow while other processes hold the CPU, so benchmarks on a
// shared machine stay comparable.
func threadCPU() (time.Duration, bool) {
	const rusageThread = 1 // RUSAGE_THREAD
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
