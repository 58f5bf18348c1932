package alloc

import (
	"fmt"
	"math/bits"
)

// TLSF parameters: sizes below 1<<tlsfSLLog2 each get their own list; above
// that, every power-of-two range [2^f, 2^(f+1)) is split into tlsfSLCount
// equal second-level classes, so a class spans at most 1/32 of its sizes.
const (
	tlsfSLLog2  = 5
	tlsfSLCount = 1 << tlsfSLLog2
	// Free ranges hold at most MaxCapacity = 2^62 bytes: f <= 62, so the
	// first level f-(tlsfSLLog2-1) is at most 58.
	tlsfFLCount = 63 - tlsfSLLog2 + 1
)

const nilID = -1

// TLSF is a two-level segregated-fit allocator (Masmano et al.): free
// ranges sit in per-size-class lists found through two levels of bitmaps,
// so Alloc and Free take constant time regardless of how many blocks exist.
// Freed blocks merge with free physical neighbours immediately, so free
// space is always fully coalesced. Alloc takes the first block of the
// smallest class guaranteed to fit ("good fit"); when that fails it scans
// the request's own class before giving up, so any request of at most
// Stats().LargestFree bytes with alignment 1 succeeds.
//
// Per-block metadata lives in a slice indexed by node id; a hash table
// finds a live block from its offset. The zero value is not usable; call
// NewTLSF.
type TLSF struct {
	capacity uint64
	nodes    []tlsfNode
	spare    []int32 // recycled node ids
	first    int32   // node at offset 0 (nilID when capacity is 0)
	last     int32   // node ending at capacity

	flBitmap uint64
	slBitmap [tlsfFLCount]uint32
	heads    [tlsfFLCount][tlsfSLCount]int32

	live offsetMap // offset of a live block -> node id

	used       uint64
	liveBlocks int
	freeRanges int
	allocs     uint64
	frees      uint64
	failures   uint64
}

type tlsfNode struct {
	off, size          uint64
	prevPhys, nextPhys int32
	prevFree, nextFree int32
	free               bool
}

// NewTLSF returns an empty TLSF allocator over [0, capacity); capacity is
// clamped to MaxCapacity (New reports that as an error instead).
func NewTLSF(capacity uint64) *TLSF {
	t := &TLSF{capacity: min(capacity, MaxCapacity)}
	t.Reset()
	return t
}

// Name returns "tlsf".
func (t *TLSF) Name() string { return "tlsf" }

// Capacity returns the size of the managed range.
func (t *TLSF) Capacity() uint64 { return t.capacity }

// tlsfMapping returns the class of a free block of the given size.
func tlsfMapping(size uint64) (fl, sl int) {
	if size < tlsfSLCount {
		return 0, int(size)
	}
	f := log2(size)
	return f - (tlsfSLLog2 - 1), int(size>>(f-tlsfSLLog2)) - tlsfSLCount
}

// findClass returns the first non-empty class whose blocks all hold at
// least size bytes.
func (t *TLSF) findClass(size uint64) (fl, sl int, ok bool) {
	if size >= tlsfSLCount {
		size += 1<<(log2(size)-tlsfSLLog2) - 1
	}
	fl, sl = tlsfMapping(size)
	if fl >= tlsfFLCount {
		return 0, 0, false
	}
	slMap := t.slBitmap[fl] & (^uint32(0) << sl)
	if slMap == 0 {
		flMap := t.flBitmap & (^uint64(0) << (fl + 1))
		if flMap == 0 {
			return 0, 0, false
		}
		fl = bits.TrailingZeros64(flMap)
		slMap = t.slBitmap[fl]
	}
	return fl, bits.TrailingZeros32(slMap), true
}

func (t *TLSF) insertFree(id int32) {
	n := &t.nodes[id]
	fl, sl := tlsfMapping(n.size)
	head := t.heads[fl][sl]
	n.prevFree, n.nextFree = nilID, head
	if head != nilID {
		t.nodes[head].prevFree = id
	}
	t.heads[fl][sl] = id
	t.flBitmap |= 1 << fl
	t.slBitmap[fl] |= 1 << sl
}

