// Package mmap maps whole files read-only into memory so that model weights
// can be read (and handed to a device copy) without first copying them into
// the Go heap.
//
// A Mapping is immutable: its bytes must never be written (on Unix the pages
// are mapped PROT_READ and a write faults). The bytes stay valid until Close;
// touching them afterwards faults. If the underlying file is truncated by
// another process while mapped, reading past the new end raises SIGBUS; model
// files are expected to be left alone while open.
package mmap

import (
	"fmt"
	"math"
	"os"
)

// Mapping is a read-only view of a whole file.
type Mapping struct {
	path   string
	data   []byte
	unmap  func([]byte) error // nil when nothing needs releasing
	closed bool
}

// Open maps the file at path read-only. The file descriptor is closed before
// Open returns; the mapping keeps the pages alive. An empty file yields an
// empty, valid Mapping. Errors name the path.
func Open(path string) (*Mapping, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	defer f.Close()
	return Map(f)
}

// Map maps the whole of f (its size at the time of the call) read-only. The
// caller keeps ownership of f and may close it right away.
func Map(f *os.File) (*Mapping, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", f.Name(), err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("mmap %s: not a regular file (%s)", f.Name(), st.Mode().Type())
	}
	size := st.Size()
	if size < 0 || uint64(size) > math.MaxInt {
		return nil, fmt.Errorf("mmap %s: size %d does not fit in memory", f.Name(), size)
	}
	if size == 0 {
		return &Mapping{path: f.Name(), data: []byte{}}, nil
	}
	data, unmap, err := mapFile(f, int(size))
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", f.Name(), err)
	}
	return &Mapping{path: f.Name(), data: data, unmap: unmap}, nil
}

// Path returns the name of the mapped file.
func (m *Mapping) Path() string { return m.path }

// Bytes returns the file's contents. The slice is read-only and valid until
// Close; after Close it is nil.
func (m *Mapping) Bytes() []byte { return m.data }

// Len returns the mapped length in bytes (0 after Close).
func (m *Mapping) Len() int { return len(m.data) }

// Close releases the mapping. It is safe to call more than once; only the
// first call can return an error. Slices obtained from Bytes must not be used
// afterwards.
func (m *Mapping) Close() error {
	if m == nil || m.closed {
		return nil
	}
	m.closed = true
	data := m.data
	m.data = nil
	if m.unmap == nil {
		return nil
	}
	if err := m.unmap(data); err != nil {
		return fmt.Errorf("munmap %s: %w", m.path, err)
	}
	return nil
}
