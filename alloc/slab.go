package alloc

import (
	"fmt"
	"math/bits"
)

//go:generate go run ./internal/mkclasses -o sizeclasses.go

// slabClass is one row of the generated table in sizeclasses.go.
type slabClass struct {
	size    uint64 // block size in bytes
	objects uint64 // blocks per page
}

// Slab serves small requests from size classes (generated into
// sizeclasses.go by internal/mkclasses, each with its worst-case waste
// stated): the capacity is split into pages of SlabPageSize bytes, a page
// is assigned to one class on demand and carved into equal blocks, and it
// is returned to the free pool as soon as its last block is freed. Alloc
// and Free take constant time (a bitmap per page finds the lowest free
// block) and blocks of one class never fragment each other. The costs:
// rounding up to the class (at most 12.5% of a block, and of a page full
// of the smallest requests of a class, for every size from 256 B up), and
// pages held by classes that are mostly empty. Requests above
// SlabMaxAlloc bytes fail with ErrTooLarge.
//
// A block of class size c sits at a multiple of the largest power of two
// dividing c; a larger alignment selects the smallest class that is a
// multiple of it (powers of two are classes), at the price of more waste.
//
// The capacity is rounded down to a multiple of SlabPageSize. Walk reports,
// per page in use, live blocks and maximal runs of free blocks (a page's
// tail that fits no block joins a free run that reaches it, or stands
// alone); each maximal run of unused pages is one free segment. Free
// segments on either side of a page boundary are not merged. LargestFree is
// the largest block an Alloc could return now (SlabMaxAlloc while a page is
// unused), not the largest free segment.
//
// The zero value is not usable; call NewSlab.
type Slab struct {
	capacity uint64
	npages   int
	pages    []slabPage // pages [0, len(pages)) have been used; the rest never were
	unused   []int      // stack of unused pages below len(pages)
	partial  [len(slabClasses)]int

	used       uint64
	liveBlocks int
	assigned   int // pages holding a class
	pageRuns   int // free segments inside assigned pages
	unusedRuns int // maximal runs of unused pages
	allocs     uint64
	frees      uint64
	failures   uint64
}

type slabPage struct {
	class      int // index into slabClasses, -1 when unused
	nobj       int
	nfree      int
	runs       int // free segments Walk reports for this page
	prev, next int // partial list links
	free       []uint64
	summary    []uint64 // bit w set when free[w] != 0
}

const noPage = -1

// NewSlab returns an empty slab allocator over [0, capacity) with capacity
// rounded down to a multiple of SlabPageSize and clamped to MaxCapacity.
func NewSlab(capacity uint64) *Slab {
	s := &Slab{}
	s.setCapacity(min(capacity, MaxCapacity))
	s.Reset()
	return s
}

func (s *Slab) setCapacity(c uint64) {
	s.npages = int(c / SlabPageSize)
	s.capacity = uint64(s.npages) * SlabPageSize
}

// Name returns "slab".
func (s *Slab) Name() string { return "slab" }

// Capacity returns the size of the managed range (whole pages).
func (s *Slab) Capacity() uint64 { return s.capacity }

// classFor returns the smallest class of at least size bytes whose blocks
// are aligned to align, or -1.
func classFor(size, align uint64) int {
	lo, hi := 0, len(slabClasses)
	for lo < hi {
		m := (lo + hi) / 2
		if slabClasses[m].size < size {
			lo = m + 1
		} else {
			hi = m
		}
	}
	for ; lo < len(slabClasses); lo++ {
		if c := slabClasses[lo].size; c&-c >= align {
			return lo
		}
	}
	return -1
}

func (s *Slab) unusedAt(p int) bool {
	return p >= 0 && p < s.npages && (p >= len(s.pages) || s.pages[p].class < 0)
}

// takePage assigns an unused page to class ci and returns it, or noPage.
func (s *Slab) takePage(ci int) int {
	var p int
	switch {
	case len(s.unused) > 0:
		p = s.unused[len(s.unused)-1]
		s.unused = s.unused[:len(s.unused)-1]
	case len(s.pages) < s.npages:
		p = len(s.pages)
		s.pages = append(s.pages, slabPage{class: -1})
	default:
		return noPage
	}
	switch l, r := s.unusedAt(p-1), s.unusedAt(p+1); {
	case l && r:
		s.unusedRuns++
	case !l && !r:
		s.unusedRuns--
	}
	pg := &s.pages[p]
	n := int(slabClasses[ci].objects)
	words := (n + 63) / 64
	if cap(pg.free) < words {
		pg.free = make([]uint64, words, SlabPageSize/slabMinClass/64)
		pg.summary = make([]uint64, (words+63)/64, (SlabPageSize/slabMinClass/64+63)/64)
	}
	pg.free = pg.free[:words]
	pg.summary = pg.summary[:(words+63)/64]
	for w := range pg.free {
		pg.free[w] = ^uint64(0)
	}
	if n%64 != 0 {
		pg.free[words-1] = 1<<(n%64) - 1
	}
	for w := range pg.summary {
		pg.summary[w] = ^uint64(0)
	}
	if words%64 != 0 {
		pg.summary[len(pg.summary)-1] = 1<<(words%64) - 1
	}
	pg.class, pg.nobj, pg.nfree, pg.runs = ci, n, n, 1
	s.pageRuns++
	s.assigned++
	s.pushPartial(p)
	return p
}

