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
