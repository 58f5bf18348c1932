package pool

import (
	"fmt"

	"github.com/memwall/memwall/alloc"
)

// CheckPages verifies the page bookkeeping of every virtual arena against
// the allocator: a page is in the free set exactly when it is mapped, not
// busy, and covered entirely by one free range; the ready set holds the
// mapped pages that are not busy; the byte counts agree with the sets.
func CheckPages(p *Pool) error {
	for _, s := range allShards(p) {
		if err := checkPages(s); err != nil {
			return err
		}
	}
	return nil
}

// allShards returns the root and every shard made so far.
func allShards(p *Pool) []*Pool {
	ss := []*Pool{p}
	p.eachShard(func(s *Pool) { ss = append(ss, s) })
	return ss
}

// SpreadShards makes every central entry of p go to the next of its
// shards in turn (p must have been made with Shards > 1), so that one
// goroutine's blocks are placed and freed across shards.
func SpreadShards(p *Pool) { p.shards.spread.Store(true) }

// ShardsMade returns how many shards p has made, the root included.
func ShardsMade(p *Pool) int { return len(allShards(p)) }

func checkPages(p *Pool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ai, a := range p.arenas {
		if !a.virtual {
			continue
		}
		// A lean arena's free set is rebuilt where it is used; check
		// the rebuild.
		a.freshen()
		free := make([]bool, len(a.pages))
		a.alloc.Walk(func(s alloc.Segment) bool {
			if s.Free {
				for i := (s.Offset + a.pageBytes - 1) / a.pageBytes; (i+1)*a.pageBytes <= s.Offset+s.Size; i++ {
					free[i] = true
				}
			}
			return true
		})
		// Pages past the allocator's range are free too (mapped by a
		// warm-up before the range grew over them).
		for i := (a.alloc.Capacity() + a.pageBytes - 1) / a.pageBytes; i < uint64(len(free)); i++ {
			free[i] = true
		}
		var n, mapped, top uint64
		for i := range a.pages {
			pg := &a.pages[i]
			inSet := a.freeSet[i/64]&(1<<(i%64)) != 0
			ready := a.ready[i/64]&(1<<(i%64)) != 0
			if ready != (pg.mapped && !pg.busy) {
				return fmt.Errorf("arena %d page %d: ready bit %v, mapped %v busy %v", ai, i, ready, pg.mapped, pg.busy)
			}
			if pg.mapped {
				mapped += a.pageBytes
			}
			if inSet {
				n += a.pageBytes
				top = uint64(i) + 1
			}
			if a.lean {
				if want := free[i] && pg.mapped && !pg.busy; inSet != want {
					return fmt.Errorf("arena %d page %d: in free set %v, want %v (entirely free %v, mapped %v, busy %v)", ai, i, inSet, want, free[i], pg.mapped, pg.busy)
				}
			} else if inSet != (pg.mapped && pg.refs == 0 && !pg.busy) {
				return fmt.Errorf("arena %d page %d: in free set %v with %d references", ai, i, inSet, pg.refs)
			}
		}
		if n != a.freePages {
			return fmt.Errorf("arena %d: %d bytes of free pages counted, %d in the free set", ai, a.freePages, n)
		}
		if mapped != a.mapped {
			return fmt.Errorf("arena %d: %d bytes mapped counted, %d mapped", ai, a.mapped, mapped)
		}
		if top > a.freeTop {
			return fmt.Errorf("arena %d: free page below %d, freeTop %d", ai, top, a.freeTop)
		}
	}
	return nil
}

// ArenaAllocs returns how many blocks the pool's arenas have handed out
// (allocations from the allocators, cache refills included).
func ArenaAllocs(p *Pool) uint64 {
	var n uint64
	for _, s := range allShards(p) {
		s.mu.Lock()
		for _, a := range s.arenas {
			n += a.alloc.Stats().Allocs
		}
		s.mu.Unlock()
	}
	return n
}

// NextShard makes the next central entry of p, whose shards are spread
// (SpreadShards), go to shard k.
func NextShard(p *Pool, k int) {
	n := len(p.shards.list)
	p.shards.turn.Store(uint32((k + n - 1) % n))
}

// LockShard locks shard k of p (made now if need be) and returns the
// function that unlocks it.
func LockShard(p *Pool, k int) func() {
	s := p
	if k != 0 {
		s = p.makeShard(k)
	}
	s.mu.Lock()
	return s.mu.Unlock
}

// QueuedFrees counts the blocks waiting in p's shards' queues. Call it
// while nothing else uses p.
func QueuedFrees(p *Pool) int {
	n := 0
	for _, s := range allShards(p) {
		for m := s.remote.Load(); m != nil; m = m.next {
			n++
		}
	}
	return n
}

// Balanced turns on p's balancing of free pages across shards.
func Balanced(p *Pool) {
	if p.shards != nil {
		p.balancing.Store(true)
	}
}

// ReclaimerStarted reports whether p's background reclaimer has started.
func ReclaimerStarted(p *Pool) bool { return p.rec.Load() != nil }
