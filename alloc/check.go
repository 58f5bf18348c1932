package alloc

import (
	"errors"
	"fmt"
)

// invariants is implemented by this package's strategies so that Check can
// go beyond what the Allocator interface shows.
type invariants interface {
	// walkCoalesced reports whether Walk never reports two adjacent free
	// segments.
	walkCoalesced() bool
	// largestIsWalkMax reports whether Stats().LargestFree always equals
	// the largest free segment reported by Walk. Strategies that cannot
	// hand out every free range whole (linear, slab) check LargestFree in
	// checkInternal instead.
	largestIsWalkMax() bool
	// checkInternal verifies strategy-internal structures (free lists
	// against bitmaps, tree order, indexes); it may assume Walk is sound.
	checkInternal() error
	// emptyFreeRanges returns the number of free ranges Walk reports when
	// no block is live.
	emptyFreeRanges() int
}

// Check walks a and verifies its invariants: the segments reported by Walk
// are non-empty, in offset order, cover [0, Capacity()) exactly without
// overlap; Stats agrees with the walk exactly (Capacity, Used, Free,
// LiveBlocks, FreeRanges, and LargestFree where the strategy's LargestFree
// is the largest free range; otherwise LargestFree must not exceed it);
// free segments are fully coalesced for strategies that promise it (tlsf,
// bestfit, linear); and, for this package's strategies, their internal
// structures are consistent. It returns nil or an error describing the
// first violation. It works on any Allocator; allocators from other
// packages get the generic checks only. Cost: one Walk plus the
// strategy's own checks, linear in the number of blocks and free ranges
// (for slab, in the bitmap words of the pages in use).
func Check(a Allocator) error {
	name := a.Name()
	capacity := a.Capacity()
	st := a.Stats()
	if st.Capacity != capacity {
		return fmt.Errorf("%s: Stats().Capacity %d, Capacity() %d", name, st.Capacity, capacity)
	}
	inv, _ := a.(invariants)
	coalesced := inv != nil && inv.walkCoalesced()
	var (
		next, used, free, largest uint64
		live, ranges              int
		prevFree                  bool
		err                       error
	)
	a.Walk(func(s Segment) bool {
		switch {
		case s.Offset != next:
			err = fmt.Errorf("%s: segment at offset %d, want %d (gap or overlap)", name, s.Offset, next)
		case s.Size == 0:
			err = fmt.Errorf("%s: empty segment at offset %d", name, s.Offset)
		case s.Size > capacity-s.Offset:
			err = fmt.Errorf("%s: segment [%d, +%d) runs past capacity %d", name, s.Offset, s.Size, capacity)
		case s.Free && prevFree && coalesced:
			err = fmt.Errorf("%s: free segment at offset %d follows another free segment (not coalesced)", name, s.Offset)
		}
		if err != nil {
			return false
		}
		if s.Free {
			free += s.Size
			largest = max(largest, s.Size)
			ranges++
		} else {
			used += s.Size
			live++
		}
		next = s.Offset + s.Size
		prevFree = s.Free
		return true
	})
	if err != nil {
		return err
	}
	if next != capacity {
		return fmt.Errorf("%s: segments end at %d, capacity %d", name, next, capacity)
	}
	switch {
	case st.Used != used:
		return fmt.Errorf("%s: Stats().Used %d, walk finds %d", name, st.Used, used)
	case st.Free != free:
		return fmt.Errorf("%s: Stats().Free %d, walk finds %d", name, st.Free, free)
	case st.LiveBlocks != live:
		return fmt.Errorf("%s: Stats().LiveBlocks %d, walk finds %d", name, st.LiveBlocks, live)
	case st.FreeRanges != ranges:
		return fmt.Errorf("%s: Stats().FreeRanges %d, walk finds %d", name, st.FreeRanges, ranges)
	case st.LargestFree > largest:
		return fmt.Errorf("%s: Stats().LargestFree %d exceeds the largest free segment %d", name, st.LargestFree, largest)
	case inv != nil && inv.largestIsWalkMax() && st.LargestFree != largest:
		return fmt.Errorf("%s: Stats().LargestFree %d, walk finds %d", name, st.LargestFree, largest)
	}
	if inv != nil {
		if err := inv.checkInternal(); err != nil {
			return err
		}
	}
	return nil
}

// ErrNotEmpty is returned by CheckEmpty when blocks are still live.
var ErrNotEmpty = errors.New("allocator not empty")

// CheckEmpty runs Check and then verifies that a holds no block (Used and
// LiveBlocks are zero, so every segment is free) and that its free space is
// in the documented empty state: a single free range covering the capacity
// (none when the capacity is 0), except for buddy, whose free space is then
// the capacity split into the fewest aligned power-of-two blocks (one block
// when the capacity is a power-of-two multiple of 256 B). Allocators from
// other packages are expected to report a single free range.
func CheckEmpty(a Allocator) error {
	if err := Check(a); err != nil {
		return err
	}
	name := a.Name()
	st := a.Stats()
	if st.Used != 0 || st.LiveBlocks != 0 {
		return fmt.Errorf("%s: %d bytes in %d live blocks: %w", name, st.Used, st.LiveBlocks, ErrNotEmpty)
	}
	want := 0
	if a.Capacity() > 0 {
		want = 1
	}
	if inv, ok := a.(invariants); ok {
		want = inv.emptyFreeRanges()
	}
	if st.FreeRanges != want {
		return fmt.Errorf("%s: empty but %d free ranges, want %d", name, st.FreeRanges, want)
	}
	return nil
}
