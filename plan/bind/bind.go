// Package bind puts a plan to work on a device: one pool allocation holds
// the whole activation arena, every buffer gets its device address, and
// Reuse says which earlier steps must be finished before a step may write,
// because the step's outputs share bytes with buffers those steps were the
// last to read — the seed's barriers between layers that alias memory.
//
// On one stream the order of submission already satisfies the rule. An
// executor that spreads steps over several streams records an event after
// each step and makes a step's stream wait on the events of the steps in
// Reuse(step) (and on its data producers) before launching it.
package bind

import (
	"fmt"
	"sort"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/pool"
)

// Arena is a plan bound to device memory.
type Arena struct {
	// Block is the one pool allocation behind the arena.
	Block pool.Block
	// Addr[i] is buffer i's device address.
	Addr []device.Ptr
	// Sizes[i] is buffer i's size in bytes.
	Sizes []uint64

	pool   *pool.Pool
	reuses [][]int
}

// Bind verifies layout for bufs and allocates its arena from p (purpose
// Activations). The arena must be released with Release.
func Bind(p *pool.Pool, bufs []plan.Buffer, layout plan.Layout) (*Arena, error) {
	if err := plan.Verify(bufs, layout); err != nil {
		return nil, fmt.Errorf("bind: %w", err)
	}
	if layout.ArenaBytes == 0 {
		return nil, fmt.Errorf("bind: empty arena for %d buffers", len(bufs))
	}
	align := max(layout.Alignment, 256)
	b, err := p.Alloc(layout.ArenaBytes, pool.AllocOptions{Align: align, Purpose: pool.Activations})
	if err != nil {
		return nil, fmt.Errorf("bind: arena of %d bytes: %w", layout.ArenaBytes, err)
	}
	a := &Arena{Block: b, pool: p, Addr: make([]device.Ptr, len(bufs)), Sizes: make([]uint64, len(bufs))}
	for i, buf := range bufs {
		a.Addr[i] = b.Ptr + device.Ptr(layout.Offsets[i])
		a.Sizes[i] = buf.Size
	}
	a.reuses = Reuse(bufs, layout)
	return a, nil
}

// Release frees the arena.
func (a *Arena) Release() error { return a.pool.Free(a.Block) }

// Reuse returns the memory-reuse dependencies of a schedule: for each step s,
// the steps that last read a buffer whose bytes a buffer first written at s
// overlaps (sorted, no duplicates, each < s). A buffer i that ends at End
// is last read at step End-1.
func (a *Arena) Reuse(step int) []int {
	if step < 0 || step >= len(a.reuses) {
		return nil
	}
	return a.reuses[step]
}

// Reuse computes the dependencies for every step of bufs under layout; the
// result has one entry per step up to the largest End.
func Reuse(bufs []plan.Buffer, layout plan.Layout) [][]int {
	steps := 0
	for _, b := range bufs {
		steps = max(steps, b.End)
	}
	deps := make([][]int, steps)
	// Index buffers by start so each writer looks only at buffers that
	// ended before it started.
	order := make([]int, len(bufs))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(x, y int) bool { return bufs[order[x]].End < bufs[order[y]].End })
	for j, w := range bufs {
		if w.End <= w.Start || w.Start >= steps {
			continue
		}
		wlo, whi := layout.Offsets[j], layout.Offsets[j]+w.Size
		seen := map[int]bool{}
		for _, i := range order {
			r := bufs[i]
			if r.End > w.Start {
				break
			}
			if i == j || r.End <= r.Start {
				continue
			}
			rlo, rhi := layout.Offsets[i], layout.Offsets[i]+r.Size
			if rlo < whi && wlo < rhi {
				seen[r.End-1] = true
			}
		}
		for s := range seen {
			deps[w.Start] = append(deps[w.Start], s)
		}
	}
	for s := range deps {
		sort.Ints(deps[s])
		deps[s] = compact(deps[s])
	}
	return deps
}

func compact(xs []int) []int {
	if len(xs) < 2 {
		return xs
	}
	out := xs[:1]
	for _, x := range xs[1:] {
		if x != out[len(out)-1] {
			out = append(out, x)
		}
	}
	return out
}
