package graph

import (
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/memwall/memwall/format/onnx"
)

// Helpers building ONNX models in memory.

func vi(name string, dt onnx.DataType, dims ...int64) onnx.ValueInfo {
	t := onnx.Type{Kind: onnx.TypeTensor, ElemType: dt, HasShape: true}
	for _, d := range dims {
		if d < 0 {
			t.Shape = append(t.Shape, onnx.Dim{Param: "n"})
		} else {
			t.Shape = append(t.Shape, onnx.Dim{Value: d, HasValue: true})
		}
	}
	return onnx.ValueInfo{Name: name, Type: t}
}

func i64Tensor(name string, dims []int64, vals ...int64) onnx.Tensor {
	raw := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(v))
	}
	return onnx.Tensor{Name: name, Dims: dims, DataType: onnx.Int64, RawData: raw}
}

func f32Tensor(name string, dims []int64, vals ...float32) onnx.Tensor {
	return onnx.Tensor{Name: name, Dims: dims, DataType: onnx.Float, FloatData: vals}
}

func weight(name string, dims ...int64) onnx.Tensor {
	return onnx.Tensor{Name: name, Dims: dims, DataType: onnx.Float, DataLocation: onnx.LocationExternal,
		ExternalData: []onnx.StringPair{{Key: "location", Value: "w.bin"}}}
}

func node(op string, in, out []string, attrs ...onnx.Attribute) onnx.Node {
	return onnx.Node{Name: op + "_" + strings.Join(out, "_"), OpType: op, Inputs: in, Outputs: out, Attributes: attrs}
}

func ints(name string, v ...int64) onnx.Attribute {
	return onnx.Attribute{Name: name, Type: onnx.AttrInts, Ints: v}
}

func intAttr(name string, v int64) onnx.Attribute {
	return onnx.Attribute{Name: name, Type: onnx.AttrInt, I: v}
}

func strAttr(name, v string) onnx.Attribute {
	return onnx.Attribute{Name: name, Type: onnx.AttrString, S: []byte(v)}
}

func tensorAttr(name string, t onnx.Tensor) onnx.Attribute {
	return onnx.Attribute{Name: name, Type: onnx.AttrTensor, T: &t}
}

func mkModel(opset int64, inputs []onnx.ValueInfo, inits []onnx.Tensor, nodes []onnx.Node, outputs ...string) *onnx.Model {
	g := &onnx.Graph{Name: "t", Inputs: inputs, Initializers: inits, Nodes: nodes}
	for _, o := range outputs {
		g.Outputs = append(g.Outputs, onnx.ValueInfo{Name: o})
	}
	return &onnx.Model{IRVersion: 8, OpsetImports: []onnx.OpsetID{{Version: opset}}, Graph: g}
}

