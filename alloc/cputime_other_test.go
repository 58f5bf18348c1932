//go:build !linux

package alloc_test

import "time"

// threadCPU is not available here; benchmarks then report wall time only.
func threadCPU() (time.Duration, bool) { return 0, false }
