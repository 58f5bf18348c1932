package trace

import (
	"io"

	"github.com/memwall/memwall/pool"
)

// WriteSnapshot writes a pool's out-of-memory snapshot (pool.OOMError's
// Snapshot) to w as an event log that replays to the moment of the
// failure: a segment_alloc per reserved range, an alloc per block that was
// held before the history began, the history's allocations and frees
// (free_requested and free_completed at once), and an oom event for the
// request. Blocks the pool held in caches appear as allocations too: they
// were memory no request could use. `memwall replay --html page.html
// FILE` draws it. It returns the bytes written and the first write error.
func WriteSnapshot(w io.Writer, s *pool.Snapshot) (int64, error) {
	cw := &countWriter{w: w}
	tw := NewWriter(cw)
	t0 := s.Time.UnixNano()
	for _, r := range s.Reserved {
		_ = tw.Write(Event{Action: SegmentAlloc, Addr: uint64(r.Ptr), Size: r.Size, Time: t0})
	}
	// The blocks live when the history began: those held at the failure
	// that the history did not allocate, and those it freed that it did
	// not allocate.
	born := map[uint64]bool{}
	var before []Event
	for _, ev := range s.Events {
		if !ev.Free {
			born[uint64(ev.Ptr)] = true
		} else if !born[uint64(ev.Ptr)] {
			before = append(before, Event{Action: Alloc, Addr: uint64(ev.Ptr), Size: ev.Size, Time: t0,
				Purpose: ev.Purpose.String(), Tenant: ev.Tenant})
		}
	}
	for _, b := range s.Blocks {
		if !bornIn(born, b) {
			ev := Event{Action: Alloc, Addr: uint64(b.Ptr), Size: b.Size, Time: t0, Tenant: b.Tenant}
			if b.Purpose != pool.Other {
				ev.Purpose = b.Purpose.String()
			}
			_ = tw.Write(ev)
		}
	}
	for _, ev := range before {
		_ = tw.Write(ev)
	}
	for _, ev := range s.Events {
		_ = writePoolEvent(tw, ev)
	}
	_ = tw.Write(Event{Action: OOM, Size: s.Requested, DeviceFree: s.DeviceFree, Time: t0})
	err := tw.Flush()
	return cw.n, err
}

// bornIn reports whether the history allocated a block inside b.
func bornIn(born map[uint64]bool, b pool.SnapshotBlock) bool {
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