// releasePage returns an empty page to the unused pool.
func (s *Slab) releasePage(p int) {
	s.removePartial(p)
	pg := &s.pages[p]
	s.pageRuns -= pg.runs
	pg.class = -1
	s.assigned--
	s.unused = append(s.unused, p)
	switch l, r := s.unusedAt(p-1), s.unusedAt(p+1); {
	case l && r:
		s.unusedRuns--
	case !l && !r:
		s.unusedRuns++
	}
}

func (s *Slab) pushPartial(p int) {
	pg := &s.pages[p]
	head := s.partial[pg.class]
	pg.prev, pg.next = noPage, head
	if head != noPage {
		s.pages[head].prev = p
	}
	s.partial[pg.class] = p
}

func (s *Slab) removePartial(p int) {
	pg := &s.pages[p]
	if pg.next != noPage {
		s.pages[pg.next].prev = pg.prev
	}
	if pg.prev != noPage {
		s.pages[pg.prev].next = pg.next
	} else {
		s.partial[pg.class] = pg.next
	}
}

// isFree reports whether block i of the page is free, treating the page
// tail (i == nobj) as free when there is one and anything outside the page
// as not free.
func (s *Slab) isFree(pg *slabPage, i int) bool {
	switch {
	case i < 0 || i > pg.nobj:
		return false
	case i == pg.nobj:
		return uint64(pg.nobj)*slabClasses[pg.class].size < SlabPageSize
	}
	return pg.free[i/64]&(1<<(i%64)) != 0
}

// Alloc returns the lowest free block of the smallest class that holds
// size bytes at the alignment. Errors: ErrInvalidArgument (size 0,
// alignment not a power of two), ErrTooLarge (size above SlabMaxAlloc, or
// an alignment no class satisfies: above SlabMaxAlloc), *OOMError (no
// block of the class is free and no page is unused).
func (s *Slab) Alloc(size, align uint64) (Block, error) {
	align, err := checkRequest("slab", size, align, slabMaxClass)
	if err != nil {
		s.failures++
		return Block{}, err
	}
	ci := classFor(size, align)
	if ci < 0 {
		s.failures++
		return Block{}, fmt.Errorf("slab: alloc of %d bytes: no class is aligned to %d (largest class %d): %w",
			size, align, uint64(slabMaxClass), ErrTooLarge)
	}
	p := s.partial[ci]
	if p == noPage {
		if p = s.takePage(ci); p == noPage {
			s.failures++
			return Block{}, s.oom(size, align)
		}
	}
	pg := &s.pages[p]
	sw := 0
	for pg.summary[sw] == 0 {
		sw++
	}
	w := sw*64 + bits.TrailingZeros64(pg.summary[sw])
	i := w*64 + bits.TrailingZeros64(pg.free[w])
	switch l, r := s.isFree(pg, i-1), s.isFree(pg, i+1); {
	case l && r:
		pg.runs++
		s.pageRuns++
	case !l && !r:
		pg.runs--
		s.pageRuns--
	}
	pg.free[w] &^= 1 << (i % 64)
	if pg.free[w] == 0 {
		pg.summary[sw] &^= 1 << (w % 64)
	}
	if pg.nfree--; pg.nfree == 0 {
		s.removePartial(p)
	}
	c := slabClasses[ci].size
	s.used += c
	s.liveBlocks++
	s.allocs++
	return Block{Offset: uint64(p)*SlabPageSize + uint64(i)*c, Size: c}, nil
}

