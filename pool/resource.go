package pool

import "github.com/memwall/memwall/device"

// Resource is what every layer of a memory stack is and what each adaptor
// takes from the layer below it, the way RMM composes memory resources:
// blocks out, blocks back. *Pool is the bottom of a stack (its arenas over
// the device memory named by Options.Upstream); *Tenant (quotas and
// ownership), *Counter (statistics) and the resource WithEvents returns
// (every allocation and free reported, as package trace's event log
// records them) each stand over any Resource, so that a stack is built to
// measure:
//
//	p, _ := pool.New(d, pool.DefaultOptions(d))     // arenas and caches
//	t, _ := p.Tenant("bert", 8<<30)                 // a quota
//	r := pool.NewCounter(log.Wrap(t), "bert")       // a trace.EventLog, then counts
//	b, _ := r.Alloc(1<<20, pool.AllocOptions{})
//	_ = r.Free(b)
//
// A block is freed through the layer that handed it out (or one above
// it that passed it on): a tenant refuses blocks that are not its own.
// Implementations are safe for concurrent use.
type Resource interface {
	// Alloc returns a block of at least size bytes. On failure the error
	// wraps ErrOutOfMemory (an *OOMError saying why) or names the bad
	// request.
	Alloc(size uint64, o AllocOptions) (Block, error)
	// Free gives b back for reuse at once: no device work may still use
	// it. Freeing a block twice, a stale copy or another layer's block
	// fails with an error wrapping ErrInvalidHandle and changes nothing.
	Free(b Block) error
	// FreeAsync gives b back once the work already queued on stream s is
	// done.
	FreeAsync(b Block, s device.Stream) error
}

// Layer is a Resource stacked over another: Upstream returns the resource
// it allocates from. A program's own adaptors implement it to stand
// between this package's layers (a tenant finds the tenants below it
// through Upstream).
type Layer interface {
	Resource
	Upstream() Resource
}

var (
	_ Resource = (*Pool)(nil)
	_ Layer    = (*Tenant)(nil)
	_ Layer    = (*Counter)(nil)
	_ Layer    = (*observed)(nil)
)

// ownerOf is the tenant whose blocks r hands out: r itself, the nearest
// tenant below it through Upstream, or nil (r hands out blocks of no
// tenant).
func ownerOf(r Resource) *Tenant {
	for r != nil {
		switch v := r.(type) {
		case *Tenant:
			return v
		case Layer:
			r = v.Upstream()
		default:
			return nil
		}
	}
	return nil
}

// heldBytes is the size of live block b as the pool that made it knows it
// (b.Size as handed out for other resources' blocks): a caller may have
// changed b.Size, and accounting must give back what it counted. Read it
// before the free that may let the block be reused.
func heldBytes(b Block) uint64 {
	if m := b.m; m != nil && m.state.Load() == b.gen&^passed {
		return m.size - m.shift
	}
	return b.Size
}
