package graph

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/memwall/memwall/format/onnx"
)

// nodeCtx is the view of one node during shape inference.
type nodeCtx struct {
	imp   *importer
	n     *onnx.Node
	node  *Node
	opset int64
}

func unknownf(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrUnknownShape)
}

func mismatchf(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrShapeMismatch)
}

// has reports whether input i is present (not omitted).
func (c *nodeCtx) has(i int) bool { return i < len(c.node.Inputs) && c.node.Inputs[i] >= 0 }

func (c *nodeCtx) in(i int) *Tensor { return &c.imp.g.Tensors[c.node.Inputs[i]] }

// shape returns the shape of input i, failing if it is missing.
func (c *nodeCtx) shape(i int) ([]int64, error) {
	if !c.has(i) {
		return nil, mismatchf("input %d is missing", i)
	}
	return c.in(i).Shape, nil
}

func (c *nodeCtx) dtype(i int) DType {
	if !c.has(i) {
		return DTypeUnknown
	}
	return c.in(i).DType
}

// val returns the statically known value of input i, or nil.
func (c *nodeCtx) val(i int) *value {
	if !c.has(i) {
		return nil
	}
	return c.imp.vals[c.node.Inputs[i]]
}

// ints returns the value of input i as integers, failing with
// ErrUnknownShape when it is not known statically.
func (c *nodeCtx) ints(i int, what string) ([]int64, error) {
	v := c.val(i)
	if v == nil {
		name := ""
		if c.has(i) {
			name = c.in(i).Name
		}
		return nil, unknownf("%s (input %d %q) is not known statically", what, i, name)
	}
	out := make([]int64, v.len())
	for k := range out {
		x, ok := v.int64At(k)
		if !ok {
			return nil, mismatchf("%s (input %d) holds a non-integer value", what, i)
		}
		out[k] = x
	}
	return out, nil
}

func (c *nodeCtx) floats(i int, what string) ([]float64, error) {
	v := c.val(i)
	if v == nil {
		name := ""
		if c.has(i) {
			name = c.in(i).Name
		}
		return nil, unknownf("%s (input %d %q) is not known statically", what, i, name)
	}
	out := make([]float64, v.len())
	for k := range out {
		out[k] = v.float64At(k)
	}
	return out, nil
}

func (c *nodeCtx) attr(name string) *onnx.Attribute { return c.n.Attr(name) }

func (c *nodeCtx) attrInt(name string, def int64) int64 {
	if a := c.attr(name); a != nil {
		return a.I
	}
	return def
}

func (c *nodeCtx) attrInts(name string) ([]int64, bool) {
	if a := c.attr(name); a != nil {
		return a.Ints, true
	}
	return nil, false
}

func (c *nodeCtx) attrString(name, def string) string {
	if a := c.attr(name); a != nil {
		return string(a.S)
	}
	return def
}

// set records output j's type and shape; an omitted output is skipped.
func (c *nodeCtx) set(j int, dt DType, shape []int64) error {
	if j >= len(c.node.Outputs) || c.node.Outputs[j] < 0 {
		return nil
	}
	t := &c.imp.g.Tensors[c.node.Outputs[j]]
	if dt == DTypeUnknown {
		return unknownf("output %q: element type unknown", t.Name)
	}
	if len(shape) > MaxRank {
		return mismatchf("output %q: rank %d exceeds %d", t.Name, len(shape), MaxRank)
	}
	return t.setShape(dt, slices.Clone(shape))
}

// setVal records output j's value if it is small enough to keep.
func (c *nodeCtx) setVal(j int, v *value) {
	if v == nil || j >= len(c.node.Outputs) || c.node.Outputs[j] < 0 || v.len() > c.imp.opts.MaxFoldElements {
		return
	}
	t := &c.imp.g.Tensors[c.node.Outputs[j]]
	if !t.Known || int64(v.len()) != product(t.Shape) {
		return
	}
	if !t.DType.IsFloat() && v.float {
		if v = v.convert(t.DType); v == nil {
			return
		}
	}
	c.imp.vals[c.node.Outputs[j]] = v
}

// small reports whether a tensor of this shape may be folded.
func (c *nodeCtx) small(shape []int64) bool {
	n, err := NumElements(shape)
	return err == nil && n <= int64(c.imp.opts.MaxFoldElements)
}

// normAxis maps a possibly negative axis into [0, rank).
func normAxis(axis int64, rank int) (int, error) {
	if axis < -int64(rank) || axis >= int64(rank) {
		return 0, mismatchf("axis %d out of range for rank %d", axis, rank)
	}
	if axis < 0 {
		axis += int64(rank)
	}
	return int(axis), nil
}

// normAxes normalizes, sorts and de-duplicates axes for rank.
func normAxes(axes []int64, rank int) ([]int, error) {
	out := make([]int, 0, len(axes))
	for _, a := range axes {
		ax, err := normAxis(a, rank)
		if err != nil {
			return nil, err
		}
		if slices.Contains(out, ax) {
			return nil, mismatchf("axis %d repeated", a)
		}
		out = append(out, ax)
	}
	slices.Sort(out)
	return out, nil
}

// broadcast applies numpy broadcasting to shapes.
func broadcast(shapes ...[]int64) ([]int64, error) {
	rank := 0
	for _, s := range shapes {
		rank = max(rank, len(s))
	}
	out := make([]int64, rank)
	for i := range out {
		out[i] = 1
	}
	for _, s := range shapes {
		off := rank - len(s)
		for i, d := range s {
			o := &out[off+i]
			switch {
			case d == *o || d == 1:
			case *o == 1:
				*o = d
			default:
				return nil, mismatchf("shapes %v do not broadcast (dimension %d: %d vs %d)", shapes, off+i, *o, d)
			}
		}
	}
	return out, nil
}

