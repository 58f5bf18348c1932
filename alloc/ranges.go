package alloc

import "fmt"

// rangeList is the machinery TLSF and BestFit share: blocks and free ranges
// as nodes in address order (the physical list), a free range split on
// allocation and merged with free neighbours on free, a hash index from the
// offset of each live block to its node, and the accounting. How free
// ranges are found — TLSF's segregated lists, best fit's treaps — is the
// strategy's, behind freeIndex.
type rangeList struct {
	name     string
	capacity uint64
	nodes    []rangeNode
	// spareHead heads the recycled nodes, linked through nextPhys (a
	// push and a pop are two stores, not an append); nSpare counts them.
	spareHead   int32
	nSpare      int
	first, last int32 // physical list ends (nilID when capacity is 0)
	live        offsetMap

	used       uint64
	liveBlocks int
	freeRanges int
	allocs     uint64
	frees      uint64
	failures   uint64

	idx freeIndex
	// bf is idx when the strategy is best fit (else nil): the calls
	// through it are direct, which the central path of a pool feels
	// (a few of them on every allocation and free). The choice between
	// bf and idx is written out at each call: a method holding both
	// calls is past the inliner's budget and would cost a call again.
	bf *BestFit
}

// rangeNode is one block or free range. prevFree/nextFree are TLSF's list
// links; left/right/prio are best fit's treap fields.
type rangeNode struct {
	off, size          uint64
	prevPhys, nextPhys int32
	prevFree, nextFree int32
	left, right        int32
	prio               uint32
	cls                uint16 // a free node's class (classID), set by the index's insertFree
	free               bool
	byHandle           bool // live, allocated by AllocHandle: not in the offset index
	// 64 bytes a node: an index is a shift, not a multiply, and a node
	// of a large (page-aligned) slice lies in one cache line.
	_ [16]byte
}

// freeIndex finds free ranges. insertFree and removeFree keep it in step
// with the free nodes; find returns a free node that holds size bytes at
// the alignment (or nilID); largestFree the size of the largest free range;
// resetIndex empties it.
type freeIndex interface {
	insertFree(id int32)
	removeFree(id int32)
	find(size, align uint64) int32
	largestFree() uint64
	resetIndex()
}

// Capacity returns the size of the managed range.
func (r *rangeList) Capacity() uint64 { return r.capacity }

func (r *rangeList) newNode(off, size uint64, free bool) int32 {
	if r.nSpare > 0 {
		id := r.spareNode(off, size)
		r.nodes[id].free = free
		return id
	}
	id := r.appendNode()
	n := &r.nodes[id]
	n.off, n.size, n.free = off, size, free
	return id
}

// appendNode appends a node in no list to the slice and returns its id.
func (r *rangeList) appendNode() int32 {
	r.nodes = append(r.nodes, rangeNode{prevPhys: nilID, nextPhys: nilID, prevFree: nilID, nextFree: nilID, left: nilID, right: nilID})
	return int32(len(r.nodes) - 1)
}

// spareNode is newNode for a free node when a spare one is sure to be
// there (take makes sure of two): inlined, no slice to grow, and the
// nodes stay where they are.
func (r *rangeList) spareNode(off, size uint64) int32 {
	id := r.spareHead
	n := &r.nodes[id]
	r.spareHead, r.nSpare = n.nextPhys, r.nSpare-1
	n.off, n.size, n.free, n.byHandle = off, size, true, false
	n.prevPhys, n.nextPhys, n.prevFree, n.nextFree, n.left, n.right = nilID, nilID, nilID, nilID, nilID, nilID
	return id
}

// growSpare adds two nodes to the slice, spare (in no list).
func (r *rangeList) growSpare() {
	for range 2 {
		id := r.appendNode()
		r.nodes[id].nextPhys, r.spareHead = r.spareHead, id
		r.nSpare++
	}
}

