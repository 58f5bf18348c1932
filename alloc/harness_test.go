package alloc_test

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"testing"

	"github.com/memwall/memwall/alloc"
)

// The harness does not call testing.TB.Helper on its hot paths: it costs
// a stack walk per call and the sequences make millions of calls.

// harness drives an allocator and checks every answer against a shadow
// model of the live blocks: returned blocks are aligned, large enough,
// inside the capacity and disjoint from every live block; failures change
// nothing but the Failures count and carry the right error; after every
// step the allocator passes alloc.Check and its Walk shows exactly the
// shadow's live blocks.
type harness struct {
	tb   testing.TB
	a    alloc.Allocator
	live []alloc.Block // by offset
	ages []uint64      // live offsets in allocation order

	// fitsBelowLargest: any request of at most Stats().LargestFree bytes
	// with alignment 1 succeeds (true for all but slab, whose LargestFree
	// belongs to one class).
	fitsBelowLargest bool
	bestFitOracle    bool // check bestfit's choice against a brute-force search

	segs []alloc.Segment // scratch
}

func newHarness(tb testing.TB, a alloc.Allocator) *harness {
	return &harness{tb: tb, a: a, fitsBelowLargest: a.Name() != "slab", bestFitOracle: a.Name() == "bestfit"}
}

// run runs f as a subtest of t with the harness reporting to it.
func (h *harness) run(t *testing.T, name string, f func()) {
	t.Helper()
	parent := h.tb
	t.Run(name, func(t *testing.T) {
		h.tb = t
		f()
	})
	h.tb = parent
}

func (h *harness) fatalf(format string, args ...any) {
	h.tb.Helper()
	h.tb.Fatalf("%s: %s", h.a.Name(), fmt.Sprintf(format, args...))
}

// alloc calls Alloc and verifies the outcome, whatever it is.
func (h *harness) alloc(size, align uint64) (alloc.Block, error) {
	before := h.a.Stats()
	var want alloc.Block
	wantOK := false
	if h.bestFitOracle && size > 0 && align&(align-1) == 0 {
		want, wantOK = h.bestFit(size, max(align, 1))
	}
	b, err := h.a.Alloc(size, align)
	if err != nil {
		h.checkFailure(before, size, align, err)
		if wantOK {
			h.fatalf("Alloc(%d, %d) failed (%v), best fit is %+v", size, align, err, want)
		}
		return b, err
	}
	if h.bestFitOracle && b != want {
		h.fatalf("Alloc(%d, %d) = %+v, best fit (lowest offset among the smallest fitting ranges) is %+v (found %v)", size, align, b, want, wantOK)
	}
	a := max(align, 1)
	capacity := h.a.Capacity()
	switch {
	case b.Offset%a != 0:
		h.fatalf("Alloc(%d, %d) = %+v: misaligned", size, align, b)
	case b.Size < size:
		h.fatalf("Alloc(%d, %d) = %+v: smaller than requested", size, align, b)
	case b.Offset >= capacity || b.Size > capacity-b.Offset:
		h.fatalf("Alloc(%d, %d) = %+v: outside capacity %d", size, align, b, capacity)
	}
	i, _ := slices.BinarySearchFunc(h.live, b.Offset, func(x alloc.Block, off uint64) int {
		switch {
		case x.Offset < off:
			return -1
		case x.Offset > off:
			return 1
		}
		return 0
	})
	if i > 0 && h.live[i-1].End() > b.Offset {
		h.fatalf("Alloc(%d, %d) = %+v overlaps live block %+v", size, align, b, h.live[i-1])
	}
	if i < len(h.live) && b.End() > h.live[i].Offset {
		h.fatalf("Alloc(%d, %d) = %+v overlaps live block %+v", size, align, b, h.live[i])
	}
	h.live = slices.Insert(h.live, i, b)
	h.ages = append(h.ages, b.Offset)
	after := h.a.Stats()
	if after.Allocs != before.Allocs+1 || after.Used != before.Used+b.Size ||
		after.LiveBlocks != before.LiveBlocks+1 || after.Failures != before.Failures {
		h.fatalf("Alloc(%d, %d) = %+v: stats went from %+v to %+v", size, align, b, before, after)
	}
	return b, nil
}

