package pool

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/memwall/memwall/device"
)

// Counter is the statistics layer: a Resource over another that counts
// what passes through it (allocations, frees, failures, live blocks and
// the bytes of their Sizes, and their peak) and samples allocation
// latency, with
// atomic counters only: no lock, no stop of the world, no walk. It answers
// for any stack (a tenant, a program's own resource) what Pool.Stats
// answers for a pool, in the same Stats struct, so that
// telemetry.RegisterPool can register it. Fields only a pool knows
// (reserved bytes, device calls, free ranges) stay zero.
type Counter struct {
	up   Resource
	name string
	// Counted per operation, from the Block as it passes.
	allocs, frees, fails, ooms atomic.Uint64
	used, peak                 atomic.Uint64
	n                          atomic.Uint64 // allocations, for latency sampling
	lat                        Histogram
}

// NewCounter returns a statistics layer named name over up.
func NewCounter(up Resource, name string) *Counter { return &Counter{up: up, name: name} }

// Upstream returns the resource the counter allocates from.
func (c *Counter) Upstream() Resource { return c.up }

// Alloc allocates from the layer below and counts the block.
func (c *Counter) Alloc(size uint64, o AllocOptions) (Block, error) {
	var start time.Time
	timed := c.n.Add(1)%latencySample == 1
	if timed {
		start = time.Now()
	}
	b, err := c.up.Alloc(size, o)
	if timed {
		c.lat.Observe(time.Since(start))
	}
	if err != nil {
		c.fails.Add(1)
		if errors.Is(err, ErrOutOfMemory) {
			c.ooms.Add(1)
		}
		return b, err
	}
	c.allocs.Add(1)
	updateMax(&c.peak, c.used.Add(b.Size))
	return b, nil
}

// Free frees b through the layer below and counts it when that layer
// accepts it.
func (c *Counter) Free(b Block) error {
	n := heldBytes(b)
	if err := c.up.Free(b); err != nil {
		return err
	}
	c.freed(n)
	return nil
}

// FreeAsync frees b stream-ordered through the layer below and counts it
// when that layer accepts it.
func (c *Counter) FreeAsync(b Block, s device.Stream) error {
	n := heldBytes(b)
	if err := c.up.FreeAsync(b, s); err != nil {
		return err
	}
	c.freed(n)
	return nil
}

func (c *Counter) freed(n uint64) {
	c.frees.Add(1)
	c.used.Add(^(n - 1))
}

// AllocLatency returns the histogram of sampled allocation latencies
// through this layer (the layers below included).
func (c *Counter) AllocLatency() *Histogram { return &c.lat }

// Stats returns the counts as a pool's Stats: Name, Allocs, Frees, OOMs,
// LiveBlocks, UsedBytes, PeakUsedBytes and the latency quantiles. Read while other goroutines allocate, the figures may
// be a few operations apart; with none in flight they are exact.
func (c *Counter) Stats() Stats {
	frees := c.frees.Load() // before allocs: no more frees than allocations
	s := Stats{
		Name:          c.name,
		Backend:       "counter",
		UsedBytes:     c.used.Load(),
		PeakUsedBytes: c.peak.Load(),
		Allocs:        c.allocs.Load(),
		Frees:         frees,
		OOMs:          c.ooms.Load(),
		ByPurpose:     map[string]uint64{},
		AllocP50:      c.lat.Quantile(0.5),
		AllocP99:      c.lat.Quantile(0.99),
	}
	s.LiveBlocks = int(s.Allocs - s.Frees)
	return s
}

// Failures is how many allocations the layers below refused, for any
// reason (out of memory or a bad request).
func (c *Counter) Failures() uint64 { return c.fails.Load() }
