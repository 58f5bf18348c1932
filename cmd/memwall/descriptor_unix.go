//go:build unix

package main

import (
	"os"
	"syscall"
)

// writeDescriptor writes data to the process's open descriptor fd through
// a duplicate of it, so that closing the duplicate leaves fd open. The two
// share one offset: a file is written where fd stands, after what was
// written to it before.
func writeDescriptor(fd int, data []byte) error {
	d, err := syscall.Dup(fd)
	if err != nil {
		return err
	}
	syscall.CloseOnExec(d)
	f := os.NewFile(uintptr(d), "")
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
