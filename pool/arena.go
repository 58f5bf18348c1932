package pool

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/memwall/memwall/alloc"
	"github.com/memwall/memwall/device"
)

// arena is one range the pool sub-allocates: a device chunk, a pinned host
// chunk, or the single virtual reservation with pages mapped on demand. All
// fields are guarded by Pool.mu.
type arena struct {
	base  device.Ptr
	size  uint64
	alloc alloc.Allocator
	// ha is alloc as a HandleAllocator (tlsf, bestfit), else nil: blocks
	// are then freed by handle, and a virtual arena finds its free pages
	// from the allocator's free ranges instead of counting references per
	// page (see lean).
	ha alloc.HandleAllocator
	// pa is alloc as a PlacingAllocator (else nil), and bf as best fit,
	// the default (else nil): the central path calls bf directly rather
	// than through the interfaces, which it feels on every allocation.
	pa   alloc.PlacingAllocator
	bf   *alloc.BestFit
	live int    // live (or cached/pending) blocks
	held uint64 // bytes of those blocks

	// chunk arenas
	host    []byte
	hostBuf *device.HostBuffer

	// virtual arena
	virtual   bool
	pageBytes uint64
	pageShift uint // log2(pageBytes) when it is a power of two, else 0
	pages     []page
	// lean (a virtual arena over a HandleAllocator) keeps no per-page
	// reference counts: a page is free when one of the allocator's free
	// ranges covers it. Allocations and frees only mark freeSet stale;
	// the few callers that choose pages to unmap or steal rebuild it
	// first from the allocator's free ranges (freshen).
	lean      bool
	stale     bool
	mappedTop uint64   // no page at or above this index was ever mapped
	ready     []uint64 // bitset of pages mapped and not busy
	freeSet   []uint64 // bitset of mapped pages with no live block
	freeTop   uint64   // no free page at or above this index
	freePages uint64   // bytes of pages in freeSet
	mapped    uint64
	// search and visit are preferMapped's state (search.visit, bound
	// once).
	search placeSearch
	visit  func(alloc.Segment) bool
	// idle and touched (nil unless the pool holds free pages for its
	// reclaimer, see reclaim.go): the pages free at the reclaimer's last
	// pass, and the pages a block has been placed on since.
	idle, touched []uint64
}

type page struct {
	h      device.PhysMem // the physical handle mapped here (every page of it holds it)
	mapped bool
	busy   bool // a goroutine is mapping or unmapping it (without p.mu)
	refs   int32
	// head is the first page of the handle mapped here and n its length
	// in pages: a handle is mapped, unmapped and released whole (CUDA
	// unmaps no part of a mapping), so a run of pages goes back to the
	// device only once every page of it is free.
	head, n uint32
}

// pageOf returns the index of the page holding offset off (a shift for
// the usual power-of-two page size: this runs on every allocation).
func (a *arena) pageOf(off uint64) uint64 {
	if a.pageShift != 0 {
		return off >> (a.pageShift & 63) // the mask: no check for a shift past the width
	}
	return off / a.pageBytes
}

func (a *arena) ptr(off uint64) device.Ptr {
	if a.base == 0 {
		return 0
	}
	return a.base + device.Ptr(off)
}

func (p *Pool) newVirtualArena() (*arena, error) {
	return p.newVirtualArenaSized(p.opts.ReserveBytes)
}

