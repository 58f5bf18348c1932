package pool

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Shards. The central path (placing blocks in the arenas, mapping pages)
// runs under a lock. When goroutines on many processors miss their caches
// at once, one lock and one allocator state serialize them, so a pool with
// per-processor caches can spread its central work over shards: each
// shard is a *Pool of its own (its lock, arenas, allocator, free pages),
// built by the pool callers hold (the root, itself shard 0) the first time
// a processor finds the root's lock taken by others often enough. The
// accounting a limit or a target needs is pool-wide: the shards share the
// root's ledger.
//
// A block is released by the shard that placed it (meta.home). A free
// that reaches the arenas under another shard's lock, or under none,
// releases the block in its home at once if that shard's lock is free,
// and otherwise pushes it onto the home's queue (remote, a lock-free
// stack), which the home empties on its next entry to the central path.
// Locks are taken one at a time (TryLock only while another is held),
// except by Stats and Close, which take the root's, then the table's
// (shardSet.mu), then the shards' in order; making a shard takes the
// table's lock with no other held. So shards cannot deadlock.

// ledger is the accounting a pool shares with its shards.
type ledger struct {
	reserved, peakReserved atomic.Uint64
	// limit is Options.Limit as SetLimit last set it: pool-wide, read
	// without a lock where the pool decides whether bytes fit.
	limit               atomic.Uint64
	peakUsed            atomic.Uint64 // peak of taken
	pendingBytes        atomic.Uint64
	ooms                atomic.Uint64
	devAllocs, devFrees atomic.Uint64
	maps, unmaps        atomic.Uint64
	// inflight is the bytes of pages being created and mapped outside
	// any lock (arena.touch); moving counts the goroutines moving pages
	// (unmap one, map it elsewhere) outside any lock: while one does, no
	// other starts a move (see takeFree). Pool-wide, so that the limit
	// counts every shard's pages in flight and shards do not queue moves
	// behind each other in the driver.
	inflight atomic.Uint64
	moving   atomic.Int32
	// spread is set once a shard beside the root exists. Until then the
	// root's held is the pool's, and every placement records its peak
	// in peakUsed exactly; from then on the bytes taken out of the
	// arenas are the sum of every shard's (takenNow), and the peak is
	// recorded where the sum is taken: wherever pages are mapped (the
	// soft target's decisions) and in Stats. A single counter that every
	// central allocation and free of every processor wrote was where 16
	// goroutines queued (one cache line, 14 M writes a second).
	spread atomic.Bool
	// balancing (set by tests and benchmarks, on pools with shards)
	// turns balance on. It is off by default: on the H200 it cut the
	// default's peak reserved memory on 16 goroutines from 3.1x to 1.3x
	// of peak use, but the pages it gave back were mapped again at once,
	// and 16 goroutines ran 0.3-0.5 M pairs/s instead of 6.8 M (GPU run
	// 2). In the ledger, so that the check of every central allocation
	// reads no other structure.
	balancing atomic.Bool
	// balanced is the reserved bytes when balance last ran: it runs
	// again only once the pool has grown past them.
	balanced atomic.Uint64
	// hot is the reclaimer's (reclaim.go): whether the pool placed blocks
	// faster than hotRate over the last pass interval.
	hot atomic.Bool
	// heldExtra is the bytes hot allocations mapped beyond the target,
	// which the reclaimer gives back as they become idle: a pool that
	// was never hot keeps its pages as one without a hold time does.
	heldExtra atomic.Uint64
}

// shardSet is the root's table of shards.
type shardSet struct {
	mu     sync.Mutex // serializes making shards and closing them
	closed bool       // guarded by mu: no more shards
	failed atomic.Bool
	list   []atomic.Pointer[Pool] // list[0] is the root; others made on demand
	of     []procShard            // per processor
	// spread (set by tests) sends each central entry to the next shard
	// in turn, so that one goroutine exercises remote frees.
	spread atomic.Bool
	turn   atomic.Uint32
}

// procShard is one processor's choice of shard.
type procShard struct {
	idx       atomic.Uint32 // the shard it allocates from
	contended atomic.Uint32 // times it found the root's lock taken
	_         [56]byte      // keep processors' entries on separate cache lines
}

