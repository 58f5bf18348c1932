package graph

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/memwall/memwall/format/onnx"
)

// DefaultMaxFoldElements is the largest tensor, in elements, whose values
// ImportONNX keeps for constant folding when Options.MaxFoldElements is 0.
const DefaultMaxFoldElements = 4096

// Options tunes ImportONNX. The zero value is the strict default.
type Options struct {
	// AllowUnknown keeps going when a tensor cannot be sized: the tensor is
	// left with Known false (and so is everything computed from it) and
	// counted in Graph.Unknown. Without it such a tensor is an error.
	AllowUnknown bool
	// MaxFoldElements bounds the tensors whose values are tracked for
	// constant folding (shape arithmetic); 0 means DefaultMaxFoldElements.
	MaxFoldElements int
}

// FromONNX converts a decoded ONNX model into a Graph with every tensor
// sized, using ImportONNX with default options.
func FromONNX(m *onnx.Model, inputs map[string][]int64) (*Graph, error) {
	return ImportONNX(m, inputs, Options{})
}

// LoadONNX reads the model at path and converts it with ImportONNX. Errors
// name the file.
func LoadONNX(path string, inputs map[string][]int64, opts Options) (*Graph, error) {
	m, err := onnx.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("graph: %w", err)
	}
	g, err := ImportONNX(m, inputs, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return g, nil
}

// ImportONNX converts the main graph of m into a Graph and infers the type
// and concrete shape of every tensor. inputs gives the dimensions of graph
// inputs; an input missing from the map uses the model's declared shape,
// which must then be fully static. Dimensions given for an input must agree
// with the model's concrete (non-symbolic) dimensions.
//
// Errors name the graph, the node and operator, and the tensor at fault, and
// wrap ErrInvalid (structure), ErrShapeMismatch (contradictory shapes) or
// ErrUnknownShape (a tensor that cannot be sized; see Options.AllowUnknown).
// Nodes are reordered only if the file's order is not topological.
func ImportONNX(m *onnx.Model, inputs map[string][]int64, opts Options) (*Graph, error) {
	if m == nil || m.Graph == nil {
		return nil, fmt.Errorf("graph: model has no graph: %w", ErrInvalid)
	}
	if opts.MaxFoldElements <= 0 {
		opts.MaxFoldElements = DefaultMaxFoldElements
	}
	og := m.Graph
	var inNames, initNames, outNames []string
	for _, v := range og.Inputs {
		inNames = append(inNames, v.Name)
	}
	for _, t := range og.Initializers {
		initNames = append(initNames, t.Name)
	}
	for _, v := range og.Outputs {
		outNames = append(outNames, v.Name)
	}
	raw := make([]rawNode, len(og.Nodes))
	for i := range og.Nodes {
		n := &og.Nodes[i]
		raw[i] = rawNode{name: n.Name, op: n.OpType, domain: n.Domain, inputs: n.Inputs, outputs: n.Outputs,
			captures: captures(n), src: i}
	}
	g, src, err := link(og.Name, inNames, initNames, raw, outNames)
	if err != nil {
		return nil, fmt.Errorf("graph: %w", err)
	}
	imp := &importer{g: g, m: m, opts: opts, vals: make([]*value, len(g.Tensors)), counted: make([]bool, len(g.Tensors))}
	if err := imp.initializers(); err != nil {
		return nil, err
	}
	if err := imp.inputs(inputs); err != nil {
		return nil, err
	}
	imp.declarations()
	for k := range g.Nodes {
		if err := imp.node(k, &og.Nodes[src[k]]); err != nil {
			return nil, err
		}
	}
	for i, v := range imp.vals {
		t := &g.Tensors[i]
		if v != nil && !v.float && t.Known && (t.DType.IsInteger() || t.DType == Bool) {
			t.Value = v.i
		}
	}
	markConstants(g)
	return g, nil
}