// newVirtualArenaSized reserves size bytes of address space (a multiple of
// PageBytes) for a virtual arena.
func (p *Pool) newVirtualArenaSized(size uint64) (*arena, error) {
	o := p.opts
	o.ReserveBytes = size
	base, err := p.dev.Reserve(o.ReserveBytes)
	if err != nil {
		return nil, fmt.Errorf("reserve %d bytes of address space: %w", o.ReserveBytes, err)
	}
	// The allocator's range starts at one page and grows only when nothing
	// fits below its end (the frontier), so every strategy reuses free
	// space low in the reservation before touching new pages. Strategies
	// that cannot grow manage the whole reservation from the start.
	// The range never grows past the reservation: a one-page range (the
	// small-block range of a pool with a small limit) starts and stays at
	// one page.
	al, err := alloc.New(o.Strategy, o.PageBytes)
	if err == nil && o.ReserveBytes > o.PageBytes && al.Grow(min(2*o.PageBytes, o.ReserveBytes)) != nil {
		al, err = alloc.New(o.Strategy, o.ReserveBytes)
	}
	if err != nil {
		_ = p.dev.Unreserve(base, o.ReserveBytes)
		return nil, err
	}
	words := (o.ReserveBytes/o.PageBytes + 63) / 64
	a := &arena{base: base, size: o.ReserveBytes, alloc: al, virtual: true, pageBytes: o.PageBytes,
		pages: make([]page, o.ReserveBytes/o.PageBytes), freeSet: make([]uint64, words), ready: make([]uint64, words)}
	a.setAllocator(al)
	a.lean = a.ha != nil
	if p.holding() {
		a.idle, a.touched = make([]uint64, words), make([]uint64, words)
	}
	if o.PageBytes&(o.PageBytes-1) == 0 {
		a.pageShift = uint(bits.TrailingZeros64(o.PageBytes))
	}
	return a, nil
}

// newChunk obtains a chunk of size bytes from the device, at priority
// (0: the device's default; see devAlloc).
func (p *Pool) newChunk(size uint64, priority float32) (*arena, error) {
	al, err := alloc.New(p.opts.Strategy, size)
	if err != nil {
		return nil, err
	}
	a := &arena{size: size}
	a.setAllocator(al)
	if p.host {
		hb, err := p.dev.HostAlloc(size)
		if err != nil {
			return nil, err
		}
		a.hostBuf, a.host, a.base = hb, hb.Bytes, hb.DevicePtr
	} else {
		ptr, err := p.devAlloc(size, priority)
		if err != nil {
			return nil, err
		}
		a.base = ptr
	}
	p.devAllocs.Add(1)
	p.addReserved(size)
	return a, nil
}

// setAllocator makes al the arena's allocator (alloc, and ha, pa and bf
// where it is one).
func (a *arena) setAllocator(al alloc.Allocator) {
	a.alloc = al
	a.ha, _ = al.(alloc.HandleAllocator)
	a.pa, _ = al.(alloc.PlacingAllocator)
	a.bf, _ = al.(*alloc.BestFit)
}

func (p *Pool) addReserved(n uint64) {
	updateMax(&p.peakReserved, p.reserved.Add(n))
}

// sync updates page i's bit in the ready set after its mapped or busy
// state changed.
func (a *arena) sync(i uint64) {
	if pg := &a.pages[i]; pg.mapped && !pg.busy {
		a.ready[i/64] |= 1 << (i % 64)
	} else {
		a.ready[i/64] &^= 1 << (i % 64)
	}
}

// wordMask returns, for bitset word w, the bits of pages [first, last].
func wordMask(w, first, last uint64) uint64 {
	m := ^uint64(0)
	if w == first/64 {
		m &= ^uint64(0) << (first % 64)
	}
	if w == last/64 {
		m &= ^uint64(0) >> (^last % 64) // 63 - last%64
	}
	return m
}

// spanMask returns the bits of pages [first, last] in their bitset word,
// which holds them all (first/64 == last/64).
func spanMask(first, last uint64) uint64 {
	return ^uint64(0) << (first % 64) & (^uint64(0) >> (^last % 64)) // ^last%64 = 63 - last%64
}

// allReady reports whether pages [first, last] are all mapped and none is
// busy.
func (a *arena) allReady(first, last uint64) bool {
	if fw := first / 64; fw == last/64 { // the usual case: one word
		m := spanMask(first, last)
		return a.ready[fw]&m == m
	}
	for w := first / 64; w <= last/64; w++ {
		if m := wordMask(w, first, last); a.ready[w]&m != m {
			return false
		}
	}
	return true
}

// freshen rebuilds a lean arena's free set after allocations and frees
// made it stale: a page is free when it is mapped, not busy, and covered
// by one of the allocator's free ranges (or lies past the allocator's
// range, mapped by a warm-up). It costs a walk over the arena's blocks
// and is called only where pages are chosen for unmapping or stealing,
// each of which costs device calls.
func (a *arena) freshen() {
	if !a.lean || !a.stale {
		return
	}
	a.stale = false
	clear(a.freeSet[:(a.mappedTop+63)/64])
	a.freePages, a.freeTop = 0, 0
	pb := a.pageBytes
	add := func(s alloc.Segment) bool {
		if s.Free {
			a.addFree(a.pageOf(s.Offset+pb-1), a.pageOf(s.Offset+s.Size))
		}
		return true
	}
	// Only free ranges of a page or more can hold a whole page.
	if a.pa != nil {
		a.pa.WalkFree(pb, add)
	} else {
		a.alloc.Walk(add)
	}
	a.addFree(a.pageOf(a.alloc.Capacity()+pb-1), a.mappedTop)
}

