// Package graph is memwall's inference-graph IR: nodes in execution order and
// the tensors they read and write, each with an element type, a concrete
// shape and a byte size. It is independent of any file format; ImportONNX
// builds one from a decoded ONNX model and runs static shape inference (with
// constant folding of the small integer tensors exporters compute shapes
// with) so that every tensor is sized for given input dimensions.
//
// Where inference cannot size a tensor because a constant it depends on is
// absent (the initializers of a model shipped without its external data
// file) or an operator is not modeled, the shape the file declares for it
// (value_info, graph outputs) is used; Graph.Declared counts those tensors,
// and import fails only when neither exists.
//
// Nothing in this package modifies a Graph once it is built, so concurrent
// readers are safe; callers that modify one own the consequences.
//
// # Quick start
//
//	g, err := graph.LoadONNX("model.onnx", map[string][]int64{"input_ids": {1, 128}}, graph.Options{})
//	for _, t := range g.Tensors { /* t.Name, t.Shape, t.Bytes, t.Producer, t.Consumers */ }
//
// plan.Activations(g, ...) turns the graph into buffers to place.
package graph

import (
	"container/heap"
	"errors"
	"fmt"
)

// Sentinel errors wrapped by the errors of this package.
var (
	// ErrInvalid marks a structurally broken graph: a tensor read but never
	// produced, a tensor produced twice, a cycle, an undefined graph output.
	ErrInvalid = errors.New("invalid graph")
	// ErrUnknownShape marks a tensor whose shape or type could not be
	// inferred: an unsupported operator, a shape that depends on tensor
	// values that are not known statically, an input without dimensions.
	// Options.AllowUnknown turns these errors into unknown tensors.
	ErrUnknownShape = errors.New("shape cannot be inferred")
	// ErrShapeMismatch marks shapes that contradict an operator: operands that
	// do not broadcast, a reshape that changes the element count, input
	// dimensions that contradict the model's declared ones.
	ErrShapeMismatch = errors.New("shape mismatch")
)

// Graph is an inference graph. Nodes are in a valid execution order (every
// tensor is produced before it is read). Tensors holds every named value:
// graph inputs, initializers and node outputs, in that order.
type Graph struct {
	Name    string
	Nodes   []Node
	Tensors []Tensor
	Inputs  []int // indices into Tensors of the graph inputs (initializers excluded)
	Outputs []int // indices into Tensors of the graph outputs, in declared order
	// Unknown counts tensors left without a shape (only with
	// Options.AllowUnknown; otherwise import fails instead).
	Unknown int
	// Declared counts tensors sized from the shapes the file declares
	// (value_info, graph outputs) because inference could not size them: a
	// constant they depend on is absent (external data not shipped) or an
	// operator is not modeled. Import fails only when neither exists.
	Declared int

	byName map[string]int
}

// Node is one operator invocation.
type Node struct {
	Name   string
	Op     string // operator type, e.g. "Conv"
	Domain string // operator set domain; "" is the default ONNX domain
	// Inputs and Outputs index Graph.Tensors in the operator's positional
	// order; -1 marks an omitted optional input or output.
	Inputs  []int
	Outputs []int
	// Captures are tensors of this graph read by the node's subgraphs
	// (If/Loop/Scan bodies) without being listed as inputs. They count as
	// reads for liveness.
	Captures []int
}

// Tensor is one value of the graph.
type Tensor struct {
	Name  string
	DType DType
	// Shape holds the concrete dimensions (empty for a scalar) when Known.
	Shape []int64
	Known bool
	// Bytes is the storage size of the tensor (0 when not Known).
	Bytes uint64
	// Producer is the index of the node writing the tensor, or -1 for graph
	// inputs and initializers.
	Producer int
	// Consumers are the indices of the nodes reading the tensor (as an input
	// or a capture), increasing, each once.
	Consumers []int

	Input       bool // a graph input supplied by the caller
	Initializer bool // a weight stored with the model
	Output      bool // a graph output
	// Constant is set for tensors whose value does not depend on the graph
	// inputs: initializers, Constant outputs, and outputs of nodes all of
	// whose inputs are constant.
	Constant bool
	// Value holds the elements of a small integer or boolean tensor whose
	// contents are known statically (shape arithmetic), row-major; nil when
	// not known.
	Value []int64
	// External locates an initializer's bytes outside the model file; nil
	// for other tensors and for initializers stored inline.
	External *External
	// Inline is set for initializers whose data is stored in the model file.
	Inline bool
}