// Operator families.
var (
	unaryOps = setOf("Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cos", "Cosh", "Elu",
		"Erf", "Exp", "Floor", "HardSigmoid", "HardSwish", "LeakyRelu", "Log", "Neg", "Reciprocal", "Relu",
		"Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh",
		"ThresholdedRelu", "Celu", "Gelu", "Mish", "Shrink", "Clip", "Softmax", "LogSoftmax", "Hardmax",
		"CumSum", "Trilu", "LRN", "InstanceNormalization", "MeanVarianceNormalization", "LpNormalization",
		"GroupNormalization", "RMSNormalization", "ReverseSequence", "ScatterND", "ScatterElements", "Scatter",
		"Identity", "BitwiseNot", "Bernoulli", "RandomNormalLike", "RandomUniformLike", "Swish")
	boolUnaryOps = setOf("Not", "IsNaN", "IsInf")
	binaryOps    = setOf("Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu", "BitShift", "BitwiseAnd",
		"BitwiseOr", "BitwiseXor", "Max", "Min", "Sum", "Mean")
	compareOps = setOf("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor")
	reduceOps  = setOf("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
		"ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
)

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// infer sets the type and shape of every output of the node, and the value
// of small outputs computable from known input values.
func (c *nodeCtx) infer() error {
	op := c.node.Op
	if d := c.node.Domain; d != "" && d != "ai.onnx" {
		return unknownf("operator domain %q is not supported", d)
	}
	for i := range c.node.Inputs {
		if c.has(i) && !c.in(i).Known {
			return unknownf("input %q has no known shape", c.in(i).Name)
		}
	}
	switch {
	case unaryOps[op]:
		return c.unary()
	case boolUnaryOps[op]:
		x, err := c.shape(0)
		if err != nil {
			return err
		}
		if err := c.set(0, Bool, x); err != nil {
			return err
		}
		if v := c.val(0); op == "Not" && v != nil {
			c.setVal(0, unaryFold(op, v))
		}
		return nil
	case binaryOps[op] || compareOps[op]:
		return c.elementwise()
	case reduceOps[op]:
		return c.reduce()
	}
	switch op {
	case "Dropout":
		x, err := c.shape(0)
		if err != nil {
			return err
		}
		if err := c.set(0, c.dtype(0), x); err != nil {
			return err
		}
		c.setVal(0, c.val(0))
		return c.set(1, Bool, x)
	case "Cast":
		to, ok := dtypeFromONNX(onnx.DataType(c.attrInt("to", 0)))
		if !ok {
			return mismatchf("unknown target type %d", c.attrInt("to", 0))
		}
		return c.castTo(to)
	case "CastLike":
		return c.castTo(c.dtype(1))
	case "Where":
		return c.where()
	case "Conv", "ConvInteger", "QLinearConv":
		return c.conv()
	case "ConvTranspose":
		return c.convTranspose()
	case "MaxPool", "AveragePool", "LpPool":
		return c.pool()
	case "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool":
		x, err := c.shape(0)
		if err != nil {
			return err
		}
		if len(x) < 3 {
			return mismatchf("input rank %d, want at least 3", len(x))
		}
		out := slices.Clone(x)
		for i := 2; i < len(out); i++ {
			out[i] = 1
		}
		return c.set(0, c.dtype(0), out)
	case "Gemm":
		return c.gemm()
	case "MatMul", "MatMulInteger", "QLinearMatMul":
		return c.matmul()
	case "BatchNormalization":
		x, err := c.shape(0)
		if err != nil {
			return err
		}
		if len(x) < 2 {
			return mismatchf("input rank %d, want at least 2", len(x))
		}
		if err := c.set(0, c.dtype(0), x); err != nil {
			return err
		}
		for j := 1; j < len(c.node.Outputs); j++ { // training-mode statistics
			if err := c.set(j, c.dtype(1), []int64{x[1]}); err != nil {
				return err
			}
		}
		return nil
	case "LayerNormalization":
		return c.layerNorm()
	case "Reshape":
		return c.reshape()
	case "Flatten":
		return c.flatten()
	case "Squeeze":
		return c.squeeze()
	case "Unsqueeze":
		return c.unsqueeze()
	case "Transpose":
		return c.transpose()
	case "Concat":
		return c.concat()
	case "Split":
		return c.split()
	case "Slice":
		return c.slice()
	case "Gather":
		return c.gather()
	case "GatherElements":
		idx, err := c.shape(1)
		if err != nil {
			return err
		}
		return c.set(0, c.dtype(0), idx)
	case "GatherND":
		return c.gatherND()
	case "Expand":
		return c.expand()
	case "Tile":
		return c.tile()
	case "Pad":
		return c.pad()
	case "Resize", "Upsample":
		return c.resize()
	case "ArgMax", "ArgMin":
		return c.argReduce()
	case "TopK":
		return c.topK()
	case "Constant":
		return c.constant()
	case "ConstantOfShape":
		return c.constantOfShape()
	case "Shape":
		return c.shapeOp()
	case "Size":
		x, err := c.shape(0)
		if err != nil {
			return err
		}
		if err := c.set(0, Int64, nil); err != nil {
			return err
		}
		c.setVal(0, intValue([]int64{product(x)}))
		return nil
	case "Range":
		return c.rangeOp()
	case "OneHot":
		return c.oneHot()
	case "DepthToSpace", "SpaceToDepth":
		return c.depthSpace()
	case "NonZero":
		v := c.val(0)
		if v == nil {
			return unknownf("output size depends on the input's values, which are not known statically")
		}
		x, _ := c.shape(0)
		cnt := int64(0)
		for k := 0; k < v.len(); k++ {
			if v.float64At(k) != 0 {
				cnt++
			}
		}
		return c.set(0, Int64, []int64{int64(len(x)), cnt})
	case "EyeLike":
		x, err := c.shape(0)
		if err != nil {
			return err
		}
		dt := c.dtype(0)
		if a := c.attr("dtype"); a != nil {
			dt, _ = dtypeFromONNX(onnx.DataType(a.I))
		}
		return c.set(0, dt, x)
	case "RandomNormal", "RandomUniform":
		shape, ok := c.attrInts("shape")
		if !ok {
			return mismatchf("no shape attribute")
		}
		dt, _ := dtypeFromONNX(onnx.DataType(c.attrInt("dtype", int64(onnx.Float))))
		return c.set(0, dt, shape)
	case "QuantizeLinear":
		x, err := c.shape(0)
		if err != nil {
			return err
		}
		dt := Uint8
		if c.has(2) {
			dt = c.dtype(2)
		} else if a := c.attr("output_dtype"); a != nil && a.I != 0 {
			dt, _ = dtypeFromONNX(onnx.DataType(a.I))
		}
		return c.set(0, dt, x)
	case "DequantizeLinear":
		x, err := c.shape(0)
		if err != nil {
			return err
		}
		return c.set(0, c.dtype(1), x)
	case "DynamicQuantizeLinear":
		x, err := c.shape(0)
		if err != nil {
			return err
		}
		if err := c.set(0, Uint8, x); err != nil {
			return err
		}
		if err := c.set(1, Float32, nil); err != nil {
			return err
		}
		return c.set(2, Uint8, nil)
	}
	return unknownf("operator %s (opset %d) is not supported by shape inference", op, c.opset)
}

func (c *nodeCtx) unary() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	if err := c.set(0, c.dtype(0), x); err != nil {
		return err
	}
	if v := c.val(0); v != nil {
		c.setVal(0, unaryFold(c.node.Op, v))
	}
	return nil
}

func (c *nodeCtx) castTo(to DType) error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	if err := c.set(0, to, x); err != nil {
		return err
	}
	if v := c.val(0); v != nil {
		c.setVal(0, v.convert(to))
	}
	return nil
}

// elementwise handles broadcasting binary and variadic operators.
func (c *nodeCtx) elementwise() error {
	op := c.node.Op
	var shapes [][]int64
	for i := range c.node.Inputs {
		if c.has(i) {
			shapes = append(shapes, c.in(i).Shape)
		}
	}
	if len(shapes) == 0 {
		return mismatchf("no inputs")
	}
	out, err := broadcast(shapes...)
	if err != nil {
		return err
	}
	dt := c.dtype(0)
	if compareOps[op] {
		dt = Bool
	}
	if err := c.set(0, dt, out); err != nil {
		return err
	}
	if !c.small(out) || len(c.node.Inputs) > 2 {
		return nil
	}
	if len(c.node.Inputs) == 1 { // a variadic op over one input
		c.setVal(0, c.val(0))
		return nil
	}
	a, b := c.val(0), c.val(1)
	if a == nil || b == nil {
		return nil
	}
	c.setVal(0, binaryFold(op, a, b, shapes[0], shapes[1], out))
	return nil
}

