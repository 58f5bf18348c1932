package alloc

import (
	"fmt"
)

// BestFit hands out the smallest free range that can hold a request and,
// among free ranges of that size, the one at the lowest offset; the block
// is placed at the lowest aligned offset of the range. Freed blocks merge
// with free neighbours immediately.
//
// Free ranges are ordered by (size, offset) in two levels: TLSF's size
// classes (found through bitmaps in constant time; a class spans at most
// 1/32 of its sizes) and, inside each class, a treap. The order is exact,
// so the choice is the true best fit, while each treap stays small: Alloc
// and Free take O(log k) expected time, k the number of free ranges in one
// class (O(log n) when all free ranges share a class). A hash table finds
// a live block from its offset and a doubly linked list in address order
// gives each block its physical neighbours.
//
// The zero value is not usable; call NewBestFit.
type BestFit struct {
	rangeList // blocks in address order; this type indexes the free ones
	classMap  // per class, the root of a treap of free ranges
	rng       uint64
	stack     []int32 // scratch for in-order iteration
}

// NewBestFit returns an empty best-fit allocator over [0, capacity);
// capacity is clamped to MaxCapacity (New reports that as an error).
func NewBestFit(capacity uint64) *BestFit {
	b := &BestFit{rng: 0x9E3779B9}
	b.rangeList = rangeList{name: "bestfit", capacity: min(capacity, MaxCapacity), idx: b, bf: b}
	b.Reset()
	return b
}

// Name returns "bestfit".
func (b *BestFit) Name() string { return "bestfit" }

// less orders free ranges by size, then offset.
func (b *BestFit) less(x, y int32) bool { return lessNode(&b.nodes[x], &b.nodes[y]) }

// lessNode is less on the nodes themselves.
func lessNode(x, y *rangeNode) bool {
	return x.size < y.size || x.size == y.size && x.off < y.off
}

// nextPrio returns a treap priority: the high half of a 64-bit linear
// congruential step (Knuth's MMIX constants), one multiply and add,
// cheaper than a shift generator on the path every free range takes.
func (b *BestFit) nextPrio() uint32 {
	b.rng = b.rng*6364136223846793005 + 1442695040888963407
	return uint32(b.rng >> 32)
}

// insert adds free node id to the treap of its class. (It and
// removeFree index a local copy of the node slice, which neither grows:
// through b, every access would load the slice again.)
func (b *BestFit) insertFree(id int32) {
	nodes := b.nodes
	n := &nodes[id]
	fl, sl := tlsfMapping(n.size)
	b.mark(fl, sl)
	cls := classID(fl, sl)
	n.cls = cls
	link := b.rootOf(cls)
	if *link == nilID {
		// Most classes hold one range: it needs no priority (any keeps
		// the heap order of a treap of one) until a second one comes.
		n.left, n.right = nilID, nilID
		*link = id
		return
	}
	prio := b.nextPrio()
	n.prio = prio
	for *link != nilID && nodes[*link].prio >= prio {
		if c := &nodes[*link]; lessNode(n, c) {
			link = &c.left
		} else {
			link = &c.right
		}
	}
	// Split the subtree at *link around id's key; id becomes its root.
	cur := *link
	l, r := &n.left, &n.right
	for cur != nilID {
		c := &nodes[cur]
		if lessNode(c, n) {
			*l = cur
			l = &c.right
			cur = c.right
		} else {
			*r = cur
			r = &c.left
			cur = c.left
		}
	}
	*l, *r = nilID, nilID
	*link = id
}

// remove deletes free node id from the treap of its class.
func (b *BestFit) removeFree(id int32) {
	nodes := b.nodes
	n := &nodes[id]
	root := b.rootOf(n.cls)
	link := root
	for *link != id {
		if c := &nodes[*link]; lessNode(n, c) {
			link = &c.left
		} else {
			link = &c.right
		}
	}
	// Merge id's subtrees in its place.
	x, y := n.left, n.right
	for x != nilID && y != nilID {
		if nx, ny := &nodes[x], &nodes[y]; nx.prio >= ny.prio {
			*link = x
			link = &nx.right
			x = nx.right
		} else {
			*link = y
			link = &ny.left
			y = ny.left
		}
	}
	if x != nilID {
		*link = x
	} else {
		*link = y
	}
	if *root == nilID {
		b.unmark(splitClass(n.cls))
	}
}

