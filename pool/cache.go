package pool

import "sync"

// procCache is one processor's cache of free blocks: per size class a stack
// of freed small blocks, and a few recently freed large blocks ("parked"),
// all still allocated in their arenas. Its owner reaches it only while
// pinned to the processor (see pin.go), so the fast paths take no lock and
// make no atomic read-modify-write; other goroutines reach it only while
// the caches are stopped (Pool.stopCaches). Blocks freed on one processor
// go to that processor's cache, wherever they were allocated. With
// Options.Cache = CacheShared there is one cache, reached under its mutex instead.
type procCache struct {
	g     cacheGuard
	mu    sync.Mutex        // guards the single shared cache of Options.Cache = CacheShared
	lists [numClasses]*meta // per size class, linked through meta.next
	count [numClasses]int32
	// misses counts, per class, refills since a block of the class was
	// last freed here: the refill batch doubles with it (batchSize).
	misses [numClasses]uint8
	bytes  uint64 // bytes of cached small blocks
	// large holds parked large blocks, newest first. deferred chains
	// (through meta.next) the other large blocks freed here, nDeferred of
	// them, that have not gone back to their arenas yet: the next trip
	// of this processor to the arenas takes them along (see deferFree).
	// largeBytes counts the bytes of both.
	large         [largeSlots]*meta
	deferred      *meta // oldest first; deferredTail is the newest
	deferredTail  *meta
	nDeferred     int
	deferredBytes uint64
	largeBytes    uint64
	lastLarge     uint64   // size of the last large request here
	c             counters // accounting of operations served here
	n             uint32   // allocations here, for latency sampling
	_             [64]byte // keep caches on separate cache lines
}

const (
	// procMaxBytes caps one processor's cached small blocks; above it the
	// cache gives half back to the arenas.
	procMaxBytes = 2 << 20
	// largeSlots is how many freed large blocks a processor parks for a
	// request of the same size (a loop allocating the same shapes step
	// after step).
	largeSlots = 2
	// maxDeferred is how many freed large blocks a processor holds back
	// before it takes them to the arenas by itself.
	maxDeferred = 4
)

// batchFor is the most blocks of a class one refill takes from the arena.
func batchFor(cls int) int {
	n := int((256 << 10) / sizeClasses[cls])
	return max(1, min(n, 4))
}

// batchSize is how many blocks the refill of class cls takes now, and
// records the refill: one block for the first refill since a block of
// the class was freed here, then twice as many each time up to batchFor.
// A loop allocating one size gets batches; a mix of random sizes, whose
// frees refill the classes as fast as its allocations empty them, takes
// no blocks it will not use (a batch of four per miss made such a mix
// move most of its small blocks between the cache and the arena).
func (c *procCache) batchSize(cls int) int {
	n := min(batchFor(cls), 1<<min(c.misses[cls], 2))
	if c.misses[cls] < 255 {
		c.misses[cls]++
	}
	return n
}

// pin pins the goroutine to its processor and returns that processor's
// cache and index, or nil (unpinned again) when the cache cannot be used
// now: the caches are stopped, the pool is closed, or GOMAXPROCS grew
// after New.
func (p *Pool) pin() (*procCache, int) {
	if p.single {
		return p.pinSingle(), 0
	}
	pid := procPin()
	if pid < len(p.procs) && !p.revoked.Load() && p.procs[pid].g.enter() {
		return &p.procs[pid], pid
	}
	procUnpin()
	return nil, pid
}

// pinSingle is pin for Options.Cache = CacheShared: the one cache, under its lock.
func (p *Pool) pinSingle() *procCache {
	c := &p.procs[0]
	c.mu.Lock()
	if p.revoked.Load() {
		c.mu.Unlock()
		return nil
	}
	return c
}

// pinIf is pin when cond holds, else nil.
func (p *Pool) pinIf(cond bool) *procCache {
	if !cond {
		return nil
	}
	c, _ := p.pin()
	return c
}

func (p *Pool) unpin(c *procCache) {
	if p.single {
		c.mu.Unlock()
		return
	}
	c.g.exit()
	procUnpin()
}

func (c *procCache) pop(cls int) *meta {
	m := c.lists[cls]
	if m != nil {
		c.lists[cls] = m.next
		m.next = nil
		c.count[cls]--
		c.bytes -= sizeClasses[cls]
	}
	return m
}

func (c *procCache) push(m *meta, cls int) {
	m.next = c.lists[cls]
	c.lists[cls] = m
	c.count[cls]++
	c.bytes += sizeClasses[cls]
}

// fits reports whether parked block m can serve a request of size bytes as
// the allocator would have: the same size, rounded to the alignment (a
// looser fit would hand out, and hold, more memory than best fit does).
func fits(m *meta, size, align uint64) bool {
	return m != nil && m.size-m.shift >= size && m.size-m.shift-size < align
}

