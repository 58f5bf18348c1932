package alloc

import "fmt"

// Linear is a ring (bump) allocator for per-step scratch: each block is
// placed right after the newest live block, wrapping to offset 0 once the
// end of the range is reached and the oldest live block starts far enough
// in. Frees may come in any order, but space is reclaimed only from the
// ends: from the oldest block forward and from the newest block back, each
// as far as the blocks there are freed. Alloc and Free take constant time
// (amortized) and there is no search at all; the cost is that a hole left
// between live blocks is unusable until everything older (or newer) than
// it has been freed too, so one long-lived block can stall the ring.
//
// Walk reports such holes, and alignment padding, as free segments merged
// with their free neighbours; Stats().LargestFree is the largest block an
// Alloc could return now: the space after the newest block (up to the end,
// or up to the oldest block once wrapped) or before the oldest block.
//
// The zero value is not usable; call NewLinear.
type Linear struct {
	capacity    uint64
	ring        []linearEntry // blocks in allocation order; len is a power of two
	front, back uint64        // sequence numbers of the blocks in the ring: [front, back)
	wrapSeq     uint64        // first block placed at offset 0 by a wrap, while older blocks remain; else noWrap
	index       offsetMap     // offset of a live block -> sequence number

	used       uint64
	liveBlocks int
	ranges     int // free ranges; valid when rangesOK
	rangesOK   bool
	allocs     uint64
	frees      uint64
	failures   uint64
}

type linearEntry struct {
	off, size uint64
	freed     bool
}

const noWrap = ^uint64(0)

// NewLinear returns an empty ring allocator over [0, capacity); capacity
// is clamped to MaxCapacity (New reports that as an error).
func NewLinear(capacity uint64) *Linear {
	return &Linear{capacity: min(capacity, MaxCapacity), wrapSeq: noWrap}
}

// Name returns "linear".
func (l *Linear) Name() string { return "linear" }

// Capacity returns the size of the managed range.
func (l *Linear) Capacity() uint64 { return l.capacity }

func (l *Linear) entry(seq uint64) *linearEntry {
	return &l.ring[seq&uint64(len(l.ring)-1)]
}

// head returns the offset just past the newest block (0 when empty).
func (l *Linear) head() uint64 {
	if l.front == l.back {
		return 0
	}
	e := l.entry(l.back - 1)
	return e.off + e.size
}

// Alloc places a block of exactly size bytes at the lowest aligned offset
// after the newest block, or at offset 0 when that does not fit before the
// end of the range and the oldest live block starts at least size bytes
// in. Errors: ErrInvalidArgument (size 0, alignment not a power of two),
// ErrTooLarge (size above MaxCapacity), *OOMError (neither place fits).
func (l *Linear) Alloc(size, align uint64) (Block, error) {
	align, err := checkRequest("linear", size, align, MaxCapacity)
	if err != nil {
		l.failures++
		return Block{}, err
	}
	var off uint64
	ok, wrap := false, false
	switch {
	case l.front == l.back:
		ok = size <= l.capacity
	case l.wrapSeq != noWrap:
		limit := l.entry(l.front).off
		a := alignUp(l.head(), align)
		off, ok = a, a <= limit && size <= limit-a
	default:
		a := alignUp(l.head(), align)
		if a <= l.capacity && size <= l.capacity-a {
			off, ok = a, true
		} else if size <= l.entry(l.front).off {
			off, ok, wrap = 0, true, true
		}
	}
	if !ok {
		l.failures++
		return Block{}, l.oom(size, align)
	}
	if l.back-l.front == uint64(len(l.ring)) {
		l.growRing()
	}
	if wrap {
		l.wrapSeq = l.back
	}
	*l.entry(l.back) = linearEntry{off: off, size: size}
	l.index.put(off, l.back)
	l.back++
	l.rangesOK = false
	l.used += size
	l.liveBlocks++
	l.allocs++
	return Block{Offset: off, Size: size}, nil
}

func (l *Linear) growRing() {
	n := max(16, 2*len(l.ring))
	r := make([]linearEntry, n)
	for s := l.front; s < l.back; s++ {
		r[s&uint64(n-1)] = *l.entry(s)
	}
	l.ring = r
}

// Free releases the live block at offset. Space is reclaimed when the
// block is the oldest or the newest in the ring, together with the freed
// blocks next to it. An offset that does not start a live block returns
// an error wrapping ErrInvalidFree and changes nothing.
func (l *Linear) Free(offset uint64) error {
	seq, ok := l.index.take(offset)
	if !ok {
		return invalidFree("linear", offset)
	}
	e := l.entry(seq)
	e.freed = true
	l.rangesOK = false
	l.used -= e.size
	l.liveBlocks--
	l.frees++
	for l.front < l.back && l.entry(l.front).freed {
		l.front++
	}
	for l.back > l.front && l.entry(l.back-1).freed {
		l.back--
	}
	switch {
	case l.front == l.back:
		l.front, l.back, l.wrapSeq = 0, 0, noWrap
	case l.wrapSeq != noWrap && (l.front >= l.wrapSeq || l.back <= l.wrapSeq):
		l.wrapSeq = noWrap // only one side of the wrap is left: addresses increase again
	}
	return nil
}

// Grow extends the range to capacity bytes. Shrinking, or growing past
// MaxCapacity, returns ErrInvalidArgument.
func (l *Linear) Grow(capacity uint64) error {
	more, err := checkGrow("linear", l.capacity, capacity)
	if more {
		l.capacity = capacity
		l.rangesOK = false
	}
	return err
}

// Reset frees every block. The Allocs, Frees and Failures counts are kept.
func (l *Linear) Reset() {
	l.front, l.back, l.wrapSeq = 0, 0, noWrap
	l.index.clear()
	l.used, l.liveBlocks = 0, 0
	l.rangesOK = false
}

