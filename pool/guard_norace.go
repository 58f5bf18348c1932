//go:build !race

package pool

// cacheGuard orders accesses to one processor's cache. Without the race
// detector, pinning already excludes other goroutines on the same
// processor, and other processors reach the cache only while the caches
// are revoked (Pool.stopCaches), so the guard is empty.
type cacheGuard struct{}

func (*cacheGuard) enter() bool { return true }
func (*cacheGuard) exit()       {}

// stopCaches gives the caller exclusive access to every processor's cache:
// after it, fast paths find the caches revoked and take the central path.
// Called with p.mu held; resumeCaches undoes it.
func (p *Pool) stopCaches() {
	if p.single {
		p.procs[0].mu.Lock()
		defer p.procs[0].mu.Unlock()
	}
	p.revoked.Store(true)
	stopTheWorld()
}

func (p *Pool) resumeCaches() { p.revoked.Store(false) }

// readCaches calls fn on every processor's cache without stopping it: fn
// only reads words that their owner writes whole (see Pool.totals). The
// shared cache of Options.Cache = CacheShared is read under its lock.
func (p *Pool) readCaches(fn func(*procCache)) {
	if p.single {
		p.procs[0].mu.Lock()
		defer p.procs[0].mu.Unlock()
	}
	for i := range p.procs {
		fn(&p.procs[i])
	}
}