func TestInferOps(t *testing.T) {
	x4 := []onnx.ValueInfo{vi("x", onnx.Float, 1, 3, 224, 224)}
	cases := []struct {
		name   string
		opset  int64
		inputs []onnx.ValueInfo
		inits  []onnx.Tensor
		nodes  []onnx.Node
		check  string  // tensor to check
		shape  []int64 // its expected shape
		dtype  DType   // 0: Float32
		value  []int64 // expected folded value, if any
	}{
		{name: "conv stride pad", inputs: x4, inits: []onnx.Tensor{weight("w", 64, 3, 7, 7)},
			nodes: []onnx.Node{node("Conv", []string{"x", "w"}, []string{"y"}, ints("strides", 2, 2), ints("pads", 3, 3, 3, 3))},
			check: "y", shape: []int64{1, 64, 112, 112}},
		{name: "conv depthwise dilated", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 32, 65, 65)},
			inits: []onnx.Tensor{weight("w", 32, 1, 3, 3)},
			nodes: []onnx.Node{node("Conv", []string{"x", "w"}, []string{"y"}, intAttr("group", 32),
				ints("dilations", 2, 2), ints("pads", 2, 2, 2, 2))},
			check: "y", shape: []int64{1, 32, 65, 65}},
		{name: "conv same upper", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 3, 15, 15)},
			inits: []onnx.Tensor{weight("w", 8, 3, 3, 3)},
			nodes: []onnx.Node{node("Conv", []string{"x", "w"}, []string{"y"}, strAttr("auto_pad", "SAME_UPPER"), ints("strides", 2, 2))},
			check: "y", shape: []int64{1, 8, 8, 8}},
		{name: "conv valid 1d", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 4, 10)},
			inits: []onnx.Tensor{weight("w", 6, 4, 3)},
			nodes: []onnx.Node{node("Conv", []string{"x", "w"}, []string{"y"}, strAttr("auto_pad", "VALID"))},
			check: "y", shape: []int64{2, 6, 8}},
		{name: "conv transpose", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 16, 7, 7)},
			inits: []onnx.Tensor{weight("w", 16, 8, 3, 3)},
			nodes: []onnx.Node{node("ConvTranspose", []string{"x", "w"}, []string{"y"}, ints("strides", 2, 2),
				ints("pads", 1, 1, 1, 1), ints("output_padding", 1, 1))},
			check: "y", shape: []int64{1, 8, 14, 14}},
		{name: "conv transpose output_shape", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 16, 7, 7)},
			inits: []onnx.Tensor{weight("w", 16, 4, 3, 3)},
			nodes: []onnx.Node{node("ConvTranspose", []string{"x", "w"}, []string{"y"}, intAttr("group", 2),
				ints("strides", 2, 2), ints("output_shape", 15, 15))},
			check: "y", shape: []int64{1, 8, 15, 15}},
		{name: "maxpool", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 64, 112, 112)},
			nodes: []onnx.Node{node("MaxPool", []string{"x"}, []string{"y"}, ints("kernel_shape", 3, 3),
				ints("strides", 2, 2), ints("pads", 1, 1, 1, 1))},
			check: "y", shape: []int64{1, 64, 56, 56}},
		{name: "maxpool ceil", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 64, 111, 111)},
			nodes: []onnx.Node{node("MaxPool", []string{"x"}, []string{"y"}, ints("kernel_shape", 3, 3),
				ints("strides", 2, 2), intAttr("ceil_mode", 1))},
			check: "y", shape: []int64{1, 64, 55, 55}},
		{name: "maxpool ceil last window in padding", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 1, 3)},
			nodes: []onnx.Node{node("MaxPool", []string{"x"}, []string{"y", "idx"}, ints("kernel_shape", 1),
				ints("strides", 2), ints("pads", 1, 1), intAttr("ceil_mode", 1))},
			check: "idx", shape: []int64{1, 1, 2}, dtype: Int64},
		{name: "avgpool", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 8, 35, 35)},
			nodes: []onnx.Node{node("AveragePool", []string{"x"}, []string{"y"}, ints("kernel_shape", 3, 3),
				ints("pads", 1, 1, 1, 1), ints("strides", 1, 1))},
			check: "y", shape: []int64{1, 8, 35, 35}},
		{name: "global pool", inputs: x4,
			nodes: []onnx.Node{node("GlobalAveragePool", []string{"x"}, []string{"y"})},
			check: "y", shape: []int64{1, 3, 1, 1}},
		{name: "gemm transB", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 2048)},
			inits: []onnx.Tensor{weight("w", 1000, 2048), weight("b", 1000)},
			nodes: []onnx.Node{node("Gemm", []string{"x", "w", "b"}, []string{"y"}, intAttr("transB", 1))},
			check: "y", shape: []int64{1, 1000}},
		{name: "matmul batch broadcast", inputs: []onnx.ValueInfo{vi("a", onnx.Float, 2, 1, 5, 3), vi("b", onnx.Float, 4, 3, 7)},
			nodes: []onnx.Node{node("MatMul", []string{"a", "b"}, []string{"y"})},
			check: "y", shape: []int64{2, 4, 5, 7}},
		{name: "matmul vector", inputs: []onnx.ValueInfo{vi("a", onnx.Float, 3), vi("b", onnx.Float, 2, 3, 7)},
			nodes: []onnx.Node{node("MatMul", []string{"a", "b"}, []string{"y"})},
			check: "y", shape: []int64{2, 7}},
		{name: "add broadcast", inputs: []onnx.ValueInfo{vi("a", onnx.Float, 8, 1, 6, 1), vi("b", onnx.Float, 7, 1, 5)},
			nodes: []onnx.Node{node("Add", []string{"a", "b"}, []string{"y"})},
			check: "y", shape: []int64{8, 7, 6, 5}},
		{name: "sum variadic", inputs: []onnx.ValueInfo{vi("a", onnx.Float, 3, 1), vi("b", onnx.Float, 1, 4), vi("c", onnx.Float, 4)},
			nodes: []onnx.Node{node("Sum", []string{"a", "b", "c"}, []string{"y"})},
			check: "y", shape: []int64{3, 4}},
		{name: "equal is bool", inputs: []onnx.ValueInfo{vi("a", onnx.Float, 3), vi("b", onnx.Float, 1)},
			nodes: []onnx.Node{node("Equal", []string{"a", "b"}, []string{"y"})},
			check: "y", shape: []int64{3}, dtype: Bool},
		{name: "clip with omitted min", inputs: x4, inits: []onnx.Tensor{f32Tensor("hi", nil, 6)},
			nodes: []onnx.Node{node("Clip", []string{"x", "", "hi"}, []string{"y"})},
			check: "y", shape: []int64{1, 3, 224, 224}},
		{name: "batchnorm", inputs: x4,
			inits: []onnx.Tensor{weight("s", 3), weight("b", 3), weight("m", 3), weight("v", 3)},
			nodes: []onnx.Node{node("BatchNormalization", []string{"x", "s", "b", "m", "v"}, []string{"y"})},
			check: "y", shape: []int64{1, 3, 224, 224}},
		{name: "layernorm stats", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 5, 8)},
			inits: []onnx.Tensor{weight("s", 8)},
			nodes: []onnx.Node{node("LayerNormalization", []string{"x", "s"}, []string{"y", "mean", "inv"}, intAttr("axis", -1))},
			check: "inv", shape: []int64{2, 5, 1}},
		{name: "softmax", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 12, 128, 128)},
			nodes: []onnx.Node{node("Softmax", []string{"x"}, []string{"y"}, intAttr("axis", -1))},
			check: "y", shape: []int64{1, 12, 128, 128}},
		{name: "reshape zero and minus one", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 3, 4)},
			inits: []onnx.Tensor{i64Tensor("s", []int64{3}, 0, -1, 2)},
			nodes: []onnx.Node{node("Reshape", []string{"x", "s"}, []string{"y"})},
			check: "y", shape: []int64{2, 6, 2}},
		{name: "reshape allowzero", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 0, 3)},
			inits: []onnx.Tensor{i64Tensor("s", []int64{2}, 3, 0)},
			nodes: []onnx.Node{node("Reshape", []string{"x", "s"}, []string{"y"}, intAttr("allowzero", 1))},
			check: "y", shape: []int64{3, 0}},
		{name: "reshape attribute opset 4", opset: 4, inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 3, 4)},
			nodes: []onnx.Node{node("Reshape", []string{"x"}, []string{"y"}, ints("shape", -1, 4))},
			check: "y", shape: []int64{6, 4}},
		{name: "flatten", inputs: x4,
			nodes: []onnx.Node{node("Flatten", []string{"x"}, []string{"y"}, intAttr("axis", -2))},
			check: "y", shape: []int64{3, 224 * 224}},
		{name: "flatten axis 0", inputs: x4,
			nodes: []onnx.Node{node("Flatten", []string{"x"}, []string{"y"}, intAttr("axis", 0))},
			check: "y", shape: []int64{1, 3 * 224 * 224}},
		{name: "squeeze attribute opset 11", opset: 11, inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 3, 1, 5)},
			nodes: []onnx.Node{node("Squeeze", []string{"x"}, []string{"y"}, ints("axes", -2))},
			check: "y", shape: []int64{1, 3, 5}},
		{name: "squeeze input opset 13", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 3, 1, 5)},
			inits: []onnx.Tensor{i64Tensor("a", []int64{2}, 0, 2)},
			nodes: []onnx.Node{node("Squeeze", []string{"x", "a"}, []string{"y"})},
			check: "y", shape: []int64{3, 5}},
		{name: "squeeze all", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 3, 1, 5)},
			nodes: []onnx.Node{node("Squeeze", []string{"x"}, []string{"y"})},
			check: "y", shape: []int64{3, 5}},
		{name: "unsqueeze attribute opset 11", opset: 11, inputs: []onnx.ValueInfo{vi("x", onnx.Float, 3, 5)},
			nodes: []onnx.Node{node("Unsqueeze", []string{"x"}, []string{"y"}, ints("axes", 0, -1))},
			check: "y", shape: []int64{1, 3, 5, 1}},
		{name: "unsqueeze input opset 13", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 3, 5)},
			inits: []onnx.Tensor{i64Tensor("a", []int64{2}, 1, 3)},
			nodes: []onnx.Node{node("Unsqueeze", []string{"x", "a"}, []string{"y"})},
			check: "y", shape: []int64{3, 1, 5, 1}},
		{name: "transpose default", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 3, 4)},
			nodes: []onnx.Node{node("Transpose", []string{"x"}, []string{"y"})},
			check: "y", shape: []int64{4, 3, 2}},
		{name: "transpose perm", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 128, 12, 64)},
			nodes: []onnx.Node{node("Transpose", []string{"x"}, []string{"y"}, ints("perm", 0, 2, 3, 1))},
			check: "y", shape: []int64{1, 12, 64, 128}},
		{name: "concat negative axis", inputs: []onnx.ValueInfo{vi("a", onnx.Float, 1, 64, 56, 56), vi("b", onnx.Float, 1, 32, 56, 56)},
			nodes: []onnx.Node{node("Concat", []string{"a", "b"}, []string{"y"}, intAttr("axis", -3))},
			check: "y", shape: []int64{1, 96, 56, 56}},
		{name: "split equal", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 12)},
			nodes: []onnx.Node{node("Split", []string{"x"}, []string{"a", "b", "c"}, intAttr("axis", 1))},
			check: "c", shape: []int64{2, 4}},
		{name: "split sizes input", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 12)},
			inits: []onnx.Tensor{i64Tensor("s", []int64{2}, 5, 7)},
			nodes: []onnx.Node{node("Split", []string{"x", "s"}, []string{"a", "b"}, intAttr("axis", -1))},
			check: "b", shape: []int64{2, 7}},
		{name: "split attribute opset 11", opset: 11, inputs: []onnx.ValueInfo{vi("x", onnx.Float, 10)},
			nodes: []onnx.Node{node("Split", []string{"x"}, []string{"a", "b"}, ints("split", 3, 7))},
			check: "a", shape: []int64{3}},
		{name: "split uneven opset 18", opset: 18, inputs: []onnx.ValueInfo{vi("x", onnx.Float, 10)},
			nodes: []onnx.Node{node("Split", []string{"x"}, []string{"a", "b", "c"}, intAttr("num_outputs", 3))},
			check: "c", shape: []int64{2}},
		{name: "slice clamped negative", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 20, 10, 5)},
			inits: []onnx.Tensor{i64Tensor("st", []int64{2}, 2, -3), i64Tensor("en", []int64{2}, 1000, -1),
				i64Tensor("ax", []int64{2}, 0, -2), i64Tensor("sp", []int64{2}, 3, 1)},
			nodes: []onnx.Node{node("Slice", []string{"x", "st", "en", "ax", "sp"}, []string{"y"})},
			check: "y", shape: []int64{6, 2, 5}},
		{name: "slice reverse", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 7)},
			inits: []onnx.Tensor{i64Tensor("st", []int64{1}, -1), i64Tensor("en", []int64{1}, math.MinInt64),
				i64Tensor("sp", []int64{1}, -2)},
			nodes: []onnx.Node{node("Slice", []string{"x", "st", "en", "", "sp"}, []string{"y"})},
			check: "y", shape: []int64{4}},
		{name: "slice attributes opset 9", opset: 9, inputs: []onnx.ValueInfo{vi("x", onnx.Float, 4, 6)},
			nodes: []onnx.Node{node("Slice", []string{"x"}, []string{"y"}, ints("starts", 1), ints("ends", 100), ints("axes", 1))},
			check: "y", shape: []int64{4, 5}},
		{name: "gather scalar index", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 128, 768)},
			inits: []onnx.Tensor{i64Tensor("i", nil, 0)},
			nodes: []onnx.Node{node("Gather", []string{"x", "i"}, []string{"y"}, intAttr("axis", 1))},
			check: "y", shape: []int64{1, 768}},
		{name: "gather embedding", inputs: []onnx.ValueInfo{vi("ids", onnx.Int64, 1, 128)},
			inits: []onnx.Tensor{weight("emb", 30522, 768)},
			nodes: []onnx.Node{node("Gather", []string{"emb", "ids"}, []string{"y"})},
			check: "y", shape: []int64{1, 128, 768}},
		{name: "expand", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 3, 1)},
			inits: []onnx.Tensor{i64Tensor("s", []int64{3}, 2, 1, 6)},
			nodes: []onnx.Node{node("Expand", []string{"x", "s"}, []string{"y"})},
			check: "y", shape: []int64{2, 3, 6}},
		{name: "where", inputs: []onnx.ValueInfo{vi("c", onnx.Bool, 1, 1, 4, 4), vi("a", onnx.Float, 1), vi("b", onnx.Float, 2, 1, 1, 4)},
			nodes: []onnx.Node{node("Where", []string{"c", "a", "b"}, []string{"y"})},
			check: "y", shape: []int64{2, 1, 4, 4}},
		{name: "resize scales", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 3, 15, 20)},
			inits: []onnx.Tensor{f32Tensor("sc", []int64{4}, 1, 1, 2, 1.5)},
			nodes: []onnx.Node{node("Resize", []string{"x", "", "sc"}, []string{"y"})},
			check: "y", shape: []int64{1, 3, 30, 30}},
		{name: "resize sizes", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 3, 15, 20)},
			inits: []onnx.Tensor{i64Tensor("sz", []int64{4}, 1, 3, 64, 48)},
			nodes: []onnx.Node{node("Resize", []string{"x", "", "", "sz"}, []string{"y"})},
			check: "y", shape: []int64{1, 3, 64, 48}},
		{name: "upsample", opset: 9, inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 3, 5, 5)},
			inits: []onnx.Tensor{f32Tensor("sc", []int64{4}, 1, 1, 2, 2)},
			nodes: []onnx.Node{node("Upsample", []string{"x", "sc"}, []string{"y"})},
			check: "y", shape: []int64{1, 3, 10, 10}},
		{name: "reducemean attribute", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 3, 4)},
			nodes: []onnx.Node{node("ReduceMean", []string{"x"}, []string{"y"}, ints("axes", -1, 0), intAttr("keepdims", 0))},
			check: "y", shape: []int64{3}},
		{name: "reducesum axes input", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 3, 4)},
			inits: []onnx.Tensor{i64Tensor("a", []int64{1}, 1)},
			nodes: []onnx.Node{node("ReduceSum", []string{"x", "a"}, []string{"y"})},
			check: "y", shape: []int64{2, 1, 4}},
		{name: "reducemax all", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 3)},
			nodes: []onnx.Node{node("ReduceMax", []string{"x"}, []string{"y"})},
			check: "y", shape: []int64{1, 1}},
		{name: "argmax", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 3, 4)},
			nodes: []onnx.Node{node("ArgMax", []string{"x"}, []string{"y"}, intAttr("axis", 1), intAttr("keepdims", 0))},
			check: "y", shape: []int64{2, 4}, dtype: Int64},
		{name: "topk", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 50)},
			inits: []onnx.Tensor{i64Tensor("k", []int64{1}, 5)},
			nodes: []onnx.Node{node("TopK", []string{"x", "k"}, []string{"v", "i"})},
			check: "i", shape: []int64{2, 5}, dtype: Int64},
		{name: "pad", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 3, 10, 10)},
			inits: []onnx.Tensor{i64Tensor("p", []int64{8}, 0, 0, 1, 2, 0, 0, 3, 4)},
			nodes: []onnx.Node{node("Pad", []string{"x", "p"}, []string{"y"})},
			check: "y", shape: []int64{1, 3, 14, 16}},
		{name: "tile", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 3)},
			inits: []onnx.Tensor{i64Tensor("r", []int64{2}, 3, 1)},
			nodes: []onnx.Node{node("Tile", []string{"x", "r"}, []string{"y"})},
			check: "y", shape: []int64{6, 3}},
		{name: "cast", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 3)},
			nodes: []onnx.Node{node("Cast", []string{"x"}, []string{"y"}, intAttr("to", int64(onnx.Float16)))},
			check: "y", shape: []int64{2, 3}, dtype: Float16},
		{name: "dropout mask", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 2, 3)},
			nodes: []onnx.Node{node("Dropout", []string{"x"}, []string{"y", "m"})},
			check: "m", shape: []int64{2, 3}, dtype: Bool},
		{name: "constant value_ints",
			nodes: []onnx.Node{node("Constant", nil, []string{"y"}, ints("value_ints", 4, 5))},
			check: "y", shape: []int64{2}, dtype: Int64, value: []int64{4, 5}},
		{name: "constant of shape",
			nodes: []onnx.Node{node("Constant", nil, []string{"s"}, tensorAttr("value", i64Tensor("", []int64{2}, 2, 3))),
				node("ConstantOfShape", []string{"s"}, []string{"y"}, tensorAttr("value", i64Tensor("", []int64{1}, 7)))},
			check: "y", shape: []int64{2, 3}, dtype: Int64, value: []int64{7, 7, 7, 7, 7, 7}},
		{name: "shape start end", inputs: x4,
			nodes: []onnx.Node{node("Shape", []string{"x"}, []string{"y"}, intAttr("start", 1), intAttr("end", -1))},
			check: "y", shape: []int64{2}, dtype: Int64, value: []int64{3, 224}},
		{name: "range", inits: []onnx.Tensor{i64Tensor("a", nil, 10), i64Tensor("b", nil, 1), i64Tensor("d", nil, -3)},
			nodes: []onnx.Node{node("Range", []string{"a", "b", "d"}, []string{"y"})},
			check: "y", shape: []int64{3}, dtype: Int64, value: []int64{10, 7, 4}},
		{name: "range float", inits: []onnx.Tensor{f32Tensor("a", nil, 0), f32Tensor("b", nil, 1), f32Tensor("d", nil, 0.25)},
			nodes: []onnx.Node{node("Range", []string{"a", "b", "d"}, []string{"y"})},
			check: "y", shape: []int64{4}},
		{name: "size", inputs: x4, nodes: []onnx.Node{node("Size", []string{"x"}, []string{"y"})},
			check: "y", shape: []int64{}, dtype: Int64, value: []int64{3 * 224 * 224}},
		{name: "onehot", inputs: []onnx.ValueInfo{vi("i", onnx.Int64, 2, 3)},
			inits: []onnx.Tensor{i64Tensor("d", nil, 10), f32Tensor("v", []int64{2}, 0, 1)},
			nodes: []onnx.Node{node("OneHot", []string{"i", "d", "v"}, []string{"y"}, intAttr("axis", 1))},
			check: "y", shape: []int64{2, 10, 3}},
		{name: "depth to space", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 16, 5, 5)},
			nodes: []onnx.Node{node("DepthToSpace", []string{"x"}, []string{"y"}, intAttr("blocksize", 2))},
			check: "y", shape: []int64{1, 4, 10, 10}},
		{name: "gather elements", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 1, 512), vi("i", onnx.Int64, 1, 128)},
			nodes: []onnx.Node{node("GatherElements", []string{"x", "i"}, []string{"y"}, intAttr("axis", 1))},
			check: "y", shape: []int64{1, 128}},
		{name: "isnan", inputs: []onnx.ValueInfo{vi("x", onnx.Float, 4)},
			nodes: []onnx.Node{node("IsNaN", []string{"x"}, []string{"y"})},
			check: "y", shape: []int64{4}, dtype: Bool},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opset := c.opset
			if opset == 0 {
				opset = 17
			}
			g, err := FromONNX(mkModel(opset, c.inputs, c.inits, c.nodes), nil)
			if err != nil {
				t.Fatal(err)
			}
			tn := g.Tensor(c.check)
			if tn == nil {
				t.Fatalf("no tensor %q", c.check)
			}
			dt := c.dtype
			if dt == DTypeUnknown {
				dt = Float32
			}
			if !tn.Known || !reflect.DeepEqual(tn.Shape, c.shape) && !(len(tn.Shape) == 0 && len(c.shape) == 0) || tn.DType != dt {
				t.Errorf("%s: %v %v, want %v %v", c.check, tn.DType, tn.Shape, dt, c.shape)
			}
			if c.value != nil && !reflect.DeepEqual(tn.Value, c.value) {
				t.Errorf("%s: value %v, want %v", c.check, tn.Value, c.value)
			}
		})
	}
}

