package pool

import "math/bits"

// sizeClasses are the sizes the per-processor caches round small blocks to:
// multiples of 256 bytes up to 2 KiB, then 8 classes per doubling, so the
// rounding wastes at most 12.5% of a block (TestSizeClassWaste holds it).
var sizeClasses = makeSizeClasses(maxClassBytes)

// maxClassBytes is the largest size class; numClasses the table's length
// (TestClassOf holds it to the table), so that the per-processor caches
// keep their lists in fixed arrays.
const (
	maxClassBytes = 1 << 20
	numClasses    = 80
)

func makeSizeClasses(max uint64) []uint64 {
	var cs []uint64
	for s := uint64(256); s <= 2048; s += 256 {
		cs = append(cs, s)
	}
	for base := uint64(2048); base < max; base *= 2 {
		step := base / 8
		for s := base + step; s <= 2*base && s <= max; s += step {
			cs = append(cs, s)
		}
	}
	return cs
}

// classOf returns the smallest class that holds size (0 < size ≤ the
// largest class), in constant time from the table's construction:
// multiples of 256 up to 2 KiB, then 8 steps per doubling.
func classOf(size uint64) int {
	if size <= 2048 {
		return int((size+255)/256) - 1
	}
	exp := bits.Len64(size-1) - 1 // base = 1<<exp < size ≤ 2*base
	// Steps of base/8 (a shift, not a division); the masks spare the
	// checks for a shift past the width.
	e, shift := uint(exp)&63, uint(exp-3)&63
	return 8 + (exp-11)*8 + int((size-(1<<e)+(1<<shift)-1)>>shift) - 1
}

// classOfSearch is classOf by binary search over the table (the test's
// reference).
func classOfSearch(size uint64) int {
	lo, hi := 0, len(sizeClasses)-1
	for lo < hi {
		mid := (lo + hi) / 2
		if sizeClasses[mid] >= size {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}
