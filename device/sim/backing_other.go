//go:build !linux

package sim

import "errors"

// mapAnon is Linux-only: elsewhere backings are Go memory.
func mapAnon(uint64) ([]byte, error) { return nil, errors.ErrUnsupported }

// unmapAnon is never called where mapAnon fails.
func unmapAnon([]byte) {}
