//go:build unix

package sim_test

import (
	"syscall"
	"testing"
)

// untouched returns n bytes that no one will read or write, as an anonymous
// mapping: a Go slice this large would be zeroed out of a heap that earlier
// tests dirtied, costing its size in resident memory.
func untouched(t *testing.T, n uint64) []byte {
	b, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_NORESERVE)
	if err != nil {
		t.Fatalf("mmap %d bytes: %v", n, err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(b) })
	return b
}
