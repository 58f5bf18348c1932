package main

import (
	"syscall"
	"unsafe"
)

// isTTY asks the kernel whether fd is a terminal (TCGETS succeeds).
func isTTY(fd uintptr) bool {
	var t syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return errno == 0
}
