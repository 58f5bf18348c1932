package alloc

import (
	"fmt"
	"math/bits"
)

// BuddyMinBlock is the smallest block the buddy allocator hands out.
const BuddyMinBlock = 256

const (
	buddyMinLog2 = 8                                          // log2(BuddyMinBlock)
	buddyOrders  = 62 - buddyMinLog2 + 1                      // blocks of 256 B << 0..54
	buddyMaxSize = uint64(BuddyMinBlock) << (buddyOrders - 1) // = MaxCapacity
)

// Buddy is a binary buddy allocator: every block is BuddyMinBlock << k
// bytes for some order k, aligned to its own size, and a freed block
// merges with its buddy (the other half of its parent) whenever that is
// free too. Alloc and Free take O(orders) time and free space never
// fragments into pieces smaller than the blocks that were freed; the cost
// is internal waste of up to half of each block (a 257 B request takes
// 512 B).
//
// The capacity is rounded down to a multiple of BuddyMinBlock. It need not
// be a power of two: the space is split into the fewest aligned
// power-of-two blocks (e.g. 3 GiB is a 2 GiB block and a 1 GiB block), and
// blocks whose buddy would reach past the capacity never merge. That also
// makes Grow cheap: the new space joins as more blocks, merging with free
// buddies. Walk reports each free block separately (adjacent free blocks
// that are not buddies cannot merge), and FreeRanges counts free blocks.
//
// The zero value is not usable; call NewBuddy.
type Buddy struct {
	capacity  uint64
	nodes     []buddyNode
	spare     []int32
	heads     [buddyOrders]int32 // free lists per order
	orderMask uint64             // bit k set when heads[k] is not empty
	index     offsetMap          // offset of every block, free or live -> node id

	used       uint64
	liveBlocks int
	freeBlocks int
	allocs     uint64
	frees      uint64
	failures   uint64
}

type buddyNode struct {
	off        uint64
	prev, next int32 // free list links
	order      uint8
	free       bool
}

// NewBuddy returns an empty buddy allocator over [0, capacity) with
// capacity rounded down to a multiple of BuddyMinBlock and clamped to
// MaxCapacity.
func NewBuddy(capacity uint64) *Buddy {
	b := &Buddy{capacity: min(capacity, MaxCapacity) &^ (BuddyMinBlock - 1)}
	b.Reset()
	return b
}

// Name returns "buddy".
func (b *Buddy) Name() string { return "buddy" }

// Capacity returns the size of the managed range (a multiple of
// BuddyMinBlock).
func (b *Buddy) Capacity() uint64 { return b.capacity }

func blockSize(order uint8) uint64 { return BuddyMinBlock << order }

// buddyOrder returns the smallest order whose blocks hold n bytes.
func buddyOrder(n uint64) int {
	if n <= BuddyMinBlock {
		return 0
	}
	return bits.Len64(n-1) - buddyMinLog2
}

func (b *Buddy) newNode(off uint64, order uint8, free bool) int32 {
	n := buddyNode{off: off, order: order, free: free, prev: nilID, next: nilID}
	if k := len(b.spare); k > 0 {
		id := b.spare[k-1]
		b.spare = b.spare[:k-1]
		b.nodes[id] = n
		return id
	}
	b.nodes = append(b.nodes, n)
	return int32(len(b.nodes) - 1)
}

func (b *Buddy) push(id int32) {
	n := &b.nodes[id]
	head := b.heads[n.order]
	n.prev, n.next = nilID, head
	if head != nilID {
		b.nodes[head].prev = id
	}
	b.heads[n.order] = id
	b.orderMask |= 1 << n.order
}

func (b *Buddy) unlinkFree(id int32) {
	n := &b.nodes[id]
	if n.next != nilID {
		b.nodes[n.next].prev = n.prev
	}
	if n.prev != nilID {
		b.nodes[n.prev].next = n.next
		return
	}
	b.heads[n.order] = n.next
	if n.next == nilID {
		b.orderMask &^= 1 << n.order
	}
}

