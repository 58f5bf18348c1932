package pool

import (
	"errors"
	"fmt"
	"math/bits"
	"strings"

	"github.com/memwall/memwall/alloc"
	"github.com/memwall/memwall/device"
)

// Causes of an allocation failure.
const (
	CauseQuota         = "tenant quota"
	CauseLimit         = "pool limit"
	CauseFragmentation = "fragmentation"
	CauseDevice        = "device out of memory"
)

var errLimit = errors.New("pool limit reached")

// OOMError explains a failed allocation with the numbers behind it.
type OOMError struct {
	Pool      string
	Tenant    string
	Requested uint64
	Align     uint64
	// Quota and TenantUsed are set when a tenant's quota refused it.
	Quota, TenantUsed uint64
	// Pool-wide numbers at the time of failure.
	Limit, Reserved, Used, Free, LargestFree uint64
	Fragmentation                            float64
	// Cause is one of CauseQuota, CauseLimit, CauseFragmentation, CauseDevice.
	Cause string
	// Tried lists what the pool did before giving up.
	Tried []string
	// Err is the device's error, when the device refused memory.
	Err error
	// Snapshot is the pool's memory at the failure (trace.WriteSnapshot
	// writes it for memwall replay --html); nil for a tenant's quota.
	Snapshot *Snapshot
}

func (e *OOMError) Error() string {
	var b strings.Builder
	if e.Pool != "" {
		fmt.Fprintf(&b, "%s: ", poolLabel(e.Pool))
	}
	fmt.Fprintf(&b, "cannot allocate %d bytes", e.Requested)
	if e.Tenant != "" {
		fmt.Fprintf(&b, " for tenant %q", e.Tenant)
	}
	fmt.Fprintf(&b, ": %s", e.Cause)
	switch e.Cause {
	case CauseQuota:
		fmt.Fprintf(&b, " (tenant uses %d of %d bytes)", e.TenantUsed, e.Quota)
	default:
		fmt.Fprintf(&b, " (limit %d, reserved %d, used %d, free in pool %d, largest free %d, fragmentation factor %.2f)",
			e.Limit, e.Reserved, e.Used, e.Free, e.LargestFree, e.Fragmentation)
	}
	if len(e.Tried) > 0 {
		fmt.Fprintf(&b, "; tried: %s", strings.Join(e.Tried, ", "))
	}
	if e.Err != nil {
		fmt.Fprintf(&b, "; device: %v", e.Err)
	}
	return b.String()
}

// Is makes errors.Is(err, ErrOutOfMemory) true.
func (e *OOMError) Is(target error) bool { return target == ErrOutOfMemory }

// Unwrap returns the device error, if any.
func (e *OOMError) Unwrap() error { return e.Err }

