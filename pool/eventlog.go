package pool

import (
	"io"
	"sync"

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