// release adds the free block [off, off+blockSize(order)) and merges it
// with free buddies of equal order as far as they go. The block must not
// be in the index.
func (b *Buddy) release(off uint64, order uint8, id int32) {
	for order < buddyOrders-1 {
		v, ok := b.index.get(off ^ blockSize(order))
		if !ok {
			break
		}
		bid := int32(v)
		bn := &b.nodes[bid]
		if !bn.free || bn.order != order {
			break
		}
		b.unlinkFree(bid)
		b.index.take(bn.off)
		b.spare = append(b.spare, bid)
		b.freeBlocks--
		off &^= blockSize(order)
		order++
	}
	if id == nilID {
		id = b.newNode(off, order, true)
	} else {
		b.nodes[id] = buddyNode{off: off, order: order, free: true}
	}
	b.index.put(off, uint64(id))
	b.push(id)
	b.freeBlocks++
}

// addRange adds [from, to) as free space, as the fewest aligned blocks.
func (b *Buddy) addRange(from, to uint64) {
	for x := from; x < to; {
		order := log2(to-x) - buddyMinLog2
		if x != 0 {
			order = min(order, bits.TrailingZeros64(x)-buddyMinLog2)
		}
		order = min(order, buddyOrders-1)
		b.release(x, uint8(order), nilID)
		x += blockSize(uint8(order))
	}
}

// Alloc returns a block of BuddyMinBlock << k bytes, the smallest that
// holds size bytes and, when align exceeds that, the alignment (blocks are
// aligned to their own size). Errors: ErrInvalidArgument (size 0,
// alignment not a power of two), ErrTooLarge (size above MaxCapacity),
// *OOMError (no free block of the order needed or larger).
func (b *Buddy) Alloc(size, align uint64) (Block, error) {
	align, err := checkRequest("buddy", size, align, MaxCapacity)
	if err != nil {
		b.failures++
		return Block{}, err
	}
	want := buddyOrder(max(size, align))
	var avail uint64
	if want < buddyOrders {
		avail = b.orderMask >> want << want
	}
	if avail == 0 {
		b.failures++
		return Block{}, b.oom(size, align)
	}
	order := bits.TrailingZeros64(avail)
	id := b.heads[order]
	b.unlinkFree(id)
	b.freeBlocks--
	off := b.nodes[id].off
	// Split down, keeping the low half and freeing the high halves.
	for order > want {
		order--
		half := b.newNode(off+blockSize(uint8(order)), uint8(order), true)
		b.index.put(b.nodes[half].off, uint64(half))
		b.push(half)
		b.freeBlocks++
	}
	n := &b.nodes[id]
	n.order, n.free = uint8(order), false
	b.used += blockSize(n.order)
	b.liveBlocks++
	b.allocs++
	return Block{Offset: off, Size: blockSize(n.order)}, nil
}

// Free releases the live block at offset and merges it with its buddies.
// An offset that does not start a live block returns an error wrapping
// ErrInvalidFree and changes nothing.
func (b *Buddy) Free(offset uint64) error {
	v, ok := b.index.get(offset)
	if !ok || b.nodes[v].free {
		return invalidFree("buddy", offset)
	}
	id := int32(v)
	b.index.take(offset)
	order := b.nodes[id].order
	b.used -= blockSize(order)
	b.liveBlocks--
	b.frees++
	b.release(offset, order, id)
	return nil
}

// Grow extends the range to capacity rounded down to a multiple of
// BuddyMinBlock; the new space merges with free buddies. Shrinking, or
// growing past MaxCapacity, returns ErrInvalidArgument.
func (b *Buddy) Grow(capacity uint64) error {
	more, err := checkGrow("buddy", b.capacity, capacity)
	if !more {
		return err
	}
	capacity &^= BuddyMinBlock - 1
	if capacity <= b.capacity {
		return nil
	}
	from := b.capacity
	b.capacity = capacity
	b.addRange(from, capacity)
	return nil
}

// Reset frees every block. The Allocs, Frees and Failures counts are kept.
func (b *Buddy) Reset() {
	b.nodes = b.nodes[:0]
	b.spare = b.spare[:0]
	b.index.clear()
	for k := range b.heads {
		b.heads[k] = nilID
	}
	b.orderMask = 0
	b.used, b.liveBlocks, b.freeBlocks = 0, 0, 0
	b.addRange(0, b.capacity)
}

