package alloc

import (
	"fmt"
	"math/bits"
)

// checkRequest validates an Alloc request against the contract shared by
// every strategy and returns the normalized alignment (0 means 1). The
// common case is small enough to inline.
func checkRequest(name string, size, align, maxAlloc uint64) (uint64, error) {
	if size-1 < maxAlloc && align&(align-1) == 0 { // 1 <= size <= maxAlloc
		return max(align, 1), nil
	}
	return 0, requestError(name, size, align, maxAlloc)
}

func requestError(name string, size, align, maxAlloc uint64) error {
	if size == 0 {
		return fmt.Errorf("%s: alloc of 0 bytes: %w", name, ErrInvalidArgument)
	}
	if align&(align-1) != 0 {
		return fmt.Errorf("%s: alloc of %d bytes: alignment %d is not a power of two: %w", name, size, align, ErrInvalidArgument)
	}
	return fmt.Errorf("%s: alloc of %d bytes exceeds the largest accepted size %d: %w", name, size, maxAlloc, ErrTooLarge)
}

// checkGrow validates a Grow request; it reports whether anything changes.
func checkGrow(name string, from, to uint64) (bool, error) {
	switch {
	case to < from:
		return false, fmt.Errorf("%s: grow from %d to %d bytes would shrink: %w", name, from, to, ErrInvalidArgument)
	case to > MaxCapacity:
		return false, fmt.Errorf("%s: grow to %d bytes exceeds the limit %d: %w", name, to, MaxCapacity, ErrInvalidArgument)
	}
	return to > from, nil
}

func invalidFree(name string, offset uint64) error {
	return fmt.Errorf("%s: free of offset %d: %w", name, offset, ErrInvalidFree)
}

// alignUp rounds x up to a multiple of align, a power of two. Callers keep
// x below MaxCapacity, so the sum cannot overflow for align <= 1<<63.
func alignUp(x, align uint64) uint64 {
	return (x + align - 1) &^ (align - 1)
}

// log2 returns floor(log2(x)) for x > 0.
func log2(x uint64) int {
	return bits.Len64(x) - 1
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