// TestShapeArithmeticChain folds the Shape -> Gather -> Unsqueeze -> Concat
// -> Reshape pattern exporters emit for dynamic reshapes, with symbolic file
// shapes resolved by the given input dimensions.
func TestShapeArithmeticChain(t *testing.T) {
	m := mkModel(17, []onnx.ValueInfo{vi("x", onnx.Float, -1, -1, 768)},
		[]onnx.Tensor{i64Tensor("zero", nil, 0), i64Tensor("one", nil, 1), i64Tensor("ax", []int64{1}, 0),
			i64Tensor("heads", []int64{2}, 12, 64)},
		[]onnx.Node{
			node("Shape", []string{"x"}, []string{"s"}),
			node("Gather", []string{"s", "zero"}, []string{"b"}, intAttr("axis", 0)),
			node("Gather", []string{"s", "one"}, []string{"t"}, intAttr("axis", 0)),
			node("Unsqueeze", []string{"b", "ax"}, []string{"b1"}),
			node("Unsqueeze", []string{"t", "ax"}, []string{"t1"}),
			node("Concat", []string{"b1", "t1", "heads"}, []string{"shape"}, intAttr("axis", 0)),
			node("Reshape", []string{"x", "shape"}, []string{"y"}),
			node("Mul", []string{"b", "t"}, []string{"bt"}),
			node("Cast", []string{"bt"}, []string{"btf"}, intAttr("to", int64(onnx.Float))),
		}, "y")
	g, err := FromONNX(m, map[string][]int64{"x": {2, 7, 768}})
	if err != nil {
		t.Fatal(err)
	}
	if y := g.Tensor("y"); !reflect.DeepEqual(y.Shape, []int64{2, 7, 12, 64}) || y.Bytes != 2*7*768*4 {
		t.Errorf("y %v %d bytes", y.Shape, y.Bytes)
	}
	for name, want := range map[string][]int64{"s": {2, 7, 768}, "b": {2}, "t1": {7}, "shape": {2, 7, 12, 64}, "bt": {14}} {
		if v := g.Tensor(name).Value; !reflect.DeepEqual(v, want) {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if h := g.Tensor("heads"); !h.Inline || h.External != nil || !h.Initializer || !reflect.DeepEqual(h.Value, []int64{12, 64}) {
		t.Errorf("inline initializer %+v", h)
	}
	if g.Tensor("btf").Value != nil {
		t.Error("float tensor exposes an integer Value")
	}
	// Without the dimensions the symbolic input cannot be sized.
	_, err = FromONNX(m, nil)
	if !errors.Is(err, ErrUnknownShape) || !strings.Contains(err.Error(), `input "x" has symbolic or unknown dimensions [n n 768]`) {
		t.Errorf("err %v", err)
	}
}

func TestInferErrors(t *testing.T) {
	x := []onnx.ValueInfo{vi("x", onnx.Float, 2, 3)}
	cases := []struct {
		name    string
		inputs  []onnx.ValueInfo
		inits   []onnx.Tensor
		nodes   []onnx.Node
		outputs []string
		wantErr error
		want    string
	}{
		{"unsupported op", x, nil, []onnx.Node{node("Einsum", []string{"x"}, []string{"y"})}, nil,
			ErrUnknownShape, `node "Einsum_y" (Einsum) computing "y": operator Einsum (opset 17) is not supported`},
		{"foreign domain", x, nil, []onnx.Node{{Name: "a", OpType: "Attention", Domain: "com.microsoft", Inputs: []string{"x"}, Outputs: []string{"y"}}}, nil,
			ErrUnknownShape, `operator domain "com.microsoft"`},
		{"reshape of runtime shape", []onnx.ValueInfo{vi("x", onnx.Float, 2, 3), vi("s", onnx.Int64, 2)}, nil,
			[]onnx.Node{node("Reshape", []string{"x", "s"}, []string{"y"})}, nil,
			ErrUnknownShape, `Reshape target shape (input 1 "s") is not known statically`},
		{"broadcast mismatch", []onnx.ValueInfo{vi("a", onnx.Float, 2, 3), vi("b", onnx.Float, 4)}, nil,
			[]onnx.Node{node("Add", []string{"a", "b"}, []string{"y"})}, nil, ErrShapeMismatch, "do not broadcast"},
		{"reshape count", x, []onnx.Tensor{i64Tensor("s", []int64{1}, 5)},
			[]onnx.Node{node("Reshape", []string{"x", "s"}, []string{"y"})}, nil, ErrShapeMismatch, "has 6 elements, target [5] has 5"},
		{"matmul inner", []onnx.ValueInfo{vi("a", onnx.Float, 2, 3), vi("b", onnx.Float, 4, 5)}, nil,
			[]onnx.Node{node("MatMul", []string{"a", "b"}, []string{"y"})}, nil, ErrShapeMismatch, "inner dimensions 3 and 4"},
		{"conv channels", []onnx.ValueInfo{vi("x", onnx.Float, 1, 3, 8, 8)}, []onnx.Tensor{weight("w", 4, 2, 3, 3)},
			[]onnx.Node{node("Conv", []string{"x", "w"}, []string{"y"})}, nil, ErrShapeMismatch, "input has 3 channels"},
		{"huge constant of shape", nil, []onnx.Tensor{i64Tensor("s", []int64{3}, 1<<30, 1<<30, 1<<30)},
			[]onnx.Node{node("ConstantOfShape", []string{"s"}, []string{"y"})}, nil, ErrShapeMismatch, "more than"},
		{"negative dims", nil, []onnx.Tensor{i64Tensor("s", []int64{2}, 4, -2)},
			[]onnx.Node{node("ConstantOfShape", []string{"s"}, []string{"y"})}, nil, ErrShapeMismatch, "negative"},
		{"missing producer", x, nil, []onnx.Node{node("Relu", []string{"z"}, []string{"y"})}, nil,
			ErrInvalid, `node "Relu_y" (Relu) reads "z", which no node produces`},
		{"duplicate producer", x, nil, []onnx.Node{node("Relu", []string{"x"}, []string{"y"}), node("Neg", []string{"x"}, []string{"y"})}, nil,
			ErrInvalid, `tensor "y" produced by both`},
		{"writes an input", x, nil, []onnx.Node{node("Relu", []string{"x"}, []string{"x"})}, nil,
			ErrInvalid, `writes "x", which is a graph input`},
		{"cycle", x, nil, []onnx.Node{node("Add", []string{"x", "b"}, []string{"a"}), node("Relu", []string{"a"}, []string{"b"})}, nil,
			ErrInvalid, "cycle through"},
		{"self loop", x, nil, []onnx.Node{node("Add", []string{"x", "a"}, []string{"a"})}, nil,
			ErrInvalid, `reads its own output "a"`},
		{"unknown initializer type", x, []onnx.Tensor{{Name: "w", DataType: 99}}, nil, nil,
			ErrUnknownShape, `initializer "w": element type DataType(99)`},
		{"string constant", x, nil, []onnx.Node{node("Constant", nil, []string{"y"}, strAttr("value_string", "a"))}, nil,
			ErrUnknownShape, "value_string has no fixed byte size"},
		{"undefined output", x, nil, []onnx.Node{node("Relu", []string{"x"}, []string{"y"})}, []string{"nope"},
			ErrInvalid, `output "nope" is not produced`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := FromONNX(mkModel(17, c.inputs, c.inits, c.nodes, c.outputs...), nil)
			if !errors.Is(err, c.wantErr) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v\nwant %v containing %q", err, c.wantErr, c.want)
			}
		})
	}
}