func (b *Buddy) largestFree() uint64 {
	if b.orderMask == 0 {
		return 0
	}
	return blockSize(uint8(log2(b.orderMask)))
}

// Stats returns the accounting in constant time. FreeRanges counts free
// blocks; MaxAlloc is MaxCapacity.
func (b *Buddy) Stats() Stats {
	return Stats{
		Capacity:    b.capacity,
		Used:        b.used,
		Free:        b.capacity - b.used,
		LargestFree: b.largestFree(),
		LiveBlocks:  b.liveBlocks,
		FreeRanges:  b.freeBlocks,
		Allocs:      b.allocs,
		Frees:       b.frees,
		Failures:    b.failures,
		MaxAlloc:    buddyMaxSize,
	}
}

// Walk reports every block, free or live, in offset order; adjacent free
// blocks that are not buddies are reported separately.
func (b *Buddy) Walk(fn func(Segment) bool) {
	for x := uint64(0); x < b.capacity; {
		v, ok := b.index.get(x)
		if !ok {
			return // corrupt; Check reports the gap
		}
		n := &b.nodes[v]
		if !fn(Segment{Offset: x, Size: blockSize(n.order), Free: n.free}) {
			return
		}
		x += blockSize(n.order)
	}
}

func (b *Buddy) oom(size, align uint64) error {
	return &OOMError{Strategy: "buddy", Requested: size, Align: align, Capacity: b.capacity,
		Free: b.capacity - b.used, LargestFree: b.largestFree()}
}

func (b *Buddy) walkCoalesced() bool    { return false }
func (b *Buddy) largestIsWalkMax() bool { return true }

// emptyFreeRanges is the number of aligned power-of-two blocks that
// [0, capacity) splits into: one per set bit of capacity/BuddyMinBlock.
func (b *Buddy) emptyFreeRanges() int {
	return bits.OnesCount64(b.capacity / BuddyMinBlock)
}

// checkInternal verifies block alignment, the index, the free lists
// against the order mask, and that no two free buddies were left unmerged.
func (b *Buddy) checkInternal() error {
	var blocks, free int
	perOrder := [buddyOrders]int{}
	for x := uint64(0); x < b.capacity; {
		v, ok := b.index.get(x)
		if !ok {
			return fmt.Errorf("buddy: no block at offset %d", x)
		}
		n := &b.nodes[v]
		size := blockSize(n.order)
		if n.off != x || x&(size-1) != 0 {
			return fmt.Errorf("buddy: block at offset %d (node offset %d) of %d bytes is misaligned", x, n.off, size)
		}
		if n.free {
			free++
			perOrder[n.order]++
			if bv, ok := b.index.get(x ^ size); ok && b.nodes[bv].free && b.nodes[bv].order == n.order {
				return fmt.Errorf("buddy: free buddies at %d and %d (%d bytes) not merged", x, x^size, size)
			}
		}
		blocks++
		x += size
	}
	if blocks != b.index.len() {
		return fmt.Errorf("buddy: walk finds %d blocks, index holds %d", blocks, b.index.len())
	}
	if inUse := len(b.nodes) - len(b.spare); blocks != inUse {
		return fmt.Errorf("buddy: %d blocks, %d nodes in use (leak)", blocks, inUse)
	}
	for k := range b.heads {
		if (b.orderMask&(1<<k) != 0) != (b.heads[k] != nilID) {
			return fmt.Errorf("buddy: order %d: mask bit disagrees with its free list", k)
		}
		count := 0
		p := int32(nilID)
		for id := b.heads[k]; id != nilID; id = b.nodes[id].next {
			n := &b.nodes[id]
			if count++; count > perOrder[k] || !n.free || int(n.order) != k || n.prev != p {
				return fmt.Errorf("buddy: order %d free list is inconsistent at offset %d", k, n.off)
			}
			p = id
		}
		if count != perOrder[k] {
			return fmt.Errorf("buddy: order %d: free list holds %d blocks, walk finds %d", k, count, perOrder[k])
		}
	}
	if free != b.freeBlocks {
		return fmt.Errorf("buddy: %d free blocks counted, walk finds %d", b.freeBlocks, free)
	}
	return nil
}
