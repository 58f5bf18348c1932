package pool

import (
	"sync"
	"time"

	"github.com/memwall/memwall/device"
)

// WithEvents returns the event layer over up: a Resource that calls on
// with an Event for every allocation up hands out and every free up
// accepts, in an order a replay can follow: a free is reported before any
// allocation that gets its address (frees through the layer are
// serialized with the reports of allocations, so on is never called
// concurrently by one layer). A pool's own requests, its tenants'
// included, are reported by Options.OnEvent instead. Events carry the
// name of the nearest Tenant below (empty for none). Package trace's
// EventLog.Wrap is this layer writing the log `memwall replay` reads.
func WithEvents(up Resource, on func(Event)) Resource {
	return &observed{up: up, on: on, tenant: ownerOf(up)}
}

// observed is WithEvents's layer. mu orders the reports: a free holds it
// from before up frees until its event is reported, an allocation takes it
// to report, so an allocation that got a freed address reports after the
// free.
type observed struct {
	up     Resource
	on     func(Event)
	tenant *Tenant // the nearest tenant below, the events' label
	mu     sync.Mutex
}

func (r *observed) Upstream() Resource { return r.up }

func (r *observed) Alloc(size uint64, o AllocOptions) (Block, error) {
	b, err := r.up.Alloc(size, o)
	if err == nil {
		if b.m == nil {
			size = b.Size // what the free will know
		}
		ev := Event{Time: time.Now(), Ptr: b.Ptr, Size: size, Stream: o.Stream, Purpose: o.Purpose, Tenant: r.tenant.name()}
		r.mu.Lock()
		r.on(ev)
		r.mu.Unlock()
	}
	return b, err
}

func (r *observed) Free(b Block) error { return r.free(b, 0) }

func (r *observed) FreeAsync(b Block, s device.Stream) error { return r.free(b, s) }

// free frees b (stream-ordered on s when s is not 0) and reports it. A
// pool's block is reported with the size it was asked for and its purpose,
// another resource's with its Size (as its allocation was).
func (r *observed) free(b Block, s device.Stream) error {
	size, purpose := b.Size, Other
	if m := b.m; m != nil && m.state.Load() == b.gen&^passed {
		size, purpose = m.req, m.purpose
	}
	ev := Event{Free: true, Ptr: b.Ptr, Size: size, Stream: s, Purpose: purpose, Tenant: r.tenant.name()}
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	if s == 0 {
		err = r.up.Free(b)
	} else {
		err = r.up.FreeAsync(b, s)
	}
	if err == nil {
		ev.Time = time.Now()
		r.on(ev)
	}
	return err
}
