//go:build linux

package cpu

import (
	"syscall"
	"unsafe"
)

// Linux's madvise advice values (asm-generic/mman-common.h), not all in
// package syscall.
const (
	madvHugepage     = 14
	madvPopulateRead = 22 // Linux 5.14
	madvCollapse     = 25 // Linux 6.1
)

func madvise(b []byte, advice int) error {
	if len(b) == 0 {
		return nil
	}
	_, _, e := syscall.Syscall(syscall.SYS_MADVISE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(advice))
	if e != 0 {
		return e
	}
	return nil
}

// populate maps b's pages for reading, by MADV_POPULATE_READ or, where
// the kernel refuses it, by reading a byte of each page.
func populate(b []byte) {
	if madvise(b, madvPopulateRead) != nil {
		touch(b)
	}
}

// adviseHuge asks for transparent huge pages over the 2 MiB-aligned part
// of b.
func adviseHuge(b []byte) {
	if a := alignedHuge(b); len(a) > 0 {
		_ = madvise(a, madvHugepage)
	}
}

// collapse asks the kernel to back the 2 MiB-aligned part of b with huge
// pages now (MADV_COLLAPSE); where it cannot, nothing changes.
func collapse(b []byte) {
	if a := alignedHuge(b); len(a) > 0 {
		_ = madvise(a, madvCollapse)
	}
}

// alignedHuge is the largest part of b that starts and ends on a
// hugeBytes boundary (empty when there is none).
func alignedHuge(b []byte) []byte {
	p := uint64(addr(b))
	lo := (p + hugeBytes - 1) &^ (hugeBytes - 1)
	hi := (p + uint64(len(b))) &^ (hugeBytes - 1)
	if hi <= lo {
		return nil
	}
	return b[lo-p : hi-p]
}
