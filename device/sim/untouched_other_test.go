//go:build !unix

package sim_test

import "testing"

// untouched returns n bytes that no one will read or write.
func untouched(_ *testing.T, n uint64) []byte { return make([]byte, n) }