func (c *nodeCtx) where() error {
	var shapes [][]int64
	for i := 0; i < 3; i++ {
		s, err := c.shape(i)
		if err != nil {
			return err
		}
		shapes = append(shapes, s)
	}
	out, err := broadcast(shapes...)
	if err != nil {
		return err
	}
	if err := c.set(0, c.dtype(1), out); err != nil {
		return err
	}
	cond, x, y := c.val(0), c.val(1), c.val(2)
	if cond == nil || x == nil || y == nil || !c.small(out) || x.float != y.float {
		return nil
	}
	ic, ix, iy := broadcastIndex(out, shapes[0]), broadcastIndex(out, shapes[1]), broadcastIndex(out, shapes[2])
	if x.float {
		res := make([]float64, len(ic))
		for k := range res {
			if cond.float64At(ic[k]) != 0 {
				res[k] = x.f[ix[k]]
			} else {
				res[k] = y.f[iy[k]]
			}
		}
		c.setVal(0, floatValue(res))
		return nil
	}
	res := make([]int64, len(ic))
	for k := range res {
		if cond.float64At(ic[k]) != 0 {
			res[k] = x.i[ix[k]]
		} else {
			res[k] = y.i[iy[k]]
		}
	}
	c.setVal(0, intValue(res))
	return nil
}

// spatial holds the per-axis window parameters of convolutions and pools.
type spatial struct {
	kernel, strides, dilations, pads []int64
	autoPad                          string
}

func (c *nodeCtx) window(rank int, kernel []int64) (spatial, error) {
	s := spatial{kernel: kernel, autoPad: c.attrString("auto_pad", "NOTSET")}
	if len(kernel) != rank {
		return s, mismatchf("kernel_shape %v has %d dimensions, input has %d spatial", kernel, len(kernel), rank)
	}
	ones := func() []int64 {
		o := make([]int64, rank)
		for i := range o {
			o[i] = 1
		}
		return o
	}
	var ok bool
	if s.strides, ok = c.attrInts("strides"); !ok {
		s.strides = ones()
	}
	if s.dilations, ok = c.attrInts("dilations"); !ok {
		s.dilations = ones()
	}
	if s.pads, ok = c.attrInts("pads"); !ok {
		s.pads = make([]int64, 2*rank)
	}
	if len(s.strides) != rank || len(s.dilations) != rank || len(s.pads) != 2*rank {
		return s, mismatchf("strides %v, dilations %v or pads %v do not match %d spatial dimensions",
			s.strides, s.dilations, s.pads, rank)
	}
	for i := 0; i < rank; i++ {
		const lim = 1 << 31
		if s.strides[i] < 1 || s.dilations[i] < 1 || kernel[i] < 1 || s.pads[i] < 0 || s.pads[rank+i] < 0 ||
			s.strides[i] > lim || s.dilations[i] > lim || kernel[i] > lim || s.pads[i] > lim || s.pads[rank+i] > lim {
			return s, mismatchf("kernel %v, strides %v, dilations %v, pads %v: values out of range",
				kernel, s.strides, s.dilations, s.pads)
		}
	}
	if s.autoPad == "VALID" {
		s.pads = make([]int64, 2*rank)
	}
	return s, nil
}

// outDims computes output spatial sizes; ceil selects pooling's ceil_mode.
func (s spatial) outDims(in []int64, ceil bool) ([]int64, error) {
	rank := len(s.kernel)
	out := make([]int64, rank)
	for i := range out {
		ek := (s.kernel[i]-1)*s.dilations[i] + 1
		st := s.strides[i]
		switch s.autoPad {
		case "SAME_UPPER", "SAME_LOWER":
			out[i] = (in[i] + st - 1) / st
			continue
		}
		span := in[i] + s.pads[i] + s.pads[rank+i] - ek
		if span < 0 {
			return nil, mismatchf("window %d (kernel %d, dilation %d) larger than padded input %d",
				ek, s.kernel[i], s.dilations[i], in[i]+s.pads[i]+s.pads[rank+i])
		}
		if ceil {
			out[i] = (span+st-1)/st + 1
			// The last window must start inside the input or its leading
			// padding.
			if (out[i]-1)*st >= in[i]+s.pads[i] {
				out[i]--
			}
		} else {
			out[i] = span/st + 1
		}
	}
	return out, nil
}

func (c *nodeCtx) conv() error {
	op := c.node.Op
	wi, dt := 1, c.dtype(0)
	switch op {
	case "QLinearConv":
		wi, dt = 3, c.dtype(7)
	case "ConvInteger":
		dt = Int32
	}
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	w, err := c.shape(wi)
	if err != nil {
		return err
	}
	if len(x) < 3 || len(w) != len(x) {
		return mismatchf("input rank %d, weight rank %d", len(x), len(w))
	}
	kernel, ok := c.attrInts("kernel_shape")
	if !ok {
		kernel = w[2:]
	}
	group := c.attrInt("group", 1)
	if group < 1 || x[1] != w[1]*group {
		return mismatchf("input has %d channels, weight %v with group %d expects %d", x[1], w, group, w[1]*group)
	}
	s, err := c.window(len(x)-2, kernel)
	if err != nil {
		return err
	}
	sp, err := s.outDims(x[2:], false)
	if err != nil {
		return err
	}
	return c.set(0, dt, append([]int64{x[0], w[0]}, sp...))
}

func (c *nodeCtx) convTranspose() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	w, err := c.shape(1)
	if err != nil {
		return err
	}
	if len(x) < 3 || len(w) != len(x) {
		return mismatchf("input rank %d, weight rank %d", len(x), len(w))
	}
	rank := len(x) - 2
	kernel, ok := c.attrInts("kernel_shape")
	if !ok {
		kernel = w[2:]
	}
	group := c.attrInt("group", 1)
	if group < 1 || x[1] != w[0] {
		return mismatchf("input has %d channels, weight %v expects %d", x[1], w, w[0])
	}
	s, err := c.window(rank, kernel)
	if err != nil {
		return err
	}
	outPad, ok := c.attrInts("output_padding")
	if !ok {
		outPad = make([]int64, rank)
	}
	if len(outPad) != rank {
		return mismatchf("output_padding %v for %d spatial dimensions", outPad, rank)
	}
	out := []int64{x[0], w[1] * group}
	if os, ok := c.attrInts("output_shape"); ok {
		if len(os) < rank {
			return mismatchf("output_shape %v for %d spatial dimensions", os, rank)
		}
		return c.set(0, c.dtype(0), append(out, os[len(os)-rank:]...))
	}
	for i := 0; i < rank; i++ {
		if x[2+i] > MaxElements>>31 {
			return mismatchf("input dimension %d too large", x[2+i])
		}
		ek := (kernel[i]-1)*s.dilations[i] + 1
		var d int64
		switch s.autoPad {
		case "SAME_UPPER", "SAME_LOWER":
			d = x[2+i] * s.strides[i]
		default:
			if outPad[i] < 0 || outPad[i] > 1<<31 {
				return mismatchf("output_padding %v out of range", outPad)
			}
			d = s.strides[i]*(x[2+i]-1) + outPad[i] + ek - s.pads[i] - s.pads[rank+i]
		}
		if d < 0 {
			return mismatchf("negative output dimension %d", d)
		}
		out = append(out, d)
	}
	return c.set(0, c.dtype(0), out)
}