// Alloc returns a block of exactly size bytes at the alignment, carved from
// the front of the free range the index finds (alignment padding stays
// free). Errors: ErrInvalidArgument (size 0, alignment not a power of two),
// ErrTooLarge (size above MaxCapacity), *OOMError (nothing fits).
func (r *rangeList) Alloc(size, align uint64) (Block, error) {
	id, err := r.allocNode(size, align)
	if err != nil {
		return Block{}, err
	}
	b := &r.nodes[id]
	r.live.put(b.off, uint64(id))
	return Block{Offset: b.off, Size: size}, nil
}

// AllocHandle is Alloc, also returning the block's handle for FreeHandle.
// The block is not entered in the offset index: only FreeHandle frees it.
func (r *rangeList) AllocHandle(size, align uint64) (Block, Handle, error) {
	id, err := r.allocNode(size, align)
	if err != nil {
		return Block{}, 0, err
	}
	b := &r.nodes[id]
	b.byHandle = true
	return Block{Offset: b.off, Size: size}, Handle(id), nil
}

// allocNode carves a live node of size bytes and returns its id.
func (r *rangeList) allocNode(size, align uint64) (int32, error) {
	f, ok := r.Find(size, align)
	if !ok {
		r.failures++
		if size-1 >= MaxCapacity || align&(align-1) != 0 {
			return nilID, requestError(r.name, size, align, MaxCapacity)
		}
		return nilID, r.oom(size, max(align, 1))
	}
	r.take(f, false) // f is Find's: no error
	return f.node, nil
}

// A Fit is the place Find chose for a block: its offset, and the free
// range that holds it.
type Fit struct {
	Offset uint64 // where the block starts
	size   uint64
	node   int32
}

// Find returns where AllocHandle(size, align) would place a block now,
// placing nothing: ok is false where AllocHandle would fail. It changes
// nothing, not the Failures count either. A caller that looks at the
// place before taking it (AllocFit) saves the allocation and free of a
// place it would refuse.
func (r *rangeList) Find(size, align uint64) (f Fit, ok bool) {
	if r.bf != nil {
		return r.bf.Find(size, align)
	}
	// checkRequest, inline: this runs on every allocation.
	if size-1 >= MaxCapacity || align&(align-1) != 0 || size > r.capacity-r.used {
		return Fit{}, false
	}
	align = max(align, 1)
	id := r.idx.find(size, align)
	if id == nilID {
		return Fit{}, false
	}
	return Fit{Offset: alignUp(r.nodes[id].off, align), size: size, node: id}, true
}

// AllocFit allocates the block of Fit f, as AllocHandle would have when
// Find returned f. f must come from Find with no change to the allocator
// since: a Fit whose range is no longer free there returns an error
// wrapping ErrInvalidArgument and changes nothing.
func (r *rangeList) AllocFit(f Fit) (Block, Handle, error) {
	return r.take(f, true)
}

// AllocHandleAt is AllocHandle at an offset the caller chose: it carves
// exactly [offset, offset+size) out of the free range that holds it (the
// bytes around it stay free). It returns an error wrapping ErrOutOfMemory
// when that range is not all free or lies past the capacity,
// ErrInvalidArgument for size 0 and ErrTooLarge above MaxCapacity; a
// failure changes nothing but the Failures count. It finds the range by walking the blocks in address
// order (O(blocks)): it is meant for callers that choose a placement
// rarely, where the alternative costs far more (a device call).
func (r *rangeList) AllocHandleAt(offset, size uint64) (Block, Handle, error) {
	if _, err := checkRequest(r.name, size, 1, MaxCapacity); err != nil {
		r.failures++
		return Block{}, 0, err
	}
	id := int32(nilID)
	if offset < r.capacity && size <= r.capacity-offset {
		for cur := r.first; cur != nilID; cur = r.nodes[cur].nextPhys {
			if n := &r.nodes[cur]; n.off+n.size > offset {
				if n.free && offset+size <= n.off+n.size {
					id = cur
				}
				break
			}
		}
	}
	if id == nilID {
		r.failures++
		return Block{}, 0, fmt.Errorf("%s: [%d, %d) is not free: %w", r.name, offset, offset+size, ErrOutOfMemory)
	}
	return r.take(Fit{Offset: offset, size: size, node: id}, true) // [offset, offset+size) lies in free node id: no error
}

