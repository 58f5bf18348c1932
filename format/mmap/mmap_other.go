//go:build !unix

package mmap

import (
	"io"
	"os"
)

// mapFile falls back to reading the file into memory where syscall.Mmap is
// not available. The result is correct but costs the file's size in heap.
func mapFile(f *os.File, size int) ([]byte, func([]byte) error, error) {
	data := make([]byte, size)
	if _, err := io.ReadFull(io.NewSectionReader(f, 0, int64(size)), data); err != nil {
		return nil, nil, err
	}
	return data, nil, nil
}