// find returns the first free range in (size, offset) order that can hold
// size bytes at the alignment, or nilID: in the size's own class, whose
// ranges may be smaller than size, else in the classes above it in order,
// whose ranges all hold size bytes (so the first range of the next
// non-empty class fits unless the alignment does not).
func (b *BestFit) find(size, align uint64) int32 {
	id, _ := b.findOff(size, align)
	return id
}

// Find returns where AllocHandle(size, align) would place a block now,
// placing nothing: ok is false where AllocHandle would fail (f is then
// no place: AllocFit refuses it). It changes nothing, not the Failures
// count either; AllocFit takes the place. (The work is findOff's, so
// that Find is inlined into its caller.)
func (b *BestFit) Find(size, align uint64) (f Fit, ok bool) {
	id, off := b.findOff(size, align)
	return Fit{Offset: off, size: size, node: id}, id != nilID
}

// findOff is Find's work: it returns find's range and the block's offset
// in it (the node is at hand here), or nilID for a request Find refuses.
func (b *BestFit) findOff(size, align uint64) (int32, uint64) {
	// checkRequest, inline: this runs on every allocation.
	if size-1 >= MaxCapacity || align&(align-1) != 0 || size > b.capacity-b.used {
		return nilID, 0
	}
	align = max(align, 1)
	fl, sl := tlsfMapping(size)
	if fl >= tlsfFLCount {
		return nilID, 0
	}
	root := *b.root(fl, sl)
	for {
		if root != nilID {
			// A class of one range, the usual case, is looked at here
			// rather than through findIn's call.
			if n := &b.nodes[root]; n.left == nilID && n.right == nilID {
				if n.size >= size && alignUp(n.off, align)-n.off+size <= n.size {
					return root, alignUp(n.off, align)
				}
			} else if id := b.findIn(root, size, align); id != nilID {
				return id, alignUp(b.nodes[id].off, align)
			}
		}
		var ok bool
		if fl, sl, ok = b.above(fl, sl); !ok {
			return nilID, 0
		}
		root = *b.root(fl, sl)
	}
}

// findIn returns the first range of one treap, in (size, offset) order,
// that can hold size bytes at the alignment, or nilID.
func (b *BestFit) findIn(root int32, size, align uint64) int32 {
	// Usually the smallest range of at least size bytes fits.
	lower := int32(nilID)
	for cur := root; cur != nilID; {
		if n := &b.nodes[cur]; n.size >= size {
			lower, cur = cur, n.left
		} else {
			cur = n.right
		}
	}
	if lower == nilID {
		return nilID
	}
	if n := &b.nodes[lower]; alignUp(n.off, align)-n.off+size <= n.size {
		return lower
	}
	// Descend to the smallest range of at least size bytes, stacking the
	// nodes where the search went left: they are its in-order successors.
	stack := b.stack[:0]
	for cur := root; cur != nilID; {
		if b.nodes[cur].size >= size {
			stack = append(stack, cur)
			cur = b.nodes[cur].left
		} else {
			cur = b.nodes[cur].right
		}
	}
	found := int32(nilID)
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		n := &b.nodes[id]
		if alignUp(n.off, align)-n.off+size <= n.size {
			found = id
			break
		}
		for c := n.right; c != nilID; c = b.nodes[c].left {
			stack = append(stack, c)
		}
	}
	b.stack = stack
	return found
}

// FitIn returns the Fit of a block of size bytes at offset in the free
// range free, as Walk or WalkFree reported it with no change to the
// allocator since, for AllocFit: AllocHandleAt's block, found through
// the free ranges' index instead of the blocks in address order. ok is
// false when free is not one of the free ranges or does not hold the
// block.
func (b *BestFit) FitIn(free Segment, offset, size uint64) (f Fit, ok bool) {
	if size == 0 || offset < free.Offset || offset-free.Offset > free.Size || size > free.Size-(offset-free.Offset) {
		return Fit{}, false
	}
	fl, sl := tlsfMapping(free.Size)
	if fl >= tlsfFLCount {
		return Fit{}, false
	}
	key := rangeNode{off: free.Offset, size: free.Size}
	for cur := *b.root(fl, sl); cur != nilID; {
		n := &b.nodes[cur]
		switch {
		case n.off == key.off && n.size == key.size:
			return Fit{Offset: offset, size: size, node: cur}, n.free
		case lessNode(&key, n):
			cur = n.left
		default:
			cur = n.right
		}
	}
	return Fit{}, false
}

