//go:build !unix

package devicetest

import (
	"errors"
	"testing"
)

// mapFileReadOnly is not available here: the subtest skips.
func mapFileReadOnly(t *testing.T, data []byte) ([]byte, func(), error) {
	return nil, nil, errors.New("read-only file mappings are only tested on unix")
}
