package pool

import (
	"errors"
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
	ha   alloc.HandleAllocator
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
}

type page struct {
	h      device.PhysMem
	mapped bool
	busy   bool // a goroutine is mapping or unmapping it (without p.mu)
	refs   int32
}

// pageOf returns the index of the page holding offset off (a shift for
// the usual power-of-two page size: this runs on every allocation).
func (a *arena) pageOf(off uint64) uint64 {
	if a.pageShift != 0 {
		return off >> a.pageShift
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
	a.ha, _ = al.(alloc.HandleAllocator)
	a.lean = a.ha != nil
	if o.PageBytes&(o.PageBytes-1) == 0 {
		a.pageShift = uint(bits.TrailingZeros64(o.PageBytes))
	}
	return a, nil
}

// newChunk obtains a chunk of size bytes from the device.
func (p *Pool) newChunk(size uint64) (*arena, error) {
	al, err := alloc.New(p.opts.Strategy, size)
	if err != nil {
		return nil, err
	}
	a := &arena{size: size, alloc: al}
	a.ha, _ = al.(alloc.HandleAllocator)
	if p.host {
		hb, err := p.dev.HostAlloc(size)
		if err != nil {
			return nil, err
		}
		a.hostBuf, a.host, a.base = hb, hb.Bytes, hb.DevicePtr
	} else {
		ptr, err := p.devAlloc(size)
		if err != nil {
			return nil, err
		}
		a.base = ptr
	}
	p.devAllocs.Add(1)
	p.addReserved(size)
	return a, nil
}

func (p *Pool) addReserved(n uint64) {
	updateMax(&p.peakReserved, p.reserved.Add(n))
}

// touch maps the pages under [off, off+size) of a virtual arena, whose
// range the allocator has just handed out, and keeps them from being
// unmapped while a block lies on them: a lean arena because the range is
// no longer free in the allocator, others by taking a reference on each
// page. On failure nothing stays referenced.
//
// Called with p.mu held, touch releases it while it waits for pages that
// another goroutine is mapping or unmapping, and while it makes its own
// device calls (a page map costs tens of microseconds), so that other
// allocations go on meanwhile. Pages in flight are marked busy: nobody
// else maps, unmaps or steals them until the caller that marked them has
// relocked and settled them. Wait for busy pages happens before this call
// marks any page of its own, so two callers never wait for each other.
func (a *arena) touch(p *Pool, off, size uint64) error {
	first, last := a.pageOf(off), a.pageOf(off+size-1)
	if a.lean && a.allReady(first, last) {
		a.stale = true
		return nil
	}
	for a.anyBusy(first, last) {
		p.cond.Wait()
	}
	// Reference the mapped pages (lean: the free set is now stale), and
	// claim the unmapped ones.
	a.stale = a.lean
	need := 0
	for i := first; i <= last; i++ {
		pg := &a.pages[i]
		if pg.mapped {
			if !a.lean && a.isFree(i) {
				a.markUsed(i)
			}
		} else {
			pg.busy = true
			a.sync(i)
			need++
		}
		if !a.lean {
			pg.refs++
		}
	}
	if need == 0 {
		return nil
	}
	// Plan where each page's memory comes from: above the soft target,
	// the highest free page's (one unmap, one map); otherwise a new
	// allocation, within the limit.
	plan := make([]mapStep, 0, need)
	var err error
	moves := false
	for i := first; i <= last && err == nil; i++ {
		if a.pages[i].mapped {
			continue
		}
		st := mapStep{page: i, from: -1}
		if src, ok := a.stealSource(p); ok {
			st.from, moves = int64(src), true
		} else if err = a.makeRoom(p); err == nil {
			p.inflight += a.pageBytes
		}
		if err == nil {
			plan = append(plan, st)
		}
	}
	if err == nil {
		if moves {
			p.moving++
		}
		p.mu.Unlock()
		for k := range plan {
			a.runStep(p, &plan[k])
		}
		p.mu.Lock()
		if moves {
			p.moving--
		}
	}
	failed := err != nil
	for k := range plan {
		if !a.settle(p, &plan[k]) && !failed {
			failed, err = true, plan[k].err
		}
	}
	for i := first; i <= last; i++ {
		a.pages[i].busy = false
		a.sync(i)
	}
	p.cond.Broadcast()
	if failed {
		// Lean arenas hold no references: the caller frees the range
		// (placeFree), which leaves the free set stale.
		for i := first; i <= last && !a.lean; i++ {
			a.unref(p, i)
		}
		return err
	}
	return nil
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
		m &= ^uint64(0) >> (63 - last%64)
	}
	return m
}

