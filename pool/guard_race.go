//go:build race

package pool

import "sync"

// cacheGuard orders accesses to one processor's cache. Under the race
// detector, which does not know that pinning excludes other goroutines, a
// mutex makes the ordering visible: the fast path only try-locks it (a
// pinned goroutine must never block) and takes the central path when it
// is held.
type cacheGuard struct{ mu sync.Mutex }

func (g *cacheGuard) enter() bool { return g.mu.TryLock() }
func (g *cacheGuard) exit()       { g.mu.Unlock() }

// stopCaches gives the caller exclusive access to every processor's cache.
// Called with p.mu held; resumeCaches undoes it.
func (p *Pool) stopCaches() {
	if p.single {
		p.procs[0].mu.Lock()
		defer p.procs[0].mu.Unlock()
	}
	p.revoked.Store(true)
	for i := range p.procs {
		p.procs[i].g.mu.Lock()
	}
}

func (p *Pool) resumeCaches() {
	for i := range p.procs {
		p.procs[i].g.mu.Unlock()
	}
	p.revoked.Store(false)
}

// readCaches calls fn on every processor's cache. Under the race detector
// each cache's guard is held meanwhile (fast paths on that processor take
// the central path for that moment), so that the detector sees the reads
// ordered; without it the reads need no guard (guard_norace.go).
func (p *Pool) readCaches(fn func(*procCache)) {
	if p.single {
		p.procs[0].mu.Lock()
		defer p.procs[0].mu.Unlock()
	}
	for i := range p.procs {
		g := &p.procs[i].g
		g.mu.Lock()
		fn(&p.procs[i])
		g.mu.Unlock()
	}
}