func (t *TLSF) removeFree(id int32) {
	n := &t.nodes[id]
	if n.nextFree != nilID {
		t.nodes[n.nextFree].prevFree = n.prevFree
	}
	if n.prevFree != nilID {
		t.nodes[n.prevFree].nextFree = n.nextFree
		return
	}
	fl, sl := tlsfMapping(n.size)
	t.heads[fl][sl] = n.nextFree
	if n.nextFree == nilID {
		t.slBitmap[fl] &^= 1 << sl
		if t.slBitmap[fl] == 0 {
			t.flBitmap &^= 1 << fl
		}
	}
}

func (t *TLSF) newNode(off, size uint64, free bool) int32 {
	n := tlsfNode{off: off, size: size, free: free, prevPhys: nilID, nextPhys: nilID, prevFree: nilID, nextFree: nilID}
	if k := len(t.spare); k > 0 {
		id := t.spare[k-1]
		t.spare = t.spare[:k-1]
		t.nodes[id] = n
		return id
	}
	t.nodes = append(t.nodes, n)
	return int32(len(t.nodes) - 1)
}

func (t *TLSF) fits(id int32, size, align uint64) bool {
	n := &t.nodes[id]
	return alignUp(n.off, align)-n.off+size <= n.size
}

// find returns a free block that can hold size bytes at the alignment, or
// nilID.
func (t *TLSF) find(size, align uint64) int32 {
	if fl, sl, ok := t.findClass(size); ok {
		if id := t.heads[fl][sl]; t.fits(id, size, align) {
			return id
		}
	}
	worst := size + align - 1 // any block this large fits at any alignment
	if align > 1 && worst <= t.capacity {
		if fl, sl, ok := t.findClass(worst); ok {
			return t.heads[fl][sl]
		}
	}
	// Slow path, taken only near exhaustion: blocks that might fit but are
	// not guaranteed to live in the classes from size's to worst's.
	flLo, slLo := tlsfMapping(size)
	flHi, slHi := tlsfMapping(min(worst, t.capacity))
	for fl := flLo; fl <= flHi; fl++ {
		m := t.slBitmap[fl]
		if fl == flLo {
			m &= ^uint32(0) << slLo
		}
		if fl == flHi && slHi < tlsfSLCount-1 {
			m &= 1<<(slHi+1) - 1
		}
		for ; m != 0; m &= m - 1 {
			sl := bits.TrailingZeros32(m)
			for id := t.heads[fl][sl]; id != nilID; id = t.nodes[id].nextFree {
				if t.fits(id, size, align) {
					return id
				}
			}
		}
	}
	return nilID
}

// Alloc returns a block of exactly size bytes at the requested alignment,
// carved from the front of a free range (alignment padding stays free).
// Errors: ErrInvalidArgument (size 0, alignment not a power of two),
// ErrTooLarge (size above MaxCapacity), *OOMError (nothing fits). Time is
// constant except near exhaustion, when one or a few class lists are
// scanned before failing.
func (t *TLSF) Alloc(size, align uint64) (Block, error) {
	align, err := checkRequest("tlsf", size, align, MaxCapacity)
	if err != nil {
		t.failures++
		return Block{}, err
	}
	id := int32(nilID)
	if size <= t.capacity-t.used {
		id = t.find(size, align)
	}
	if id == nilID {
		t.failures++
		return Block{}, t.oom(size, align)
	}
	t.removeFree(id)
	t.freeRanges--
	n := t.nodes[id]
	if start := alignUp(n.off, align); start > n.off {
		pad := t.newNode(n.off, start-n.off, true)
		t.linkBefore(pad, id)
		t.nodes[id].off, t.nodes[id].size = start, n.size-(start-n.off)
		t.insertFree(pad)
		t.freeRanges++
	}
	if rest := t.nodes[id].size - size; rest > 0 {
		tail := t.newNode(t.nodes[id].off+size, rest, true)
		t.linkAfter(tail, id)
		t.nodes[id].size = size
		t.insertFree(tail)
		t.freeRanges++
	}
	b := &t.nodes[id]
	b.free = false
	t.live.put(b.off, uint64(id))
	t.used += size
	t.liveBlocks++
	t.allocs++
	return Block{Offset: b.off, Size: size}, nil
}

// linkBefore inserts node id into the physical list just before next.
func (t *TLSF) linkBefore(id, next int32) {
	prev := t.nodes[next].prevPhys
	t.nodes[id].prevPhys, t.nodes[id].nextPhys = prev, next
	t.nodes[next].prevPhys = id
	if prev == nilID {
		t.first = id
	} else {
		t.nodes[prev].nextPhys = id
	}
}