// takeLarge removes and returns a parked block that fits size, or nil.
func (c *procCache) takeLarge(size, align uint64) *meta {
	if c.large[0] == nil { // the slots fill from the front: none parked
		return nil
	}
	for i := range c.large {
		if m := c.large[i]; fits(m, size, align) {
			copy(c.large[i:], c.large[i+1:])
			c.large[largeSlots-1] = nil
			c.largeBytes -= m.size
			return m
		}
	}
	return nil
}

// park keeps m as the newest parked block and returns the block it evicts
// (nil when a slot was free).
func (c *procCache) park(m *meta) (evicted *meta) {
	evicted = c.large[largeSlots-1]
	if evicted != nil {
		c.largeBytes -= evicted.size
	}
	copy(c.large[1:], c.large[:largeSlots-1])
	c.large[0] = m
	c.largeBytes += m.size
	return evicted
}

// unparkAll removes every parked and deferred block, returning them as a
// chain.
// The deferred blocks come first, in the order they were freed, as they
// would have gone back had they not been held.
func (c *procCache) unparkAll() (chain *meta) {
	if c.large[0] == nil { // the slots fill from the front: none parked
		return c.takeDeferred()
	}
	for i, m := range c.large {
		if m != nil {
			m.next = chain
			chain = m
			c.large[i] = nil
		}
	}
	chain = appendChain(c.takeDeferred(), chain)
	c.largeBytes = 0
	return chain
}

// deferFree holds back freed large block m and reports whether enough
// are held that the caller should take them to the arenas now.
func (c *procCache) deferFree(m *meta) bool {
	m.next = nil
	if c.deferredTail == nil {
		c.deferred = m
	} else {
		c.deferredTail.next = m
	}
	c.deferredTail = m
	c.nDeferred++
	c.deferredBytes += m.size
	c.largeBytes += m.size
	return c.nDeferred >= maxDeferred
}

// takeDeferred removes the deferred blocks, returning them as a chain.
func (c *procCache) takeDeferred() *meta {
	chain := c.deferred
	c.largeBytes -= c.deferredBytes
	c.deferred, c.deferredTail, c.nDeferred, c.deferredBytes = nil, nil, 0, 0
	return chain
}

// drain removes cached small blocks until at most keep bytes remain,
// taking class cls first, then the largest classes (the fewest blocks for
// the bytes, so the fewest refills later), and returns them as a chain.
func (c *procCache) drain(cls int, keep uint64) (chain *meta) {
	k, next := cls, numClasses-1 // next: no non-empty class above it
	for c.bytes > keep {
		if c.count[k] == 0 {
			for c.count[next] == 0 {
				next--
			}
			k = next
		}
		m := c.pop(k)
		m.next = chain
		chain = m
	}
	return chain
}

// cacheAlloc serves a small block of class cls: from this processor's
// cache, else from the arenas, taking a few more of the class into the
// cache in the same trip. When the fast path already found the class
// empty (tried), batch is the refill's size and deferred the blocks it
// took from the cache to give back first (see keepFree).
func (p *Pool) cacheAlloc(cls int, req uint64, purpose Purpose, t *Tenant, tried bool, batch int, deferred *meta) (*meta, error) {
	if c := p.pinIf(!tried); c != nil {
		m := c.pop(cls)
		if m != nil {
			m.assign(req, purpose, t)
			c.c.add(m)
			p.unpin(c)
			return m, nil
		}
		batch = c.batchSize(cls)
		deferred = c.takeDeferred()
		p.unpin(c)
	}
	size := sizeClasses[cls]
	first, sh, err := p.shardAlloc(size, p.opts.Alignment, purpose, deferred)
	if err != nil {
		return nil, err
	}
	locked := true
	defer func() {
		if locked { // a panic below: unlock, so that Close cannot wedge on the lock
			sh.mu.Unlock()
		}
	}()
	first.class = cls + 1
	first.assign(req, purpose, t)
	var extra *meta
	for k := 1; k < batch; k++ {
		m, err := sh.tryArenas(size, p.opts.Alignment)
		if m == nil || err != nil {
			break // the batch is an optimization: never grow for it
		}
		m.class = cls + 1
		m.next = extra
		extra = m
	}
	c, _ := p.pin()
	if c == nil {
		// No cache now: count centrally and give the extras back.
		sh.central.add(first)
		sh.releaseList(extra)
		locked = false
		sh.mu.Unlock()
		return first, nil
	}
	c.c.add(first)
	for extra != nil {
		m := extra
		extra = m.next
		c.push(m, cls)
	}
	p.unpin(c)
	locked = false
	sh.mu.Unlock()
	return first, nil
}