// addFree adds the ready pages of [first, end) to the free set.
func (a *arena) addFree(first, end uint64) {
	end = min(end, a.mappedTop)
	if first >= end {
		return
	}
	last := end - 1
	for w := first / 64; w <= last/64; w++ {
		x := wordMask(w, first, last) & a.ready[w] &^ a.freeSet[w]
		if x == 0 {
			continue
		}
		a.freeSet[w] |= x
		a.freePages += uint64(bits.OnesCount64(x)) * a.pageBytes
		a.freeTop = max(a.freeTop, w*64+uint64(64-bits.LeadingZeros64(x)))
	}
}

func (a *arena) va(i uint64) device.Ptr { return a.base + device.Ptr(i*a.pageBytes) }

// anyBusy reports whether a page in [first, last] is being mapped or
// unmapped by another goroutine.
func (a *arena) anyBusy(first, last uint64) bool {
	for i := first; i <= last; i++ {
		if a.pages[i].busy {
			return true
		}
	}
	return false
}

func (a *arena) unref(p *Pool, i uint64) {
	pg := &a.pages[i]
	pg.refs--
	if pg.refs == 0 && pg.mapped && !a.isFree(i) {
		a.markFree(i)
	}
}

// isFree reports whether page i is in the free set.
func (a *arena) isFree(i uint64) bool { return a.freeSet[i/64]&(1<<(i%64)) != 0 }

// markFree records page i as mapped and unreferenced.
func (a *arena) markFree(i uint64) {
	a.freeSet[i/64] |= 1 << (i % 64)
	a.freePages += a.pageBytes
	a.freeTop = max(a.freeTop, i+1)
}

// markUsed takes page i out of the free set.
func (a *arena) markUsed(i uint64) {
	a.freeSet[i/64] &^= 1 << (i % 64)
	a.freePages -= a.pageBytes
}

// place allocates size bytes at the alignment from the arena's
// allocator, by handle where it has them.
func (a *arena) place(size, align uint64) (alloc.Block, alloc.Handle, error) {
	if a.bf != nil {
		return a.bf.AllocHandle(size, align)
	}
	if a.ha != nil {
		return a.ha.AllocHandle(size, align)
	}
	b, err := a.alloc.Alloc(size, align)
	return b, 0, err
}

// placeFree returns a range from place to the allocator (a lean arena's
// free set is then stale). The caller accounts for the block
// (Pool.release does, for a block handed out).
func (a *arena) placeFree(off uint64, h alloc.Handle) error {
	var err error
	switch {
	case a.bf != nil:
		_, err = a.bf.FreeHandle(h, off)
	case a.ha != nil:
		_, err = a.ha.FreeHandle(h, off)
	default:
		return a.alloc.Free(off)
	}
	a.stale = a.stale || a.lean
	return err
}

// releasedPages is called after a block's range in a virtual arena went
// back to the allocator (placeFree) and was accounted for (Pool.release):
// it drops the pages' references when the arena is not lean, and gives
// back the free pages above the bytes to keep.
func (a *arena) releasedPages(p *Pool, off, size uint64) {
	if !a.lean {
		first, last := a.pageOf(off), a.pageOf(off+size-1)
		for i := first; i <= last; i++ {
			a.unref(p, i)
		}
	}
	if keep := a.keepBytes(p); keep != math.MaxUint64 {
		if a.freshen(); a.freePages > keep {
			a.shrink(p, keep)
		}
	}
}

