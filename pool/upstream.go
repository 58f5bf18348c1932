package pool

import (
	"fmt"
	"sync"

	"github.com/memwall/memwall/device"
)

// Upstream is the device memory under a pool's arenas, the bottom layer
// of a stack: chunks of memory (Alloc, Free) and how much is left
// (MemInfo). Every device.Device is one, and it is the default
// (Options.Upstream nil); Chunks makes one of any Resource, so that a pool
// stands over another pool (a model's pool, with its own arenas, caches
// and limit, inside a server's). A pool grows by one virtual range of
// mapped pages (GrowVirtual) only over its device: physical pages come
// from the driver, so a pool over another Upstream grows by chunks.
type Upstream interface {
	// MemInfo returns the free and total bytes the upstream can give, or
	// an error when it cannot tell (then the pool reads no pressure from
	// it).
	MemInfo() (free, total uint64, err error)
	// Alloc returns size bytes, aligned to at least 256. A refusal for
	// want of memory wraps ErrOutOfMemory or device.ErrOutOfMemory.
	Alloc(size uint64) (device.Ptr, error)
	// Free gives back memory from Alloc.
	Free(p device.Ptr) error
}

// Chunks returns an Upstream whose chunks are blocks of r, allocated with
// o (their purpose, an alignment). Its MemInfo is r's when r, or a
// resource below it through Layer.Upstream, has one (a *Pool: see
// Pool.MemInfo).
func Chunks(r Resource, o AllocOptions) Upstream {
	return &chunks{r: r, o: o, live: map[device.Ptr]Block{}}
}

type chunks struct {
	r    Resource
	o    AllocOptions
	mu   sync.Mutex
	live map[device.Ptr]Block
}

func (c *chunks) Alloc(size uint64) (device.Ptr, error) {
	b, err := c.r.Alloc(size, c.o)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	c.live[b.Ptr] = b
	c.mu.Unlock()
	return b.Ptr, nil
}

func (c *chunks) Free(p device.Ptr) error {
	c.mu.Lock()
	b, ok := c.live[p]
	delete(c.live, p)
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("chunk %#x was not allocated here: %w", uint64(p), device.ErrInvalid)
	}
	return c.r.Free(b)
}

func (c *chunks) MemInfo() (free, total uint64, err error) {
	for r := c.r; r != nil; {
		if mi, ok := r.(interface {
			MemInfo() (uint64, uint64, error)
		}); ok {
			return mi.MemInfo()
		}
		l, ok := r.(Layer)
		if !ok {
			break
		}
		r = l.Upstream()
	}
	return 0, 0, fmt.Errorf("the resource under these chunks reports no free memory: %w", device.ErrUnsupported)
}

// MemInfo returns what the pool could still hand out, as an Upstream
// reports it: free is the reserved bytes no block holds plus what the
// pool may still reserve (up to its limit, and no more than its upstream
// has free), total its limit.
func (p *Pool) MemInfo() (free, total uint64, err error) {
	p.mu.Lock()
	reserved := p.reserved.Load()
	idle := reserved - min(reserved, p.takenNow())
	p.mu.Unlock()
	more := p.limitBytes() - min(p.limitBytes(), reserved)
	if f, _, err := p.up.MemInfo(); err == nil {
		more = min(more, f)
	}
	return idle + more, p.limitBytes(), nil
}
