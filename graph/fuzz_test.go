package graph

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/memwall/memwall/format/onnx"
)

// FuzzImportONNX decodes arbitrary bytes and imports whatever decodes, with
// and without AllowUnknown. Import must never panic, every error must wrap one
// of the package's sentinels, and every tensor it calls known must have a
// byte size consistent with its shape.
func FuzzImportONNX(f *testing.F) {
	for _, name := range []string{"squeezenet1_1", "deeplabv3_mobilenet_v3"} {
		if data, err := os.ReadFile(filepath.Join(modelDir, name+".onnx")); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := onnx.Decode(data)
		if err != nil {
			return
		}
		for _, opts := range []Options{{}, {AllowUnknown: true, MaxFoldElements: 64}} {
			g, err := ImportONNX(m, nil, opts)
			if err != nil {
				if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnknownShape) && !errors.Is(err, ErrShapeMismatch) {
					t.Fatalf("error without a sentinel: %v", err)
				}
				continue
			}
			for _, tn := range g.Tensors {
				if !tn.Known {
					if !opts.AllowUnknown {
						t.Fatalf("tensor %q unknown without AllowUnknown", tn.Name)
					}
					continue
				}
				n, err := NumElements(tn.Shape)
				if err != nil {
					t.Fatalf("tensor %q: known shape %v: %v", tn.Name, tn.Shape, err)
				}
				if b, _ := tn.DType.ByteSize(uint64(n)); b != tn.Bytes {
					t.Fatalf("tensor %q: %d bytes for %v %v", tn.Name, tn.Bytes, tn.DType, tn.Shape)
				}
			}
		}
	})
}

// fuzzOps are the operators FuzzInferOps draws from.
var fuzzOps = []string{"Add", "Mul", "Div", "Mod", "Pow", "Equal", "Where", "Conv", "ConvTranspose", "MaxPool",
	"AveragePool", "GlobalAveragePool", "Gemm", "MatMul", "BatchNormalization", "LayerNormalization", "Reshape",
	"Flatten", "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split", "Slice", "Gather", "GatherND", "Expand",
	"Tile", "Pad", "Resize", "ReduceSum", "ReduceMean", "ReduceProd", "ArgMax", "TopK", "Cast", "Constant",
	"ConstantOfShape", "Shape", "Size", "Range", "OneHot", "DepthToSpace", "SpaceToDepth", "NonZero", "Relu",
	"Neg", "Not", "Softmax", "Dropout", "Identity", "Sum", "Max"}

// FuzzInferOps builds small random graphs from the fuzz input (operators,
// wiring, integer attributes and constant tensors all drawn from its bytes)
// and imports them: shape inference and constant folding must never panic
// on hostile attribute or value combinations, and must fail only with the
// package's sentinels.
func FuzzInferOps(f *testing.F) {
	f.Add([]byte{2, 1, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{4, 1, 3, 8, 8, 20, 0, 1, 18, 1, 2, 255, 254, 7, 33, 9})
	f.Add([]byte("\x03\x02\x05\x07reshape-slice-gather-concat"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := byteReader{data: data}
		rank := int(r.next() % 5)
		var dims []int64
		for i := 0; i < rank; i++ {
			dims = append(dims, int64(r.next()%9))
		}
		inputs := []onnx.ValueInfo{vi("x", onnx.Float, dims...)}
		names := []string{"x"}
		var inits []onnx.Tensor
		for i := 0; i < 3; i++ {
			n := int(r.next() % 5)
			vals := make([]int64, n)
			for j := range vals {
				vals[j] = r.small()
			}
			name := "c" + string(rune('0'+i))
			shape := []int64{int64(n)}
			if n == 1 && r.next()%2 == 0 {
				shape = nil
			}
			inits = append(inits, i64Tensor(name, shape, vals...))
			names = append(names, name)
		}
		var nodes []onnx.Node
		for k := 0; k < 8 && r.more(); k++ {
			op := fuzzOps[int(r.next())%len(fuzzOps)]
			nIn := int(r.next() % 5)
			var in []string
			for j := 0; j < nIn; j++ {
				if r.next()%7 == 0 {
					in = append(in, "")
				} else {
					in = append(in, names[int(r.next())%len(names)])
				}
			}
			var attrs []onnx.Attribute
			for _, a := range []string{"axis", "group", "transA", "keepdims", "allowzero", "blocksize", "to", "ceil_mode", "batch_dims"} {
				if r.next()%3 == 0 {
					attrs = append(attrs, intAttr(a, r.small()))
				}
			}
			for _, a := range []string{"kernel_shape", "strides", "pads", "perm", "axes", "dilations", "value_ints", "split"} {
				if r.next()%3 == 0 {
					n := int(r.next() % 5)
					v := make([]int64, n)
					for j := range v {
						v[j] = r.small()
					}
					attrs = append(attrs, ints(a, v...))
				}
			}
			out := "t" + string(rune('a'+k))
			outs := []string{out}
			if r.next()%4 == 0 {
				outs = append(outs, out+"2")
			}
			nodes = append(nodes, onnx.Node{Name: out, OpType: op, Inputs: in, Outputs: outs, Attributes: attrs})
			names = append(names, outs...)
		}
		m := mkModel(int64(r.next()%18)+1, inputs, inits, nodes)
		for _, opts := range []Options{{}, {AllowUnknown: true, MaxFoldElements: 16}} {
			g, err := ImportONNX(m, nil, opts)
			if err != nil {
				if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnknownShape) && !errors.Is(err, ErrShapeMismatch) {
					t.Fatalf("error without a sentinel: %v", err)
				}
				continue
			}
			for _, tn := range g.Tensors {
				if tn.Known {
					if _, err := NumElements(tn.Shape); err != nil {
						t.Fatalf("tensor %q: known shape %v: %v", tn.Name, tn.Shape, err)
					}
				}
			}
		}
	})
}

// byteReader hands out fuzz bytes, then zeros.
type byteReader struct {
	data []byte
	pos  int
}

func (r *byteReader) more() bool { return r.pos < len(r.data) }

func (r *byteReader) next() byte {
	if r.pos >= len(r.data) {
		return 0
	}
	r.pos++
	return r.data[r.pos-1]
}

// small returns values around zero with occasional extremes.
func (r *byteReader) small() int64 {
	b := r.next()
	switch b {
	case 255:
		return -1 << 63
	case 254:
		return 1<<63 - 1
	case 253:
		return 1 << 40
	}
	return int64(int8(b)) % 12
}