// destroy returns all of the arena's memory to the device.
func (a *arena) destroy(p *Pool) error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if a.virtual {
		for i := uint64(0); i < uint64(len(a.pages)); i++ {
			pg := &a.pages[i]
			if !pg.mapped || uint64(pg.head) != i {
				continue
			}
			n := uint64(pg.n)
			keep(p.dev.Unmap(a.va(i), n*a.pageBytes))
			keep(p.dev.ReleasePhysical(pg.h))
			p.unmaps.Add(1)
			p.devFrees.Add(1)
			p.reserved.Add(^(n*a.pageBytes - 1))
			for j := i; j < i+n; j++ {
				a.pages[j] = page{}
				a.sync(j)
			}
		}
		a.mapped = 0
		keep(p.dev.Unreserve(a.base, a.size))
		return first
	}
	if a.hostBuf != nil {
		keep(p.dev.HostFree(a.hostBuf))
	} else {
		keep(p.up.Free(a.base))
	}
	p.devFrees.Add(1)
	p.reserved.Add(^(a.size - 1))
	return first
}

func (p *Pool) logf(format string, a ...any) {
	if p.opts.Logger != nil {
		p.opts.Logger.Debug(fmt.Sprintf(format, a...), "pool", p.opts.Name)
	}
}

// keepBytes is how many bytes of free mapped pages stay mapped:
// KeepFreeBytes, or all of them when it is 0 (then pages go back to the
// device only under the limit's pressure or on Trim).
func (a *arena) keepBytes(p *Pool) uint64 {
	if p.opts.KeepFreeBytes == 0 {
		return math.MaxUint64
	}
	return p.opts.KeepFreeBytes
}

// unready counts the pages of [first, last] that are not mapped and idle:
// the pages a block there would have to map (or wait for).
func (a *arena) unready(first, last uint64) uint64 {
	var n uint64
	for w := first / 64; w <= last/64; w++ {
		m := wordMask(w, first, last)
		n += uint64(bits.OnesCount64(m &^ a.ready[w]))
	}
	return n
}

// preferMapped is called for a lean virtual arena when the strategy placed
// b (handle h; size bytes at align) over pages that are not all mapped. It
// gives b's range back and looks, among all free ranges (b's own, merged
// with its free neighbours, included), for the place that needs the fewest
// pages mapped: the fewest unmapped pages first, then the strategy's own
// choice, then the smallest free range, then the lowest offset. Best fit
// alone puts a block of a new size in the free range that fits it most
// tightly, wherever its pages are; when the sizes change from call to call
// (a batch or a sequence length per request) that is, more often than
// not, a range over pages unmapped earlier while free mapped pages lie
// elsewhere, and each such placement costs a page map (above the soft
// target, a move: an unmap and a map). The search visits the free ranges
// that can hold the block (through the strategy's size classes, not the
// blocks) and their runs of mapped pages a bitset word at a time; it runs
// only where best fit's choice needs pages. Called with p.mu held.
func (a *arena) preferMapped(b alloc.Block, h alloc.Handle, size, align uint64) (alloc.Block, alloc.Handle, error) {
	if a.pa == nil {
		return b, h, nil
	}
	if err := a.placeFree(b.Offset, h); err != nil {
		return b, h, err
	}
	return a.searchMapped(b.Offset, size, align)
}

// searchMapped is preferMapped for the strategy's choice at offset orig,
// found but not placed (alloc.BestFit.Find): it places the block where
// preferMapped would have. Called with p.mu held.
func (a *arena) searchMapped(orig, size, align uint64) (alloc.Block, alloc.Handle, error) {
	pa := a.pa
	ps := &a.search
	// Field by field: the composite literal was built aside and copied.
	ps.a, ps.size, ps.align, ps.orig, ps.ordered = a, size, align, orig, a.bf != nil
	ps.best, ps.bestCost, ps.bestRange, ps.bestStart, ps.s, ps.e = orig, math.MaxUint64, 0, 0, 0, 0
	if a.visit == nil {
		a.visit = ps.visit // bound once: a method value passed on escapes
	}
	pa.WalkFree(size, a.visit)
	var nb alloc.Block
	var nh alloc.Handle
	var err error
	if f, ok := a.fitIn(alloc.Segment{Offset: ps.bestStart, Size: ps.bestRange, Free: true}, ps.best, size); ok {
		nb, nh, err = a.bf.AllocFit(f)
	} else {
		nb, nh, err = pa.AllocHandleAt(ps.best, size)
	}
	if err != nil {
		// best lies in a free range (orig did a moment ago): this does
		// not happen. Place as the strategy would.
		nb, nh, err = a.place(size, align)
	}
	a.stale = true
	return nb, nh, err
}