// External is the location of an initializer's data in a side file, as the
// model records it. Location is relative to the model file's directory.
type External struct {
	Location  string
	Offset    int64
	Length    int64
	HasLength bool
}

// Lookup returns the index of the tensor called name.
func (g *Graph) Lookup(name string) (int, bool) {
	i, ok := g.byName[name]
	return i, ok
}

// Tensor returns the tensor called name, or nil if the graph has none. The
// pointer refers into g.Tensors.
func (g *Graph) Tensor(name string) *Tensor {
	if i, ok := g.byName[name]; ok {
		return &g.Tensors[i]
	}
	return nil
}

// rawNode is a node as a file or a builder lists it, by tensor names.
type rawNode struct {
	name, op, domain string
	inputs, outputs  []string
	captures         []string
	src              int // position in the source listing
}

// describe names a node for error messages.
func (n *rawNode) describe() string {
	if n.name != "" {
		return fmt.Sprintf("node %q (%s)", n.name, n.op)
	}
	return fmt.Sprintf("node #%d (%s)", n.src, n.op)
}

// link resolves names into a Graph: it creates a tensor for every graph
// input, initializer and node output, orders the nodes so that producers come
// before consumers (keeping the given order when it already is one), and
// records producers, consumers and flags. Shapes are left unknown. It also
// returns, for each node of the graph, its position in nodes.
func link(name string, inputs, inits []string, nodes []rawNode, outputs []string) (*Graph, []int, error) {
	g := &Graph{Name: name, byName: make(map[string]int, len(inputs)+len(inits)+len(nodes))}
	define := func(n string) int {
		g.byName[n] = len(g.Tensors)
		g.Tensors = append(g.Tensors, Tensor{Name: n, Producer: -1})
		return len(g.Tensors) - 1
	}
	for _, n := range inits {
		if n == "" {
			return nil, nil, fmt.Errorf("graph %q: initializer without a name: %w", name, ErrInvalid)
		}
		if _, dup := g.byName[n]; dup {
			return nil, nil, fmt.Errorf("graph %q: initializer %q defined twice: %w", name, n, ErrInvalid)
		}
		i := define(n)
		g.Tensors[i].Initializer, g.Tensors[i].Constant = true, true
	}
	for _, n := range inputs {
		if n == "" {
			return nil, nil, fmt.Errorf("graph %q: input without a name: %w", name, ErrInvalid)
		}
		if _, dup := g.byName[n]; dup {
			// An input that is also an initializer is a default value the
			// caller may override (IR < 4); we plan with the initializer.
			if g.Tensors[g.byName[n]].Initializer {
				continue
			}
			return nil, nil, fmt.Errorf("graph %q: input %q declared twice: %w", name, n, ErrInvalid)
		}
		i := define(n)
		g.Tensors[i].Input = true
		g.Inputs = append(g.Inputs, i)
	}
	// Producers by name, to order nodes and detect duplicates.
	producer := make(map[string]int, len(nodes))
	for i := range nodes {
		for _, o := range nodes[i].outputs {
			if o == "" {
				continue
			}
			if _, ok := g.byName[o]; ok {
				return nil, nil, fmt.Errorf("graph %q: %s writes %q, which is a graph input or initializer: %w",
					name, nodes[i].describe(), o, ErrInvalid)
			}
			if p, ok := producer[o]; ok {
				return nil, nil, fmt.Errorf("graph %q: tensor %q produced by both %s and %s: %w",
					name, o, nodes[p].describe(), nodes[i].describe(), ErrInvalid)
			}
			producer[o] = i
		}
	}
	// Dependencies; a missing producer is an error naming the tensor.
	waiting := make([]int, len(nodes)) // unresolved inputs per node
	readers := make([][]int, len(nodes))
	for i := range nodes {
		seen := map[int]bool{}
		for _, list := range [][]string{nodes[i].inputs, nodes[i].captures} {
			for _, in := range list {
				if in == "" {
					continue
				}
				if _, ok := g.byName[in]; ok {
					continue
				}
				p, ok := producer[in]
				if !ok {
					return nil, nil, fmt.Errorf("graph %q: %s reads %q, which no node produces and is not an input or initializer: %w",
						name, nodes[i].describe(), in, ErrInvalid)
				}
				if p == i {
					return nil, nil, fmt.Errorf("graph %q: %s reads its own output %q (cycle): %w",
						name, nodes[i].describe(), in, ErrInvalid)
				}
				if !seen[p] {
					seen[p] = true
					waiting[i]++
					readers[p] = append(readers[p], i)
				}
			}
		}
	}
	// Kahn's algorithm, always running the ready node that comes first in
	// the listing: the listing's order is kept whenever it is valid.
	ready := &intHeap{}
	for i := range nodes {
		if waiting[i] == 0 {
			heap.Push(ready, i)
		}
	}
	order := make([]int, 0, len(nodes))
	for ready.Len() > 0 {
		i := heap.Pop(ready).(int)
		order = append(order, i)
		for _, r := range readers[i] {
			if waiting[r]--; waiting[r] == 0 {
				heap.Push(ready, r)
			}
		}
	}
	if len(order) < len(nodes) {
		for i := range nodes {
			if waiting[i] > 0 {
				for _, in := range nodes[i].inputs {
					if p, ok := producer[in]; ok && waiting[p] > 0 {
						return nil, nil, fmt.Errorf("graph %q: cycle through %s and tensor %q: %w",
							name, nodes[i].describe(), in, ErrInvalid)
					}
				}
				return nil, nil, fmt.Errorf("graph %q: cycle through %s: %w", name, nodes[i].describe(), ErrInvalid)
			}
		}
	}
	g.Nodes = make([]Node, len(order))
	for k, i := range order {
		rn := &nodes[i]
		n := Node{Name: rn.name, Op: rn.op, Domain: rn.domain,
			Inputs: make([]int, len(rn.inputs)), Outputs: make([]int, len(rn.outputs))}
		for j, o := range rn.outputs {
			n.Outputs[j] = -1
			if o != "" {
				n.Outputs[j] = define(o)
				g.Tensors[n.Outputs[j]].Producer = k
			}
		}
		g.Nodes[k] = n
	}
	for k, i := range order {
		rn, n := &nodes[i], &g.Nodes[k]
		for j, in := range rn.inputs {
			n.Inputs[j] = -1
			if in != "" {
				n.Inputs[j] = g.byName[in]
			}
		}
		seen := map[int]bool{}
		for _, in := range rn.captures {
			t, ok := g.byName[in]
			if ok && !seen[t] {
				seen[t] = true
				n.Captures = append(n.Captures, t)
			}
		}
		for _, list := range [][]int{n.Inputs, n.Captures} {
			for _, t := range list {
				if t < 0 {
					continue
				}
				c := g.Tensors[t].Consumers
				if len(c) == 0 || c[len(c)-1] != k {
					g.Tensors[t].Consumers = append(c, k)
				}
			}
		}
	}
	for _, o := range outputs {
		t, ok := g.byName[o]
		if !ok {
			return nil, nil, fmt.Errorf("graph %q: output %q is not produced by any node, input or initializer: %w",
				name, o, ErrInvalid)
		}
		g.Tensors[t].Output = true
		g.Outputs = append(g.Outputs, t)
	}
	src := make([]int, len(order))
	for k, i := range order {
		src[k] = nodes[i].src
	}
	return g, src, nil
}