// bestFit finds the block bestfit must return: in the smallest free range
// that can hold size bytes at align, lowest offset among equals, placed at
// the lowest aligned offset.
func (h *harness) bestFit(size, align uint64) (alloc.Block, bool) {
	var best alloc.Segment
	found := false
	h.a.Walk(func(s alloc.Segment) bool {
		start := (s.Offset + align - 1) &^ (align - 1)
		if s.Free && start-s.Offset <= s.Size && size <= s.Size-(start-s.Offset) && (!found || s.Size < best.Size) {
			best, found = s, true
		}
		return true
	})
	return alloc.Block{Offset: (best.Offset + align - 1) &^ (align - 1), Size: size}, found
}

func (h *harness) checkFailure(before alloc.Stats, size, align uint64, err error) {
	after := h.a.Stats()
	wantAfter := before
	wantAfter.Failures++
	if after != wantAfter {
		h.fatalf("failed Alloc(%d, %d) changed stats from %+v to %+v", size, align, before, after)
	}
	maxAlloc := before.MaxAlloc
	if maxAlloc == 0 {
		maxAlloc = before.Capacity
	}
	var oom *alloc.OOMError
	switch {
	case size == 0 || align&(align-1) != 0:
		if !errors.Is(err, alloc.ErrInvalidArgument) {
			h.fatalf("Alloc(%d, %d) = %v, want ErrInvalidArgument", size, align, err)
		}
	case size > maxAlloc:
		if !errors.Is(err, alloc.ErrTooLarge) {
			h.fatalf("Alloc(%d, %d) = %v, want ErrTooLarge (MaxAlloc %d)", size, align, err, maxAlloc)
		}
	case errors.Is(err, alloc.ErrTooLarge) && align > maxAlloc:
		// An alignment the strategy cannot honour (slab: no class that large).
	case errors.As(err, &oom):
		if !errors.Is(err, alloc.ErrOutOfMemory) {
			h.fatalf("Alloc(%d, %d) = %v: not ErrOutOfMemory", size, align, err)
		}
		want := alloc.OOMError{Strategy: h.a.Name(), Requested: size, Align: max(align, 1),
			Capacity: before.Capacity, Free: before.Free, LargestFree: before.LargestFree}
		if *oom != want {
			h.fatalf("Alloc(%d, %d): OOMError %+v, want %+v", size, align, *oom, want)
		}
		if h.fitsBelowLargest && max(align, 1) == 1 && size <= before.LargestFree {
			h.fatalf("Alloc(%d, 1) failed with %d bytes in the largest free range: %v", size, before.LargestFree, err)
		}
	default:
		h.fatalf("Alloc(%d, %d) = %v, want an *OOMError", size, align, err)
	}
}

// free frees the i-th live block (by offset) and verifies the accounting.
func (h *harness) free(i int) {
	b := h.live[i]
	before := h.a.Stats()
	if err := h.a.Free(b.Offset); err != nil {
		h.fatalf("Free(%d) of live block %+v: %v", b.Offset, b, err)
	}
	h.live = slices.Delete(h.live, i, i+1)
	h.ages = slices.Delete(h.ages, slices.Index(h.ages, b.Offset), slices.Index(h.ages, b.Offset)+1)
	after := h.a.Stats()
	if after.Frees != before.Frees+1 || after.Used != before.Used-b.Size || after.LiveBlocks != before.LiveBlocks-1 {
		h.fatalf("Free(%d): stats went from %+v to %+v", b.Offset, before, after)
	}
}

// freeOffset frees the live block at offset.
func (h *harness) freeOffset(off uint64) {
	for i, b := range h.live {
		if b.Offset == off {
			h.free(i)
			return
		}
	}
	h.fatalf("no live block at %d in the model", off)
}

