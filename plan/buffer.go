// Package plan decides where things live in device memory: activation
// lifetimes and offsets within one arena (liveness-based aliasing), and which
// weights stay resident or stream under a VRAM budget.
//
// # Quick start
//
// Activations of a model (graph.LoadONNX gives the graph):
//
//	set, err := plan.Activations(g, plan.LivenessOptions{InPlace: true})
//	layout, rep, err := plan.Solve(ctx, set.Buffers, plan.Options{Alignment: 256})
//	// layout.Offsets[i] places set.Buffers[i] (the tensors set.Members[i])
//	// in an arena of layout.ArenaBytes; rep.LowerBoundBytes is the most
//	// bytes live at one step.
//
// ONNX Runtime settings from such a plan: NewORTSettings(weights,
// layout.ArenaBytes, 0). Weights under a budget: GroupWeights, then
// PlanWeights. ExampleSolve and ExampleNewORTSettings run as tests.
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
