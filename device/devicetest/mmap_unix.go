//go:build unix

package devicetest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// mapFileReadOnly writes data to a temporary file and maps it PROT_READ, as
// memwall maps model files. unmap releases the mapping.
func mapFileReadOnly(t *testing.T, data []byte) (b []byte, unmap func(), err error) {
	path := filepath.Join(t.TempDir(), "weights.bin")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return nil, nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	b, err = syscall.Mmap(int(f.Fd()), 0, len(data), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return b, func() {
		if err := syscall.Munmap(b); err != nil {
			t.Errorf("munmap: %v", err)
		}
	}, nil
}
