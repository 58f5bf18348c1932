package pool

import (
	"sync"
)

// shard is one small-block cache: per size class, a stack of freed blocks
// that are still allocated in their arena. Goroutines pick a shard by
// rotating try-locks, so concurrent small allocations rarely wait for each
// other or for the central lock.
type shard struct {
	mu    sync.Mutex
	idx   int
	lists []*meta
	count []int
	bytes uint64   // cached bytes
	c     counters // accounting of operations served here
	_     [64]byte // keep shards on separate cache lines
}

const shardMaxBytes = 2 << 20 // cached bytes per shard before draining

// batchFor is how many blocks of a class one refill takes from the arena.
func batchFor(cls int) int {
	n := int((256 << 10) / sizeClasses[cls])
	return max(1, min(n, 4))
}

// token gives a goroutine affinity to one shard: tokens live in a
// sync.Pool, whose Get returns the token last Put on the same processor, so
// work on one processor keeps using one shard (its cache lines stay local)
// without any shared counter. A token the pool dropped at a GC is simply
// made again.
type token struct {
	shard int
	n     uint32 // operations through this token, for latency sampling
}

func (p *Pool) getToken() *token { return p.tokens.Get().(*token) }

func (p *Pool) newToken() any {
	// A new token times its first allocation, so short-lived pools (and
	// tokens the sync.Pool dropped) still feed the latency histogram.
	return &token{shard: int(p.tokenSeq.Add(1)) % len(p.shards), n: latencySample - 1}
}

// pickShard locks shard i, or the next free one when another processor
// holds it.
func (p *Pool) pickShard(i int) *shard {
	n := len(p.shards)
	for j := 0; j < n; j++ {
		s := &p.shards[(i+j)%n]
		if s.mu.TryLock() {
			return s
		}
	}
	s := &p.shards[i]
	s.mu.Lock()
	return s
}

func (s *shard) pop(cls int) *meta {
	m := s.lists[cls]
	if m != nil {
		s.lists[cls] = m.next
		m.next = nil
		s.count[cls]--
		s.bytes -= sizeClasses[cls]
	}
	return m
}

func (s *shard) push(m *meta, cls int) {
	m.next = s.lists[cls]
	s.lists[cls] = m
	s.count[cls]++
	s.bytes += sizeClasses[cls]
}

// cacheAlloc serves a small block from a shard, refilling the shard from the
// arenas in a batch when its list for the class is empty.
func (p *Pool) cacheAlloc(tok *token, cls int, req uint64, purpose Purpose, t *Tenant) (*meta, error) {
	s := p.pickShard(tok.shard)
	if s.count == nil {
		s.count = make([]int, len(sizeClasses))
	}
	m := s.pop(cls)
	if m != nil {
		m.req, m.purpose, m.tenant, m.shard = req, purpose, t, s.idx
		s.c.add(m)
		s.mu.Unlock()
		return m, nil
	}
	s.mu.Unlock()
	size := sizeClasses[cls]
	p.mu.Lock()
	first, err := p.arenaAlloc(size, p.opts.Alignment, 0)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	first.class = cls + 1
	first.req, first.purpose, first.tenant, first.shard = req, purpose, t, tok.shard
	p.central.add(first)
	var extra []*meta
	for k := 1; k < batchFor(cls); k++ {
		m, err := p.tryArenas(size, p.opts.Alignment)
		if m == nil || err != nil {
			break // the batch is an optimization: never grow for it
		}
		m.class = cls + 1
		extra = append(extra, m)
	}
	p.mu.Unlock()
	if len(extra) > 0 {
		s = p.pickShard(tok.shard)
		if s.count == nil {
			s.count = make([]int, len(sizeClasses))
		}
		for _, m := range extra {
			s.push(m, cls)
		}
		s.mu.Unlock()
	}
	return first, nil
}

// cacheFree puts a small block back into a shard, draining the shard into
// the arenas when it holds too much.
func (p *Pool) cacheFree(m *meta) {
	cls := m.class - 1
	s := p.pickShard(m.shard)
	if s.count == nil {
		s.count = make([]int, len(sizeClasses))
	}
	s.c.sub(m)
	s.push(m, cls)
	var drain []*meta
	if s.bytes > shardMaxBytes {
		for s.bytes > shardMaxBytes/2 {
			// Drain the class just freed first, then any other.
			c := cls
			if s.count[c] == 0 {
				for c = range s.lists {
					if s.count[c] > 0 {
						break
					}
				}
			}
			drain = append(drain, s.pop(c))
		}
	}
	s.mu.Unlock()
	if len(drain) > 0 {
		p.mu.Lock()
		for _, d := range drain {
			p.release(d)
		}
		p.mu.Unlock()
	}
}

// flushCaches returns every cached block to its arena. Called with p.mu held.
func (p *Pool) flushCaches() uint64 {
	var n uint64
	for i := range p.shards {
		s := &p.shards[i]
		s.mu.Lock()
		var all []*meta
		for c := range s.lists {
			for s.count != nil && s.count[c] > 0 {
				all = append(all, s.pop(c))
			}
		}
		s.mu.Unlock()
		for _, m := range all {
			n += m.size
			p.release(m)
		}
	}
	return n
}
