package plan

import (
	"fmt"
	"math/bits"
	"slices"

	"github.com/memwall/memwall/graph"
)

// DefaultActivationAlignment is the buffer alignment Activations uses when
// LivenessOptions.Alignment is 0 (what CUDA allocators hand out).
const DefaultActivationAlignment = 256

// LivenessOptions tunes Activations. The zero value means 256-byte alignment
// and no aliasing.
type LivenessOptions struct {
	// Alignment rounds every buffer size up to a multiple of it; 0 means
	// DefaultActivationAlignment.
	Alignment uint64
	// InPlace lets tensors share a buffer: view operators (graph.IsView:
	// Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout) alias their
	// input, and an elementwise operator (graph.IsElementwise) writes over
	// an input of the output's byte size that nothing reads afterwards.
	InPlace bool
}

// ActivationSet is the activation memory of a graph: one Buffer per group of
// tensors sharing bytes, live over the steps (node indices) of [Start, End).
//
// Activations are node outputs, including the outputs of Constant nodes
// (an engine materializes them like any other result; they are small). Graph
// inputs and initializers are not activations: the caller and the weight
// plan own them. A tensor produced at node p and last read at node q lives
// on [p, q+1); a graph output lives to Steps; a tensor nobody reads lives
// on [p, p+1).
type ActivationSet struct {
	// Buffers holds one buffer per group, in the order the groups' first
	// tensors are produced. ID is the first tensor's name; Size is the
	// group's byte size rounded up to the alignment; the interval is the
	// union of the members' lifetimes.
	Buffers []Buffer
	// Members lists, per buffer, the names of its tensors in production
	// order. Without InPlace every buffer has one member.
	Members [][]string
	// Index maps each activation tensor's name to its buffer in Buffers.
	Index map[string]int
	// Steps is the number of nodes; every End is at most Steps.
	Steps int
	// NaiveBytes is the sum over all activation tensors of their aligned
	// sizes: the memory needed with no sharing and no aliasing. It does not
	// depend on InPlace.
	NaiveBytes uint64
	// Skipped counts node outputs left out because their size is unknown
	// (graphs imported with AllowUnknown).
	Skipped int
	// ExternalViews counts view outputs dropped with InPlace because they
	// alias a graph input or initializer, whose memory is not planned here.
	ExternalViews int
}

// Activations computes the activation buffers of g. It fails for a nil graph
// or when aligning a size would overflow.
func Activations(g *graph.Graph, opts LivenessOptions) (*ActivationSet, error) {
	if g == nil {
		return nil, fmt.Errorf("plan activations: nil graph")
	}
	align := opts.Alignment
	if align == 0 {
		align = DefaultActivationAlignment
	}
	steps := len(g.Nodes)
	set := &ActivationSet{Steps: steps, Index: map[string]int{}}

	// Per-tensor lifetimes of the activations (sized node outputs).
	nt := len(g.Tensors)
	active := make([]bool, nt)
	start := make([]int, nt)
	end := make([]int, nt)
	for i := range g.Tensors {
		t := &g.Tensors[i]
		if t.Producer < 0 {
			continue
		}
		if !t.Known {
			set.Skipped++
			continue
		}
		active[i] = true
		start[i], end[i] = t.Producer, t.Producer+1
		if n := len(t.Consumers); n > 0 {
			end[i] = max(end[i], t.Consumers[n-1]+1)
		}
		if t.Output {
			end[i] = steps
		}
		sz, err := liveAlignUp(t.Bytes, align)
		if err != nil {
			return nil, fmt.Errorf("plan activations: tensor %q: %w", t.Name, err)
		}
		set.NaiveBytes += sz
	}

	// Union-find over tensors; each root carries its group's lifetime, and
	// whether the group aliases memory not planned here (external) or holds
	// a graph output.
	parent := make([]int, nt)
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	external := make([]bool, nt)
	output := make([]bool, nt)
	for i := range g.Tensors {
		output[i] = g.Tensors[i].Output
		external[i] = !active[i] && g.Tensors[i].Producer < 0 // graph input or initializer
	}
	union := func(a, b int) {
		ra, rb := find(a), find(b)
		if ra == rb {
			return
		}
		if ra > rb { // keep the earlier tensor as root
			ra, rb = rb, ra
		}
		parent[rb] = ra
		start[ra], end[ra] = min(start[ra], start[rb]), max(end[ra], end[rb])
		external[ra] = external[ra] || external[rb]
		output[ra] = output[ra] || output[rb]
	}
	if opts.InPlace {
		for k := range g.Nodes {
			n := &g.Nodes[k]
			if len(n.Outputs) == 0 || n.Outputs[0] < 0 || !active[n.Outputs[0]] || len(n.Inputs) == 0 {
				continue
			}
			o := n.Outputs[0]
			switch {
			case graph.IsView(n.Op):
				in := n.Inputs[0]
				if in < 0 || !g.Tensors[in].Known || g.Tensors[in].Bytes != g.Tensors[o].Bytes {
					continue
				}
				union(in, o)
			case graph.IsElementwise(n.Op):
				for _, in := range n.Inputs {
					if in < 0 || !active[in] || g.Tensors[in].Bytes != g.Tensors[o].Bytes {
						continue
					}
					r := find(in)
					if external[r] || output[r] || end[r] != k+1 || find(o) == r {
						continue
					}
					union(in, o)
					break
				}
			}
		}
	}

	// One buffer per non-external group of activations.
	bufOf := make(map[int]int)
	for i := range g.Tensors {
		if !active[i] {
			continue
		}
		r := find(i)
		if external[r] {
			set.ExternalViews++
			continue
		}
		b, ok := bufOf[r]
		if !ok {
			b = len(set.Buffers)
			bufOf[r] = b
			set.Buffers = append(set.Buffers, Buffer{ID: g.Tensors[i].Name, Start: start[r], End: end[r]})
			set.Members = append(set.Members, nil)
		}
		sz, _ := liveAlignUp(g.Tensors[i].Bytes, align) // checked above
		set.Buffers[b].Size = max(set.Buffers[b].Size, sz)
		set.Members[b] = append(set.Members[b], g.Tensors[i].Name)
		set.Index[g.Tensors[i].Name] = b
	}
	// Tensors are numbered in production order except for roots merged
	// across views; keep members sorted by producer for readability.
	for b := range set.Members {
		slices.SortStableFunc(set.Members[b], func(x, y string) int {
			return g.Tensor(x).Producer - g.Tensor(y).Producer
		})
	}
	return set, nil
}

// liveAlignUp rounds n up to a multiple of a, failing on overflow.
func liveAlignUp(n, a uint64) (uint64, error) {
	if a <= 1 {
		return n, nil
	}
	q, r := n/a, n%a
	if r == 0 {
		return n, nil
	}
	hi, lo := bits.Mul64(q+1, a)
	if hi != 0 {
		return 0, fmt.Errorf("size %d rounded up to alignment %d overflows", n, a)
	}
	return lo, nil
}