func (c *nodeCtx) pool() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	if len(x) < 3 {
		return mismatchf("input rank %d, want at least 3", len(x))
	}
	kernel, ok := c.attrInts("kernel_shape")
	if !ok {
		return mismatchf("no kernel_shape attribute")
	}
	s, err := c.window(len(x)-2, kernel)
	if err != nil {
		return err
	}
	sp, err := s.outDims(x[2:], c.attrInt("ceil_mode", 0) != 0)
	if err != nil {
		return err
	}
	out := append([]int64{x[0], x[1]}, sp...)
	if err := c.set(0, c.dtype(0), out); err != nil {
		return err
	}
	return c.set(1, Int64, out) // MaxPool's optional Indices
}

func (c *nodeCtx) gemm() error {
	a, err := c.shape(0)
	if err != nil {
		return err
	}
	b, err := c.shape(1)
	if err != nil {
		return err
	}
	if len(a) != 2 || len(b) != 2 {
		return mismatchf("operands of rank %d and %d, want 2", len(a), len(b))
	}
	m, k := a[0], a[1]
	if c.attrInt("transA", 0) != 0 {
		m, k = k, m
	}
	k2, n := b[0], b[1]
	if c.attrInt("transB", 0) != 0 {
		k2, n = n, k2
	}
	if k != k2 {
		return mismatchf("inner dimensions %d and %d differ", k, k2)
	}
	return c.set(0, c.dtype(0), []int64{m, n})
}

func (c *nodeCtx) matmul() error {
	op := c.node.Op
	bi, dt := 1, c.dtype(0)
	switch op {
	case "MatMulInteger":
		dt = Int32
	case "QLinearMatMul":
		bi, dt = 3, c.dtype(7)
	}
	a, err := c.shape(0)
	if err != nil {
		return err
	}
	b, err := c.shape(bi)
	if err != nil {
		return err
	}
	out, err := matmulShape(a, b)
	if err != nil {
		return err
	}
	return c.set(0, dt, out)
}

// matmulShape follows numpy.matmul: 1-D operands are promoted and the
// promoted dimension removed; batch dimensions broadcast.
func matmulShape(a, b []int64) ([]int64, error) {
	if len(a) == 0 || len(b) == 0 {
		return nil, mismatchf("scalar operand")
	}
	a1, b1 := len(a) == 1, len(b) == 1
	if a1 {
		a = []int64{1, a[0]}
	}
	if b1 {
		b = []int64{b[0], 1}
	}
	if a[len(a)-1] != b[len(b)-2] {
		return nil, mismatchf("inner dimensions %d and %d differ", a[len(a)-1], b[len(b)-2])
	}
	batch, err := broadcast(a[:len(a)-2], b[:len(b)-2])
	if err != nil {
		return nil, err
	}
	out := batch
	if !a1 {
		out = append(out, a[len(a)-2])
	}
	if !b1 {
		out = append(out, b[len(b)-1])
	}
	return out, nil
}

func (c *nodeCtx) layerNorm() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	axis, err := normAxis(c.attrInt("axis", -1), len(x))
	if err != nil {
		return err
	}
	if err := c.set(0, c.dtype(0), x); err != nil {
		return err
	}
	stat := slices.Clone(x)
	for i := axis; i < len(stat); i++ {
		stat[i] = 1
	}
	st, ok := dtypeFromONNX(onnx.DataType(c.attrInt("stash_type", int64(onnx.Float))))
	if !ok {
		st = Float32
	}
	if err := c.set(1, st, stat); err != nil {
		return err
	}
	return c.set(2, st, stat)
}

// passValue forwards input 0's value to output 0 (ops that only re-shape).
func (c *nodeCtx) passValue() {
	c.setVal(0, c.val(0))
}

func (c *nodeCtx) reshape() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	var spec []int64
	if c.opset < 5 {
		var ok bool
		if spec, ok = c.attrInts("shape"); !ok {
			return mismatchf("no shape attribute")
		}
	} else if spec, err = c.ints(1, "Reshape target shape"); err != nil {
		return err
	}
	out, err := reshapeDims(x, spec, c.attrInt("allowzero", 0) != 0)
	if err != nil {
		return err
	}
	return c.setReshaped(out)
}

// setReshaped sets output 0 to input 0's elements in shape: its dtype and
// its value, when known.
func (c *nodeCtx) setReshaped(shape []int64) error {
	if err := c.set(0, c.dtype(0), shape); err != nil {
		return err
	}
	c.passValue()
	return nil
}

// reshapeDims applies Reshape's rules: 0 copies the input dimension (unless
// allowzero), one -1 is inferred from the element count.
func reshapeDims(in, spec []int64, allowZero bool) ([]int64, error) {
	total, err := NumElements(in)
	if err != nil {
		return nil, err
	}
	if len(spec) > MaxRank {
		return nil, mismatchf("rank %d exceeds %d", len(spec), MaxRank)
	}
	out := make([]int64, len(spec))
	neg := -1
	known := int64(1)
	for i, d := range spec {
		switch {
		case d == 0 && !allowZero:
			if i >= len(in) {
				return nil, mismatchf("0 at position %d copies a dimension the input %v lacks", i, in)
			}
			d = in[i]
		case d == -1:
			if neg >= 0 {
				return nil, mismatchf("more than one -1 in %v", spec)
			}
			neg = i
			continue
		case d < -1:
			return nil, mismatchf("invalid dimension %d in %v", d, spec)
		}
		out[i] = d
		if d != 0 && known > MaxElements/d {
			return nil, mismatchf("target %v too large", spec)
		}
		known *= d
	}
	if neg >= 0 {
		if known == 0 || total%known != 0 {
			return nil, mismatchf("cannot infer -1 in %v from %d elements of %v", spec, total, in)
		}
		out[neg] = total / known
	} else if known != total {
		return nil, mismatchf("%v has %d elements, target %v has %d", in, total, spec, known)
	}
	return out, nil
}

func (c *nodeCtx) flatten() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	axis := c.attrInt("axis", 1)
	if axis < -int64(len(x)) || axis > int64(len(x)) {
		return mismatchf("axis %d out of range for rank %d", axis, len(x))
	}
	if axis < 0 {
		axis += int64(len(x))
	}
	if err := c.set(0, c.dtype(0), []int64{product(x[:axis]), product(x[axis:])}); err != nil {
		return err
	}
	c.passValue()
	return nil
}