// linkAfter inserts node id into the physical list just after prev.
func (t *TLSF) linkAfter(id, prev int32) {
	next := t.nodes[prev].nextPhys
	t.nodes[id].prevPhys, t.nodes[id].nextPhys = prev, next
	t.nodes[prev].nextPhys = id
	if next == nilID {
		t.last = id
	} else {
		t.nodes[next].prevPhys = id
	}
}

// unlink removes node id from the physical list and recycles it.
func (t *TLSF) unlink(id int32) {
	n := &t.nodes[id]
	if n.prevPhys == nilID {
		t.first = n.nextPhys
	} else {
		t.nodes[n.prevPhys].nextPhys = n.nextPhys
	}
	if n.nextPhys == nilID {
		t.last = n.prevPhys
	} else {
		t.nodes[n.nextPhys].prevPhys = n.prevPhys
	}
	t.spare = append(t.spare, id)
}

// Free releases the live block at offset and merges it with free
// neighbours. An offset that does not start a live block returns an error
// wrapping ErrInvalidFree and changes nothing. Constant time.
func (t *TLSF) Free(offset uint64) error {
	v, ok := t.live.take(offset)
	if !ok {
		return invalidFree("tlsf", offset)
	}
	id := int32(v)
	n := &t.nodes[id]
	n.free = true
	t.used -= n.size
	t.liveBlocks--
	t.frees++
	t.freeRanges++
	if prev := n.prevPhys; prev != nilID && t.nodes[prev].free {
		t.removeFree(prev)
		t.nodes[prev].size += t.nodes[id].size
		t.unlink(id)
		id = prev
		t.freeRanges--
	}
	if next := t.nodes[id].nextPhys; next != nilID && t.nodes[next].free {
		t.removeFree(next)
		t.nodes[id].size += t.nodes[next].size
		t.unlink(next)
		t.freeRanges--
	}
	t.insertFree(id)
	return nil
}

// Grow extends the range to capacity bytes; the new space merges with a
// free range at the old end. Shrinking, or growing past MaxCapacity,
// returns ErrInvalidArgument.
func (t *TLSF) Grow(capacity uint64) error {
	more, err := checkGrow("tlsf", t.capacity, capacity)
	if !more {
		return err
	}
	delta := capacity - t.capacity
	t.capacity = capacity
	if t.last != nilID && t.nodes[t.last].free {
		t.removeFree(t.last)
		t.nodes[t.last].size += delta
		t.insertFree(t.last)
		return nil
	}
	id := t.newNode(capacity-delta, delta, true)
	if t.last == nilID {
		t.first, t.last = id, id
	} else {
		t.linkAfter(id, t.last)
	}
	t.insertFree(id)
	t.freeRanges++
	return nil
}

// Reset frees every block. The Allocs, Frees and Failures counts are kept.
func (t *TLSF) Reset() {
	t.nodes = t.nodes[:0]
	t.spare = t.spare[:0]
	t.flBitmap = 0
	t.slBitmap = [tlsfFLCount]uint32{}
	for fl := range t.heads {
		for sl := range t.heads[fl] {
			t.heads[fl][sl] = nilID
		}
	}
	t.live.clear()
	t.used, t.liveBlocks, t.freeRanges = 0, 0, 0
	t.first, t.last = nilID, nilID
	if t.capacity > 0 {
		id := t.newNode(0, t.capacity, true)
		t.first, t.last = id, id
		t.insertFree(id)
		t.freeRanges = 1
	}
}

// largestFree scans the highest non-empty class.
func (t *TLSF) largestFree() uint64 {
	if t.flBitmap == 0 {
		return 0
	}
	fl := log2(t.flBitmap)
	sl := bits.Len32(t.slBitmap[fl]) - 1
	if sl < 0 {
		return 0 // bitmaps disagree; checkInternal reports it
	}
	var largest uint64
	for id := t.heads[fl][sl]; id != nilID; id = t.nodes[id].nextFree {
		largest = max(largest, t.nodes[id].size)
	}
	return largest
}

// Stats returns the accounting. LargestFree scans one class list; the rest
// is constant time.
func (t *TLSF) Stats() Stats {
	return Stats{
		Capacity:    t.capacity,
		Used:        t.used,
		Free:        t.capacity - t.used,
		LargestFree: t.largestFree(),
		LiveBlocks:  t.liveBlocks,
		FreeRanges:  t.freeRanges,
		Allocs:      t.allocs,
		Frees:       t.frees,
		Failures:    t.failures,
		MaxAlloc:    MaxCapacity,
	}
}

