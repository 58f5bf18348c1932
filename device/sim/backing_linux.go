package sim

import (
	"math"
	"syscall"
)

// mapAnon maps n zeroed bytes of anonymous private memory, reserving no swap
// for them (untouched pages cost nothing, so a simulated device larger than
// the host still works until its bytes are written).
func mapAnon(n uint64) ([]byte, error) {
	if n > math.MaxInt {
		return nil, syscall.EINVAL
	}
	return syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_NORESERVE)
}

// unmapAnon gives back a mapping from mapAnon.
func unmapAnon(b []byte) { _ = syscall.Munmap(b) }