// isLiveStart reports whether off starts a live block in the model.
func (h *harness) isLiveStart(off uint64) bool {
	for _, b := range h.live {
		if b.Offset == off {
			return true
		}
	}
	return false
}

// badFree frees an offset that starts no live block and verifies that the
// call fails with ErrInvalidFree and changes nothing.
func (h *harness) badFree(off uint64) {
	if h.isLiveStart(off) {
		h.fatalf("badFree(%d): the model has a live block there", off)
	}
	before := h.a.Stats()
	segsBefore := h.walk()
	err := h.a.Free(off)
	if !errors.Is(err, alloc.ErrInvalidFree) {
		h.fatalf("Free(%d) of a non-block = %v, want ErrInvalidFree", off, err)
	}
	if after := h.a.Stats(); after != before {
		h.fatalf("failed Free(%d) changed stats from %+v to %+v", off, before, after)
	}
	if segsAfter := h.walk(); !slices.Equal(segsBefore, segsAfter) {
		h.fatalf("failed Free(%d) changed the segments", off)
	}
}

// walk returns a copy of the segments.
func (h *harness) walk() []alloc.Segment {
	var segs []alloc.Segment
	h.a.Walk(func(s alloc.Segment) bool {
		segs = append(segs, s)
		return true
	})
	return segs
}

// verify runs alloc.Check and compares the walk's live blocks with the
// model.
func (h *harness) verify() {
	if err := alloc.Check(h.a); err != nil {
		h.tb.Fatal(err)
	}
	h.segs = h.segs[:0]
	h.a.Walk(func(s alloc.Segment) bool {
		if !s.Free {
			h.segs = append(h.segs, s)
		}
		return true
	})
	if len(h.segs) != len(h.live) {
		h.fatalf("walk shows %d live blocks, model has %d", len(h.segs), len(h.live))
	}
	for i, s := range h.segs {
		if s.Offset != h.live[i].Offset || s.Size != h.live[i].Size {
			h.fatalf("walk shows live block [%d, +%d), model has %+v", s.Offset, s.Size, h.live[i])
		}
	}
}

// freeAll frees every live block in a mixed order and checks the empty
// state.
func (h *harness) freeAll() {
	for len(h.live) > 0 {
		h.free(len(h.live) / 2)
		h.verify()
	}
	if err := alloc.CheckEmpty(h.a); err != nil {
		h.tb.Fatal(err)
	}
}

// reset calls Reset and checks the empty state.
func (h *harness) reset() {
	before := h.a.Stats()
	h.a.Reset()
	h.live, h.ages = h.live[:0], h.ages[:0]
	if err := alloc.CheckEmpty(h.a); err != nil {
		h.tb.Fatal(err)
	}
	after := h.a.Stats()
	if after.Allocs != before.Allocs || after.Frees != before.Frees || after.Failures != before.Failures {
		h.fatalf("Reset changed the counters from %+v to %+v", before, after)
	}
}

// grow calls Grow and checks the outcome; it returns false when the
// strategy cannot grow.
func (h *harness) grow(capacity uint64) bool {
	before := h.a.Capacity()
	err := h.a.Grow(capacity)
	switch {
	case errors.Is(err, alloc.ErrNotGrowable):
		return false
	case err != nil:
		h.fatalf("Grow(%d) from %d: %v", capacity, before, err)
	}
	if c := h.a.Capacity(); c < before || c > capacity {
		h.fatalf("Grow(%d) from %d: capacity now %d", capacity, before, c)
	}
	return true
}

// walkStopsEarly checks that Walk stops as soon as fn returns false.
func (h *harness) walkStopsEarly(k int) {
	total := len(h.walk())
	calls := 0
	h.a.Walk(func(alloc.Segment) bool {
		calls++
		return calls < k
	})
	if want := min(k, total); calls != want {
		h.fatalf("Walk returning false at call %d: %d calls, want %d (of %d segments)", k, calls, want, total)
	}
}

func nextPow2(x uint64) uint64 {
	if x <= 1 {
		return 1
	}
	return 1 << bits.Len64(x-1)
}
