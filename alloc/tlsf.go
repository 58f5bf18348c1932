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
	rangeList // blocks in address order; this type indexes the free ones
	classMap  // per class, the head of a doubly linked list of free ranges
}

// NewTLSF returns an empty TLSF allocator over [0, capacity); capacity is
// clamped to MaxCapacity (New reports that as an error instead).
func NewTLSF(capacity uint64) *TLSF {
	t := &TLSF{}
	t.rangeList = rangeList{name: "tlsf", capacity: min(capacity, MaxCapacity), idx: t}
	t.Reset()
	return t
}

// Name returns "tlsf".
func (t *TLSF) Name() string { return "tlsf" }

// tlsfMapping returns the class of a free block of the given size.
func tlsfMapping(size uint64) (fl, sl int) {
	if size < tlsfSLCount {
		return 0, int(size)
	}
	f := log2(size) // ≥ tlsfSLLog2 here
	return f - (tlsfSLLog2 - 1), int(size>>(uint(f-tlsfSLLog2)&63)) - tlsfSLCount
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
	// The size's own row, and the first non-empty row above it: which of
	// the two holds the class is a coin toss on sizes that vary, so both
	// are read and one is selected without a branch.
	slMap := t.slBitmap[fl&63] & (^uint32(0) << (uint(sl) & 31))
	up := t.flBitmap & (^uint64(0) << (uint(fl+1) & 63)) // fl+1 < 64
	upFl := bits.TrailingZeros64(up)                     // 64 when no row above
	upMap := t.slBitmap[upFl&63] & -uint32(b2u(up != 0))
	if slMap == 0 {
		fl, slMap = upFl, upMap
	}
	if slMap == 0 {
		return 0, 0, false
	}
	return fl, bits.TrailingZeros32(slMap), true
}

func (t *TLSF) insertFree(id int32) {
	n := &t.nodes[id]
	fl, sl := tlsfMapping(n.size)
	root := t.root(fl, sl)
	head := *root
	n.prevFree, n.nextFree, n.cls = nilID, head, classID(fl, sl)
	if head != nilID {
		t.nodes[head].prevFree = id
	}
	*root = id
	t.mark(fl, sl)
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
	*t.rootOf(n.cls) = n.nextFree
	if n.nextFree == nilID {
		t.unmark(splitClass(n.cls))
	}
}

// WalkFree calls fn for each free range of at least min bytes, by size
// class (smallest first), until fn returns false. It visits only those
// ranges, not the blocks.
func (t *TLSF) WalkFree(min uint64, fn func(Segment) bool) {
	fl, sl := tlsfMapping(max(min, 1))
	if fl >= tlsfFLCount {
		return
	}
	ok := t.slBitmap[fl]&(1<<sl) != 0
	for {
		for id := *t.root(fl, sl); ok && id != nilID; id = t.nodes[id].nextFree {
			if n := &t.nodes[id]; n.size >= min && !fn(Segment{Offset: n.off, Size: n.size, Free: true}) {
				return
			}
		}
		if fl, sl, ok = t.above(fl, sl); !ok {
			return
		}
	}
}

func (t *TLSF) fits(id int32, size, align uint64) bool {
	n := &t.nodes[id]
	return alignUp(n.off, align)-n.off+size <= n.size
}

// find returns a free block that can hold size bytes at the alignment, or
// nilID.
func (t *TLSF) find(size, align uint64) int32 {
	if fl, sl, ok := t.findClass(size); ok {
		if id := *t.root(fl, sl); t.fits(id, size, align) {
			return id
		}
	}
	worst := size + align - 1 // any block this large fits at any alignment
	if align > 1 && worst <= t.capacity {
		if fl, sl, ok := t.findClass(worst); ok {
			return *t.root(fl, sl)
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
			for id := *t.root(fl, sl); id != nilID; id = t.nodes[id].nextFree {
				if t.fits(id, size, align) {
					return id
				}
			}
		}
	}
	return nilID
}

// resetIndex empties the class lists.
func (t *TLSF) resetIndex() { t.reset() }

// largestFree scans the highest non-empty class.
func (t *TLSF) largestFree() uint64 {
	fl, sl, ok := t.highest()
	if !ok {
		return 0
	}
	var largest uint64
	for id := *t.root(fl, sl); id != nilID; id = t.nodes[id].nextFree {
		largest = max(largest, t.nodes[id].size)
	}
	return largest
}

// checkInternal verifies the physical list, the free lists against the
// bitmaps, the live index and node recycling.
func (t *TLSF) checkInternal() error {
	physFree, err := t.checkPhysical()
	if err != nil {
		return err
	}
	if err := t.check("tlsf"); err != nil {
		return err
	}
	listed := 0
	for fl := 0; fl < tlsfFLCount; fl++ {
		for m := t.slBitmap[fl]; m != 0; m &= m - 1 {
			sl := bits.TrailingZeros32(m)
			head := *t.root(fl, sl)
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
				if f, s := tlsfMapping(n.size); f != fl || s != sl || n.cls != classID(fl, sl) {
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