// intHeap is a min-heap of ints for container/heap.
type intHeap []int

func (h intHeap) Len() int           { return len(h) }
func (h intHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h intHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *intHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *intHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// setShape records a tensor's type and shape and computes its byte size.
func (t *Tensor) setShape(dt DType, shape []int64) error {
	n, err := NumElements(shape)
	if err != nil {
		return fmt.Errorf("tensor %q: %w: %w", t.Name, ErrShapeMismatch, err)
	}
	b, err := dt.ByteSize(uint64(n))
	if err != nil {
		return fmt.Errorf("tensor %q: %w: %w", t.Name, ErrUnknownShape, err)
	}
	t.DType, t.Shape, t.Known, t.Bytes = dt, shape, true, b
	return nil
}

// Spec declares a tensor's name, element type and shape for Builder.
type Spec struct {
	Name  string
	DType DType
	Shape []int64
}

// Builder assembles a Graph by hand: a planner's tests, or a front end for a
// format without its own shape inference. Every tensor's type and shape is
// given; nothing is inferred. Methods record the first error, which Build
// returns.
type Builder struct {
	name    string
	specs   map[string]Spec
	inputs  []string
	inits   []string
	nodes   []rawNode
	outputs []string
	err     error
}

// NewBuilder starts a graph called name.
func NewBuilder(name string) *Builder {
	return &Builder{name: name, specs: map[string]Spec{}}
}

func (b *Builder) spec(s Spec) {
	if b.err != nil {
		return
	}
	if _, dup := b.specs[s.Name]; dup && s.Name != "" {
		b.err = fmt.Errorf("graph %q: tensor %q declared twice: %w", b.name, s.Name, ErrInvalid)
		return
	}
	b.specs[s.Name] = s
}

// Input declares a graph input.
func (b *Builder) Input(s Spec) *Builder {
	b.spec(s)
	b.inputs = append(b.inputs, s.Name)
	return b
}

// Initializer declares a weight.
func (b *Builder) Initializer(s Spec) *Builder {
	b.spec(s)
	b.inits = append(b.inits, s.Name)
	return b
}

// Node appends an operator reading the named tensors ("" for an omitted
// optional input) and writing outputs. Nodes may be added in any order that
// admits a topological sort.
func (b *Builder) Node(op string, inputs []string, outputs ...Spec) *Builder {
	rn := rawNode{name: fmt.Sprintf("%s_%d", op, len(b.nodes)), op: op, inputs: inputs, src: len(b.nodes)}
	for _, o := range outputs {
		if o.Name != "" {
			b.spec(o)
		}
		rn.outputs = append(rn.outputs, o.Name)
	}
	b.nodes = append(b.nodes, rn)
	return b
}

// Output marks tensors as graph outputs.
func (b *Builder) Output(names ...string) *Builder {
	b.outputs = append(b.outputs, names...)
	return b
}

// Build checks the graph (every read tensor produced, no cycles) and returns
// it. Errors wrap ErrInvalid or, for an unsized spec, ErrShapeMismatch or
// ErrUnknownShape.
func (b *Builder) Build() (*Graph, error) {
	if b.err != nil {
		return nil, b.err
	}
	g, _, err := link(b.name, b.inputs, b.inits, b.nodes, b.outputs)
	if err != nil {
		return nil, err
	}
	for i := range g.Tensors {
		t := &g.Tensors[i]
		s := b.specs[t.Name]
		if err := t.setShape(s.DType, append([]int64{}, s.Shape...)); err != nil {
			return nil, fmt.Errorf("graph %q: %w", b.name, err)
		}
	}
	markConstants(g)
	return g, nil
}

// markConstants sets Constant on every node output whose node reads only
// constant tensors (Constant nodes read none).
func markConstants(g *Graph) {
	for k := range g.Nodes {
		n := &g.Nodes[k]
		c := len(n.Captures) == 0
		for _, in := range n.Inputs {
			if in >= 0 && !g.Tensors[in].Constant {
				c = false
			}
		}
		switch n.Op {
		case "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli":
			c = false // a new value on every run
		}
		for _, o := range n.Outputs {
			if o >= 0 {
				g.Tensors[o].Constant = c
			}
		}
	}
}