// captures lists the outer-scope names read by a node's subgraphs: names
// used inside them that they do not define themselves.
func captures(n *onnx.Node) []string {
	var out []string
	var walk func(sg *onnx.Graph, outer map[string]bool)
	walk = func(sg *onnx.Graph, outer map[string]bool) {
		local := map[string]bool{}
		for k := range outer {
			local[k] = true
		}
		for _, v := range sg.Inputs {
			local[v.Name] = true
		}
		for _, t := range sg.Initializers {
			local[t.Name] = true
		}
		for _, sn := range sg.Nodes {
			for _, o := range sn.Outputs {
				local[o] = true
			}
		}
		use := func(name string) {
			if name != "" && !local[name] {
				out = append(out, name)
			}
		}
		for _, sn := range sg.Nodes {
			for _, in := range sn.Inputs {
				use(in)
			}
			for _, a := range sn.Attributes {
				if a.G != nil {
					walk(a.G, local)
				}
				for _, gg := range a.Graphs {
					walk(gg, local)
				}
			}
		}
		for _, v := range sg.Outputs {
			use(v.Name)
		}
	}
	for _, a := range n.Attributes {
		if a.G != nil {
			walk(a.G, nil)
		}
		for _, sg := range a.Graphs {
			walk(sg, nil)
		}
	}
	return out
}

// importer carries the state of one ImportONNX call.
type importer struct {
	g       *Graph
	m       *onnx.Model
	opts    Options
	vals    []*value // statically known values, by tensor index
	counted []bool   // tensors already counted in Graph.Unknown
	// declared holds the types the file states for its values (value_info
	// and graph outputs), and binds the symbolic input dimensions' values,
	// for the fallback of declare.
	declared map[string]onnx.Type
	binds    map[string]int64
}

// dtypeFromONNX maps an ONNX element type code to a DType.
func dtypeFromONNX(d onnx.DataType) (DType, bool) {
	switch d {
	case onnx.Float:
		return Float32, true
	case onnx.Uint8:
		return Uint8, true
	case onnx.Int8:
		return Int8, true
	case onnx.Uint16:
		return Uint16, true
	case onnx.Int16:
		return Int16, true
	case onnx.Int32:
		return Int32, true
	case onnx.Int64:
		return Int64, true
	case onnx.String:
		return String, true
	case onnx.Bool:
		return Bool, true
	case onnx.Float16:
		return Float16, true
	case onnx.Double:
		return Float64, true
	case onnx.Uint32:
		return Uint32, true
	case onnx.Uint64:
		return Uint64, true
	case onnx.Complex64:
		return Complex64, true
	case onnx.Complex128:
		return Complex128, true
	case onnx.BFloat16:
		return BFloat16, true
	case onnx.Float8E4M3FN:
		return Float8E4M3FN, true
	case onnx.Float8E4M3FNUZ:
		return Float8E4M3FNUZ, true
	case onnx.Float8E5M2:
		return Float8E5M2, true
	case onnx.Float8E5M2FNUZ:
		return Float8E5M2FNUZ, true
	case onnx.Uint4:
		return Uint4, true
	case onnx.Int4:
		return Int4, true
	case onnx.Float4E2M1:
		return Float4E2M1, true
	case onnx.Float8E8M0:
		return Float8E8M0, true
	case onnx.Uint2:
		return Uint2, true
	case onnx.Int2:
		return Int2, true
	}
	return DTypeUnknown, false
}

// tensorValue returns the values of an inline ONNX tensor when it is small
// enough to fold, or nil.
func (imp *importer) tensorValue(t *onnx.Tensor, dt DType) *value {
	n, err := onnx.NumElements(t.Dims)
	if err != nil || n > int64(imp.opts.MaxFoldElements) {
		return nil
	}
	if dt.IsFloat() {
		if f, err := t.Float64s(); err == nil {
			return floatValue(f)
		}
		return nil
	}
	if dt.IsInteger() || dt == Bool {
		if v, err := t.Int64s(); err == nil {
			return intValue(v)
		}
	}
	return nil
}

func (imp *importer) initializers() error {
	for i := range imp.m.Graph.Initializers {
		ot := &imp.m.Graph.Initializers[i]
		idx, _ := imp.g.Lookup(ot.Name)
		t := &imp.g.Tensors[idx]
		dt, ok := dtypeFromONNX(ot.DataType)
		if !ok {
			if err := imp.unknown(idx, fmt.Errorf("graph %q: initializer %q: element type %v: %w",
				imp.g.Name, ot.Name, ot.DataType, ErrUnknownShape)); err != nil {
				return err
			}
			continue
		}
		if err := t.setShape(dt, append([]int64{}, ot.Dims...)); err != nil {
			if err := imp.unknown(idx, fmt.Errorf("graph %q: initializer: %w", imp.g.Name, err)); err != nil {
				return err
			}
			continue
		}
		e, err := ot.External()
		if err != nil {
			return fmt.Errorf("graph %q: initializer: %w: %w", imp.g.Name, err, ErrInvalid)
		}
		if e != nil {
			t.External = &External{Location: e.Location, Offset: e.Offset, Length: e.Length, HasLength: e.HasLength}
		} else {
			t.Inline = true
			imp.vals[idx] = imp.tensorValue(ot, dt)
		}
	}
	return nil
}