// take turns the free node of Fit f into the live node of its block,
// allocated by handle or not (byHandle), leaving free nodes for the bytes
// before and after, and returns the block and its handle. A Fit whose
// block does not lie in a free node returns an error wrapping
// ErrInvalidArgument and changes nothing. (AllocFit, inlined into its
// caller, is a call to take.)
func (r *rangeList) take(f Fit, byHandle bool) (Block, Handle, error) {
	id, start, size := f.node, f.Offset, f.size
	if id < 0 || int(id) >= len(r.nodes) {
		return Block{}, 0, fmt.Errorf("%s: stale fit at offset %d: %w", r.name, start, ErrInvalidArgument)
	}
	// [start, start+size) within the free node: an offset below it wraps
	// around, a size of 0 too.
	if n := &r.nodes[id]; !n.free || size-1 >= n.size || start-n.off > n.size-size {
		return Block{}, 0, fmt.Errorf("%s: stale fit at offset %d: %w", r.name, start, ErrInvalidArgument)
	}
	if r.nSpare < 2 { // the two nodes the bytes around the block may need
		r.growSpare()
	}
	if r.bf != nil {
		r.bf.removeFree(id)
	} else {
		r.idx.removeFree(id)
	}
	r.freeRanges--
	n := &r.nodes[id]
	if off := n.off; start > off {
		pad := r.spareNode(off, start-off)
		r.linkBefore(pad, id)
		n.off, n.size = start, n.size-(start-off)
		if r.bf != nil {
			r.bf.insertFree(pad)
		} else {
			r.idx.insertFree(pad)
		}
		r.freeRanges++
	}
	if rest := n.size - size; rest > 0 {
		tail := r.spareNode(n.off+size, rest)
		r.linkAfter(tail, id)
		n.size = size
		if r.bf != nil {
			r.bf.insertFree(tail)
		} else {
			r.idx.insertFree(tail)
		}
		r.freeRanges++
	}
	n.free, n.byHandle = false, byHandle
	r.used += size
	r.liveBlocks++
	r.allocs++
	return Block{Offset: start, Size: size}, Handle(id), nil
}

// linkBefore inserts node id into the physical list just before next.
func (r *rangeList) linkBefore(id, next int32) {
	nodes := r.nodes
	prev := nodes[next].prevPhys
	nodes[id].prevPhys, nodes[id].nextPhys = prev, next
	nodes[next].prevPhys = id
	if prev == nilID {
		r.first = id
	} else {
		nodes[prev].nextPhys = id
	}
}

// linkAfter inserts node id into the physical list just after prev.
func (r *rangeList) linkAfter(id, prev int32) {
	nodes := r.nodes
	next := nodes[prev].nextPhys
	nodes[id].prevPhys, nodes[id].nextPhys = prev, next
	nodes[prev].nextPhys = id
	if next == nilID {
		r.last = id
	} else {
		nodes[next].prevPhys = id
	}
}

// unlink removes node id from the physical list and recycles it.
func (r *rangeList) unlink(id int32) {
	nodes := r.nodes
	n := &nodes[id]
	if n.prevPhys == nilID {
		r.first = n.nextPhys
	} else {
		nodes[n.prevPhys].nextPhys = n.nextPhys
	}
	if n.nextPhys == nilID {
		r.last = n.prevPhys
	} else {
		nodes[n.nextPhys].prevPhys = n.prevPhys
	}
	n.nextPhys, r.spareHead = r.spareHead, id
	r.nSpare++
}