// Free releases the live block at offset; a page whose last block is
// freed returns to the unused pool. An offset that does not start a live
// block returns an error wrapping ErrInvalidFree and changes nothing.
func (s *Slab) Free(offset uint64) error {
	if offset >= s.capacity {
		return invalidFree("slab", offset)
	}
	p := int(offset / SlabPageSize)
	if p >= len(s.pages) || s.pages[p].class < 0 {
		return invalidFree("slab", offset)
	}
	pg := &s.pages[p]
	c := slabClasses[pg.class].size
	rel := offset - uint64(p)*SlabPageSize
	i := int(rel / c)
	if rel%c != 0 || i >= pg.nobj || pg.free[i/64]&(1<<(i%64)) != 0 {
		return invalidFree("slab", offset)
	}
	switch l, r := s.isFree(pg, i-1), s.isFree(pg, i+1); {
	case l && r:
		pg.runs--
		s.pageRuns--
	case !l && !r:
		pg.runs++
		s.pageRuns++
	}
	w := i / 64
	pg.free[w] |= 1 << (i % 64)
	pg.summary[w/64] |= 1 << (w % 64)
	s.used -= c
	s.liveBlocks--
	s.frees++
	if pg.nfree++; pg.nfree == 1 {
		s.pushPartial(p)
	}
	if pg.nfree == pg.nobj {
		s.releasePage(p)
	}
	return nil
}

// Grow extends the range to capacity rounded down to a multiple of
// SlabPageSize; the new pages are unused. Shrinking, or growing past
// MaxCapacity, returns ErrInvalidArgument.
func (s *Slab) Grow(capacity uint64) error {
	more, err := checkGrow("slab", s.capacity, capacity)
	if !more {
		return err
	}
	old := s.npages
	s.setCapacity(capacity)
	if s.npages > old && !s.unusedAt(old-1) {
		s.unusedRuns++ // otherwise the new pages extend the last run
	}
	return nil
}

// Reset frees every block and returns every page. The Allocs, Frees and
// Failures counts are kept.
func (s *Slab) Reset() {
	s.pages = s.pages[:0]
	s.unused = s.unused[:0]
	for ci := range s.partial {
		s.partial[ci] = noPage
	}
	s.used, s.liveBlocks, s.assigned, s.pageRuns = 0, 0, 0, 0
	s.unusedRuns = boolInt(s.npages > 0)
}

func (s *Slab) largestFree() uint64 {
	if s.assigned < s.npages {
		return slabMaxClass
	}
	for ci := len(slabClasses) - 1; ci >= 0; ci-- {
		if s.partial[ci] != noPage {
			return slabClasses[ci].size
		}
	}
	return 0
}

// Stats returns the accounting. Free counts every byte not in a live block
// (page tails included: they become usable when the page is returned);
// FreeRanges counts the segments Walk reports; MaxAlloc is SlabMaxAlloc.
// LargestFree may scan the class table.
func (s *Slab) Stats() Stats {
	return Stats{
		Capacity:    s.capacity,
		Used:        s.used,
		Free:        s.capacity - s.used,
		LargestFree: s.largestFree(),
		LiveBlocks:  s.liveBlocks,
		FreeRanges:  s.pageRuns + s.unusedRuns,
		Allocs:      s.allocs,
		Frees:       s.frees,
		Failures:    s.failures,
		MaxAlloc:    slabMaxClass,
	}
}

// nextUsed returns the first block at or after i that is live, or nobj.
func (pg *slabPage) nextUsed(i int) int {
	for w := i / 64; w < len(pg.free); w++ {
		x := ^pg.free[w]
		if w == i/64 {
			x &= ^uint64(0) << (i % 64)
		}
		if x != 0 {
			return min(w*64+bits.TrailingZeros64(x), pg.nobj)
		}
	}
	return pg.nobj
}

// Walk reports live blocks and free segments in offset order (see Slab).
func (s *Slab) Walk(fn func(Segment) bool) {
	for p := 0; p < s.npages; {
		base := uint64(p) * SlabPageSize
		if s.unusedAt(p) {
			q := p + 1
			for q < len(s.pages) && s.pages[q].class < 0 {
				q++
			}
			if q >= len(s.pages) {
				q = s.npages // pages never used form one run to the end
			}
			if !fn(Segment{Offset: base, Size: uint64(q-p) * SlabPageSize, Free: true}) {
				return
			}
			p = q
			continue
		}
		pg := &s.pages[p]
		c := slabClasses[pg.class].size
		tailMerged := false
		for i := 0; i < pg.nobj; {
			if pg.free[i/64]&(1<<(i%64)) == 0 {
				if !fn(Segment{Offset: base + uint64(i)*c, Size: c}) {
					return
				}
				i++
				continue
			}
			j := pg.nextUsed(i)
			end := base + uint64(j)*c
			if j == pg.nobj {
				end, tailMerged = base+SlabPageSize, true
			}
			if !fn(Segment{Offset: base + uint64(i)*c, Size: end - base - uint64(i)*c, Free: true}) {
				return
			}
			i = j
		}
		if tail := uint64(pg.nobj) * c; !tailMerged && tail < SlabPageSize {
			if !fn(Segment{Offset: base + tail, Size: SlabPageSize - tail, Free: true}) {
				return
			}
		}
		p++
	}
}