func (imp *importer) inputs(dims map[string][]int64) error {
	g := imp.g
	declared := map[string]onnx.Type{}
	for _, v := range imp.m.Graph.Inputs {
		declared[v.Name] = v.Type
	}
	var names []string
	for name := range dims {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		i, ok := g.Lookup(name)
		if !ok || !g.Tensors[i].Input {
			var have []string
			for _, j := range g.Inputs {
				have = append(have, g.Tensors[j].Name)
			}
			return fmt.Errorf("graph %q: %q is not a graph input (inputs: %s): %w",
				g.Name, name, strings.Join(have, ", "), ErrInvalid)
		}
	}
	for _, i := range g.Inputs {
		t := &g.Tensors[i]
		typ := declared[t.Name]
		dt, ok := dtypeFromONNX(typ.ElemType)
		if typ.Kind != onnx.TypeTensor || !ok {
			if err := imp.unknown(i, fmt.Errorf("graph %q: input %q: not a tensor of a known element type: %w",
				g.Name, t.Name, ErrUnknownShape)); err != nil {
				return err
			}
			continue
		}
		shape, given := dims[t.Name]
		switch {
		case given:
			shape = append([]int64{}, shape...)
			if typ.HasShape {
				if len(typ.Shape) != len(shape) {
					return fmt.Errorf("graph %q: input %q: %d dimensions given, the model declares %d: %w",
						g.Name, t.Name, len(shape), len(typ.Shape), ErrShapeMismatch)
				}
				for d, dim := range typ.Shape {
					if dim.HasValue && dim.Value != shape[d] {
						return fmt.Errorf("graph %q: input %q: dimension %d given as %d, the model fixes it at %d: %w",
							g.Name, t.Name, d, shape[d], dim.Value, ErrShapeMismatch)
					}
				}
			}
		default:
			var static bool
			if shape, static = typ.Static(); !static {
				if err := imp.unknown(i, fmt.Errorf("graph %q: input %q has symbolic or unknown dimensions %s; give them in inputs: %w",
					g.Name, t.Name, describeDims(typ), ErrUnknownShape)); err != nil {
					return err
				}
				continue
			}
		}
		if err := t.setShape(dt, shape); err != nil {
			return fmt.Errorf("graph %q: input: %w", g.Name, err)
		}
	}
	return nil
}

