// Package alloc holds offset allocators: pure algorithms that hand out
// ranges of [0, capacity) and know nothing about GPUs (a "virtual allocator").
// The device pool, the activation planner, the KV cache and trace replay all
// use them through the Allocator interface.
//
// No allocator is safe for concurrent use; callers serialize access. All
// metadata lives on the host, in memory proportional to the number of
// blocks and free ranges (never to the capacity), and a successful Alloc or
// Free allocates no Go memory once the tables have grown to the working set.
//
// # Strategies
//
// New builds one by name; Strategies lists the names.
//
//   - "tlsf" (TLSF): two-level segregated fit. Constant-time Alloc and Free
//     through two levels of bitmaps over 32 size classes per power of two;
//     free neighbours merge at once. It takes the first range of the
//     smallest class sure to fit ("good fit"), so it may split a larger range
//     than best fit would: slightly more fragmentation for a bounded,
//     predictable cost. The fastest general choice; no internal waste.
//   - "bestfit" (BestFit): exact best fit with address-ordered ties (the
//     smallest free range that fits, lowest offset among equals, block at
//     its lowest aligned offset); free neighbours merge at once. Least
//     fragmentation of the general strategies and low addresses first, which
//     suits a growable virtual-memory arena; costs O(log k) per operation
//     (k: free ranges of one size class), somewhat slower than tlsf.
//   - "buddy" (Buddy): binary buddy, blocks of 256 B × 2^k aligned to their
//     size. Cheap, predictable merging and no external fragmentation below
//     the block sizes freed, but up to 50% internal waste per block
//     (257 B takes 512 B).
//   - "slab" (Slab): generated size classes (sizeclasses.go) from 256 B to
//     256 KiB over 2 MiB pages assigned to a class on demand and returned
//     when empty. Constant time, at most 12.5% waste per block and per page
//     for every size from 256 B up; larger requests fail with ErrTooLarge.
//     Pages held by sparsely used classes are its fragmentation.
//   - "linear" (Linear): a ring of bump allocations for per-step scratch.
//     No search at all, but space returns only from the ends of the ring: a
//     hole left by an early free waits until everything older (or newer)
//     is freed, and one long-lived block can stall it.
//
// Check and CheckEmpty verify any Allocator's invariants (segments cover
// the capacity exactly, Stats agree with Walk, coalescing, and this
// package's internal structures); tests elsewhere can call them after every
// step of a random sequence.
//
// # Quick start
//
//	a, err := alloc.New("tlsf", 1<<30) // offsets of a 1 GiB range
//	b, err := a.Alloc(4096, 256)       // b.Offset, b.Size
//	err = a.Free(b.Offset)
//	st := a.Stats()                    // Used, Free, LargestFree, ...
//
// Example and Example_outOfMemory run this as tests.
package alloc

import (
	"errors"
	"fmt"
)

// Block is a range handed out by an allocator. Size is the number of bytes
// reserved for it, which may exceed the requested size (rounding, size
// classes); the caller may use all of it.
type Block struct {
	Offset uint64
	Size   uint64
}

// End returns the first offset past the block.
func (b Block) End() uint64 { return b.Offset + b.Size }

// Segment is one contiguous range reported by Walk: either a live block or a
// free range. Walk reports segments in increasing offset order.
type Segment struct {
	Offset uint64
	Size   uint64
	Free   bool
}

// Stats is an allocator's accounting. All sizes are bytes.
type Stats struct {
	Capacity uint64 // size of the managed range
	Used     uint64 // bytes in live blocks (as reserved, including rounding)
	// Free is Capacity-Used minus any bytes the strategy can never hand out
	// (metadata-free strategies keep it equal to Capacity-Used).
	Free        uint64
	LargestFree uint64 // largest block that an Alloc with alignment 1 could return now
	LiveBlocks  int
	FreeRanges  int    // number of maximal free ranges
	Allocs      uint64 // successful Alloc calls, total
	Frees       uint64 // successful Free calls, total
	Failures    uint64 // failed Alloc calls, total
	// MaxAlloc is the largest size the strategy accepts at all (0 means the
	// capacity); larger requests fail with ErrTooLarge.
	MaxAlloc uint64
}

// FragmentationFactor is the largest free block over total free bytes: 1
// means all free space is one range; near 0 means it is scattered. It is 1
// when nothing is free.
func (s Stats) FragmentationFactor() float64 {
	if s.Free == 0 {
		return 1
	}
	return float64(s.LargestFree) / float64(s.Free)
}