// axesInput reads an axes list from attribute (before opset since) or from
// input i (from since on). present is false when neither is given.
func (c *nodeCtx) axesInput(since int64, i int) (axes []int64, present bool, err error) {
	if c.opset < since {
		axes, present = c.attrInts("axes")
		return axes, present, nil
	}
	if !c.has(i) {
		return nil, false, nil
	}
	axes, err = c.ints(i, "axes")
	return axes, true, err
}

func (c *nodeCtx) squeeze() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	axes, present, err := c.axesInput(13, 1)
	if err != nil {
		return err
	}
	var out []int64
	if !present {
		for _, d := range x {
			if d != 1 {
				out = append(out, d)
			}
		}
	} else {
		ax, err := normAxes(axes, len(x))
		if err != nil {
			return err
		}
		for i, d := range x {
			if slices.Contains(ax, i) {
				if d != 1 {
					return mismatchf("dimension %d of %v is %d, not 1", i, x, d)
				}
				continue
			}
			out = append(out, d)
		}
	}
	if err := c.set(0, c.dtype(0), out); err != nil {
		return err
	}
	c.passValue()
	return nil
}

func (c *nodeCtx) unsqueeze() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	axes, present, err := c.axesInput(13, 1)
	if errors.Is(err, ErrUnknownShape) {
		if out, ok := c.imp.unsqueezeFromUses(c.node); ok {
			if err := c.set(0, c.dtype(0), out); err != nil {
				return err
			}
			c.imp.g.Declared++
			return nil
		}
	}
	if err != nil {
		return err
	}
	if !present {
		return mismatchf("no axes")
	}
	out, err := unsqueezeShape(x, axes)
	if err != nil {
		return err
	}
	return c.setReshaped(out)
}

// unsqueezeShape is x with a 1 inserted at each of axes (of the result).
func unsqueezeShape(x, axes []int64) ([]int64, error) {
	rank := len(x) + len(axes)
	if rank > MaxRank {
		return nil, mismatchf("rank %d exceeds %d", rank, MaxRank)
	}
	ax, err := normAxes(axes, rank)
	if err != nil {
		return nil, err
	}
	out := make([]int64, 0, rank)
	j := 0
	for i := 0; i < rank; i++ {
		if slices.Contains(ax, i) {
			out = append(out, 1)
		} else {
			out = append(out, x[j])
			j++
		}
	}
	return out, nil
}

// unsqueezeFromUses sizes the output of Unsqueeze node n whose single axis
// has no known value (an exporter's constant in an external file that is
// absent): one tensor has one value, so the axis is one that every
// Unsqueeze reading the same axes tensor agrees with — each one's input
// shape, unsqueezed at it, matches the shape the file declares for that
// node's output. It reports false unless the axes tensor holds one
// element and every axis so allowed gives n the same output shape.
func (imp *importer) unsqueezeFromUses(n *Node) ([]int64, bool) {
	g := imp.g
	if len(n.Inputs) < 2 || n.Inputs[1] < 0 || !g.Tensors[n.Inputs[0]].Known {
		return nil, false
	}
	axes := n.Inputs[1]
	if at := g.Tensors[axes]; !at.Known || product(at.Shape) != 1 || len(at.Shape) > 1 {
		return nil, false
	}
	type use struct {
		x    []int64
		decl onnx.Type
		ok   bool // declared
	}
	var uses []use
	for i := range g.Nodes {
		u := &g.Nodes[i]
		if u.Op != "Unsqueeze" || u.Domain != "" || len(u.Inputs) < 2 || u.Inputs[1] != axes ||
			u.Inputs[0] < 0 || !g.Tensors[u.Inputs[0]].Known || len(u.Outputs) == 0 || u.Outputs[0] < 0 {
			continue
		}
		typ, ok := imp.declared[g.Tensors[u.Outputs[0]].Name]
		uses = append(uses, use{g.Tensors[u.Inputs[0]].Shape, typ, ok && typ.HasShape})
	}
	x := g.Tensors[n.Inputs[0]].Shape
	var out []int64
	for a := -int64(MaxRank); a < MaxRank; a++ {
		agreed := true
		for _, u := range uses {
			s, err := unsqueezeShape(u.x, []int64{a})
			if err != nil || u.ok && !imp.matchesDeclared(s, u.decl) {
				agreed = false
				break
			}
		}
		if !agreed {
			continue
		}
		s, err := unsqueezeShape(x, []int64{a})
		switch {
		case err != nil:
		case out == nil:
			out = s
		case !slices.Equal(out, s):
			return nil, false // two axes fit: the shape is not known
		}
	}
	return out, out != nil
}

// matchesDeclared reports whether shape agrees with declared type typ:
// the same rank, and every dimension typ states (a value, or a symbol bound
// to an input's dimension) equal; unnamed dimensions agree with any.
func (imp *importer) matchesDeclared(shape []int64, typ onnx.Type) bool {
	if typ.Kind != onnx.TypeTensor || !typ.HasShape || len(typ.Shape) != len(shape) {
		return false
	}
	for d, dim := range typ.Shape {
		v, bound := imp.binds[dim.Param]
		switch {
		case dim.HasValue && dim.Value >= 0 && dim.Value != shape[d]:
			return false
		case !dim.HasValue && dim.Param != "" && bound && v != shape[d]:
			return false
		}
	}
	return true
}

func (c *nodeCtx) transpose() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	permAttr, ok := c.attrInts("perm")
	perm := make([]int, len(x))
	if !ok {
		for i := range perm {
			perm[i] = len(x) - 1 - i
		}
	} else {
		if len(permAttr) != len(x) {
			return mismatchf("perm %v for rank %d", permAttr, len(x))
		}
		seen := make([]bool, len(x))
		for i, p := range permAttr {
			if p < 0 || p >= int64(len(x)) || seen[p] {
				return mismatchf("perm %v is not a permutation", permAttr)
			}
			seen[p] = true
			perm[i] = int(p)
		}
	}
	out := make([]int64, len(x))
	for i, p := range perm {
		out[i] = x[p]
	}
	if err := c.set(0, c.dtype(0), out); err != nil {
		return err
	}
	if v := c.val(0); v != nil && c.small(x) {
		c.setVal(0, v.gather(permuteIndex(x, perm)))
	}
	return nil
}

