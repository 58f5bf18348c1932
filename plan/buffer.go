// Package plan decides where things live in device memory: activation
// lifetimes and offsets within one arena (liveness-based aliasing), and which
// weights stay resident or stream under a VRAM budget.
package plan

// Buffer is one block of memory to place in an arena: Size bytes, live on the
// half-open step interval [Start, End). Two buffers may share bytes only when
// their intervals do not overlap. For a graph, a tensor produced at node p and
// last read at node q is live on [p, q+1).
type Buffer struct {
	ID    string `json:"id"`
	Start int    `json:"start"`
	End   int    `json:"end"`
	Size  uint64 `json:"size"`
}

// Overlaps reports whether the two buffers are live at a common step.
func (b Buffer) Overlaps(o Buffer) bool { return b.Start < o.End && o.Start < b.End }
