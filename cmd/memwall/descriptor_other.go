//go:build !unix

package main

import "fmt"

// writeDescriptor is not available here: only Unix systems name their
// descriptors by path.
func writeDescriptor(fd int, data []byte) error {
	return fmt.Errorf("writing to descriptor %d by its path is supported on Unix systems only", fd)
}