// fitIn is best fit's FitIn (ok false for other strategies).
func (a *arena) fitIn(free alloc.Segment, off, size uint64) (alloc.Fit, bool) {
	if a.bf == nil {
		return alloc.Fit{}, false
	}
	return a.bf.FitIn(free, off, size)
}

// placeSearch is preferMapped's search, kept in the arena so that the
// walk allocates nothing: the free range being visited is [s, e).
// ordered says the allocator walks its free ranges by size, then offset
// (best fit): then, once a place needing no page is found, no later range
// can win the ties (smaller range, then lower offset; the strategy's own
// choice always needs a page), and the walk stops.
type placeSearch struct {
	a                         *arena
	size, align, orig         uint64
	best, bestCost, bestRange uint64
	bestStart                 uint64 // the free range holding best is [bestStart, bestStart+bestRange)
	s, e                      uint64
	ordered                   bool
}

// try considers placing the block at off in the free range [s, e).
func (ps *placeSearch) try(off uint64) {
	s, e := ps.s, ps.e
	if off < s || off+ps.size > e {
		return
	}
	a := ps.a
	first, last := a.pageOf(off), a.pageOf(off+ps.size-1)
	var c uint64
	if fw := first / 64; fw == last/64 { // unready's usual case: one word
		c = uint64(bits.OnesCount64(spanMask(first, last) &^ a.ready[fw]))
	} else {
		c = a.unready(first, last)
	}
	if c < ps.bestCost || c == ps.bestCost && ps.best != ps.orig &&
		(off == ps.orig || e-s < ps.bestRange || e-s == ps.bestRange && off < ps.best) {
		ps.best, ps.bestCost, ps.bestRange, ps.bestStart = off, c, e-s, s
	}
}

// visit tries the places in one free range that can need the fewest
// unmapped pages.
func (ps *placeSearch) visit(seg alloc.Segment) bool {
	s, e := seg.Offset, seg.Offset+seg.Size
	ps.s, ps.e = s, e
	size, align := ps.size, ps.align
	if s <= ps.orig && ps.orig+size <= e {
		ps.try(ps.orig)
	}
	// The lowest place: in best fit's own range it is orig (Find places
	// there), whose second try could not change the best.
	if lo := (s + align - 1) &^ (align - 1); lo != ps.orig {
		ps.try(lo)
	}
	if ps.ordered && ps.bestCost == 0 {
		// The range's lowest place needs no page (orig, tried first,
		// needs one): no later place, here or in a later range, wins.
		return false
	}
	ps.try((e - size) &^ (align - 1))
	// The fewest unmapped pages under a window slid over the range lie
	// with the window's start at the start of a run of ready pages, or
	// its end at the end of one.
	// (readyEdges, written out: a call through a closure per edge cost
	// more than the edge's try.)
	a := ps.a
	first, last := a.pageOf(s)+1, a.pageOf(e-1)
	for w := first / 64; first <= last && w <= last/64; w++ {
		d, x := a.edgeBits(w, first, last)
		for ; d != 0; d &= d - 1 {
			k := uint64(bits.TrailingZeros64(d))
			switch i := w*64 + k; {
			case x&(1<<k) != 0:
				ps.try((i*a.pageBytes + align - 1) &^ (align - 1))
			case i*a.pageBytes >= size:
				ps.try((i*a.pageBytes - size) &^ (align - 1))
			}
		}
	}
	return !ps.ordered || ps.bestCost != 0
}

// edgeBits returns the pages of [first, last] in word w of the ready set
// whose ready bit differs from page i-1's (bit k: page 64w+k), and the
// word itself: where a bit of x is set, a run of ready pages starts at the
// edge, else one ended there. It reads the ready set a word at a time, so
// long runs cost little. first must be at least 1.
func (a *arena) edgeBits(w, first, last uint64) (d, x uint64) {
	x = a.ready[w]
	// prev holds, at bit k, the ready bit of page 64w+k-1.
	prev := x << 1
	if w > 0 {
		prev |= a.ready[w-1] >> 63
	}
	return (x ^ prev) & wordMask(w, first, last), x
}