// Free releases the live block at offset and merges it with free
// neighbours. An offset that does not start a live block returns an error
// wrapping ErrInvalidFree and changes nothing.
func (r *rangeList) Free(offset uint64) error {
	v, ok := r.live.take(offset)
	if !ok {
		return invalidFree(r.name, offset)
	}
	_, err := r.freeAt(int32(v), offset, false) // the offset index holds only such blocks: no error
	return err
}

// FreeHandle frees the block AllocHandle returned with h at offset and
// returns the maximal free range that now holds it. A handle that is not a
// live block from AllocHandle at that offset returns an error wrapping
// ErrInvalidFree and changes nothing.
func (r *rangeList) FreeHandle(h Handle, offset uint64) (Segment, error) {
	id, err := r.freeAt(int32(h), offset, true)
	if err != nil {
		return Segment{}, err
	}
	n := &r.nodes[id]
	return Segment{Offset: n.off, Size: n.size, Free: true}, nil
}

// FreeByHandle is FreeHandle for a caller that needs no merged range: the
// same checks and errors, the same free, a little less work (it is
// inlined into its caller).
func (r *rangeList) FreeByHandle(h Handle, offset uint64) error {
	_, err := r.freeAt(int32(h), offset, true)
	return err
}

// freeAt frees live node id, the block at offset allocated by handle or
// not (byHandle), merges it with its free neighbours and returns the id of
// the merged free node; where id is no such block it returns an error
// wrapping ErrInvalidFree and changes nothing. (The index and unlink leave
// the node slice where it is.)
func (r *rangeList) freeAt(id int32, offset uint64, byHandle bool) (int32, error) {
	if id < 0 || int(id) >= len(r.nodes) {
		return nilID, invalidFree(r.name, offset)
	}
	nodes := r.nodes
	n := &nodes[id]
	if n.free || n.byHandle != byHandle || n.off != offset {
		return nilID, invalidFree(r.name, offset)
	}
	n.free, n.byHandle = true, false
	r.used -= n.size
	r.liveBlocks--
	r.frees++
	r.freeRanges++
	if prev := n.prevPhys; prev != nilID {
		if pn := &nodes[prev]; pn.free {
			if r.bf != nil {
				r.bf.removeFree(prev)
			} else {
				r.idx.removeFree(prev)
			}
			pn.size += n.size
			r.unlink(id)
			id, n = prev, pn
			r.freeRanges--
		}
	}
	if next := n.nextPhys; next != nilID {
		if nn := &nodes[next]; nn.free {
			if r.bf != nil {
				r.bf.removeFree(next)
			} else {
				r.idx.removeFree(next)
			}
			n.size += nn.size
			r.unlink(next)
			r.freeRanges--
		}
	}
	if r.bf != nil {
		r.bf.insertFree(id)
	} else {
		r.idx.insertFree(id)
	}
	return id, nil
}

// Grow extends the range to capacity bytes; the new space merges with a
// free range at the old end. Shrinking, or growing past MaxCapacity,
// returns ErrInvalidArgument.
func (r *rangeList) Grow(capacity uint64) error {
	more, err := checkGrow(r.name, r.capacity, capacity)
	if !more {
		return err
	}
	delta := capacity - r.capacity
	r.capacity = capacity
	if r.last != nilID && r.nodes[r.last].free {
		r.idx.removeFree(r.last)
		r.nodes[r.last].size += delta
		r.idx.insertFree(r.last)
		return nil
	}
	id := r.newNode(capacity-delta, delta, true)
	if r.last == nilID {
		r.first, r.last = id, id
	} else {
		r.linkAfter(id, r.last)
	}
	r.idx.insertFree(id)
	r.freeRanges++
	return nil
}

// Reset frees every block. The Allocs, Frees and Failures counts are kept.
func (r *rangeList) Reset() {
	r.nodes = r.nodes[:0]
	r.spareHead, r.nSpare = nilID, 0
	r.idx.resetIndex()
	r.live.clear()
	r.used, r.liveBlocks, r.freeRanges = 0, 0, 0
	r.first, r.last = nilID, nilID
	if r.capacity > 0 {
		id := r.newNode(0, r.capacity, true)
		r.first, r.last = id, id
		r.idx.insertFree(id)
		r.freeRanges = 1
	}
}