// Walk reports every block and free range in offset order; free ranges
// are maximal.
func (t *TLSF) Walk(fn func(Segment) bool) {
	for id := t.first; id != nilID; id = t.nodes[id].nextPhys {
		n := &t.nodes[id]
		if !fn(Segment{Offset: n.off, Size: n.size, Free: n.free}) {
			return
		}
	}
}

func (t *TLSF) oom(size, align uint64) error {
	return &OOMError{Strategy: "tlsf", Requested: size, Align: align, Capacity: t.capacity,
		Free: t.capacity - t.used, LargestFree: t.largestFree()}
}

func (t *TLSF) walkCoalesced() bool    { return true }
func (t *TLSF) largestIsWalkMax() bool { return true }
func (t *TLSF) emptyFreeRanges() int   { return boolInt(t.capacity > 0) }

// checkInternal verifies the physical list, the free lists against the
// bitmaps, the live index and node recycling.
func (t *TLSF) checkInternal() error {
	nodesInUse := len(t.nodes) - len(t.spare)
	var physFree, physLive, seen int
	prev := int32(nilID)
	for id := t.first; id != nilID; id = t.nodes[id].nextPhys {
		if seen++; seen > nodesInUse {
			return fmt.Errorf("tlsf: physical list longer than the %d nodes in use (cycle?)", nodesInUse)
		}
		n := &t.nodes[id]
		if n.prevPhys != prev {
			return fmt.Errorf("tlsf: node at offset %d: prevPhys %d, want %d", n.off, n.prevPhys, prev)
		}
		if prev != nilID && t.nodes[prev].off+t.nodes[prev].size != n.off {
			return fmt.Errorf("tlsf: node at offset %d does not follow its physical predecessor", n.off)
		}
		if n.free {
			physFree++
			fl, sl := tlsfMapping(n.size)
			if t.flBitmap&(1<<fl) == 0 || t.slBitmap[fl]&(1<<sl) == 0 {
				return fmt.Errorf("tlsf: free node at offset %d (size %d): class (%d,%d) bit clear", n.off, n.size, fl, sl)
			}
		} else {
			physLive++
			if v, ok := t.live.get(n.off); !ok || int32(v) != id {
				return fmt.Errorf("tlsf: live node at offset %d missing from the offset index", n.off)
			}
		}
		prev = id
	}
	if prev != t.last {
		return fmt.Errorf("tlsf: last node is %d, physical list ends at %d", t.last, prev)
	}
	if seen != nodesInUse {
		return fmt.Errorf("tlsf: %d nodes in the physical list, %d in use (leak)", seen, nodesInUse)
	}
	if physLive != t.live.len() {
		return fmt.Errorf("tlsf: %d live nodes, offset index holds %d", physLive, t.live.len())
	}
	listed := 0
	for fl := 0; fl < tlsfFLCount; fl++ {
		if (t.flBitmap&(1<<fl) != 0) != (t.slBitmap[fl] != 0) {
			return fmt.Errorf("tlsf: first-level bit %d disagrees with its second-level bitmap %#x", fl, t.slBitmap[fl])
		}
		for m := t.slBitmap[fl]; m != 0; m &= m - 1 {
			sl := bits.TrailingZeros32(m)
			head := t.heads[fl][sl]
			if head == nilID {
				return fmt.Errorf("tlsf: class (%d,%d) bit set but list empty", fl, sl)
			}
			p := int32(nilID)
			for id := head; id != nilID; id = t.nodes[id].nextFree {
				if listed++; listed > physFree {
					return fmt.Errorf("tlsf: free lists hold more than the %d free nodes", physFree)
				}
				n := &t.nodes[id]
				if !n.free || n.prevFree != p {
					return fmt.Errorf("tlsf: class (%d,%d): node at offset %d is not free or badly linked", fl, sl, n.off)
				}
				if f, s := tlsfMapping(n.size); f != fl || s != sl {
					return fmt.Errorf("tlsf: node of size %d in class (%d,%d), belongs in (%d,%d)", n.size, fl, sl, f, s)
				}
				p = id
			}
		}
	}
	if listed != physFree {
		return fmt.Errorf("tlsf: free lists hold %d nodes, physical list has %d free", listed, physFree)
	}
	return nil
}
