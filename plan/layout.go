package plan

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Limits on the instances the offset planners accept. They bound the work
// and memory a hostile or mistaken input can cause: the greedy planners are
// quadratic in the worst case, and sums of sizes must not overflow.
const (
	// MaxBuffers is the most buffers one instance may hold.
	MaxBuffers = 1 << 16
	// MaxBufferBytes is the largest size one buffer may have (1 TiB).
	MaxBufferBytes = 1 << 40
	// MaxAlignment is the largest offset alignment accepted (1 GiB).
	MaxAlignment = 1 << 30
)

// ErrInvalid marks an instance the planners refuse: a buffer with an empty
// lifetime, an oversized buffer, too many buffers, a bad alignment. Errors
// returned for such input wrap it and name the buffer and the limit.
var ErrInvalid = errors.New("invalid plan instance")

// ErrOverlap marks a layout that places two buffers live at a common step on
// overlapping bytes, or a buffer past the arena's end; Verify's errors wrap
// it.
var ErrOverlap = errors.New("layout overlap")

// Layout places every buffer of an instance in one arena.
type Layout struct {
	// Offsets[i] is the byte offset of buffer i of the instance the layout
	// was computed for.
	Offsets []uint64 `json:"offsets"`
	// ArenaBytes is the size of the arena: the largest Offsets[i] plus
	// buffer i's size rounded up to Alignment.
	ArenaBytes uint64 `json:"arena_bytes"`
	// Alignment is the multiple every offset is of; 0 or 1 means none.
	Alignment uint64 `json:"alignment"`
	// Algorithm names the planner that produced the layout.
	Algorithm string `json:"algorithm"`
}

// LowerBound returns the largest total size of buffers live at one step: no
// layout of bufs can use a smaller arena. Buffers with an empty lifetime
// (End <= Start) count for nothing. For instances that pass Validate the sum
// cannot overflow.
func LowerBound(bufs []Buffer) uint64 {
	type event struct {
		t     int
		delta int64 // +size at Start, -size at End
	}
	ev := make([]event, 0, 2*len(bufs))
	for _, b := range bufs {
		if b.End <= b.Start || b.Size == 0 {
			continue
		}
		s := int64(min(b.Size, math.MaxInt64))
		ev = append(ev, event{b.Start, s}, event{b.End, -s})
	}
	// Ends sort before starts at the same step: lifetimes are half-open.
	slices.SortFunc(ev, func(a, b event) int {
		if c := cmp.Compare(a.t, b.t); c != 0 {
			return c
		}
		return cmp.Compare(a.delta, b.delta)
	})
	var live, peak int64
	for _, e := range ev {
		live += e.delta
		peak = max(peak, live)
	}
	return uint64(peak)
}

// Validate reports whether the planners accept bufs with the given offset
// alignment (0 or 1: none). It returns an error wrapping ErrInvalid naming
// the first offending buffer and the limit it breaks.
func Validate(bufs []Buffer, alignment uint64) error {
	if len(bufs) > MaxBuffers {
		return fmt.Errorf("plan: %d buffers, more than the limit of %d: %w", len(bufs), MaxBuffers, ErrInvalid)
	}
	if alignment > MaxAlignment {
		return fmt.Errorf("plan: alignment %d exceeds the limit of %d: %w", alignment, MaxAlignment, ErrInvalid)
	}
	for i, b := range bufs {
		if b.End <= b.Start {
			return fmt.Errorf("plan: buffer %d (%q): lifetime [%d, %d) is empty: %w", i, b.ID, b.Start, b.End, ErrInvalid)
		}
		if b.Size > MaxBufferBytes {
			return fmt.Errorf("plan: buffer %d (%q): size %d exceeds the limit of %d: %w", i, b.ID, b.Size, uint64(MaxBufferBytes), ErrInvalid)
		}
	}
	return nil
}

// alignUp rounds n up to a multiple of a (a <= 1: n). Callers keep n and a
// within the Validate limits, so the result cannot overflow.
func alignUp(n, a uint64) uint64 {
	if a <= 1 {
		return n
	}
	return (n + a - 1) / a * a
}