// WalkFree calls fn for each free range of at least min bytes, smallest
// first (ties by offset), until fn returns false. It visits only those
// ranges (through the size classes), not the blocks.
func (b *BestFit) WalkFree(min uint64, fn func(Segment) bool) {
	fl, sl := tlsfMapping(max(min, 1))
	if fl >= tlsfFLCount {
		return
	}
	ok := b.slBitmap[fl]&(1<<sl) != 0
	for {
		if ok {
			// Most classes hold one range: it is visited without
			// walkTreap's call.
			root := *b.root(fl, sl)
			if n := &b.nodes[root]; n.left == nilID && n.right == nilID {
				if n.size >= min && !fn(Segment{Offset: n.off, Size: n.size, Free: true}) {
					return
				}
			} else if !b.walkTreap(root, min, fn) {
				return
			}
		}
		if fl, sl, ok = b.above(fl, sl); !ok {
			return
		}
	}
}

// walkTreap visits the ranges of one treap of at least min bytes in
// order; it returns false once fn did.
func (b *BestFit) walkTreap(id int32, min uint64, fn func(Segment) bool) bool {
	if id == nilID {
		return true
	}
	// Children that are not there are not called for: most treaps hold
	// one range.
	n := &b.nodes[id]
	if n.size >= min && n.left != nilID && !b.walkTreap(n.left, min, fn) {
		return false
	}
	if n.size >= min && !fn(Segment{Offset: n.off, Size: n.size, Free: true}) {
		return false
	}
	return n.right == nilID || b.walkTreap(n.right, min, fn)
}

// resetIndex empties the treaps.
func (b *BestFit) resetIndex() { b.reset() }

// largestFree returns the largest range of the highest non-empty class.
func (b *BestFit) largestFree() uint64 {
	fl, sl, ok := b.highest()
	if !ok {
		return 0
	}
	id := *b.root(fl, sl)
	for id != nilID && b.nodes[id].right != nilID {
		id = b.nodes[id].right
	}
	if id == nilID {
		return 0
	}
	return b.nodes[id].size
}

// checkInternal verifies the physical list, the live index, the class
// bitmaps, and that the treaps hold exactly the free ranges, each in its
// class, in strict (size, offset) order with the heap property.
func (b *BestFit) checkInternal() error {
	physFree, err := b.checkPhysical()
	if err != nil {
		return err
	}
	if err := b.check("bestfit"); err != nil {
		return err
	}
	inUse := len(b.nodes) - b.nSpare
	// In-order traversal of every class's treap.
	count := 0
	var stack []int32
	for fl := 0; fl < tlsfFLCount; fl++ {
		for sl := 0; sl < tlsfSLCount; sl++ {
			root := *b.root(fl, sl)
			last := int32(nilID)
			cur := root
			for cur != nilID || len(stack) > 0 {
				for cur != nilID {
					if len(stack) > inUse {
						return fmt.Errorf("bestfit: treap deeper than the %d nodes in use (cycle?)", inUse)
					}
					stack = append(stack, cur)
					cur = b.nodes[cur].left
				}
				id := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				n := &b.nodes[id]
				if count++; count > physFree {
					return fmt.Errorf("bestfit: treaps hold more than the %d free ranges", physFree)
				}
				if !n.free {
					return fmt.Errorf("bestfit: treap holds live block at offset %d", n.off)
				}
				if f, s := tlsfMapping(n.size); f != fl || s != sl || n.cls != classID(fl, sl) {
					return fmt.Errorf("bestfit: range of %d bytes in class (%d,%d), belongs in (%d,%d)", n.size, fl, sl, f, s)
				}
				if last != nilID && !b.less(last, id) {
					return fmt.Errorf("bestfit: treap out of order: (%d,%d) before (%d,%d)",
						b.nodes[last].size, b.nodes[last].off, n.size, n.off)
				}
				for _, c := range [2]int32{n.left, n.right} {
					if c != nilID && b.nodes[c].prio > n.prio {
						return fmt.Errorf("bestfit: treap heap order broken below offset %d", n.off)
					}
				}
				last = id
				cur = n.right
			}
		}
	}
	if count != physFree {
		return fmt.Errorf("bestfit: treaps hold %d ranges, physical list has %d free", count, physFree)
	}
	return nil
}