// maxShards caps Options.Shards.
const maxShards = 256

// switchAfter is how many times a processor finds the root's lock taken
// before it moves to a shard of its own.
const switchAfter = 8

func newShardSet(root *Pool, n, nproc int) *shardSet {
	ss := &shardSet{list: make([]atomic.Pointer[Pool], n), of: make([]procShard, max(n, nproc))}
	ss.list[0].Store(root)
	return ss
}

// lockShard locks and returns the shard the calling processor allocates
// from, after giving back the blocks queued to it. Called on the root,
// with no lock held.
func (p *Pool) lockShard() *Pool {
	if p.shards == nil {
		return p.lockShardOf(0)
	}
	pid := procPin()
	procUnpin()
	return p.lockShardOf(pid)
}

// lockShardOf is lockShard for a caller that has just been pinned to
// processor pid (and unpinned again): the shard of pid, without pinning
// a second time.
func (p *Pool) lockShardOf(pid int) *Pool {
	ss := p.shards
	if ss == nil {
		p.mu.Lock()
		p.drainRemote()
		return p
	}
	if ss.spread.Load() {
		return p.lockTurn()
	}
	if pid >= len(ss.of) { // processors added since New; a division otherwise costs every call
		pid %= len(ss.of)
	}
	ps := &ss.of[pid]
	s := ss.list[ps.idx.Load()].Load()
	if !s.mu.TryLock() {
		if own := pid % len(ss.list); s == p && own != 0 && ps.contended.Add(1) >= switchAfter {
			if t := p.makeShard(own); t != nil {
				ps.idx.Store(uint32(own))
				s = t
			}
		}
		s.mu.Lock()
	}
	s.drainRemote()
	return s
}

// lockTurn is lockShard with Pool.shards.spread set: the next shard in
// turn.
func (p *Pool) lockTurn() *Pool {
	s := p
	if i := int(p.shards.turn.Add(1)) % len(p.shards.list); i != 0 {
		if t := p.makeShard(i); t != nil {
			s = t
		}
	}
	s.mu.Lock()
	s.drainRemote()
	return s
}

