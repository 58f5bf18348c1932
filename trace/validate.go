package trace

import "fmt"

// Validator checks that a sequence of events is consistent, whatever format
// it came from: every free names a live block with the size it was allocated
// with, no alloc lands on a live block, sizes are at most MaxSize. A Reader
// runs one unless Options.NoValidate is set; replayers fed from elsewhere
// can run their own.
//
// A Validator is not safe for concurrent use. Its memory grows with the
// number of blocks and segments live at once, not with the trace length.
type Validator struct {
	live     map[uint64]block
	segments map[uint64]uint64 // segment address → size
	liveSize uint64
}

type block struct {
	size      uint64
	requested bool // free_requested seen
}

// NewValidator returns a Validator with nothing live.
func NewValidator() *Validator {
	return &Validator{live: make(map[uint64]block), segments: make(map[uint64]uint64)}
}

// Check applies ev if it is consistent with the events before it and
// returns nil. Otherwise it returns an error wrapping ErrBadSize,
// ErrUnknownAddress, ErrDoubleAlloc, ErrDoubleFree, ErrSizeMismatch or
// ErrUnknownAction, and leaves the state as it was, so a lenient caller can
// skip the event and go on.
//
// Rules: Alloc needs a free address; FreeRequested and FreeCompleted need a
// live block of the same size (FreeCompleted need not follow a
// FreeRequested); a second FreeRequested is a double free. SegmentAlloc
// needs a free segment address, SegmentFree a live segment of the same size.
// SegmentMap and SegmentUnmap (expandable segments map parts of a reserved
// range) and OOM are only size-checked; OOM's Size is what was asked for
// and may exceed MaxSize.
func (v *Validator) Check(ev *Event) error {
	if ev.Size > MaxSize && ev.Action != OOM {
		return fmt.Errorf("%w: %s of %d bytes at %#x exceeds %d", ErrBadSize, ev.Action, ev.Size, ev.Addr, uint64(MaxSize))
	}
	switch ev.Action {
	case Alloc:
		if b, ok := v.live[ev.Addr]; ok {
			return fmt.Errorf("%w: alloc of %d bytes at %#x, already live with %d bytes", ErrDoubleAlloc, ev.Size, ev.Addr, b.size)
		}
		v.live[ev.Addr] = block{size: ev.Size}
		v.liveSize += ev.Size
	case FreeRequested, FreeCompleted:
		b, ok := v.live[ev.Addr]
		if !ok {
			return fmt.Errorf("%w: %s of %#x, which is not live", ErrUnknownAddress, ev.Action, ev.Addr)
		}
		if b.size != ev.Size {
			return fmt.Errorf("%w: %s of %#x with %d bytes, allocated with %d", ErrSizeMismatch, ev.Action, ev.Addr, ev.Size, b.size)
		}
		if ev.Action == FreeCompleted {
			delete(v.live, ev.Addr)
			v.liveSize -= b.size
			break
		}
		if b.requested {
			return fmt.Errorf("%w: free_requested of %#x twice", ErrDoubleFree, ev.Addr)
		}
		b.requested = true
		v.live[ev.Addr] = b
	case SegmentAlloc:
		if size, ok := v.segments[ev.Addr]; ok {
			return fmt.Errorf("%w: segment_alloc of %d bytes at %#x, already a segment of %d bytes", ErrDoubleAlloc, ev.Size, ev.Addr, size)
		}
		v.segments[ev.Addr] = ev.Size
	case SegmentFree:
		size, ok := v.segments[ev.Addr]
		if !ok {
			return fmt.Errorf("%w: segment_free of %#x, which is not a live segment", ErrUnknownAddress, ev.Addr)
		}
		if size != ev.Size {
			return fmt.Errorf("%w: segment_free of %#x with %d bytes, reserved with %d", ErrSizeMismatch, ev.Addr, ev.Size, size)
		}
		delete(v.segments, ev.Addr)
	case SegmentMap, SegmentUnmap, OOM:
	default:
		return fmt.Errorf("%w: action %d", ErrUnknownAction, ev.Action)
	}
	return nil
}

// Live returns the number of live blocks and their total size in bytes.
func (v *Validator) Live() (blocks int, bytes uint64) { return len(v.live), v.liveSize }

// Segments returns the number of live segments (from SegmentAlloc and
// SegmentFree).
func (v *Validator) Segments() int { return len(v.segments) }
