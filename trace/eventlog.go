package trace

import (
	"io"
	"sync"

	"github.com/memwall/memwall/pool"
)

// EventLog writes a pool's events as a memwall event log (JSON lines: an
// alloc, or for a free a free_requested and a free_completed at once),
// which `memwall replay` reads to replay the requests through other pool
// configurations and `memwall replay --html` draws. Record is the pool's
// event hook (pool.Options.OnEvent); Wrap puts the log over any
// pool.Resource. One log may record several pools; their addresses share
// the file, so record pools of one address space (a device's) together.
//
//	log := trace.NewEventLog(f)
//	p, _ := pool.New(d, pool.Options{OnEvent: log.Record})
//	... // allocate and free
//	err := log.Flush()
type EventLog struct {
	mu     sync.Mutex
	tw     *Writer
	err    error
	events int
}

// NewEventLog returns a log that writes to w, buffered: Flush writes what
// is left.
func NewEventLog(w io.Writer) *EventLog {
	return &EventLog{tw: NewWriter(w)}
}

// Record appends ev; it is safe for concurrent use. After a write error
// the log records nothing more and Flush returns the error.
func (l *EventLog) Record(ev pool.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.err = writePoolEvent(l.tw, ev)
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

// Wrap returns the event-log layer over up (pool.WithEvents recording into
// the log): every allocation up hands out and every free up accepts, a
// free recorded before any allocation that gets its address, so the log
// replays. Set Record as a pool's Options.OnEvent instead to log the
// pool's own requests, its tenants' included.
func (l *EventLog) Wrap(up pool.Resource) pool.Resource { return pool.WithEvents(up, l.Record) }

// writePoolEvent writes ev as the log's events: an alloc, or for a free a
// free_requested and a free_completed at the same time.
func writePoolEvent(tw *Writer, ev pool.Event) error {
	te := Event{Action: Alloc, Addr: uint64(ev.Ptr), Size: ev.Size, Stream: uint64(ev.Stream),
		Time: ev.Time.UnixNano(), Purpose: ev.Purpose.String(), Tenant: ev.Tenant}
	if ev.Free {
		te.Action = FreeRequested
		if err := tw.Write(te); err != nil {
			return err
		}
		te.Action = FreeCompleted
	}
	return tw.Write(te)
}