func (c *nodeCtx) concat() error {
	var shapes [][]int64
	for i := range c.node.Inputs {
		s, err := c.shape(i)
		if err != nil {
			return err
		}
		shapes = append(shapes, s)
	}
	if len(shapes) == 0 {
		return mismatchf("no inputs")
	}
	rank := len(shapes[0])
	axis, err := normAxis(c.attrInt("axis", 0), rank)
	if err != nil {
		return err
	}
	out := slices.Clone(shapes[0])
	out[axis] = 0
	for _, s := range shapes {
		if len(s) != rank {
			return mismatchf("inputs of rank %d and %d", rank, len(s))
		}
		for d := range s {
			if d != axis && s[d] != out[d] {
				return mismatchf("shapes %v differ outside axis %d", shapes, axis)
			}
		}
		out[axis] += s[axis]
		if out[axis] > MaxElements {
			return mismatchf("axis %d too large", axis)
		}
	}
	if err := c.set(0, c.dtype(0), out); err != nil {
		return err
	}
	if !c.small(out) {
		return nil
	}
	// Fold: interleave blocks of each input per outer index.
	vals := make([]*value, len(shapes))
	for i := range shapes {
		if vals[i] = c.val(i); vals[i] == nil {
			return nil
		}
		if vals[i].float != vals[0].float {
			return nil
		}
	}
	outer := product(out[:axis])
	inner := product(out[axis+1:])
	var idx []int
	var src []int
	for o := int64(0); o < outer; o++ {
		for i, s := range shapes {
			blk := s[axis] * inner
			for k := int64(0); k < blk; k++ {
				src = append(src, i)
				idx = append(idx, int(o*blk+k))
			}
		}
	}
	if vals[0].float {
		res := make([]float64, len(idx))
		for k := range res {
			res[k] = vals[src[k]].f[idx[k]]
		}
		c.setVal(0, floatValue(res))
	} else {
		res := make([]int64, len(idx))
		for k := range res {
			res[k] = vals[src[k]].i[idx[k]]
		}
		c.setVal(0, intValue(res))
	}
	return nil
}

func (c *nodeCtx) split() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	axis, err := normAxis(c.attrInt("axis", 0), len(x))
	if err != nil {
		return err
	}
	nOut := len(c.node.Outputs)
	var sizes []int64
	switch {
	case c.opset < 13:
		sizes, _ = c.attrInts("split")
	case c.has(1):
		if sizes, err = c.ints(1, "split sizes"); err != nil {
			return err
		}
	}
	if sizes == nil {
		n := int64(nOut)
		if a := c.attr("num_outputs"); a != nil {
			n = a.I
		}
		if n < 1 || n != int64(nOut) {
			return mismatchf("%d outputs, num_outputs %d", nOut, n)
		}
		d := x[axis]
		chunk := (d + n - 1) / n
		if d%n != 0 && c.opset < 18 {
			return mismatchf("dimension %d does not split evenly into %d", d, n)
		}
		for i := int64(0); i < n; i++ {
			sizes = append(sizes, max(0, min(chunk, d-i*chunk)))
		}
	}
	if len(sizes) != nOut {
		return mismatchf("%d sizes for %d outputs", len(sizes), nOut)
	}
	var sum int64
	for _, s := range sizes {
		if s < 0 {
			return mismatchf("negative size in %v", sizes)
		}
		sum += s
	}
	if sum != x[axis] {
		return mismatchf("sizes %v sum to %d, dimension %d is %d", sizes, sum, axis, x[axis])
	}
	for j, s := range sizes {
		out := slices.Clone(x)
		out[axis] = s
		if err := c.set(j, c.dtype(0), out); err != nil {
			return err
		}
	}
	return nil
}

func (c *nodeCtx) slice() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	var starts, ends, axes, steps []int64
	if c.opset < 10 {
		starts, _ = c.attrInts("starts")
		ends, _ = c.attrInts("ends")
		axes, _ = c.attrInts("axes")
	} else {
		if starts, err = c.ints(1, "Slice starts"); err != nil {
			return err
		}
		if ends, err = c.ints(2, "Slice ends"); err != nil {
			return err
		}
		if c.has(3) {
			if axes, err = c.ints(3, "Slice axes"); err != nil {
				return err
			}
		}
		if c.has(4) {
			if steps, err = c.ints(4, "Slice steps"); err != nil {
				return err
			}
		}
	}
	if len(starts) != len(ends) || (axes != nil && len(axes) != len(starts)) || (steps != nil && len(steps) != len(starts)) {
		return mismatchf("starts %v, ends %v, axes %v, steps %v differ in length", starts, ends, axes, steps)
	}
	if axes == nil {
		for i := range starts {
			axes = append(axes, int64(i))
		}
	}
	out := slices.Clone(x)
	first := make([]int64, len(x))
	step := make([]int64, len(x))
	for i := range step {
		step[i] = 1
	}
	seen := make([]bool, len(x))
	for i := range starts {
		ax, err := normAxis(axes[i], len(x))
		if err != nil {
			return err
		}
		if seen[ax] {
			return mismatchf("axis %d repeated", axes[i])
		}
		seen[ax] = true
		st := int64(1)
		if steps != nil {
			st = steps[i]
		}
		if st == 0 {
			return mismatchf("step 0 on axis %d", ax)
		}
		b, n := sliceRange(starts[i], ends[i], st, x[ax])
		first[ax], step[ax], out[ax] = b, st, n
	}
	if err := c.set(0, c.dtype(0), out); err != nil {
		return err
	}
	if v := c.val(0); v != nil && c.small(x) {
		c.setVal(0, v.gather(sliceIndex(x, out, first, step)))
	}
	return nil
}

// sliceRange clamps start and end as ONNX Slice does and returns the first
// index and the number of elements taken from a dimension of size dim.
func sliceRange(start, end, step, dim int64) (first, n int64) {
	clamp := func(v, lo, hi int64) int64 { return max(lo, min(v, hi)) }
	if start < 0 {
		start = max(start, -dim-1) + dim // avoid overflow on MinInt64
	}
	if end < 0 {
		end = max(end, -dim-1) + dim
	}
	if step > 0 {
		start, end = clamp(start, 0, dim), clamp(end, 0, dim)
		if end <= start {
			return start, 0
		}
		return start, (end-start-1)/step + 1
	}
	start, end = clamp(start, 0, dim-1), clamp(end, -1, dim-1)
	if start <= end {
		return start, 0
	}
	// -step may overflow for math.MinInt64; divide in uint64.
	return start, int64(uint64(start-end-1)/(uint64(-(step+1))+1)) + 1
}

func (c *nodeCtx) gather() error {
	data, err := c.shape(0)
	if err != nil {
		return err
	}
	idx, err := c.shape(1)
	if err != nil {
		return err
	}
	if len(data) == 0 {
		return mismatchf("scalar data")
	}
	axis, err := normAxis(c.attrInt("axis", 0), len(data))
	if err != nil {
		return err
	}
	out := slices.Concat(data[:axis], idx, data[axis+1:])
	if err := c.set(0, c.dtype(0), out); err != nil {
		return err
	}
	v, iv := c.val(0), c.val(1)
	if v == nil || iv == nil || !c.small(out) {
		return nil
	}
	outer, inner, dim := product(data[:axis]), product(data[axis+1:]), data[axis]
	var src []int
	for o := int64(0); o < outer; o++ {
		for k := 0; k < iv.len(); k++ {
			j, ok := iv.int64At(k)
			if !ok {
				return nil
			}
			if j < 0 {
				j += dim
			}
			if j < 0 || j >= dim {
				return mismatchf("index %d out of range for dimension %d", j, dim)
			}
			for in := int64(0); in < inner; in++ {
				src = append(src, int((o*dim+j)*inner+in))
			}
		}
	}
	c.setVal(0, v.gather(src))
	return nil
}