func TestAllowUnknown(t *testing.T) {
	m := mkModel(17, []onnx.ValueInfo{vi("x", onnx.Float, 2, 3)}, nil, []onnx.Node{
		node("Relu", []string{"x"}, []string{"a"}),
		node("Einsum", []string{"a"}, []string{"b"}),
		node("Relu", []string{"b"}, []string{"c"}),
		node("Add", []string{"a", "c"}, []string{"d"}),
		node("Neg", []string{"a"}, []string{"e"}),
	}, "d", "e")
	if _, err := FromONNX(m, nil); !errors.Is(err, ErrUnknownShape) || !strings.Contains(err.Error(), "Einsum") {
		t.Fatalf("strict: %v", err)
	}
	g, err := ImportONNX(m, nil, Options{AllowUnknown: true})
	if err != nil {
		t.Fatal(err)
	}
	if g.Unknown != 3 {
		t.Errorf("Unknown = %d, want 3 (b, c, d)", g.Unknown)
	}
	for name, known := range map[string]bool{"a": true, "b": false, "c": false, "d": false, "e": true} {
		if tn := g.Tensor(name); tn.Known != known || (!known && tn.Bytes != 0) {
			t.Errorf("%s: known %v bytes %d, want known %v", name, tn.Known, tn.Bytes, known)
		}
	}
	// Structural errors are not excused.
	bad := mkModel(17, nil, nil, []onnx.Node{node("Relu", []string{"z"}, []string{"y"})})
	if _, err := ImportONNX(bad, nil, Options{AllowUnknown: true}); !errors.Is(err, ErrInvalid) {
		t.Errorf("structural error with AllowUnknown: %v", err)
	}
}