// makeShard returns shard i, made now if it does not exist yet; nil when
// it cannot be made (the pool is closed, or the device refused address
// space: then no shard is tried again).
func (p *Pool) makeShard(i int) *Pool {
	ss := p.shards
	if s := ss.list[i].Load(); s != nil {
		return s
	}
	if ss.failed.Load() {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if s := ss.list[i].Load(); s != nil || ss.closed {
		return s
	}
	s := &Pool{dev: p.dev, up: p.up, opts: p.opts, host: p.host, info: p.info, ledger: p.ledger, root: p,
		cacheMax: p.cacheMax, smallMax: p.smallMax}
	s.opts.Warmup = 0
	s.passAt = time.Since(p.born) // its pace counts from now (hotNow)
	s.cond = sync.NewCond(&s.mu)
	if err := s.reserveRanges(); err != nil {
		p.logf("shard %d: %v; allocating from the shards there are", i, err)
		s.destroyArenas()
		ss.failed.Store(true)
		return nil
	}
	ss.list[i].Store(s)
	p.spread.Store(true)
	return s
}

// takenNow returns the bytes of blocks out of the arenas of every shard
// (live, cached, parked, pending or queued), and records them in the
// peak of use. While the root is the only shard the caller holds its
// lock (every caller holds its shard's), and its held bytes are read as
// they are; from then on, as the shards publish them (noteHeld).
func (p *Pool) takenNow() uint64 {
	r := p.root
	if !p.spread.Load() {
		updateMax(&p.peakUsed, r.held)
		return r.held
	}
	n := r.heldPub.Load()
	r.eachShard(func(s *Pool) { n += s.heldPub.Load() })
	updateMax(&p.peakUsed, n)
	return n
}

// peakWith returns the peak of use counting a block of size bytes about
// to be placed beside what every shard holds now, and records it: the
// soft target's measure where pages are mapped.
func (p *Pool) peakWith(size uint64) uint64 {
	n := p.takenNow() + size
	updateMax(&p.peakUsed, n)
	return p.peakUsed.Load()
}

// noteHeld records p.held after it changed: while the root is the only
// shard, in the peak of use; from then on it publishes it for takenNow
// (one atomic store a placement and a free, which one goroutine alone
// need not pay; the root's figure is then stale until its next change).
// Called with p.mu held.
func (p *Pool) noteHeld() {
	if !p.spread.Load() {
		updateMax(&p.peakUsed, p.held)
		return
	}
	p.heldPub.Store(p.held)
}

// noteHeldFell is noteHeld after p.held fell: the peak of use it
// recorded stands, so only the figure published for takenNow changes.
// Called with p.mu held.
func (p *Pool) noteHeldFell() {
	if p.spread.Load() {
		p.heldPub.Store(p.held)
	}
}

// eachShard calls fn on every shard made so far but the root.
func (p *Pool) eachShard(fn func(s *Pool)) {
	if p.shards == nil {
		return
	}
	for i := 1; i < len(p.shards.list); i++ {
		if s := p.shards.list[i].Load(); s != nil {
			fn(s)
		}
	}
}

// releaseRemote releases m, a block of shard p, from outside p's lock: at
// once if the lock is free, else through p's queue.
func (p *Pool) releaseRemote(m *meta) {
	if p.mu.TryLock() {
		p.drainRemote()
		p.release(m)
		p.mu.Unlock()
		return
	}
	for {
		old := p.remote.Load()
		m.next = old
		if p.remote.CompareAndSwap(old, m) {
			return
		}
	}
}

// drainRemote releases the blocks queued to p. Called with p.mu held.
func (p *Pool) drainRemote() {
	if p.remote.Load() != nil { // inlined: the queue is usually empty
		p.drainQueue()
	}
}

// drainQueue is drainRemote when blocks are queued.
func (p *Pool) drainQueue() {
	for m := p.remote.Swap(nil); m != nil; {
		next := m.next
		m.next = nil
		p.release(m)
		m = next
	}
}

// releaseChain releases a chain of blocks freed on this processor (of any
// shard) under the processor's shard's lock.
func (p *Pool) releaseChain(chain *meta) {
	s := p.lockShard()
	s.releaseList(chain)
	s.mu.Unlock()
}

// shardAlloc places a block of size bytes in the processor's shard,
// growing it as needed; when that fails for want of memory, it tries
// every shard (see rescue). It returns the block with its shard locked:
// the caller records the block and unlocks. parked are blocks to give
// back first.
func (p *Pool) shardAlloc(size, align uint64, purpose Purpose, parked *meta) (*meta, *Pool, error) {
	s := p.lockShard()
	s.releaseList(parked)
	m, err := s.arenaAlloc(size, align, 0, purpose)
	if err == nil {
		p.balance(s)
		return m, s, nil
	}
	if p.shards == nil || !errors.Is(err, ErrOutOfMemory) {
		s.mu.Unlock()
		return nil, nil, err
	}
	s.mu.Unlock()
	return p.rescue(size, align, purpose, s)
}

// balance keeps a pool with shards near its soft target: a shard maps
// pages only from its own free pages (or new memory), so free pages other
// shards hold, such as those of the root that every processor allocated
// from before moving to a shard of its own, would otherwise stay mapped
// beside the new ones. When the pool has grown above TargetRatio × peak
// use since the last time, balance gives back the excess from the free
// pages of the other shards whose locks are free. Called with home's lock
// held (the others are only tried).
func (p *Pool) balance(home *Pool) {
	if p.balancing.Load() { // inlined: off by default
		p.rebalance(home)
	}
}

// rebalance is balance with balancing on.
func (p *Pool) rebalance(home *Pool) {
	r := p.opts.TargetRatio
	if !p.opts.hasTarget() || !p.spread.Load() {
		return
	}
	res := p.reserved.Load()
	target := max(uint64(r*float64(p.peakUsed.Load())), p.opts.Warmup)
	if res <= target || res <= p.balanced.Load() {
		return
	}
	excess := res - target
	give := func(s *Pool) {
		if excess == 0 || s == home || !s.mu.TryLock() {
			return
		}
		for _, a := range s.arenas {
			if a.virtual && excess > 0 {
				if a.freshen(); a.freePages > 0 {
					excess -= min(excess, a.shrink(s, a.freePages-min(excess, a.freePages)))
				}
			}
		}
		s.mu.Unlock()
	}
	give(p.root)
	p.root.eachShard(give)
	p.balanced.Store(p.reserved.Load())
}

// rescue is the out-of-memory path of a pool with shards, after shard
// home could not place size bytes: it gives back every processor's cached
// blocks and every shard's queued frees, tries each shard's arenas as
// they are, gives back the free pages and empty chunks of the other
// shards, and then tries home once more, growing. It returns the block
// with its shard locked, or home's error.
func (p *Pool) rescue(size, align uint64, purpose Purpose, home *Pool) (*meta, *Pool, error) {
	p.mu.Lock()
	p.flushCaches()
	p.mu.Unlock()
	shards := []*Pool{p}
	p.eachShard(func(s *Pool) { shards = append(shards, s) })
	for _, s := range shards {
		s.mu.Lock()
		s.drainRemote()
		if !s.closed {
			if m, err := s.tryArenas(size, align); m != nil && err == nil {
				return m, s, nil
			}
		}
		s.mu.Unlock()
	}
	for _, s := range shards {
		if s != home {
			s.giveBackLocking()
		}
	}
	home.mu.Lock()
	home.drainRemote()
	m, err := home.arenaAlloc(size, align, 0, purpose)
	if err != nil {
		home.mu.Unlock()
		var oe *OOMError
		if errors.As(err, &oe) {
			oe.Tried = append(oe.Tried, "give back every shard's queued frees", "try every shard", "give back the other shards' free memory")
		}
		return nil, nil, err
	}
	return m, home, nil
}

// lockShards adds the central counters of the shards to c and returns
// with every shard's lock held, for the caller to read the processor
// caches before it calls unlock. Called with the root's lock held. A block
// may be counted allocated in one shard and freed in another or in a
// cache, so no shard may count anything until all, and the caches, are
// read, as the root's lock alone made the sum consistent without shards.
// The locks are taken in shard order, after the table's (no shard is made
// meanwhile); nobody else waits for a second shard's lock while holding
// one.
func (p *Pool) lockShards(c *counters) (unlock func()) {
	if p.shards == nil {
		return func() {}
	}
	p.shards.mu.Lock()
	var locked []*Pool
	p.eachShard(func(s *Pool) {
		s.mu.Lock()
		locked = append(locked, s)
		c.plus(&s.central)
	})
	return func() {
		for _, s := range locked {
			s.mu.Unlock()
		}
		p.shards.mu.Unlock()
	}
}

// closeShards frees the memory of every shard but the root; blocks still
// queued to them are dropped with it. Called with the root's lock held.
func (p *Pool) closeShards() error {
	if p.shards == nil {
		return nil
	}
	p.shards.mu.Lock()
	p.shards.closed = true
	p.shards.mu.Unlock()
	var first error
	p.eachShard(func(s *Pool) {
		s.mu.Lock()
		s.closed = true
		s.remote.Store(nil)
		if err := s.destroyArenas(); err != nil && first == nil {
			first = err
		}
		s.mu.Unlock()
	})
	return first
}

// destroyArenas returns the memory of every arena of p to the device.
func (p *Pool) destroyArenas() error {
	var first error
	for _, a := range p.arenas {
		if err := a.destroy(p); err != nil && first == nil {
			first = err
		}
	}
	p.arenas, p.direct, p.smallFit = nil, nil, nil
	return first
}

// trimShards is Trim for the shards but the root. Called with the root's
// lock held.
func (p *Pool) trimShards() { p.eachShard((*Pool).giveBackLocking) }

// giveBackLocking returns shard p's free memory to the device, under its
// lock: its queued frees, empty chunks and free mapped pages.
func (p *Pool) giveBackLocking() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drainRemote()
	p.trimChunks()
	for _, a := range p.arenas {
		if a.virtual {
			a.shrink(p, 0)
		}
	}
}

// shardArenaStats adds the shards' free space to st. Called with the
// root's lock held.
func (p *Pool) shardArenaStats(st *arenaStats) {
	p.eachShard(func(s *Pool) {
		s.mu.Lock()
		t := s.arenaStats()
		s.mu.Unlock()
		st.free += t.free
		st.largest = max(st.largest, t.largest)
	})
}