// Stats returns the accounting; LargestFree is the index's.
func (r *rangeList) Stats() Stats {
	return Stats{
		Capacity:    r.capacity,
		Used:        r.used,
		Free:        r.capacity - r.used,
		LargestFree: r.idx.largestFree(),
		LiveBlocks:  r.liveBlocks,
		FreeRanges:  r.freeRanges,
		Allocs:      r.allocs,
		Frees:       r.frees,
		Failures:    r.failures,
		MaxAlloc:    MaxCapacity,
	}
}

// Walk reports every block and free range in offset order; free ranges
// are maximal.
func (r *rangeList) Walk(fn func(Segment) bool) {
	for id := r.first; id != nilID; id = r.nodes[id].nextPhys {
		n := &r.nodes[id]
		if !fn(Segment{Offset: n.off, Size: n.size, Free: n.free}) {
			return
		}
	}
}

func (r *rangeList) oom(size, align uint64) error {
	return &OOMError{Strategy: r.name, Requested: size, Align: align, Capacity: r.capacity,
		Free: r.capacity - r.used, LargestFree: r.idx.largestFree()}
}

func (r *rangeList) walkCoalesced() bool    { return true }
func (r *rangeList) largestIsWalkMax() bool { return true }
func (r *rangeList) emptyFreeRanges() int   { return boolInt(r.capacity > 0) }

// checkPhysical verifies the physical list (links, contiguity, ends, no
// leaked or cyclic nodes) and the live index, and returns the number of
// free nodes for the strategy to compare with its index.
func (r *rangeList) checkPhysical() (free int, err error) {
	inUse := len(r.nodes) - r.nSpare
	spares := 0
	for id := r.spareHead; id != nilID; id = r.nodes[id].nextPhys {
		if spares++; spares > r.nSpare {
			return 0, fmt.Errorf("%s: spare list longer than its count %d (cycle?)", r.name, r.nSpare)
		}
	}
	if spares != r.nSpare {
		return 0, fmt.Errorf("%s: spare list holds %d nodes, counted %d", r.name, spares, r.nSpare)
	}
	var seen, live, handled int
	prev := int32(nilID)
	for id := r.first; id != nilID; id = r.nodes[id].nextPhys {
		if seen++; seen > inUse {
			return 0, fmt.Errorf("%s: physical list longer than the %d nodes in use (cycle?)", r.name, inUse)
		}
		n := &r.nodes[id]
		if n.prevPhys != prev {
			return 0, fmt.Errorf("%s: node at offset %d: prevPhys %d, want %d", r.name, n.off, n.prevPhys, prev)
		}
		if prev != nilID && r.nodes[prev].off+r.nodes[prev].size != n.off {
			return 0, fmt.Errorf("%s: node at offset %d does not follow its physical predecessor", r.name, n.off)
		}
		if n.free {
			free++
		} else if n.byHandle {
			live++
			handled++
			if _, ok := r.live.get(n.off); ok {
				return 0, fmt.Errorf("%s: block at offset %d allocated by handle is in the offset index", r.name, n.off)
			}
		} else {
			live++
			if v, ok := r.live.get(n.off); !ok || int32(v) != id {
				return 0, fmt.Errorf("%s: live node at offset %d missing from the offset index", r.name, n.off)
			}
		}
		prev = id
	}
	if prev != r.last {
		return 0, fmt.Errorf("%s: last node is %d, physical list ends at %d", r.name, r.last, prev)
	}
	if seen != inUse {
		return 0, fmt.Errorf("%s: %d nodes in the physical list, %d in use (leak)", r.name, seen, inUse)
	}
	if live-handled != r.live.len() {
		return 0, fmt.Errorf("%s: %d live nodes (%d by handle), offset index holds %d", r.name, live, handled, r.live.len())
	}
	return free, nil
}