func (c *nodeCtx) gatherND() error {
	data, err := c.shape(0)
	if err != nil {
		return err
	}
	idx, err := c.shape(1)
	if err != nil {
		return err
	}
	b := int(c.attrInt("batch_dims", 0))
	if len(idx) < 1 || b < 0 || b >= len(idx) || b > len(data) {
		return mismatchf("indices %v, data %v, batch_dims %d", idx, data, b)
	}
	last := idx[len(idx)-1]
	if last < 1 || int64(b)+last > int64(len(data)) {
		return mismatchf("index depth %d too large for data %v", last, data)
	}
	out := slices.Concat(idx[:len(idx)-1], data[int64(b)+last:])
	return c.set(0, c.dtype(0), out)
}

func (c *nodeCtx) expand() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	target, err := c.ints(1, "Expand shape")
	if err != nil {
		return err
	}
	out, err := broadcast(x, target)
	if err != nil {
		return err
	}
	if err := c.set(0, c.dtype(0), out); err != nil {
		return err
	}
	if v := c.val(0); v != nil && c.small(out) {
		c.setVal(0, v.gather(broadcastIndex(out, x)))
	}
	return nil
}

func (c *nodeCtx) tile() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	reps, err := c.ints(1, "Tile repeats")
	if err != nil {
		return err
	}
	if len(reps) != len(x) {
		return mismatchf("%d repeats for rank %d", len(reps), len(x))
	}
	out := make([]int64, len(x))
	for i := range x {
		if reps[i] < 0 || (x[i] != 0 && reps[i] > MaxElements/x[i]) {
			return mismatchf("repeats %v invalid for %v", reps, x)
		}
		out[i] = x[i] * reps[i]
	}
	return c.set(0, c.dtype(0), out)
}

func (c *nodeCtx) pad() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	var pads []int64
	if c.opset < 11 {
		pads, _ = c.attrInts("pads")
	} else if pads, err = c.ints(1, "Pad pads"); err != nil {
		return err
	}
	axes := make([]int, len(x))
	for i := range axes {
		axes[i] = i
	}
	if c.opset >= 18 && c.has(3) {
		a, err := c.ints(3, "Pad axes")
		if err != nil {
			return err
		}
		if axes, err = normAxes(a, len(x)); err != nil {
			return err
		}
	}
	if len(pads) != 2*len(axes) {
		return mismatchf("%d pads for %d axes", len(pads), len(axes))
	}
	out := slices.Clone(x)
	for _, p := range pads {
		if p < -MaxElements || p > MaxElements {
			return mismatchf("pads %v out of range", pads)
		}
	}
	for i, ax := range axes {
		out[ax] += pads[i] + pads[len(axes)+i]
		if out[ax] < 0 {
			return mismatchf("pads %v make dimension %d negative", pads, ax)
		}
	}
	return c.set(0, c.dtype(0), out)
}

func (c *nodeCtx) resize() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	// Inputs: Upsample-9 and Resize-10 (X, scales); Resize-11+ (X, roi,
	// scales, sizes); Upsample-7 has a scales attribute.
	scalesAt, sizesAt := 1, -1
	if c.node.Op == "Resize" && c.opset >= 11 {
		scalesAt, sizesAt = 2, 3
	}
	axes := make([]int, len(x))
	for i := range axes {
		axes[i] = i
	}
	if a, ok := c.attrInts("axes"); ok {
		if axes, err = normAxes(a, len(x)); err != nil {
			return err
		}
	}
	out := slices.Clone(x)
	if sizesAt > 0 && c.has(sizesAt) && len(c.in(sizesAt).Shape) == 1 && c.in(sizesAt).Shape[0] > 0 {
		sizes, err := c.ints(sizesAt, "Resize sizes")
		if err != nil {
			return err
		}
		if len(sizes) != len(axes) {
			return mismatchf("%d sizes for %d axes", len(sizes), len(axes))
		}
		policy := c.attrString("keep_aspect_ratio_policy", "stretch")
		if policy == "stretch" {
			for i, ax := range axes {
				out[ax] = sizes[i]
			}
		} else {
			scale := math.Inf(1)
			if policy == "not_smaller" {
				scale = math.Inf(-1)
			}
			for i, ax := range axes {
				s := float64(sizes[i]) / float64(x[ax])
				if policy == "not_smaller" {
					scale = math.Max(scale, s)
				} else {
					scale = math.Min(scale, s)
				}
			}
			for _, ax := range axes {
				out[ax] = int64(math.Round(scale * float64(x[ax])))
			}
		}
	} else {
		var scales []float64
		switch {
		case c.node.Op == "Upsample" && c.opset < 9:
			a := c.attr("scales")
			if a == nil {
				return mismatchf("no scales")
			}
			for _, f := range a.Floats {
				scales = append(scales, float64(f))
			}
		case c.has(scalesAt):
			if scales, err = c.floats(scalesAt, "Resize scales"); err != nil {
				return err
			}
		default:
			return mismatchf("neither scales nor sizes given")
		}
		if len(scales) != len(axes) {
			return mismatchf("%d scales for %d axes", len(scales), len(axes))
		}
		for i, ax := range axes {
			f := math.Floor(float64(x[ax]) * scales[i])
			if !(f >= 0 && f <= float64(MaxElements)) {
				return mismatchf("scale %v gives dimension %v", scales[i], f)
			}
			out[ax] = int64(f)
		}
	}
	for _, d := range out {
		if d < 0 {
			return mismatchf("negative output dimension in %v", out)
		}
	}
	return c.set(0, c.dtype(0), out)
}

func (c *nodeCtx) reduce() error {
	op := c.node.Op
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	since := int64(18)
	if op == "ReduceSum" {
		since = 13
	}
	axes, present, err := c.axesInput(since, 1)
	if err != nil {
		return err
	}
	if present && len(axes) == 0 {
		present = false
	}
	if !present && c.attrInt("noop_with_empty_axes", 0) != 0 {
		if err := c.set(0, c.dtype(0), x); err != nil {
			return err
		}
		c.passValue()
		return nil
	}
	var ax []int
	if present {
		if ax, err = normAxes(axes, len(x)); err != nil {
			return err
		}
	} else {
		for i := range x {
			ax = append(ax, i)
		}
	}
	keep := c.attrInt("keepdims", 1) != 0
	var out []int64
	for i, d := range x {
		switch {
		case !slices.Contains(ax, i):
			out = append(out, d)
		case keep:
			out = append(out, 1)
		}
	}
	if err := c.set(0, c.dtype(0), out); err != nil {
		return err
	}
	if v := c.val(0); v != nil && c.small(x) {
		c.setVal(0, reduceFold(op, v, x, ax, out))
	}
	return nil
}

func (c *nodeCtx) argReduce() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	axis, err := normAxis(c.attrInt("axis", 0), len(x))
	if err != nil {
		return err
	}
	out := slices.Clone(x)
	if c.attrInt("keepdims", 1) != 0 {
		out[axis] = 1
	} else {
		out = slices.Delete(out, axis, axis+1)
	}
	return c.set(0, Int64, out)
}