// PaddedBytes is the room buffer b takes in an arena with the given
// alignment: its size rounded up to a multiple of alignment.
func PaddedBytes(b Buffer, alignment uint64) uint64 { return alignUp(b.Size, alignment) }

// Padded returns a copy of bufs with every size rounded up to alignment:
// the instance whose lower bound an aligned layout is measured against.
func Padded(bufs []Buffer, alignment uint64) []Buffer {
	out := slices.Clone(bufs)
	for i := range out {
		out[i].Size = alignUp(out[i].Size, alignment)
	}
	return out
}

// Verify checks that layout is a valid placement of bufs: one offset per
// buffer, every offset a multiple of layout.Alignment, every buffer inside
// [0, layout.ArenaBytes), and no two buffers live at a common step sharing a
// byte. Zero-size buffers occupy no bytes. It returns nil or an error naming
// the first violation found; address conflicts and buffers past the arena
// wrap ErrOverlap, malformed layouts wrap ErrInvalid.
func Verify(bufs []Buffer, layout Layout) error {
	return verify(context.Background(), bufs, layout)
}

// verify is Verify, stopped with ctx's error when ctx is done.
func verify(ctx context.Context, bufs []Buffer, layout Layout) error {
	if len(layout.Offsets) != len(bufs) {
		return fmt.Errorf("plan verify: %d offsets for %d buffers: %w", len(layout.Offsets), len(bufs), ErrInvalid)
	}
	a := layout.Alignment
	for i, b := range bufs {
		off := layout.Offsets[i]
		if a > 1 && off%a != 0 {
			return fmt.Errorf("plan verify: buffer %d (%q): offset %d not a multiple of %d: %w", i, b.ID, off, a, ErrInvalid)
		}
		if off > layout.ArenaBytes || b.Size > layout.ArenaBytes-off {
			return fmt.Errorf("plan verify: buffer %d (%q): [%d, +%d) past the arena of %d bytes: %w",
				i, b.ID, off, b.Size, layout.ArenaBytes, ErrOverlap)
		}
	}
	// Sweep by start; keep the buffers still live, and check each newcomer
	// against them. Work is the number of pairs live together.
	idx := make([]int, 0, len(bufs))
	for i, b := range bufs {
		if b.Size > 0 && b.Start < b.End {
			idx = append(idx, i)
		}
	}
	slices.SortFunc(idx, func(x, y int) int {
		return cmp.Or(cmp.Compare(bufs[x].Start, bufs[y].Start), cmp.Compare(x, y))
	})
	var live []int
	for n, i := range idx {
		if n%checkEvery == 0 && ctx.Err() != nil {
			return fmt.Errorf("plan verify: %d of %d buffers checked: %w", n, len(idx), ctx.Err())
		}
		b := bufs[i]
		live = slices.DeleteFunc(live, func(j int) bool { return bufs[j].End <= b.Start })
		lo, hi := layout.Offsets[i], layout.Offsets[i]+b.Size
		for _, j := range live {
			o := bufs[j]
			olo, ohi := layout.Offsets[j], layout.Offsets[j]+o.Size
			if lo < ohi && olo < hi {
				return fmt.Errorf("plan verify: buffers %d (%q, [%d, %d) at %d, %d bytes) and %d (%q, [%d, %d) at %d, %d bytes) overlap: %w",
					j, o.ID, o.Start, o.End, olo, o.Size, i, b.ID, b.Start, b.End, lo, b.Size, ErrOverlap)
			}
		}
		live = append(live, i)
	}
	return nil
}

// arenaOf returns the arena size a set of offsets needs: the largest offset
// plus padded size.
func arenaOf(bufs []Buffer, offsets []uint64, alignment uint64) uint64 {
	var top uint64
	for i, b := range bufs {
		if b.Size == 0 {
			continue
		}
		top = max(top, offsets[i]+alignUp(b.Size, alignment))
	}
	return top
}
