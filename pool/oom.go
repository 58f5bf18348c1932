package pool

import (
	"time"

	"github.com/memwall/memwall/alloc"
)

// Snapshot is a pool's memory at the moment an allocation failed: the
// device memory it held, the blocks taken out of its arenas, and, when
// Options.History is set, the allocations and frees that led there. It is
// plain data: package trace writes it as a memwall event log
// (trace.WriteSnapshot), which `memwall replay --html` draws, the way
// PyTorch users read the snapshot an OOM observer dumps.
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