func (s *Slab) oom(size, align uint64) error {
	return &OOMError{Strategy: "slab", Requested: size, Align: align, Capacity: s.capacity,
		Free: s.capacity - s.used, LargestFree: s.largestFree()}
}

func (s *Slab) walkCoalesced() bool    { return false }
func (s *Slab) largestIsWalkMax() bool { return false }
func (s *Slab) emptyFreeRanges() int   { return boolInt(s.npages > 0) }

// checkInternal verifies every page's bitmap, counts and free-run count,
// the partial lists, the unused-page stack, and the totals.
func (s *Slab) checkInternal() error {
	if len(s.pages) > s.npages {
		return fmt.Errorf("slab: %d pages touched, capacity holds %d", len(s.pages), s.npages)
	}
	var used uint64
	var live, assigned, runs, unusedBelow int
	perClass := make([]int, len(slabClasses))
	for p := range s.pages {
		pg := &s.pages[p]
		if pg.class < 0 {
			unusedBelow++
			continue
		}
		assigned++
		if pg.class >= len(slabClasses) || pg.nobj != int(slabClasses[pg.class].objects) {
			return fmt.Errorf("slab: page %d: class %d with %d blocks", p, pg.class, pg.nobj)
		}
		nfree := 0
		for w, x := range pg.free {
			nfree += bits.OnesCount64(x)
			if (pg.summary[w/64]&(1<<(w%64)) != 0) != (x != 0) {
				return fmt.Errorf("slab: page %d: summary bit %d disagrees with its word", p, w)
			}
		}
		if last := pg.free[len(pg.free)-1]; pg.nobj%64 != 0 && last>>(pg.nobj%64) != 0 {
			return fmt.Errorf("slab: page %d: bits set past block %d", p, pg.nobj)
		}
		if nfree != pg.nfree || nfree == pg.nobj {
			return fmt.Errorf("slab: page %d: %d free bits, count %d of %d blocks (empty pages must be returned)", p, nfree, pg.nfree, pg.nobj)
		}
		if nfree > 0 {
			perClass[pg.class]++
		}
		// Count run starts: free blocks whose predecessor is not free,
		// and the tail when the last block is live.
		r := 0
		carry := uint64(0)
		for _, x := range pg.free {
			r += bits.OnesCount64(x &^ (x<<1 | carry))
			carry = x >> 63
		}
		if s.isFree(pg, pg.nobj) && !s.isFree(pg, pg.nobj-1) {
			r++
		}
		if r != pg.runs {
			return fmt.Errorf("slab: page %d: %d free runs, counted %d", p, r, pg.runs)
		}
		runs += r
		live += pg.nobj - nfree
		used += uint64(pg.nobj-nfree) * slabClasses[pg.class].size
	}
	if len(s.unused) != unusedBelow {
		return fmt.Errorf("slab: %d unused pages below %d, stack holds %d", unusedBelow, len(s.pages), len(s.unused))
	}
	for _, p := range s.unused {
		if p < 0 || p >= len(s.pages) || s.pages[p].class >= 0 {
			return fmt.Errorf("slab: unused stack holds page %d, which is in use", p)
		}
	}
	unusedRuns := 0
	for p := 0; p < s.npages && p <= len(s.pages); p++ { // pages past len(s.pages) extend one run
		if s.unusedAt(p) && !s.unusedAt(p-1) {
			unusedRuns++
		}
	}
	switch {
	case used != s.used || live != s.liveBlocks:
		return fmt.Errorf("slab: pages hold %d bytes in %d blocks, counted %d in %d", used, live, s.used, s.liveBlocks)
	case assigned != s.assigned:
		return fmt.Errorf("slab: %d pages in use, counted %d", assigned, s.assigned)
	case runs != s.pageRuns || unusedRuns != s.unusedRuns:
		return fmt.Errorf("slab: %d+%d free runs, counted %d+%d", runs, unusedRuns, s.pageRuns, s.unusedRuns)
	}
	for ci, head := range s.partial {
		n := 0
		prev := noPage
		for p := head; p != noPage; p = s.pages[p].next {
			pg := &s.pages[p]
			if n++; n > perClass[ci] || pg.class != ci || pg.nfree == 0 || pg.prev != prev {
				return fmt.Errorf("slab: class %d partial list inconsistent at page %d", ci, p)
			}
			prev = p
		}
		if n != perClass[ci] {
			return fmt.Errorf("slab: class %d: %d partial pages listed, %d exist", ci, n, perClass[ci])
		}
	}
	var largest uint64
	if assigned < s.npages {
		largest = slabMaxClass
	} else {
		for ci := range perClass {
			if perClass[ci] > 0 {
				largest = slabClasses[ci].size
			}
		}
	}
	if largest != s.largestFree() {
		return fmt.Errorf("slab: largest free block %d, Stats says %d", largest, s.largestFree())
	}
	return nil
}
