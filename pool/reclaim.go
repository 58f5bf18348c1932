package pool

import (
	"sync"
	"time"
)

// The reclaimer: free pages beyond the soft target go back to the device
// off the allocating goroutine.
//
// Under its soft target (TargetRatio) a GrowVirtual pool keeps free pages
// mapped until it holds TargetRatio × its peak used bytes; from then on an
// allocation that needs pages mapped moves free ones there (an unmap and a
// map) on the allocating goroutine. That keeps memory at the target, and
// at the pace of inference (thousands of placements a second) the moves
// cost a few per cent of the time. A pool that places blocks faster than
// hotRate is hot: a move would then cost more than the allocations around
// it. With a hold time (Options.HoldTime > 0, the default), a hot pool
// does not move pages on the allocating path: it maps new memory (within
// the limit), and the free mapped pages beyond the target form the
// give-back queue. An allocation placed on them (placement prefers mapped
// pages) takes them back with no driver call at all — the give-back is
// cancelled — and a pass of the reclaimer, every HoldTime, gives back
// (unmaps and releases) those that no block has lain on since its previous
// pass, highest first, until the pool is within its target. A free page
// therefore goes back between one and two hold times after its last use,
// and only while the pool holds more than its target. Pages idle for a
// whole pass are also what a hot allocation moves first, before mapping
// new memory.
//
// Under pressure queued pages go back at once: when the limit is reached
// (makeRoom), when the device refuses memory (the out-of-memory retry),
// and, at a pass, when the device reports less than a sixteenth of its
// memory free (MemInfo: another process or another pool needs it).
//
// The reclaimer is a goroutine per pool (started the first time the pool is
// hot, stopped and joined by Close) or, with ReclaimByCaller, whoever calls Reclaim: memwall
// replay runs its passes at trace time, so its tables do not depend on the
// machine's clock. Whether the pool is hot is decided from the placements
// counted between passes (and, with the background reclaimer, from their
// pace since the last pass, so that a pool is hot within its first few
// dozen placements), never from the clock under ReclaimByCaller.

// DefaultHoldTime is the default Options.HoldTime: long enough for the
// pages a forward pass or a decode step frees to serve the next one (tens
// of milliseconds on the recorded traces), short enough that memory a
// workload no longer uses goes back within a fraction of a second.
const DefaultHoldTime = 100 * time.Millisecond

// ReclaimMode selects Options.Reclaimer.
type ReclaimMode uint8

// Reclaim modes.
const (
	// ReclaimBackground (the default): a goroutine of the pool, started
	// the first time the pool is hot, runs a pass every HoldTime.
	ReclaimBackground ReclaimMode = iota
	// ReclaimByCaller: no goroutine; the caller runs passes with
	// Pool.Reclaim (memwall replay does, at trace time, so that a replay
	// is reproducible).
	ReclaimByCaller
)

func (m ReclaimMode) String() string {
	if m == ReclaimByCaller {
		return "caller"
	}
	return "background"
}

// reclaimer is the root pool's background goroutine.
type reclaimer struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// holding reports whether free pages beyond the target wait for the
// reclaimer (a GrowVirtual pool with a soft target and a hold time).
func (p *Pool) holding() bool {
	o := &p.opts
	return o.HoldTime > 0 && o.hasTarget() && o.Growth == GrowVirtual && !p.host
}

// startReclaimer starts the background reclaimer of root pool p the first
// time the pool is hot (a pool that never is has no free pages waiting,
// and no goroutine), unless Close has begun. Safe for concurrent use.
func (p *Pool) startReclaimer() {
	if !p.holding() || p.opts.Reclaimer != ReclaimBackground {
		return
	}
	p.recStart.Do(func() {
		if p.recStopped.Load() {
			return
		}
		r := &reclaimer{stop: make(chan struct{}), done: make(chan struct{})}
		p.rec.Store(r)
		hold := p.opts.HoldTime
		go func() {
			defer close(r.done)
			t := time.NewTicker(hold)
			defer t.Stop()
			for {
				select {
				case <-r.stop:
					return
				case <-t.C:
					p.Reclaim()
				}
			}
		}()
	})
}

// stopReclaimer keeps the background reclaimer from starting, or stops it
// and waits for it to exit. Safe to call more than once, and concurrently.
func (p *Pool) stopReclaimer() {
	p.recStopped.Store(true)
	p.recStart.Do(func() {}) // waits for a start in progress
	if r := p.rec.Load(); r != nil {
		r.once.Do(func() { close(r.stop) })
		<-r.done
	}
}

// Reclaim runs one pass of the reclaimer now and returns the bytes it gave
// back to the device: in every shard, the free handles (runs of pages
// mapped together) that no block has lain on since the previous pass, the
// highest first, while the pool holds more than TargetRatio × its peak used
// bytes and no more than what it mapped beyond that while hot (a pool that
// was never hot keeps its pages as without a hold time); when the device
// reports less than a sixteenth of its memory free, every free handle
// beyond the target. The unmaps run outside the pool's locks. A pool whose
// free pages do not wait (no hold time, no target, chunk growth) has
// nothing to reclaim: Reclaim returns 0. Safe for concurrent use; a pool
// with ReclaimBackground runs it on its own every HoldTime once hot.
func (p *Pool) Reclaim() uint64 {
	r := p.root
	if !r.holding() {
		return 0
	}
	r.recMu.Lock()
	defer r.recMu.Unlock()
	force := r.devicePressed()
	target := max(uint64(r.opts.TargetRatio*float64(r.takenPeak())), r.opts.Warmup)
	// What hot allocations mapped beyond the target and is still there
	// (the limit, an out-of-memory retry or Trim may have given it back).
	excess := r.reserved.Load() - min(r.reserved.Load(), target)
	budget := min(r.heldExtra.Load(), excess)
	if force {
		budget = excess
	}
	var placed uint64
	now := time.Since(r.born)
	n := r.reclaimShard(target, force, budget, now, &placed)
	r.eachShard(func(s *Pool) { n += s.reclaimShard(target, force, budget-min(n, budget), now, &placed) })
	r.hot.Store(placed >= r.hotCount())
	for {
		old := r.heldExtra.Load()
		if r.heldExtra.CompareAndSwap(old, min(old, excess)-min(n, old, excess)) {
			break
		}
	}
	return n
}

