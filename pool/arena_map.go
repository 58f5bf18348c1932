package pool

import (
	"errors"
	"fmt"

	"github.com/memwall/memwall/device"
)

// touch maps the pages under [off, off+size) of a virtual arena, whose
// range the allocator has just handed out, and keeps them from being
// unmapped while a block lies on them: a lean arena because the range is
// no longer free in the allocator, others by taking a reference on each
// page. On failure nothing stays referenced.
//
// Each run of unmapped pages under the block is mapped with one physical
// handle of the run's length (one create and one map, whatever its
// length), or, above the soft target, with free handles moved there from
// elsewhere in the arena (one unmap and one map each) and, for what they
// do not cover, a new handle paid for by releasing a free one (see
// planRun).
//
// Called with p.mu held, touch releases it while it waits for pages that
// another goroutine is mapping or unmapping, and while it makes its own
// device calls (a map costs tens of microseconds), so that other
// allocations go on meanwhile. Pages in flight are marked busy: nobody
// else maps, unmaps or takes them until the caller that marked them has
// relocked and settled them. Wait for busy pages happens before this call
// marks any page of its own, so two callers never wait for each other.
func (a *arena) touch(p *Pool, off, size uint64) error {
	first, last := a.pageOf(off), a.pageOf(off+size-1)
	if a.touched != nil {
		a.markTouched(first, last)
	}
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
	need := false
	for i := first; i <= last; i++ {
		pg := &a.pages[i]
		if pg.mapped {
			if !a.lean && a.isFree(i) {
				a.markUsed(i)
			}
		} else {
			pg.busy = true
			a.sync(i)
			need = true
		}
		if !a.lean {
			pg.refs++
		}
	}
	if !need {
		return nil
	}
	// The soft target and the handles' length count the block being
	// placed in the peak of use.
	pl := planner{peak: p.peakWith(size)}
	err := pl.plan(p, a, first, last)
	if err == nil {
		if pl.moves {
			p.moving.Add(1)
		}
		p.mu.Unlock()
		for k := range pl.steps {
			a.runStep(p, &pl.steps[k])
		}
		p.mu.Lock()
		if pl.moves {
			p.moving.Add(-1)
		}
	}
	failed := err != nil
	for k := range pl.steps {
		if !a.settle(p, &pl.steps[k]) && !failed {
			failed, err = true, pl.steps[k].err
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

// mapStep is one handle's worth of device calls: map n pages at first
// with a new handle (from < 0), or with the free handle whose first page
// is from in arena src (moved: unmapped there, mapped here); or, with
// release, unmap and release the free handle at first in src.
type mapStep struct {
	first, n uint64
	from     int64
	src      *arena
	release  bool
	h        device.PhysMem
	unmapped bool // the moved or released handle was unmapped
	created  bool // h was created here
	mapped   bool
	err      error
}

// planner collects the steps of one touch. releasing is the bytes of the
// handles its release steps give back, which the soft target counts as
// gone already; moves says whether any step unmaps (see Pool.moving).
type planner struct {
	steps     []mapStep
	releasing uint64
	moves     bool
	peak      uint64 // peak used bytes, the block being placed included
}

// plan plans the runs of unmapped pages in [first, last] (all marked
// busy by the caller). Called with p.mu held.
func (pl *planner) plan(p *Pool, a *arena, first, last uint64) error {
	for i := first; i <= last; {
		if a.pages[i].mapped {
			i++
			continue
		}
		j := i + 1
		for j <= last && !a.pages[j].mapped {
			j++
		}
		if err := pl.planRun(p, a, i, j-i); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// planRun plans mapping the n unmapped pages from first. Below the soft
// target they get a new handle. Above it, free handles that fit in the
// run are moved into it, the largest first (two calls each, no new
// memory); the rest gets a new handle, paid for by releasing the smallest
// free handle at least as long (two calls; the memory freed beyond the
// rest's length is what the target asked for anyway). Within the limit
// only (makeRoom).
//
// A pool that holds pages for its reclaimer does so while it is hot
// (hotNow): above the target it then moves only handles idle for a whole
// pass, which the reclaimer's next pass would give back anyway, and maps
// the rest with new memory; the reclaimer gives back what stays free
// beyond the target, off this goroutine.
func (pl *planner) planRun(p *Pool, a *arena, first, n uint64) error {
	pb := a.pageBytes
	hold := a.idle != nil && p.hotNow()
	for n > 0 {
		for n > 0 && a.overTarget(p, pl.peak, pb, pl.releasing) {
			sa, src, k, ok := takeFree(p, a, n, false, !hold)
			if !ok {
				break
			}
			pl.steps = append(pl.steps, mapStep{first: first, n: k, from: int64(src), src: sa})
			pl.moves = true
			first, n = first+k, n-k
		}
		if n == 0 {
			return nil
		}
		c := min(n, a.maxRun(p, pl.peak, hold))
		over := a.overTarget(p, pl.peak, c*pb, pl.releasing)
		if over && !hold {
			if sa, src, k, ok := takeFree(p, a, c, true, true); ok {
				pl.steps = append(pl.steps, mapStep{first: src, n: k, from: -1, src: sa, release: true})
				pl.releasing += k * pb
				pl.moves = true
			}
		}
		if err := a.makeRoom(p, c*pb); err != nil {
			return err
		}
		if over && hold {
			p.heldExtra.Add(c * pb)
		}
		p.inflight.Add(c * pb)
		pl.steps = append(pl.steps, mapStep{first: first, n: c, from: -1})
		first, n = first+c, n-c
	}
	return nil
}

// maxRun is the most pages one new handle covers. A handle goes back to
// the device only whole, so a long one that is partly in use pins memory
// that nobody uses: under a soft target, handles stay within half of the
// target's slack ((TargetRatio − 1) × peak used bytes; a single page for
// pools smaller than about 200 MiB at the default 1.02), so that pinned
// memory stays within what the target allows. With pages kept (no target)
// nothing is unmapped before a limit or Trim asks, and a handle covers its
// whole run (one create and one map for a block of any size), up to a
// sixteenth of the limit, so that memory pinned by partly used handles
// cannot starve a pool under a small limit, and up to KeepFreeBytes when
// that caps the free pages kept. A hot pool holding pages for its
// reclaimer (hold) maps as one that keeps its pages: the reclaimer gives
// back whole handles once idle.
func (a *arena) maxRun(p *Pool, peak uint64, hold bool) uint64 {
	n := max(1, p.limitBytes()/16/a.pageBytes)
	if k := p.opts.KeepFreeBytes; k != 0 {
		n = min(n, k/a.pageBytes)
	}
	if r := p.opts.TargetRatio; p.opts.hasTarget() && !hold {
		n = min(n, uint64((r-1)*float64(peak))/2/a.pageBytes)
	}
	return max(1, n)
}

// overTarget reports whether mapping extra more bytes would take the
// pool's reserved memory (less releasing, about to be released) above its
// soft target, TargetRatio × peak used bytes (memory reserved by the
// warm-up is never counted against it). Called with p.mu held.
func (a *arena) overTarget(p *Pool, peak, extra, releasing uint64) bool {
	r := p.opts.TargetRatio
	if !p.opts.hasTarget() {
		return false
	}
	target := max(uint64(r*float64(peak)), p.opts.Warmup)
	return p.reserved.Load()+p.inflight.Load()+extra-releasing > target
}

// takeFree picks a free handle for a step above the soft target, in
// arena a or another virtual arena of the pool (physical memory moves
// between the ranges: the small-block range's pages pay for the main
// range's and the other way round), and marks its pages used and busy: to
// move, the longest of at most n pages; to release, the shortest of at
// least n pages (a's first, then the highest among equals). Unless any is
// set, only handles idle for a whole pass of the reclaimer count. Called
// with p.mu held.
func takeFree(p *Pool, a *arena, n uint64, release, any bool) (sa *arena, head, k uint64, ok bool) {
	if p.moving.Load() > 0 {
		// Another goroutine is moving pages now, outside the lock. The
		// driver serializes such calls, and goroutines that queued
		// behind each other's moves made the default pool collapse
		// under concurrent load of random sizes (BENCHMARKS.md). Take
		// new memory instead, within the limit: the pool then grows
		// toward what the concurrent load needs and stops mapping. One
		// goroutine alone never gets here, so sequential workloads (the
		// replays) are unchanged.
		return nil, 0, 0, false
	}
	look := func(b *arena) {
		if !b.virtual || b.pageBytes != a.pageBytes {
			return
		}
		if b.freshen(); b.freePages == 0 {
			return
		}
		b.freeHandles(func(h, hk uint64) bool {
			if !any && b.idle != nil && !b.idleRun(h, hk) {
				return true // freed since the reclaimer's last pass: held for reuse
			}
			if release && hk >= n && (!ok || hk < k) || !release && hk <= n && hk > k {
				sa, head, k, ok = b, h, hk, true
			}
			return release || k < n
		})
	}
	look(a)
	for _, b := range p.arenas {
		if b != a && (release || k < n) {
			look(b)
		}
	}
	if !ok {
		return nil, 0, 0, false
	}
	for j := head; j < head+k; j++ {
		sa.markUsed(j)
		sa.pages[j].busy = true
		sa.sync(j)
	}
	return sa, head, k, true
}

// freeHandles calls fn with the first page and length of each handle
// whose pages are all free, highest first, until fn returns false.
func (a *arena) freeHandles(fn func(head, n uint64) bool) {
	for i := int64(a.freeTop) - 1; i >= 0; {
		w := uint64(i) / 64
		if a.freeSet[w] == 0 {
			i = int64(w*64) - 1
			continue
		}
		if !a.isFree(uint64(i)) {
			i--
			continue
		}
		// Seen from above, a free page that is not its handle's last
		// means a page above it in the handle is in use.
		pg := &a.pages[i]
		h, n := uint64(pg.head), uint64(pg.n)
		if h+n-1 == uint64(i) && a.allFree(h, uint64(i)) && !fn(h, n) {
			return
		}
		i = int64(h) - 1
	}
}

// allFree reports whether pages [first, last] are all in the free set.
func (a *arena) allFree(first, last uint64) bool {
	for w := first / 64; w <= last/64; w++ {
		if m := wordMask(w, first, last); a.freeSet[w]&m != m {
			return false
		}
	}
	return true
}

// makeRoom makes sure bytes more fit under the limit, releasing free
// handles if it must. Called with p.mu held.
func (a *arena) makeRoom(p *Pool, bytes uint64) error {
	if p.reserved.Load()+p.inflight.Load()+bytes <= p.limitBytes() {
		return nil
	}
	a.shrink(p, 0)
	if p.reserved.Load()+p.inflight.Load()+bytes > p.limitBytes() {
		return errLimit
	}
	return nil
}

// runStep makes the device calls of one step. Called without p.mu: the
// pages involved are busy, so only this goroutine touches them.
func (a *arena) runStep(p *Pool, st *mapStep) {
	size := st.n * a.pageBytes
	switch {
	case st.release:
		sa := st.src
		h := sa.pages[st.first].h
		if err := p.dev.Unmap(sa.va(st.first), size); err != nil {
			st.err = fmt.Errorf("unmap %d bytes at %#x: %w", size, uint64(sa.va(st.first)), err)
			return
		}
		st.unmapped = true
		if err := p.dev.ReleasePhysical(h); err != nil {
			p.logf("release %d bytes: %v", size, err)
		}
		return
	case st.from >= 0:
		sa, src := st.src, uint64(st.from)
		if err := p.dev.Unmap(sa.va(src), size); err != nil {
			st.err = fmt.Errorf("unmap %d bytes at %#x: %w", size, uint64(sa.va(src)), err)
			return
		}
		st.unmapped, st.h = true, sa.pages[src].h
	default:
		h, err := p.dev.CreatePhysical(size)
		if err != nil {
			st.err = fmt.Errorf("create %d-byte handle: %w", size, err)
			return
		}
		st.h, st.created = h, true
	}
	if err := p.dev.Map(a.va(st.first), size, st.h); err != nil {
		st.err = fmt.Errorf("map %d bytes at %#x: %w", size, uint64(a.va(st.first)), err)
		return
	}
	st.mapped = true
}

// settle records the outcome of a step (with p.mu held again) and reports
// whether its pages are mapped (a release step always reports true: its
// failure loses nothing). A run whose new handle the device refused gets
// one more try after releasing the free handles, as before growth failed.
func (a *arena) settle(p *Pool, st *mapStep) bool {
	if st.release || st.from >= 0 {
		sa, src := st.src, st.first
		if !st.release {
			src = uint64(st.from)
		}
		for j := src; j < src+st.n; j++ {
			sa.pages[j].busy = false
			sa.sync(j)
		}
		if !st.unmapped {
			// Still mapped: free again, unless (lean) a block now lies
			// on it.
			if sa.lean {
				sa.stale = true
			} else {
				for j := src; j < src+st.n; j++ {
					sa.markFree(j)
				}
			}
			if st.release {
				return true
			}
			if st.err == nil {
				st.err = errLimit // planned, never run: another step failed first
			}
			return false
		}
		p.unmaps.Add(1)
		sa.clearPages(p, src, st.n)
		if st.release {
			p.devFrees.Add(1)
			return true
		}
	} else {
		p.inflight.Add(^(st.n*a.pageBytes - 1))
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
			// The device refused a new handle: try once more, after
			// releasing free handles, synchronously (this is the
			// out-of-memory path).
			a.shrink(p, 0)
			if a.newRun(p, st.first, st.n) == nil {
				return true
			}
		}
		if st.err == nil {
			st.err = errLimit
		}
		return false
	}
	p.maps.Add(1)
	a.setMapped(p, st.first, st.n, st.h)
	return true
}

// setMapped records handle h mapped over pages [first, first+n).
func (a *arena) setMapped(p *Pool, first, n uint64, h device.PhysMem) {
	for j := first; j < first+n; j++ {
		pg := &a.pages[j]
		pg.h, pg.mapped, pg.head, pg.n = h, true, uint32(first), uint32(n)
		a.sync(j)
	}
	a.mappedTop = max(a.mappedTop, first+n)
	a.mapped += n * a.pageBytes
	p.addReserved(n * a.pageBytes)
}

// clearPages records the handle over pages [first, first+n) unmapped.
func (a *arena) clearPages(p *Pool, first, n uint64) {
	for j := first; j < first+n; j++ {
		a.pages[j] = page{}
		a.sync(j)
	}
	a.mapped -= n * a.pageBytes
	p.reserved.Add(^(n*a.pageBytes - 1))
}

// newRun maps a new handle over the n pages from first, within the limit;
// when the device refuses the allocation, free handles are released and
// it is tried once more. Called with p.mu held (warm-up, and the
// out-of-memory retry of touch).
func (a *arena) newRun(p *Pool, first, n uint64) error {
	size := n * a.pageBytes
	if err := a.makeRoom(p, size); err != nil {
		return err
	}
	h, err := p.dev.CreatePhysical(size)
	if err != nil {
		a.shrink(p, 0)
		if h, err = p.dev.CreatePhysical(size); err != nil {
			return fmt.Errorf("create %d-byte handle: %w", size, err)
		}
	}
	p.devAllocs.Add(1)
	if err := p.dev.Map(a.va(first), size, h); err != nil {
		_ = p.dev.ReleasePhysical(h)
		p.devFrees.Add(1)
		return fmt.Errorf("map %d bytes at %#x: %w", size, uint64(a.va(first)), err)
	}
	p.maps.Add(1)
	a.setMapped(p, first, n, h)
	return nil
}

// shrink releases free handles, highest first, until at most keep bytes
// of free mapped pages remain (or no handle is entirely free), and
// returns the bytes released.
func (a *arena) shrink(p *Pool, keep uint64) uint64 {
	if a.freshen(); a.freePages <= keep {
		return 0
	}
	var hs [][2]uint64
	a.freeHandles(func(h, n uint64) bool {
		hs = append(hs, [2]uint64{h, n})
		return true
	})
	var released uint64
	for _, hn := range hs {
		if a.freePages <= keep {
			break
		}
		h, n := hn[0], hn[1]
		size := n * a.pageBytes
		for j := h; j < h+n; j++ {
			a.markUsed(j)
		}
		if err := p.dev.Unmap(a.va(h), size); err != nil {
			p.logf("unmap %d bytes at %#x: %v", size, uint64(a.va(h)), err)
			for j := h; j < h+n && !a.lean; j++ {
				a.markFree(j)
			}
			a.stale = a.lean
			continue
		}
		p.unmaps.Add(1)
		if err := p.dev.ReleasePhysical(a.pages[h].h); err != nil {
			p.logf("release %d bytes at %#x: %v", size, uint64(a.va(h)), err)
		}
		p.devFrees.Add(1)
		a.clearPages(p, h, n)
		released += size
	}
	return released
}
