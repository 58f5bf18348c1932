package pool

import (
	"io"
	"sync"
	"time"

	"github.com/memwall/memwall/device"

	"github.com/memwall/memwall/trace"
)

// EventLog is the pool's event-log adaptor: its Record, set as
// Options.OnEvent, writes every allocation and free as a memwall event log
// (package trace's JSON lines: alloc, then free_requested and
// free_completed at once), which `memwall replay` reads to replay the
// pool's requests through other configurations and `memwall replay --html`
// draws. One log may record several pools; their addresses share the
// file, so record pools of one address space (a device's) together.
//
//	log := pool.NewEventLog(f)
//	p, _ := pool.New(d, pool.Options{OnEvent: log.Record})
//	... // allocate and free
//	err := log.Flush()
type EventLog struct {
	mu     sync.Mutex
	tw     *trace.Writer
	err    error
	events int
}

// NewEventLog returns a log that writes to w, buffered: Flush writes what
// is left.
func NewEventLog(w io.Writer) *EventLog {
	return &EventLog{tw: trace.NewWriter(w)}
}

// Record appends ev; it is safe for concurrent use. After a write error
// the log records nothing more and Flush returns the error.
func (l *EventLog) Record(ev Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.err = writeEvent(l.tw, ev)
	l.events++
}

// Events is how many allocations and frees the log recorded.
func (l *EventLog) Events() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events
}

// Flush writes the buffered events and returns the first error of any
// write.
func (l *EventLog) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	l.err = l.tw.Flush()
	return l.err
}

// writeEvent writes ev as the log's events: an alloc, or for a free a
// free_requested and a free_completed at the same time.
func writeEvent(tw *trace.Writer, ev Event) error {
	te := trace.Event{Action: trace.Alloc, Addr: uint64(ev.Ptr), Size: ev.Size, Stream: uint64(ev.Stream),
		Time: ev.Time.UnixNano(), Purpose: ev.Purpose.String(), Tenant: ev.Tenant}
	if ev.Free {
		te.Action = trace.FreeRequested
		if err := tw.Write(te); err != nil {
			return err
		}
		te.Action = trace.FreeCompleted
	}
	return tw.Write(te)
}

// Wrap returns the event-log layer over up: a Resource that records in
// the log every allocation up hands out and every free up accepts, in an
// order replay can follow: a free is recorded before any allocation that
// gets its address (frees through the layer are serialized with the
// recording of allocations). Set Record as a pool's Options.OnEvent
// instead to log the pool's own requests, its tenants' included.
func (l *EventLog) Wrap(up Resource) Resource { return &logged{up: up, log: l, tenant: ownerOf(up)} }

// logged is EventLog.Wrap's layer. mu orders the records: a free holds it
// from before up frees until its event is recorded, an allocation takes it
// to record, so an allocation that got a freed address records after the
// free.
type logged struct {
	up     Resource
	log    *EventLog
	tenant *Tenant // the nearest tenant below, the events' label
	mu     sync.Mutex
}

func (r *logged) Upstream() Resource { return r.up }

func (r *logged) Alloc(size uint64, o AllocOptions) (Block, error) {
	b, err := r.up.Alloc(size, o)
	if err == nil {
		if b.m == nil {
			size = b.Size // what the free will know
		}
		ev := Event{Time: time.Now(), Ptr: b.Ptr, Size: size, Stream: o.Stream, Purpose: o.Purpose, Tenant: r.tenant.name()}
		r.mu.Lock()
		r.log.Record(ev)
		r.mu.Unlock()
	}
	return b, err
}

func (r *logged) Free(b Block) error { return r.free(b, 0) }

func (r *logged) FreeAsync(b Block, s device.Stream) error { return r.free(b, s) }

// free frees b (stream-ordered on s when s is not 0) and records it. A
// pool's block is logged with the size it was asked for and its purpose,
// another resource's with its Size (as its allocation was).
func (r *logged) free(b Block, s device.Stream) error {
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
		r.log.Record(ev)
	}
	return err
}
