package pool

import "testing"

func TestClassOf(t *testing.T) {
	if len(sizeClasses) != numClasses || sizeClasses[numClasses-1] != maxClassBytes {
		t.Fatalf("%d classes up to %d; numClasses %d, maxClassBytes %d", len(sizeClasses), sizeClasses[len(sizeClasses)-1], numClasses, maxClassBytes)
	}
	max := sizeClasses[len(sizeClasses)-1]
	for size := uint64(1); size <= max; size += 1 + size/97 {
		c, want := classOf(size), classOfSearch(size)
		if c != want {
			t.Fatalf("classOf(%d) = %d, binary search says %d", size, c, want)
		}
		if sizeClasses[c] < size || (c > 0 && sizeClasses[c-1] >= size) {
			t.Fatalf("class %d (%d bytes) is not the smallest holding %d", c, sizeClasses[c], size)
		}
	}
	for _, size := range []uint64{256, 257, 2048, 2049, 4096, 4097, 65536, 65537, max} {
		if classOf(size) != classOfSearch(size) {
			t.Fatalf("classOf(%d)", size)
		}
	}
}

// TestSizeClassWaste holds the bound the table promises: rounding a
// request up to its class wastes at most 12.5% of the block above 2 KiB
// and less than 256 bytes below.
func TestSizeClassWaste(t *testing.T) {
	max := sizeClasses[len(sizeClasses)-1]
	for size := uint64(1); size <= max; size++ {
		c := sizeClasses[classOf(size)]
		waste := c - size
		if size > 2048 && float64(waste) > 0.125*float64(c) {
			t.Fatalf("size %d rounds to %d: %.1f%% wasted", size, c, 100*float64(waste)/float64(c))
		}
		if size <= 2048 && waste >= 256 {
			t.Fatalf("size %d rounds to %d", size, c)
		}
	}
}
