//go:build unix

package cpu

import "syscall"

const canMap = true

// mapAnon maps n bytes of private anonymous memory, read-write.
func mapAnon(n int) ([]byte, error) {
	return syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
}

func unmap(b []byte) error { return syscall.Munmap(b) }