// Allocator hands out non-overlapping blocks of [0, Capacity()).
type Allocator interface {
	// Name is the strategy's name as accepted by New.
	Name() string
	// Alloc returns a block of at least size bytes whose offset is a
	// multiple of align (a power of two; 0 means 1). It returns an error
	// wrapping ErrOutOfMemory (an *OOMError) when no free range fits,
	// ErrTooLarge when size exceeds what the strategy accepts, and
	// ErrInvalidArgument for size 0 or a bad alignment. A failed Alloc
	// changes nothing but the Failures count.
	Alloc(size, align uint64) (Block, error)
	// Free releases the block that starts at offset. An offset that is not
	// the start of a live block (never allocated, or already freed) returns
	// an error wrapping ErrInvalidFree and changes nothing.
	Free(offset uint64) error
	// Capacity returns the size of the managed range.
	Capacity() uint64
	// Grow extends the managed range to capacity bytes; new space is free.
	// Strategies that cannot grow return ErrNotGrowable; shrinking returns
	// ErrInvalidArgument.
	Grow(capacity uint64) error
	// Stats returns the current accounting.
	Stats() Stats
	// Walk calls fn for each live block and each maximal free range, in
	// offset order, covering [0, Capacity()) exactly, until fn returns false.
	// Strategies whose free space has structure (buddy orders, slab pages)
	// may report adjacent free segments that cannot merge.
	Walk(fn func(Segment) bool)
	// Reset frees every block at once.
	Reset()
}

// Handle identifies a block allocated by HandleAllocator.AllocHandle.
type Handle int32

// HandleAllocator is implemented by strategies ("tlsf", "bestfit") that
// can hand out a handle with each block, so that its free needs no lookup
// (the device pool frees its blocks this way) and can say which free range
// the block merged into.
type HandleAllocator interface {
	Allocator
	// AllocHandle is Alloc, also returning the block's handle. Such a
	// block is freed only with FreeHandle (Free does not know it).
	AllocHandle(size, align uint64) (Block, Handle, error)
	// FreeHandle frees the block allocated with handle h at offset and
	// returns the maximal free range that now holds it. A handle that
	// is not a live block of AllocHandle at that offset returns an error
	// wrapping ErrInvalidFree and changes nothing.
	FreeHandle(h Handle, offset uint64) (Segment, error)
}

// PlacingAllocator is implemented by strategies ("tlsf", "bestfit") that
// can also place a block where the caller chooses, among the free ranges
// Walk reports: the device pool does when the strategy's own choice would
// lie on unmapped pages and a free range over mapped pages holds the
// block.
type PlacingAllocator interface {
	HandleAllocator
	// AllocHandleAt allocates exactly [offset, offset+size), which must
	// lie inside one free range; otherwise it returns an error wrapping
	// ErrOutOfMemory and changes nothing but the Failures count. The
	// block is freed with FreeHandle.
	AllocHandleAt(offset, size uint64) (Block, Handle, error)
	// WalkFree calls fn for each free range of at least min bytes, in an
	// order of the strategy's (by size), until fn returns false: the free
	// ranges Walk reports, without visiting the blocks.
	WalkFree(min uint64, fn func(Segment) bool)
}

// Errors returned by allocators; match with errors.Is.
var (
	ErrOutOfMemory     = errors.New("out of memory")
	ErrInvalidFree     = errors.New("free of an offset that is not a live block")
	ErrInvalidArgument = errors.New("invalid argument")
	ErrTooLarge        = errors.New("request larger than the strategy accepts")
	ErrNotGrowable     = errors.New("strategy cannot grow")
)

// OOMError explains a failed allocation with the numbers behind it.
type OOMError struct {
	Strategy    string
	Requested   uint64
	Align       uint64
	Capacity    uint64
	Free        uint64
	LargestFree uint64
}

func (e *OOMError) Error() string {
	why := "capacity exhausted"
	if e.Free >= e.Requested {
		why = "fragmentation: enough free bytes but no free range large enough"
	}
	return fmt.Sprintf("%s: out of memory: requested %d bytes (align %d), capacity %d, free %d, largest free %d (%s)",
		e.Strategy, e.Requested, e.Align, e.Capacity, e.Free, e.LargestFree, why)
}

// Unwrap makes errors.Is(err, ErrOutOfMemory) true.
func (e *OOMError) Unwrap() error { return ErrOutOfMemory }

// MaxCapacity is the largest capacity any strategy manages, and the largest
// request any strategy accepts: 4 EiB keeps every offset computation
// (alignment padding included) free of uint64 overflow.
const MaxCapacity uint64 = 1 << 62

// Strategies returns the names New accepts, in a stable order.
func Strategies() []string {
	return []string{"tlsf", "bestfit", "buddy", "slab", "linear"}
}

// New returns an empty allocator of the named strategy over [0, capacity).
// Buddy and slab round capacity down to their granule (256 B blocks, slab
// pages); Capacity reports the rounded value. An unknown name or a capacity
// above MaxCapacity returns an error wrapping ErrInvalidArgument.
func New(strategy string, capacity uint64) (Allocator, error) {
	if capacity > MaxCapacity {
		return nil, fmt.Errorf("alloc %s: capacity %d exceeds the limit %d: %w", strategy, capacity, MaxCapacity, ErrInvalidArgument)
	}
	switch strategy {
	case "tlsf":
		return NewTLSF(capacity), nil
	case "bestfit":
		return NewBestFit(capacity), nil
	case "buddy":
		return NewBuddy(capacity), nil
	case "slab":
		return NewSlab(capacity), nil
	case "linear":
		return NewLinear(capacity), nil
	}
	return nil, fmt.Errorf("alloc: unknown strategy %q (have %v): %w", strategy, Strategies(), ErrInvalidArgument)
}