func (c *nodeCtx) topK() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	var k int64
	if c.opset < 10 {
		k = c.attrInt("k", -1)
	} else {
		ks, err := c.ints(1, "TopK k")
		if err != nil {
			return err
		}
		if len(ks) != 1 {
			return mismatchf("k has %d elements", len(ks))
		}
		k = ks[0]
	}
	axis, err := normAxis(c.attrInt("axis", -1), len(x))
	if err != nil {
		return err
	}
	if k < 0 || k > x[axis] {
		return mismatchf("k %d out of range for dimension %d", k, x[axis])
	}
	out := slices.Clone(x)
	out[axis] = k
	if err := c.set(0, c.dtype(0), out); err != nil {
		return err
	}
	return c.set(1, Int64, out)
}

func (c *nodeCtx) constant() error {
	for _, a := range c.n.Attributes {
		switch a.Name {
		case "value":
			if a.T == nil {
				return mismatchf("value attribute without a tensor")
			}
			dt, ok := dtypeFromONNX(a.T.DataType)
			if !ok {
				return unknownf("element type %v", a.T.DataType)
			}
			if err := c.set(0, dt, a.T.Dims); err != nil {
				return err
			}
			c.setVal(0, c.imp.tensorValue(a.T, dt))
			return nil
		case "value_float":
			if err := c.set(0, Float32, nil); err != nil {
				return err
			}
			c.setVal(0, floatValue([]float64{float64(a.F)}))
			return nil
		case "value_floats":
			if err := c.set(0, Float32, []int64{int64(len(a.Floats))}); err != nil {
				return err
			}
			f := make([]float64, len(a.Floats))
			for i, x := range a.Floats {
				f[i] = float64(x)
			}
			c.setVal(0, floatValue(f))
			return nil
		case "value_int":
			if err := c.set(0, Int64, nil); err != nil {
				return err
			}
			c.setVal(0, intValue([]int64{a.I}))
			return nil
		case "value_ints":
			if err := c.set(0, Int64, []int64{int64(len(a.Ints))}); err != nil {
				return err
			}
			c.setVal(0, intValue(slices.Clone(a.Ints)))
			return nil
		case "value_string", "value_strings", "sparse_value":
			return unknownf("%s has no fixed byte size", a.Name)
		}
	}
	return mismatchf("no value attribute")
}

func (c *nodeCtx) constantOfShape() error {
	shape, err := c.ints(0, "ConstantOfShape shape")
	if err != nil {
		return err
	}
	dt := Float32
	fill := floatValue([]float64{0})
	if a := c.attr("value"); a != nil && a.T != nil {
		var ok bool
		if dt, ok = dtypeFromONNX(a.T.DataType); !ok {
			return unknownf("element type %v", a.T.DataType)
		}
		if v := c.imp.tensorValue(a.T, dt); v != nil && v.len() == 1 {
			fill = v
		} else {
			fill = nil
		}
	}
	if err := c.set(0, dt, shape); err != nil {
		return err
	}
	if fill != nil && c.small(shape) {
		c.setVal(0, fill.gather(make([]int, product(shape))))
	}
	return nil
}

func (c *nodeCtx) shapeOp() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	r := int64(len(x))
	start, end := int64(0), r
	if c.opset >= 15 {
		start, end = c.attrInt("start", 0), c.attrInt("end", r)
		if start < 0 {
			start += r
		}
		if end < 0 {
			end += r
		}
		start, end = max(0, min(start, r)), max(0, min(end, r))
		end = max(start, end)
	}
	dims := x[start:end]
	if err := c.set(0, Int64, []int64{int64(len(dims))}); err != nil {
		return err
	}
	c.setVal(0, valueFromShape(dims))
	return nil
}

func (c *nodeCtx) rangeOp() error {
	var vals [3]*value
	for i, what := range []string{"start", "limit", "delta"} {
		if vals[i] = c.val(i); vals[i] == nil || vals[i].len() != 1 {
			return unknownf("Range %s is not a statically known scalar", what)
		}
	}
	dt := c.dtype(0)
	var n int64
	if vals[0].float || vals[1].float || vals[2].float {
		s, l, d := vals[0].float64At(0), vals[1].float64At(0), vals[2].float64At(0)
		if d == 0 || math.IsNaN(s) || math.IsNaN(l) || math.IsNaN(d) {
			return mismatchf("start %v, limit %v, delta %v", s, l, d)
		}
		f := math.Ceil((l - s) / d)
		if f > float64(MaxElements) {
			return mismatchf("%v elements", f)
		}
		n = max(0, int64(f))
		if err := c.set(0, dt, []int64{n}); err != nil {
			return err
		}
		if c.small([]int64{n}) {
			out := make([]float64, n)
			for i := range out {
				out[i] = s + float64(i)*d
			}
			c.setVal(0, floatValue(out))
		}
		return nil
	}
	s, l, d := vals[0].i[0], vals[1].i[0], vals[2].i[0]
	if d == 0 {
		return mismatchf("delta 0")
	}
	// ceil((l-s)/d) computed without overflow in float64; exact for the
	// sizes accepted below.
	f := math.Ceil((float64(l) - float64(s)) / float64(d))
	if f > float64(MaxElements) {
		return mismatchf("%v elements", f)
	}
	n = max(0, int64(f))
	if err := c.set(0, dt, []int64{n}); err != nil {
		return err
	}
	if c.small([]int64{n}) {
		out := make([]int64, n)
		for i := range out {
			out[i] = s + int64(i)*d
		}
		c.setVal(0, intValue(out))
	}
	return nil
}

func (c *nodeCtx) oneHot() error {
	idx, err := c.shape(0)
	if err != nil {
		return err
	}
	depth, err := c.ints(1, "OneHot depth")
	if err != nil {
		return err
	}
	if len(depth) != 1 || depth[0] < 0 {
		return mismatchf("depth %v", depth)
	}
	rank := len(idx) + 1
	axis, err := normAxis(c.attrInt("axis", -1), rank)
	if err != nil {
		return err
	}
	out := slices.Concat(idx[:axis], []int64{depth[0]}, idx[axis:])
	return c.set(0, c.dtype(2), out)
}

func (c *nodeCtx) depthSpace() error {
	x, err := c.shape(0)
	if err != nil {
		return err
	}
	b := c.attrInt("blocksize", 0)
	if len(x) != 4 || b < 1 || b > 1<<16 || x[2] > MaxElements>>32 || x[3] > MaxElements>>32 {
		return mismatchf("input %v, blocksize %d", x, b)
	}
	var out []int64
	if c.node.Op == "DepthToSpace" {
		if x[1]%(b*b) != 0 {
			return mismatchf("%d channels not divisible by %d", x[1], b*b)
		}
		out = []int64{x[0], x[1] / (b * b), x[2] * b, x[3] * b}
	} else {
		if x[2]%b != 0 || x[3]%b != 0 {
			return mismatchf("%v not divisible by block %d", x, b)
		}
		out = []int64{x[0], x[1] * b * b, x[2] / b, x[3] / b}
	}
	return c.set(0, c.dtype(0), out)
}