// slowAlloc allocates outside the processor caches, first giving the
// chain parked (blocks the caller took from its processor's cache) back to
// the arenas.
func (p *Pool) slowAlloc(size, align uint64, s device.Stream, purpose Purpose, t *Tenant, parked *meta) (*meta, error) {
	if s == 0 && p.shards != nil {
		m, sh, err := p.shardAlloc(size, align, purpose, parked)
		if err != nil {
			return nil, err
		}
		defer sh.mu.Unlock()
		m.assign(size, purpose, t)
		sh.central.add(m)
		return m, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock() // also on a panic, so that Close cannot wedge on the lock
	if parked != nil {
		p.releaseList(parked)
	}
	var m *meta
	if s != 0 {
		if l := p.pending[s]; l != nil {
			if m = l.take(size, align); m != nil {
				p.pendingBytes.Add(^(m.size - 1))
			}
		}
	}
	if m == nil {
		var err error
		if m, err = p.arenaAlloc(size, align, s, purpose); err != nil {
			return nil, err
		}
	}
	m.assign(size, purpose, t)
	p.central.add(m)
	return m, nil
}

// tryArenas places a block in the existing arenas without growing. It
// returns (nil, nil) when nothing fits. Called with p.mu held.
func (p *Pool) tryArenas(size, align uint64) (*meta, error) {
	// Blocks are whole multiples of the pool's alignment, so the range
	// after one starts aligned: an odd size would leave every following
	// placement a sliver of alignment padding (a free range of its own).
	size = (size + p.opts.Alignment - 1) &^ (p.opts.Alignment - 1)
	if align == p.opts.Alignment {
		if m, err := p.placeDirect(size); m != nil || err != nil {
			return m, err
		}
		if p.smallFit != nil && size <= p.smallMax {
			if m, err := p.placeFit(p.smallFit, size); m != nil || err != nil {
				return m, err
			}
		}
	}
	arenas := p.arenas
	if len(arenas) == 2 && arenas[1].virtual {
		// A virtual pool keeps small blocks in a range of their own so they
		// pin no pages among the large ones; they spill into the main range
		// only when their own is full. Large blocks never go there.
		if size <= p.smallMax {
			arenas = []*arena{arenas[1], arenas[0]}
		} else {
			arenas = arenas[:1]
		}
	}
	for _, a := range arenas {
		if !a.virtual && a.size-a.held < size {
			continue // cannot fit: skip without asking the allocator
		}
		// The allocator aligns offsets; the address is base+offset, so a
		// chunk whose base is less aligned than asked for gets a block
		// with slack, and the handed-out address is shifted into it.
		want, slack := align, uint64(0)
		if base := uint64(a.ptr(0)); base != 0 && base&(align-1) != 0 {
			want = base & -base // the base's own alignment
			slack = align - want
		}
		b, h, err := a.place(size+slack, want)
		// Move the frontier up by what the request needs; a strategy
		// that places blocks at aligned offsets (buddy) may need more, so
		// try twice and four times that before giving up.
		for k := uint64(1); err != nil && k <= 4 && a.virtual && errors.Is(err, alloc.ErrOutOfMemory) && a.alloc.Capacity() < a.size; k *= 2 {
			grow := min(a.size, roundUp(a.alloc.Capacity()+k*(size+align), a.pageBytes))
			if gerr := a.alloc.Grow(grow); gerr != nil {
				break
			}
			// The same request as the first try: the slack is what lets
			// the shift below land the block inside what was placed.
			b, h, err = a.place(size+slack, want)
		}
		if err != nil {
			if errors.Is(err, alloc.ErrOutOfMemory) || errors.Is(err, alloc.ErrTooLarge) {
				continue
			}
			return nil, err
		}
		searched := false
		if a.virtual {
			first, last := a.pageOf(b.Offset), a.pageOf(b.Offset+b.Size-1)
			ready := a.lean && a.allReady(first, last)
			if a.lean && !ready && p.opts.Placement == PlaceMapped {
				if b, h, err = a.preferMapped(b, h, size+slack, want); err != nil {
					return nil, err
				}
				searched = true
			}
			if ready { // touch, for pages all mapped: nothing to wait for or map
				if a.touched != nil {
					a.markTouched(first, last)
				}
				a.stale = true
			} else if err := a.touch(p, b.Offset, b.Size); err != nil {
				_ = a.placeFree(b.Offset, h)
				return nil, err
			}
		}
		var shift uint64
		if slack != 0 {
			shift = (align - (uint64(a.ptr(b.Offset)) % align)) % align
		}
		m := p.placed(a, b, h, shift)
		m.paged = searched
		return m, nil
	}
	return nil, nil
}

// placeDirect places a large block of size bytes (a multiple of the pool's
// alignment) at the pool's alignment in the main range of a virtual pool
// (Pool.direct, whose base is aligned for it), mapping pages if it must.
// It returns (nil, nil) when the pool has no such range, the block is
// small, or nothing fits below the range's frontier: tryArenas's loop
// handles those. Called with p.mu held.
func (p *Pool) placeDirect(size uint64) (*meta, error) {
	a := p.direct
	if a == nil || size <= p.smallMax {
		return nil, nil
	}
	if a.bf != nil {
		return p.placeFit(a, size)
	}
	b, h, err := a.place(size, p.opts.Alignment)
	if err != nil {
		return nil, nil
	}
	searched := false
	if !a.allReady(a.pageOf(b.Offset), a.pageOf(b.Offset+b.Size-1)) {
		if p.opts.Placement == PlaceMapped {
			if b, h, err = a.preferMapped(b, h, size, p.opts.Alignment); err != nil {
				return nil, err
			}
			searched = true
		}
		if err := a.touch(p, b.Offset, b.Size); err != nil {
			_ = a.placeFree(b.Offset, h)
			return nil, err
		}
	} else if a.touched != nil {
		a.markTouched(a.pageOf(b.Offset), a.pageOf(b.Offset+b.Size-1))
	}
	a.stale = true
	m := p.placed(a, b, h, 0)
	m.paged = searched
	return m, nil
}

// placeFit is placeDirect for a range a over best fit, also serving the
// small-block range (Pool.smallFit): it looks at best fit's place (Find)
// before taking it, and where its pages are not all ready it searches for
// mapped pages from there (searchMapped) without placing and freeing it
// first, as placeDirect's place and preferMapped would; the block lands
// where theirs would. It returns (nil, nil) when nothing fits below the
// range's frontier. Called with p.mu held.
func (p *Pool) placeFit(a *arena, size uint64) (*meta, error) {
	align := p.opts.Alignment
	f, ok := a.bf.Find(size, align)
	if !ok {
		return nil, nil
	}
	var b alloc.Block
	var h alloc.Handle
	var err error
	searched := false
	first, last := a.pageOf(f.Offset), a.pageOf(f.Offset+size-1)
	ready := false
	if fw := first / 64; fw == last/64 { // allReady's usual case, without its call
		m := spanMask(first, last)
		ready = a.ready[fw]&m == m
	} else {
		ready = a.allReady(first, last)
	}
	if ready {
		if b, h, err = a.bf.AllocFit(f); err != nil {
			return nil, err
		}
		if a.touched != nil {
			a.markTouched(first, last)
		}
	} else {
		if p.opts.Placement == PlaceMapped {
			b, h, err = a.searchMapped(f.Offset, size, align)
			searched = true
		} else {
			b, h, err = a.bf.AllocFit(f)
		}
		if err != nil {
			return nil, err
		}
		if err := a.touch(p, b.Offset, b.Size); err != nil {
			_ = a.placeFree(b.Offset, h)
			return nil, err
		}
	}
	a.stale = true
	m := p.placed(a, b, h, 0)
	m.paged = searched
	return m, nil
}

// rescueLarge follows largeIn for the large blocks of Alloc's plain path
// when shard s, whose lock largeIn released, could not place the block
// (err): with shards, another shard may (rescue).
func (p *Pool) rescueLarge(s *Pool, size uint64, purpose Purpose, err error) (*meta, error) {
	if p.shards == nil || !errors.Is(err, ErrOutOfMemory) {
		return nil, err
	}
	m, s, err := p.rescue(size, p.opts.Alignment, purpose, s)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	p.balance(s)
	m.assign(size, purpose, nil)
	s.central.add(m)
	return m, nil
}

// largeIn is slowAlloc for the large blocks of Alloc's plain path, in
// shard s of the processor just pinned and unpinned, whose lock the
// caller holds and largeIn releases (also on a panic, so that Close
// cannot wedge on it): it gives the chain parked back, then places the
// block, directly where it can.
func (p *Pool) largeIn(s *Pool, size uint64, purpose Purpose, parked *meta) (*meta, error) {
	defer s.mu.Unlock()
	s.releaseList(parked)
	// tryArenas's first steps, taken here: a small block (SmallMax) goes
	// to the small-block range, a large one to the main range, each
	// looked at once.
	var m *meta
	var err error
	if rounded := (size + p.opts.Alignment - 1) &^ (p.opts.Alignment - 1); rounded > s.smallMax {
		if a := s.direct; a != nil && a.bf != nil {
			m, err = s.placeFit(a, rounded) // placeDirect's first step, without its call
		} else {
			m, err = s.placeDirect(rounded)
		}
	} else if s.smallFit != nil {
		m, err = s.placeFit(s.smallFit, rounded)
	}
	if m == nil {
		if err != nil {
			m, err = s.arenaRetry(size, p.opts.Alignment, 0, purpose, err)
		} else {
			m, err = s.arenaAlloc(size, p.opts.Alignment, 0, purpose)
		}
		if err != nil {
			return nil, err
		}
	}
	p.balance(s)
	m.assign(size, purpose, nil)
	s.central.add(m)
	return m, nil
}

// placed records block b (allocator handle h) just placed in arena a,
// handed out shift bytes into its range, and returns its meta. Called with
// p.mu held.
func (p *Pool) placed(a *arena, b alloc.Block, h alloc.Handle, shift uint64) *meta {
	m := p.newMeta() // class 0 and home p already
	m.arena, m.off, m.size, m.node, m.shift = a, b.Offset, b.Size, h, shift
	p.placements++
	a.live++
	a.held += b.Size
	p.held += b.Size
	p.noteHeld()
	return m
}

// arenaAlloc places a block, reclaiming and growing as needed. Called with
// p.mu held.
func (p *Pool) arenaAlloc(size, align uint64, s device.Stream, purpose Purpose) (*meta, error) {
	if p.closed {
		return nil, fmt.Errorf("%s: %w", poolLabel(p.opts.Name), ErrClosed)
	}
	// The common case, a block that fits in the arenas as they are, takes
	// no more than this call.
	m, err := p.tryArenas(size, align)
	if m != nil {
		return m, nil
	}
	return p.arenaRetry(size, align, s, purpose, err)
}

// arenaRetry is arenaAlloc after a first attempt that placed nothing
// (firstErr: why, or nil when nothing fitted): it reclaims, grows and
// retries, and explains a failure.
func (p *Pool) arenaRetry(size, align uint64, s device.Stream, purpose Purpose, firstErr error) (*meta, error) {
	var tried []string
	var devErr error
	limitHit := false
	noteErr := func(err error) {
		if errors.Is(err, errLimit) {
			limitHit = true
		} else if errors.Is(err, device.ErrOutOfMemory) || devErr == nil {
			devErr = err
		}
	}
	if firstErr != nil {
		noteErr(firstErr)
	}
	attempt := func() (*meta, bool) {
		m, err := p.tryArenas(size, align)
		if err != nil {
			noteErr(err)
			return nil, false
		}
		return m, m != nil
	}
	if p.opts.Growth == GrowVirtual {
		tried = append(tried, "map pages in the reserved range (unmapping free pages when refused)")
	}
	// Reclaim what is already free but parked: finished stream-ordered
	// frees, then the small-block caches.
	if len(p.awaiting) > 0 {
		tried = append(tried, "reclaim completed stream-ordered frees")
		if p.reapAwaiting(false) > 0 {
			if m, ok := attempt(); ok {
				return m, nil
			}
		}
	}
	if p.flushCaches() > 0 {
		tried = append(tried, "flush small-block caches")
		if m, ok := attempt(); ok {
			return m, nil
		}
	}
	// Grow.
	if p.opts.Growth == GrowChunks {
		tried = append(tried, "grow by a new chunk")
		m, err := p.growChunk(size, align, purpose)
		if err == nil {
			return m, nil
		}
		if errors.Is(err, errLimit) {
			limitHit = true
		} else {
			devErr = err
		}
		if n := p.trimChunks(); n > 0 {
			tried = append(tried, "free empty chunks")
			if m, err := p.growChunk(size, align, purpose); err == nil {
				return m, nil
			}
		}
	}
	// Last resort: wait for other streams' pending frees.
	p.sealAll()
	if len(p.awaiting) > 0 {
		tried = append(tried, "wait for pending stream-ordered frees")
		if p.reapAwaiting(true) > 0 {
			if m, ok := attempt(); ok {
				return m, nil
			}
			if p.opts.Growth == GrowChunks {
				if m, err := p.growChunk(size, align, purpose); err == nil {
					return m, nil
				}
			}
		}
	}
	return nil, p.oomError(size, align, tried, limitHit, devErr)
}

// growChunk adds a chunk that holds the request and allocates from it.
// A chunk of the request's own (above ChunkBytes/2) takes its purpose's
// priority under Options.PriorityByPurpose.
func (p *Pool) growChunk(size, align uint64, purpose Purpose) (*meta, error) {
	const unit = 2 << 20
	need := size + align
	if p.opts.Strategy == "buddy" {
		// Buddy blocks are powers of two at offsets aligned to their size,
		// and a chunk whose base is less aligned than asked for is asked
		// for size plus the alignment's slack (tryArenas).
		need = 1 << bits.Len64(need-1)
	}
	csize := p.opts.ChunkBytes
	prio := p.opts.Priority
	if need > csize/2 {
		csize = roundUp(need, unit)
		if p.opts.PriorityByPurpose {
			prio = PurposePriority(purpose)
		}
	}
	if p.reserved.Load()+csize > p.limitBytes() {
		if p.reserved.Load()+roundUp(need, unit) > p.limitBytes() {
			return nil, errLimit
		}
		csize = roundUp(need, unit)
	}
	a, err := p.newChunk(csize, prio)
	if err != nil {
		return nil, err
	}
	p.arenas = append(p.arenas, a)
	p.logf("new %d-byte chunk, %d reserved", csize, p.reserved.Load())
	m, err := p.tryArenas(size, align)
	if m == nil && err == nil {
		// The strategy could not place the request even in a chunk sized
		// for it (buddy rounds sizes up to a power of two).
		err = fmt.Errorf("a new %d-byte chunk cannot hold %d bytes aligned to %d: %w", csize, size, align, device.ErrOutOfMemory)
	}
	return m, err
}

// trimChunks frees chunks that hold no block. Called with p.mu held.
func (p *Pool) trimChunks() uint64 {
	if p.opts.Growth != GrowChunks {
		return 0
	}
	var n uint64
	kept := p.arenas[:0]
	for _, a := range p.arenas {
		if a.live == 0 {
			if err := a.destroy(p); err == nil {
				n += a.size
				continue
			}
		}
		kept = append(kept, a)
	}
	for i := len(kept); i < len(p.arenas); i++ {
		p.arenas[i] = nil
	}
	p.arenas = kept
	return n
}

func (p *Pool) oomError(size, align uint64, tried []string, limitHit bool, devErr error) *OOMError {
	st := p.arenaStats()
	c, _ := p.totals()
	used := c.used()
	e := &OOMError{Pool: p.opts.Name, Requested: size, Align: align, Limit: p.limitBytes(),
		Reserved: p.reserved.Load(), Used: used, Free: st.free, LargestFree: st.largest,
		Fragmentation: st.frag(), Tried: tried, Snapshot: p.snapshot(size)}
	switch {
	case devErr != nil && !limitHit:
		e.Cause, e.Err = CauseDevice, devErr
	case st.free >= size && p.opts.Growth == GrowChunks:
		e.Cause = CauseFragmentation
	case limitHit && st.free >= size:
		e.Cause = CauseFragmentation
	default:
		e.Cause = CauseLimit
	}
	return e
}

type arenaStats struct{ free, largest uint64 }

func (s arenaStats) frag() float64 {
	if s.free == 0 {
		return 1
	}
	return float64(s.largest) / float64(s.free)
}

// arenaStats sums free space in reserved memory. For a virtual arena only
// mapped free bytes count. Called with p.mu held.
func (p *Pool) arenaStats() arenaStats {
	var st arenaStats
	for _, a := range p.arenas {
		if !a.virtual {
			s := a.alloc.Stats()
			st.free += s.Free
			st.largest = max(st.largest, s.LargestFree)
			continue
		}
		// Free bytes that lie on mapped pages, and the longest such run.
		var run uint64
		a.alloc.Walk(func(seg alloc.Segment) bool {
			if !seg.Free {
				run = 0
				return true
			}
			for off := seg.Offset; off < seg.Offset+seg.Size; {
				pi := off / a.pageBytes
				end := min((pi+1)*a.pageBytes, seg.Offset+seg.Size)
				if a.pages[pi].mapped {
					st.free += end - off
					run += end - off
					st.largest = max(st.largest, run)
				} else {
					run = 0
				}
				off = end
			}
			return true
		})
	}
	return st
}

// warmup reserves n bytes ahead of use. Called with p.mu held.
func (p *Pool) warmup(n uint64) error {
	if p.opts.Growth == GrowChunks {
		a, err := p.newChunk(roundUp(n, 2<<20), p.opts.Priority)
		if err != nil {
			return err
		}
		p.arenas = append(p.arenas, a)
		return nil
	}
	a := p.arenas[0]
	pages := min(roundUp(n, a.pageBytes)/a.pageBytes, uint64(len(a.pages)))
	if pages > 0 {
		if err := a.newRun(p, 0, pages); err != nil {
			return err
		}
	}
	for i := uint64(0); i < pages; i++ {
		a.markFree(i)
	}
	// A cap on kept free pages (0 = keep all) must not undo the warm-up.
	if k := p.opts.KeepFreeBytes; k != 0 && k < pages*a.pageBytes {
		p.opts.KeepFreeBytes = pages * a.pageBytes
	}
	return nil
}

// Trim returns memory the pool holds but does not use to the device: cached
// small blocks, completed stream-ordered frees, empty chunks, free mapped
// pages. It waits for a pass of the reclaimer in progress, so that the
// pages that pass gives back are gone too. It returns the bytes given
// back.
func (p *Pool) Trim() uint64 {
	p.recMu.Lock()
	defer p.recMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	before := p.reserved.Load()
	p.sealAll()
	p.reapAwaiting(false)
	p.flushCaches()
	p.drainRemote()
	p.trimChunks()
	for _, a := range p.arenas {
		if a.virtual {
			a.shrink(p, 0)
		}
	}
	p.trimShards()
	return before - p.reserved.Load()
}