func (l *Linear) largestFree() uint64 {
	switch {
	case l.front == l.back:
		return l.capacity
	case l.wrapSeq != noWrap:
		return l.entry(l.front).off - l.head()
	}
	return max(l.capacity-l.head(), l.entry(l.front).off)
}

// segments calls fn for each segment in offset order, merging adjacent
// free ones, until fn returns false.
func (l *Linear) segments(fn func(Segment) bool) {
	var pending Segment // a free segment not yet reported; Size 0 when none
	stopped := false
	emit := func(s Segment) {
		if stopped {
			return
		}
		if s.Free {
			if pending.Size > 0 && pending.Offset+pending.Size == s.Offset {
				pending.Size += s.Size
				return
			}
			if pending.Size > 0 && !fn(pending) {
				stopped = true
				return
			}
			pending = s
			return
		}
		if pending.Size > 0 {
			if !fn(pending) {
				stopped = true
				return
			}
			pending = Segment{}
		}
		stopped = !fn(s)
	}
	cursor := uint64(0)
	visit := func(from, to uint64) {
		for s := from; s < to && !stopped; s++ {
			e := l.entry(s)
			if e.off > cursor {
				emit(Segment{Offset: cursor, Size: e.off - cursor, Free: true})
			}
			emit(Segment{Offset: e.off, Size: e.size, Free: e.freed})
			cursor = e.off + e.size
		}
	}
	if l.wrapSeq != noWrap {
		visit(l.wrapSeq, l.back)
		visit(l.front, l.wrapSeq)
	} else {
		visit(l.front, l.back)
	}
	if cursor < l.capacity {
		emit(Segment{Offset: cursor, Size: l.capacity - cursor, Free: true})
	}
	if !stopped && pending.Size > 0 {
		fn(pending)
	}
}

// Stats returns the accounting. FreeRanges is counted by a pass over the
// ring, O(blocks in the ring, freed ones included), cached until the next
// change.
func (l *Linear) Stats() Stats {
	if !l.rangesOK {
		l.ranges = 0
		l.segments(func(s Segment) bool {
			if s.Free {
				l.ranges++
			}
			return true
		})
		l.rangesOK = true
	}
	return Stats{
		Capacity:    l.capacity,
		Used:        l.used,
		Free:        l.capacity - l.used,
		LargestFree: l.largestFree(),
		LiveBlocks:  l.liveBlocks,
		FreeRanges:  l.ranges,
		Allocs:      l.allocs,
		Frees:       l.frees,
		Failures:    l.failures,
		MaxAlloc:    MaxCapacity,
	}
}

// Walk reports live blocks and maximal free ranges (holes and padding
// included) in offset order.
func (l *Linear) Walk(fn func(Segment) bool) { l.segments(fn) }

func (l *Linear) oom(size, align uint64) error {
	return &OOMError{Strategy: "linear", Requested: size, Align: align, Capacity: l.capacity,
		Free: l.capacity - l.used, LargestFree: l.largestFree()}
}

func (l *Linear) walkCoalesced() bool    { return true }
func (l *Linear) largestIsWalkMax() bool { return false }
func (l *Linear) emptyFreeRanges() int   { return boolInt(l.capacity > 0) }

// checkInternal verifies the ring: its ends are live, blocks on each side
// of a wrap are in increasing, non-overlapping order, the newest block of
// a wrap ends before the oldest begins, and the index holds exactly the
// live blocks.
func (l *Linear) checkInternal() error {
	n := l.back - l.front
	if n > uint64(len(l.ring)) {
		return fmt.Errorf("linear: %d blocks in a ring of %d", n, len(l.ring))
	}
	if n == 0 {
		if l.wrapSeq != noWrap || l.index.len() != 0 {
			return fmt.Errorf("linear: empty ring with wrap %d and %d indexed blocks", l.wrapSeq, l.index.len())
		}
		return nil
	}
	if l.entry(l.front).freed || l.entry(l.back-1).freed {
		return fmt.Errorf("linear: freed block left at an end of the ring [%d, %d)", l.front, l.back)
	}
	split := l.back
	if l.wrapSeq != noWrap {
		if l.wrapSeq <= l.front || l.wrapSeq >= l.back {
			return fmt.Errorf("linear: wrap at %d outside the ring (%d, %d)", l.wrapSeq, l.front, l.back)
		}
		if l.entry(l.wrapSeq).off != 0 {
			return fmt.Errorf("linear: block after the wrap starts at %d, not 0", l.entry(l.wrapSeq).off)
		}
		split = l.wrapSeq
	}
	live := 0
	var used uint64
	for _, part := range [2][2]uint64{{l.front, split}, {split, l.back}} {
		end := uint64(0)
		for s := part[0]; s < part[1]; s++ {
			e := l.entry(s)
			if e.size == 0 || e.off < end || e.size > l.capacity-e.off {
				return fmt.Errorf("linear: block %d [%d, +%d) out of order or out of range", s, e.off, e.size)
			}
			end = e.off + e.size
			if e.freed {
				continue
			}
			live++
			used += e.size
			if v, ok := l.index.get(e.off); !ok || v != s {
				return fmt.Errorf("linear: live block at offset %d missing from the index", e.off)
			}
		}
		if part[0] == split && split < l.back && end > l.entry(l.front).off {
			return fmt.Errorf("linear: wrapped blocks end at %d, past the oldest block at %d", end, l.entry(l.front).off)
		}
	}
	if live != l.liveBlocks || live != l.index.len() || used != l.used {
		return fmt.Errorf("linear: ring holds %d live blocks (%d bytes), counted %d (%d bytes), index %d",
			live, used, l.liveBlocks, l.used, l.index.len())
	}
	return nil
}