// allReady reports whether pages [first, last] are all mapped and none is
// busy.
func (a *arena) allReady(first, last uint64) bool {
	if fw := first / 64; fw == last/64 { // the usual case: one word
		m := ^uint64(0) << (first % 64) & (^uint64(0) >> (63 - last%64))
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
	a.alloc.Walk(func(s alloc.Segment) bool {
		if s.Free {
			a.addFree(a.pageOf(s.Offset+pb-1), a.pageOf(s.Offset+s.Size))
		}
		return true
	})
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

// mapStep is one page to map: with memory stolen from page from (≥ 0), or
// with a new physical allocation (from < 0).
type mapStep struct {
	page     uint64
	from     int64
	h        device.PhysMem
	unmapped bool // the stolen page was unmapped
	created  bool // h was created here
	mapped   bool
	err      error
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

// stealSource picks the page whose memory a new mapping takes when the
// pool is at its soft target: the highest free page, marked busy. Called
// with p.mu held.
func (a *arena) stealSource(p *Pool) (uint64, bool) {
	r := p.opts.TargetRatio
	if r <= 0 {
		return 0, false
	}
	// Memory reserved by the warm-up is never counted against the target.
	target := max(uint64(r*float64(p.peakUsed.Load())), p.opts.Warmup)
	if p.reserved.Load()+p.inflight+a.pageBytes <= target {
		return 0, false
	}
	if p.moving > 0 {
		// Another goroutine is moving pages now, outside the lock. The
		// driver serializes such calls, and goroutines that queued
		// behind each other's moves made the default pool collapse
		// under concurrent load of random sizes (BENCHMARKS.md). Take
		// new memory instead, within the limit: the pool then grows
		// toward what the concurrent load needs and stops mapping. One
		// goroutine alone never gets here, so sequential workloads (the
		// replays) are unchanged.
		return 0, false
	}
	if a.freshen(); a.freePages == 0 {
		return 0, false
	}
	i, ok := a.highestFree()
	if !ok {
		return 0, false
	}
	a.markUsed(i)
	a.pages[i].busy = true
	a.sync(i)
	return i, true
}

// makeRoom makes sure one more page fits under the limit, unmapping free
// pages if it must. Called with p.mu held.
func (a *arena) makeRoom(p *Pool) error {
	if p.reserved.Load()+p.inflight+a.pageBytes <= p.opts.Limit {
		return nil
	}
	a.shrink(p, 0)
	if p.reserved.Load()+p.inflight+a.pageBytes > p.opts.Limit {
		return errLimit
	}
	return nil
}

// runStep makes the device calls of one step. Called without p.mu: the
// pages involved are busy, so only this goroutine touches them.
func (a *arena) runStep(p *Pool, st *mapStep) {
	if st.from >= 0 {
		src := uint64(st.from)
		if err := p.dev.Unmap(a.va(src), a.pageBytes); err != nil {
			st.err = fmt.Errorf("unmap page at %#x: %w", uint64(a.va(src)), err)
			return
		}
		st.unmapped, st.h = true, a.pages[src].h
	} else {
		h, err := p.dev.CreatePhysical(a.pageBytes)
		if err != nil {
			st.err = fmt.Errorf("create %d-byte page: %w", a.pageBytes, err)
			return
		}
		st.h, st.created = h, true
	}
	if err := p.dev.Map(a.va(st.page), a.pageBytes, st.h); err != nil {
		st.err = fmt.Errorf("map page at %#x: %w", uint64(a.va(st.page)), err)
		return
	}
	st.mapped = true
}

// settle records the outcome of a step (with p.mu held again) and reports
// whether its page is mapped. A page whose new allocation the device
// refused gets one more try after unmapping the free pages, as before
// growth failed.
func (a *arena) settle(p *Pool, st *mapStep) bool {
	pg := &a.pages[st.page]
	if st.from >= 0 {
		src := uint64(st.from)
		sp := &a.pages[src]
		sp.busy = false
		a.sync(src)
		if !st.unmapped {
			if st.err == nil {
				st.err = errLimit // planned, never run: another step failed first
			}
			if a.lean {
				a.stale = true // still mapped: free again, unless a block now lies on it
			} else {
				a.markFree(src) // still mapped: free again
			}
			return false
		}
		p.unmaps.Add(1)
		*sp = page{}
		a.sync(src)
		a.mapped -= a.pageBytes
		p.reserved.Add(^(a.pageBytes - 1))
	} else {
		p.inflight -= a.pageBytes
		if st.created {
			p.devAllocs.Add(1)
		}
	}
	if !st.mapped {
		if st.unmapped || st.created {
			_ = p.dev.ReleasePhysical(st.h)
			p.devFrees.Add(1)
		}
		if st.from < 0 && !st.created && errors.Is(st.err, device.ErrOutOfMemory) {
			// The device refused a new page: try once more, after
			// unmapping free pages, synchronously (this is the
			// out-of-memory path).
			a.shrink(p, 0)
			if a.newPage(p, st.page) == nil {
				return true
			}
		}
		if st.err == nil {
			st.err = errLimit
		}
		return false
	}
	p.maps.Add(1)
	pg.h, pg.mapped = st.h, true
	a.sync(st.page)
	a.mappedTop = max(a.mappedTop, st.page+1)
	a.mapped += a.pageBytes
	p.addReserved(a.pageBytes)
	return true
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

// highestFree returns the highest free page, scanning down from freeTop.
func (a *arena) highestFree() (uint64, bool) {
	for w := int((a.freeTop+63)/64) - 1; w >= 0; w-- {
		if x := a.freeSet[w]; x != 0 {
			i := uint64(w)*64 + uint64(63-bits.LeadingZeros64(x))
			a.freeTop = i + 1
			return i, true
		}
	}
	a.freeTop = 0
	return 0, false
}

// newPage maps a newly allocated physical page at page i, within the
// limit; when the device refuses the allocation, free pages are unmapped
// and it is tried once more. Called with p.mu held (warm-up, and the
// out-of-memory retry of touch).
func (a *arena) newPage(p *Pool, i uint64) error {
	if err := a.makeRoom(p); err != nil {
		return err
	}
	h, err := p.dev.CreatePhysical(a.pageBytes)
	if err != nil {
		a.shrink(p, 0)
		if h, err = p.dev.CreatePhysical(a.pageBytes); err != nil {
			return fmt.Errorf("create %d-byte page: %w", a.pageBytes, err)
		}
	}
	p.devAllocs.Add(1)
	return a.mapHandle(p, i, h)
}

// mapHandle maps the physical page h at page i. On failure h is released.
func (a *arena) mapHandle(p *Pool, i uint64, h device.PhysMem) error {
	va := a.base + device.Ptr(i*a.pageBytes)
	if err := p.dev.Map(va, a.pageBytes, h); err != nil {
		_ = p.dev.ReleasePhysical(h)
		p.devFrees.Add(1)
		return fmt.Errorf("map page at %#x: %w", uint64(va), err)
	}
	p.maps.Add(1)
	pg := &a.pages[i]
	pg.h, pg.mapped = h, true
	a.sync(i)
	a.mappedTop = max(a.mappedTop, i+1)
	a.mapped += a.pageBytes
	p.addReserved(a.pageBytes)
	return nil
}

// shrink unmaps free pages, highest address first, until at most keep bytes
// of free mapped pages remain.
func (a *arena) shrink(p *Pool, keep uint64) uint64 {
	var released uint64
	a.freshen()
	for a.freePages > keep {
		i, ok := a.highestFree()
		if !ok {
			break
		}
		a.markUsed(i)
		pg := &a.pages[i]
		va := a.base + device.Ptr(i*a.pageBytes)
		if err := p.dev.Unmap(va, a.pageBytes); err != nil {
			p.logf("unmap page at %#x: %v", uint64(va), err)
			continue
		}
		p.unmaps.Add(1)
		if err := p.dev.ReleasePhysical(pg.h); err != nil {
			p.logf("release page at %#x: %v", uint64(va), err)
		}
		p.devFrees.Add(1)
		*pg = page{}
		a.sync(i)
		a.mapped -= a.pageBytes
		p.reserved.Add(^(a.pageBytes - 1))
		released += a.pageBytes
	}
	return released
}

// place allocates size bytes at the alignment from the arena's
// allocator, by handle where it has them.
func (a *arena) place(size, align uint64) (alloc.Block, alloc.Handle, error) {
	if a.ha != nil {
		return a.ha.AllocHandle(size, align)
	}
	b, err := a.alloc.Alloc(size, align)
	return b, 0, err
}

// placeFree returns a range from place to the allocator (a lean arena's
// free set is then stale). The caller accounts for the block (released
// does, for a block handed out).
func (a *arena) placeFree(off uint64, h alloc.Handle) error {
	if a.ha == nil {
		return a.alloc.Free(off)
	}
	_, err := a.ha.FreeHandle(h, off)
	a.stale = a.stale || a.lean
	return err
}

// released is called after a block's range went back to the allocator
// (placeFree).
func (a *arena) released(p *Pool, off, size uint64) {
	a.live--
	a.held -= size
	p.held -= size
	if !a.virtual {
		return
	}
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
		for i := range a.pages {
			pg := &a.pages[i]
			if !pg.mapped {
				continue
			}
			va := a.base + device.Ptr(uint64(i)*a.pageBytes)
			keep(p.dev.Unmap(va, a.pageBytes))
			keep(p.dev.ReleasePhysical(pg.h))
			p.unmaps.Add(1)
			p.devFrees.Add(1)
			p.reserved.Add(^(a.pageBytes - 1))
			*pg = page{}
			a.sync(uint64(i))
		}
		a.mapped = 0
		keep(p.dev.Unreserve(a.base, a.size))
		return first
	}
	if a.hostBuf != nil {
		keep(p.dev.HostFree(a.hostBuf))
	} else {
		keep(p.dev.Free(a.base))
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