// cacheFree puts a small block into this processor's cache, giving half of
// the cache back to the arenas when it holds too much.
func (p *Pool) cacheFree(m *meta) {
	c, _ := p.pin()
	if c == nil {
		p.centralFree(m)
		return
	}
	cls := m.class - 1
	c.c.sub(m)
	c.push(m, cls)
	c.misses[cls] = 0
	var chain *meta
	if c.bytes > procMaxBytes {
		chain = appendChain(c.takeDeferred(), c.drain(cls, procMaxBytes/2))
	}
	p.unpin(c)
	if chain != nil {
		p.releaseChain(chain)
	}
}

// parkable reports whether a freed large block may be parked: blocks up to
// a sixty-fourth of the pool's limit.
func (p *Pool) parkable(m *meta) bool {
	return m.class == 0 && m.size <= p.limitBytes()/64 && p.procs != nil
}

// keepFree keeps a freed large block in this processor's cache, and
// reports false, having done nothing, when the cache cannot be used now.
//
// The block is parked, to serve the next request of its size, when its
// size is the one last requested here (a loop allocating the same shapes
// step after step) and the slack before its address is less than the
// pool's alignment: a parked block serves only requests at the pool's
// alignment, and one placed with more (an over-aligned request in a chunk
// whose base is less aligned) would hand them that slack too, memory no
// request asked for. Nor is a block that the search for mapped pages
// placed (meta.paged: its best-fit place lay on unmapped pages): its place
// was chosen by the pages mapped at the time, not by its fit, and parked it
// would hand that place whole to the next request of its size, often a
// block that stays (a layer's K or V in a prefill, docs/pool-policy.md);
// the next request is placed afresh. Otherwise, and for a parked block it
// evicts, its range goes back to the arena on this processor's next trip
// to the arenas: the next allocation that misses the cache takes it there under
// the same lock, before it places anything, so placement is as if it had
// gone back at once, one lock acquisition fewer per free. maxDeferred
// blocks waiting make the free take them itself; an allocation that would
// fail otherwise, Trim and Close take every processor's.
//
// A parked block that serves the next request skips best fit, which might
// have placed that request in a tighter hole and kept the freed range
// whole. Parking only repeated sizes keeps that rare where sizes vary
// (replaying the GPT-2 trace with best fit in chunks: 1.055× peak live,
// against 1.114× when any freed block was parked); on the BERT trace, whose layers
// repeat their shapes within a call, the default makes 18.8% device calls
// per allocation against 16.8% without parking, at the same 1.037× memory.
func (p *Pool) keepFree(m *meta) bool {
	c, _ := p.pin()
	if c == nil {
		return false
	}
	c.c.sub(m)
	if m.req == c.lastLarge && m.shift < p.opts.Alignment && !m.paged {
		m = c.park(m)
	}
	var chain *meta
	if m != nil && c.deferFree(m) {
		chain = c.takeDeferred()
	}
	p.unpin(c)
	if chain != nil {
		p.releaseChain(chain)
	}
	return true
}

// flushCaches returns every cached and parked block of every processor to
// its arena, and returns the bytes given back. This processor's cache is
// emptied pinned, as its own fast path would; the others are stopped
// (stopCaches: a stop of the world) only when one of them holds
// something, so that a goroutine alone (a single-threaded program's
// out-of-memory retries and Trims) stops nobody. Called with p.mu held.
func (p *Pool) flushCaches() uint64 {
	if len(p.procs) == 0 || p.closed {
		return 0
	}
	var chain *meta
	var n uint64
	own := -1
	if c, pid := p.pin(); c != nil {
		n += c.bytes + c.largeBytes
		chain = appendChain(c.drain(0, 0), c.unparkAll())
		own = pid
		p.unpin(c)
	}
	others := false
	i := 0
	p.readCaches(func(c *procCache) {
		others = others || i != own && c.bytes+c.largeBytes > 0
		i++
	})
	if !others {
		p.releaseList(chain)
		return n
	}
	p.stopCaches()
	for i := range p.procs {
		c := &p.procs[i]
		n += c.bytes + c.largeBytes
		if c.bytes > 0 {
			sub := c.drain(0, 0)
			chain = appendChain(sub, chain)
		}
		if c.largeBytes > 0 {
			chain = appendChain(c.unparkAll(), chain)
		}
	}
	p.resumeCaches()
	p.releaseList(chain)
	return n
}

// appendChain links chain b after chain a and returns the head.
func appendChain(a, b *meta) *meta {
	if a == nil {
		return b
	}
	t := a
	for t.next != nil {
		t = t.next
	}
	t.next = b
	return a
}