// hotRate is the placements a second in the arenas above which a pool is
// hot: a page move (an unmap and a map, 50–80 µs on the H200) would cost
// more than the 20 µs between placements. The replayed inference traces
// place 4,000–20,000 blocks a second (at their recorded pace); the random
// size mix of memwall bench alloc, millions.
const hotRate = 50_000

// hotCount is hotRate's placements over one pass interval (HoldTime).
func (p *Pool) hotCount() uint64 {
	return uint64(hotRate * p.opts.HoldTime.Seconds())
}

// hotMin is the fewest placements since a pass from which a shard's own
// pace decides that the pool is hot before the next pass.
const hotMin = 64

// hotNow reports whether the pool is hot: it placed blocks faster than
// hotRate over the last pass interval, or shard p has placed hotRate ×
// HoldTime since the last pass, or (with the background reclaimer, whose
// passes follow the clock) at least hotMin at more than hotRate since the
// last pass (or since New). A hot pool holds free pages beyond its target
// for the reclaimer instead of moving them on the allocating path
// (planRun). Under ReclaimByCaller passes are the only clock, so a
// replay's decisions do not depend on the machine's. Called with p.mu
// held.
func (p *Pool) hotNow() bool {
	if p.hot.Load() {
		return true
	}
	n := p.placements - p.placedAtPass
	r := p.root
	if n >= r.hotCount() {
		r.startReclaimer()
		return true
	}
	if n < hotMin || p.opts.Reclaimer != ReclaimBackground {
		return false
	}
	if float64(n) < hotRate*(time.Since(r.born)-p.passAt).Seconds() {
		return false
	}
	r.startReclaimer()
	return true
}

// devicePressed reports whether the device has less than a sixteenth of its
// memory free.
func (p *Pool) devicePressed() bool {
	free, total, err := p.up.MemInfo()
	return err == nil && total > 0 && free < total/16
}

// reclaimShard is Reclaim's pass over shard p's arenas, giving back at
// most budget bytes while the pool holds more than target. It adds the
// blocks placed in the shard since its last pass to placed and starts a
// new interval at now.
func (p *Pool) reclaimShard(target uint64, force bool, budget uint64, now time.Duration, placed *uint64) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0
	}
	*placed += p.placements - p.placedAtPass
	p.placedAtPass, p.passAt = p.placements, now
	p.drainRemote()
	var steps []mapStep
	var releasing uint64
	for _, a := range p.arenas {
		if !a.virtual || a.idle == nil {
			continue
		}
		a.freshen()
		a.freeHandles(func(h, n uint64) bool {
			if p.reserved.Load()+p.inflight.Load()-releasing <= target || releasing >= budget {
				return false
			}
			if force || a.idleRun(h, n) {
				for j := h; j < h+n; j++ {
					a.markUsed(j)
					a.pages[j].busy = true
					a.sync(j)
				}
				steps = append(steps, mapStep{first: h, n: n, from: -1, src: a, release: true})
				releasing += n * a.pageBytes
			}
			return true
		})
		a.rememberIdle()
	}
	if len(steps) == 0 {
		return 0
	}
	p.mu.Unlock()
	for k := range steps {
		steps[k].src.runStep(p, &steps[k])
	}
	p.mu.Lock()
	var freed uint64
	for k := range steps {
		st := &steps[k]
		st.src.settle(p, st)
		if st.unmapped {
			freed += st.n * st.src.pageBytes
		}
	}
	p.cond.Broadcast()
	return freed
}

// takenPeak returns the pool's peak used bytes, counting what every shard
// holds now.
func (p *Pool) takenPeak() uint64 {
	if p.spread.Load() {
		p.takenNow()
	}
	return p.peakUsed.Load()
}

// markTouched records that a block now lies on pages [first, last], which
// keeps them from the reclaimer's next pass. Called with p.mu held.
func (a *arena) markTouched(first, last uint64) {
	// The first word's bits from first on, the last word's up to last,
	// every bit of the words between: no mask per word.
	fw, lw := first/64, last/64
	hi := ^uint64(0) >> (^last % 64) // 63 - last%64
	if fw == lw {
		hi &= ^uint64(0) << (first % 64)
	} else {
		a.touched[fw] |= ^uint64(0) << (first % 64)
		for w := fw + 1; w < lw; w++ {
			a.touched[w] = ^uint64(0)
		}
	}
	a.touched[lw] |= hi
}

// idleRun reports whether pages [first, first+n) were free at the
// reclaimer's previous pass and no block has lain on them since.
func (a *arena) idleRun(first, n uint64) bool {
	last := first + n - 1
	for w := first / 64; w <= last/64; w++ {
		m := wordMask(w, first, last)
		if a.idle[w]&m != m || a.touched[w]&m != 0 {
			return false
		}
	}
	return true
}

// rememberIdle starts a new pass interval: the pages free now are the
// candidates of the next pass, and no page has been touched yet.
func (a *arena) rememberIdle() {
	copy(a.idle, a.freeSet)
	clear(a.touched)
}