func TestReordersNonTopologicalFile(t *testing.T) {
	m := mkModel(17, []onnx.ValueInfo{vi("x", onnx.Float, 4)}, nil, []onnx.Node{
		node("Neg", []string{"a"}, []string{"b"}),
		node("Relu", []string{"x"}, []string{"a"}),
		node("Add", []string{"a", "b"}, []string{"c"}),
	}, "c")
	g, err := FromONNX(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, n := range g.Nodes {
		ops = append(ops, n.Op)
	}
	if !reflect.DeepEqual(ops, []string{"Relu", "Neg", "Add"}) {
		t.Errorf("order %v", ops)
	}
	a := g.Tensor("a")
	if a.Producer != 0 || !reflect.DeepEqual(a.Consumers, []int{1, 2}) {
		t.Errorf("a: producer %d consumers %v", a.Producer, a.Consumers)
	}
}

func TestSubgraphCaptures(t *testing.T) {
	body := &onnx.Graph{Name: "then", Nodes: []onnx.Node{node("Add", []string{"w", "local"}, []string{"out"})},
		Inputs: []onnx.ValueInfo{{Name: "local"}}, Outputs: []onnx.ValueInfo{{Name: "out"}}}
	m := mkModel(17, []onnx.ValueInfo{vi("x", onnx.Float, 4), vi("c", onnx.Bool)}, nil, []onnx.Node{
		node("Relu", []string{"x"}, []string{"w"}),
		{Name: "if", OpType: "If", Inputs: []string{"c"}, Outputs: []string{"y"},
			Attributes: []onnx.Attribute{{Name: "then_branch", Type: onnx.AttrGraph, G: body}}},
	}, "y")
	g, err := ImportONNX(m, nil, Options{AllowUnknown: true})
	if err != nil {
		t.Fatal(err)
	}
	w := g.Tensor("w")
	if !reflect.DeepEqual(w.Consumers, []int{1}) || !reflect.DeepEqual(g.Nodes[1].Captures, []int{g.byName["w"]}) {
		t.Errorf("captures: consumers %v, node %+v", w.Consumers, g.Nodes[1])
	}
	if g.Unknown != 1 {
		t.Errorf("If output should be unknown, Unknown = %d", g.Unknown)
	}
}

func TestConstantFlag(t *testing.T) {
	m := mkModel(17, []onnx.ValueInfo{vi("x", onnx.Float, 4)}, []onnx.Tensor{weight("w", 4)}, []onnx.Node{
		node("Identity", []string{"w"}, []string{"w2"}),
		node("Constant", nil, []string{"k"}, onnx.Attribute{Name: "value_float", Type: onnx.AttrFloat, F: 2}),
		node("Mul", []string{"w2", "k"}, []string{"wk"}),
		node("Add", []string{"x", "wk"}, []string{"y"}),
	}, "y")
	g, err := FromONNX(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"x": false, "w": true, "w2": true, "k": true, "wk": true, "y": false} {
		if g.Tensor(name).Constant != want {
			t.Errorf("%s: Constant %v, want %v", name, !want, want)
		}
	}
}
