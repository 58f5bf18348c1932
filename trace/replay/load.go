package replay

import (
	"errors"
	"fmt"
	"io"

	"github.com/memwall/memwall/trace"
)

// FreeAt says which trace event frees a block in a replay.
type FreeAt uint8

// Free points.
const (
	// FreeCompleted frees a block at its free_completed event: when
	// PyTorch's allocator could reuse it (the default).
	FreeCompleted FreeAt = iota
	// FreeRequested frees a block at its free_requested event: when the
	// program dropped it. The pool is then assumed to see the frees in
	// stream order (a block is reused only by work ordered after its last
	// use, as on a single stream); free_completed events are ignored.
	FreeRequested
)

func (f FreeAt) String() string {
	if f == FreeRequested {
		return "requested"
	}
	return "completed"
}

// ParseFreeAt returns the FreeAt named "completed" or "requested".
func ParseFreeAt(s string) (FreeAt, error) {
	switch s {
	case "completed", "free_completed":
		return FreeCompleted, nil
	case "requested", "free_requested":
		return FreeRequested, nil
	}
	return 0, fmt.Errorf("free point %q: want completed or requested", s)
}

// LoadOptions tune Load.
type LoadOptions struct {
	// FreeAt picks the event that frees a block.
	FreeAt FreeAt
	// Lenient skips bad records (a free of an unknown address, a double
	// alloc, an unknown action, a bad size, a malformed line) and counts
	// them in Trace.Skipped instead of failing.
	Lenient bool
	// MaxOps bounds the ops kept in memory (16 bytes each); a longer trace
	// fails with ErrTooLong. Zero means DefaultMaxOps.
	MaxOps int
}

// DefaultMaxOps is the default LoadOptions.MaxOps: 2^26 ops, 1 GiB.
const DefaultMaxOps = 1 << 26

// ErrTooLong: the trace holds more alloc and free events than
// LoadOptions.MaxOps.
var ErrTooLong = errors.New("trace too long to replay")

// Op is one step of a replay: allocate Size bytes for block ID, or free
// block ID. IDs are dense (reused once a block is freed), so a replay keeps
// its live blocks in a slice indexed by ID.
type Op struct {
	Size uint64 // bytes requested; the block's size for a free
	ID   uint32
	Free bool
}

// Trace is a trace reduced to what a replay needs: its allocs and frees in
// order, with addresses mapped to dense block IDs. A Trace is immutable
// once loaded and safe to replay concurrently.
type Trace struct {
	Name   string
	Format trace.Format
	Ops    []Op
	// Events is the number of events read (every action, after skipped
	// records); Allocs the alloc events among them.
	Events, Allocs int64
	// PeakLive is the largest sum of live requested bytes, reached after
	// op PeakOp (an index into Ops).
	PeakLive uint64
	PeakOp   int
	// MaxID is one more than the largest block ID: the most blocks live at
	// once.
	MaxID int
	// Unfreed counts blocks still live at the end of the trace.
	Unfreed int
	// Meta is what the reader learned: PyTorch's own reserved bytes and
	// segment allocations where the trace has them.
	Meta trace.Meta
	// Skipped counts bad records dropped in lenient mode (the reader's and
	// Load's own); FirstSkipped is one of the first (Load's own first,
	// then the reader's), with its position.
	Skipped      int64
	FirstSkipped error
}

// PyTorchReserved returns the bytes PyTorch's allocator reserved (the peak
// of its segment allocations and mappings, or a snapshot's segments when
// the trace has no segment events) and whether the trace says.
func (t *Trace) PyTorchReserved() (uint64, bool) {
	m := t.Meta
	if m.PeakReserved > 0 {
		return m.PeakReserved, true
	}
	if m.HasSegments {
		return m.SegmentsReserved, true
	}
	return 0, false
}

// PyTorchDeviceAllocs returns the number of segment_alloc events (PyTorch's
// cudaMalloc calls) and whether the trace records segments at all.
func (t *Trace) PyTorchDeviceAllocs() (int64, bool) {
	m := t.Meta
	if m.SegmentAllocs > 0 || m.PeakReserved > 0 {
		return m.SegmentAllocs, true
	}
	return 0, false
}

// Load reads the trace file at path (any format package trace reads).
// Errors for bad input are *trace.Error values naming the file and the
// line or offset.
func Load(path string, o LoadOptions) (*Trace, error) {
	r, err := trace.Open(path, trace.Options{Lenient: o.Lenient})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return Read(r, path, o)
}

// Read loads the events of r (opened with the same Lenient setting as o)
// into a Trace named name. It does not close r.
func Read(r *trace.Reader, name string, o LoadOptions) (*Trace, error) {
	maxOps := o.MaxOps
	if maxOps <= 0 {
		maxOps = DefaultMaxOps
	}
	t := &Trace{Name: name, Format: r.Format()}
	ids := make(map[uint64]uint32)
	var freeIDs []uint32
	var live uint64
	var own int64 // records skipped here, not by the reader
	skip := func(err error) error {
		e := &trace.Error{File: name, Pos: r.Pos(), Err: err}
		if !o.Lenient {
			return e
		}
		own++
		if t.FirstSkipped == nil {
			t.FirstSkipped = e
		}
		return nil
	}
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		t.Events++
		var op Op
		switch ev.Action {
		case trace.Alloc:
			t.Allocs++
			if _, ok := ids[ev.Addr]; ok {
				if err := skip(fmt.Errorf("%w: alloc of %d bytes at %#x, already live", trace.ErrDoubleAlloc, ev.Size, ev.Addr)); err != nil {
					return nil, err
				}
				continue
			}
			if ev.Size == 0 {
				continue // nothing to allocate; its free is ignored below
			}
			var id uint32
			if n := len(freeIDs); n > 0 {
				id, freeIDs = freeIDs[n-1], freeIDs[:n-1]
			} else {
				id = uint32(t.MaxID)
				t.MaxID++
			}
			ids[ev.Addr] = id
			op = Op{Size: ev.Size, ID: id}
			live += ev.Size
		case trace.FreeRequested, trace.FreeCompleted:
			want := trace.FreeCompleted
			if o.FreeAt == FreeRequested {
				want = trace.FreeRequested
			}
			if ev.Action != want {
				continue // the other free point: the block is freed at want
			}
			id, ok := ids[ev.Addr]
			if !ok {
				if ev.Size == 0 {
					continue
				}
				if err := skip(fmt.Errorf("%w: %s of %#x, which is not live", trace.ErrUnknownAddress, ev.Action, ev.Addr)); err != nil {
					return nil, err
				}
				continue
			}
			delete(ids, ev.Addr)
			freeIDs = append(freeIDs, id)
			op = Op{Size: ev.Size, ID: id, Free: true}
			live -= min(live, ev.Size)
		default:
			continue
		}
		if len(t.Ops) >= maxOps {
			return nil, &trace.Error{File: name, Pos: r.Pos(), Err: fmt.Errorf("%w: more than %d allocs and frees", ErrTooLong, maxOps)}
		}
		t.Ops = append(t.Ops, op)
		if live > t.PeakLive {
			t.PeakLive, t.PeakOp = live, len(t.Ops)-1
		}
	}
	t.Meta = r.Meta()
	st := r.Stats()
	t.Skipped = st.Skipped + own
	if t.FirstSkipped == nil {
		t.FirstSkipped = st.FirstSkipped
	}
	t.Unfreed = len(ids)
	return t, nil
}