func describeDims(t onnx.Type) string {
	if !t.HasShape {
		return "(rank unknown)"
	}
	parts := make([]string, len(t.Shape))
	for i, d := range t.Shape {
		switch {
		case d.HasValue:
			parts[i] = fmt.Sprint(d.Value)
		case d.Param != "":
			parts[i] = d.Param
		default:
			parts[i] = "?"
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// unknown records that tensor i cannot be sized: with AllowUnknown the
// tensor stays unknown and is counted, otherwise err is returned.
func (imp *importer) unknown(i int, err error) error {
	if !imp.opts.AllowUnknown || !errors.Is(err, ErrUnknownShape) {
		return err
	}
	if !imp.counted[i] {
		imp.counted[i] = true
		imp.g.Unknown++
	}
	t := &imp.g.Tensors[i]
	t.Known, t.Shape, t.Bytes = false, nil, 0
	imp.vals[i] = nil
	return nil
}

// node infers the outputs of node k.
func (imp *importer) node(k int, on *onnx.Node) error {
	g := imp.g
	n := &g.Nodes[k]
	fail := func(err error) error {
		where := fmt.Sprintf("node %q (%s)", n.Name, n.Op)
		if n.Name == "" {
			where = fmt.Sprintf("node #%d (%s)", k, n.Op)
		}
		var outs []string
		for _, o := range n.Outputs {
			if o >= 0 {
				outs = append(outs, strconv.Quote(g.Tensors[o].Name))
			}
		}
		return fmt.Errorf("graph %q: %s computing %s: %w", g.Name, where, strings.Join(outs, ", "), err)
	}
	// An output left unknown by an earlier AllowUnknown skip makes every
	// output of this node unknown too.
	for _, in := range append(slices.Clone(n.Inputs), n.Captures...) {
		if in >= 0 && !g.Tensors[in].Known {
			if imp.declare(n) {
				return nil
			}
			for _, o := range n.Outputs {
				if o >= 0 {
					if err := imp.unknown(o, fmt.Errorf("%w", ErrUnknownShape)); err != nil {
						return fail(err)
					}
				}
			}
			return nil
		}
	}
	c := &nodeCtx{imp: imp, n: on, node: n, opset: imp.opsetFor(n.Domain)}
	err := c.infer()
	if err == nil {
		for j, o := range n.Outputs {
			if o >= 0 && !g.Tensors[o].Known {
				err = fmt.Errorf("output %d %q: not inferred: %w", j, g.Tensors[o].Name, ErrUnknownShape)
				break
			}
		}
	}
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrUnknownShape) && imp.declare(n) {
		return nil
	}
	if !imp.opts.AllowUnknown || !errors.Is(err, ErrUnknownShape) {
		return fail(err)
	}
	for _, o := range n.Outputs {
		if o >= 0 && !g.Tensors[o].Known {
			if err := imp.unknown(o, err); err != nil {
				return fail(err)
			}
		}
	}
	return nil
}

// declarations collects the shapes the file declares (value_info first,
// graph outputs over them) and binds each symbolic dimension of the graph
// inputs to the value it was given (or assumed), so that a declared
// dimension named like an input's ("batch", "s0") resolves.
func (imp *importer) declarations() {
	og := imp.m.Graph
	imp.declared = map[string]onnx.Type{}
	for _, vs := range [][]onnx.ValueInfo{og.ValueInfo, og.Outputs} {
		for _, v := range vs {
			if v.Type.Kind == onnx.TypeTensor && v.Type.HasShape {
				imp.declared[v.Name] = v.Type
			}
		}
	}
	imp.binds = map[string]int64{}
	conflict := map[string]bool{}
	for _, v := range og.Inputs {
		i, ok := imp.g.Lookup(v.Name)
		if !ok || !imp.g.Tensors[i].Input || !imp.g.Tensors[i].Known || !v.Type.HasShape {
			continue
		}
		shape := imp.g.Tensors[i].Shape
		for d, dim := range v.Type.Shape {
			if dim.HasValue || dim.Param == "" || d >= len(shape) {
				continue
			}
			if old, ok := imp.binds[dim.Param]; ok && old != shape[d] {
				conflict[dim.Param] = true
			}
			imp.binds[dim.Param] = shape[d]
		}
	}
	for p := range conflict {
		delete(imp.binds, p) // two values for one name: resolve neither
	}
}

// declare sizes the outputs of node n that inference left unknown from the
// shapes the file declares for them, and reports whether it could: every
// such output must have a declared tensor type of a known element type
// whose dimensions are all concrete or named after a bound input
// dimension. It sizes nothing unless it can size them all. The tensors it
// sizes count in Graph.Declared; their values stay unknown.
func (imp *importer) declare(n *Node) bool {
	g := imp.g
	type decl struct {
		o     int
		dt    DType
		shape []int64
	}
	var ds []decl
	for _, o := range n.Outputs {
		if o < 0 || g.Tensors[o].Known {
			continue
		}
		typ, ok := imp.declared[g.Tensors[o].Name]
		if !ok {
			return false
		}
		dt, ok := dtypeFromONNX(typ.ElemType)
		if !ok {
			return false
		}
		shape := make([]int64, len(typ.Shape))
		for d, dim := range typ.Shape {
			switch v, bound := imp.binds[dim.Param]; {
			case dim.HasValue && dim.Value >= 0:
				shape[d] = dim.Value
			case !dim.HasValue && dim.Param != "" && bound:
				shape[d] = v
			default:
				return false
			}
		}
		ds = append(ds, decl{o, dt, shape})
	}
	if len(ds) == 0 {
		return false
	}
	for k, d := range ds {
		if err := g.Tensors[d.o].setShape(d.dt, d.shape); err != nil {
			for _, u := range ds[:k+1] {
				t := &g.Tensors[u.o]
				t.Known, t.Shape, t.Bytes = false, nil, 0
			}
			return false
		}
	}
	for _, d := range ds {
		imp.vals[d.o] = nil
		if imp.counted[d.o] {
			imp.counted[d.o] = false
			g.Unknown--
		}
		g.Declared++
	}
	return true
}

func (imp *importer) opsetFor(domain string) int64 {
	return imp.m.Opset(domain)
}
