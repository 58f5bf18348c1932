package pool

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/memwall/memwall/alloc"
	"github.com/memwall/memwall/trace"
)

// Snapshot is a pool's memory at the moment an allocation failed: the
// device memory it held, the blocks taken out of its arenas, and, when
// Options.History is set, the allocations and frees that led there. Its
// WriteTo writes it as a memwall event log (package trace's JSON lines),
// which `memwall replay --html` draws, the way PyTorch users read the
// snapshot an OOM observer dumps.
type Snapshot struct {
	Pool string
	Time time.Time
	// Reserved are the ranges of device memory held (chunks, runs of
	// mapped pages), in address order within each arena.
	Reserved []Range
	// Blocks are the ranges held by blocks (live, cached or pending),
	// each with the purpose and tenant of the live ones where known.
	Blocks []SnapshotBlock
	// Events are the last Options.History allocations and frees, oldest
	// first; empty without a history.
	Events []Event
	// Requested is the allocation that failed.
	Requested uint64
	// DeviceFree is what the device reported free at the failure.
	DeviceFree uint64
}

// SnapshotBlock is one block of a Snapshot.
type SnapshotBlock struct {
	Range
	Purpose Purpose
	Tenant  string
}

// history is a ring of the last events (Options.History). Guarded by
// Pool.mu, like the event hook that fills it.
type history struct {
	buf  []Event
	next int
	full bool
}

func (h *history) add(ev Event) {
	h.buf[h.next] = ev
	h.next++
	if h.next == len(h.buf) {
		h.next, h.full = 0, true
	}
}

func (h *history) events() []Event {
	if !h.full {
		return append([]Event(nil), h.buf[:h.next]...)
	}
	return append(append([]Event(nil), h.buf[h.next:]...), h.buf[:h.next]...)
}

// snapshot captures the pool's memory for an OOMError. Called with p.mu
// held.
func (p *Pool) snapshot(size uint64) *Snapshot {
	s := &Snapshot{Pool: p.opts.Name, Time: time.Now(), Requested: size}
	if free, _, err := p.up.MemInfo(); err == nil {
		s.DeviceFree = free
	}
	s.Reserved = p.reservationsLocked()
	for _, a := range p.arenas {
		a.alloc.Walk(func(seg alloc.Segment) bool {
			if !seg.Free {
				s.Blocks = append(s.Blocks, SnapshotBlock{Range: Range{Ptr: a.ptr(seg.Offset), Size: seg.Size}})
			}
			return true
		})
	}
	if p.hist != nil {
		s.Events = p.hist.events()
		// Label the live blocks the history saw allocated.
		label := map[uint64]Event{}
		for _, ev := range s.Events {
			if ev.Free {
				delete(label, uint64(ev.Ptr))
			} else {
				label[uint64(ev.Ptr)] = ev
			}
		}
		for i := range s.Blocks {
			b := &s.Blocks[i]
			for ptr, ev := range label {
				if ptr >= uint64(b.Ptr) && ptr < uint64(b.Ptr)+b.Size {
					b.Purpose, b.Tenant = ev.Purpose, ev.Tenant
				}
			}
		}
	}
	return s
}

// WriteTo writes s as an event log that replays to the moment of the
// failure: a segment_alloc per reserved range, an alloc per block that was
// held before the history began, the history's allocations and frees
// (free_requested and free_completed at once), and an oom event for the
// request. Blocks the pool held in caches appear as allocations too: they
// were memory no request could use.
func (s *Snapshot) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: w}
	tw := trace.NewWriter(cw)
	t0 := s.Time.UnixNano()
	for _, r := range s.Reserved {
		_ = tw.Write(trace.Event{Action: trace.SegmentAlloc, Addr: uint64(r.Ptr), Size: r.Size, Time: t0})
	}
	// The blocks live when the history began: those held at the failure
	// that the history did not allocate, and those it freed that it did
	// not allocate.
	born := map[uint64]bool{}
	var before []trace.Event
	for _, ev := range s.Events {
		if !ev.Free {
			born[uint64(ev.Ptr)] = true
		} else if !born[uint64(ev.Ptr)] {
			before = append(before, trace.Event{Action: trace.Alloc, Addr: uint64(ev.Ptr), Size: ev.Size, Time: t0,
				Purpose: ev.Purpose.String(), Tenant: ev.Tenant})
		}
	}
	for _, b := range s.Blocks {
		if !bornIn(born, b) {
			ev := trace.Event{Action: trace.Alloc, Addr: uint64(b.Ptr), Size: b.Size, Time: t0, Tenant: b.Tenant}
			if b.Purpose != Other {
				ev.Purpose = b.Purpose.String()
			}
			_ = tw.Write(ev)
		}
	}
	for _, ev := range before {
		_ = tw.Write(ev)
	}
	for _, ev := range s.Events {
		_ = writeEvent(tw, ev)
	}
	_ = tw.Write(trace.Event{Action: trace.OOM, Size: s.Requested, DeviceFree: s.DeviceFree, Time: t0})
	err := tw.Flush()
	return cw.n, err
}

// bornIn reports whether the history allocated a block inside b.
func bornIn(born map[uint64]bool, b SnapshotBlock) bool {
	if len(born) == 0 {
		return false
	}
	for ptr := range born {
		if ptr >= uint64(b.Ptr) && ptr < uint64(b.Ptr)+b.Size {
			return true
		}
	}
	return false
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// WriteSnapshot writes the pool's snapshot at the failure to the file at
// path (see Snapshot.WriteTo); `memwall replay --html page.html path`
// draws it.
func (e *OOMError) WriteSnapshot(path string) error {
	if e.Snapshot == nil {
		return fmt.Errorf("%s: the out-of-memory error holds no snapshot", poolLabel(e.Pool))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := e.Snapshot.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write OOM snapshot %s: %w", path, err)
	}
	return f.Close()
}
