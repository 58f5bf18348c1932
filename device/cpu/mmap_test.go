//go:build unix

package cpu_test

import (
	"syscall"
	"testing"
)

// mapReadOnly maps n bytes of anonymous memory and makes them read-only.
func mapReadOnly(t *testing.T, n int) []byte {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mprotect(b, syscall.PROT_READ); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}
