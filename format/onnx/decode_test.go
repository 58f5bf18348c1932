package onnx

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

const modelDir = "../../testdata/onnx"

// Small protobuf writers for hand-built test messages.

func tag(b []byte, num protowire.Number, typ protowire.Type) []byte {
	return protowire.AppendTag(b, num, typ)
}

func varintField(b []byte, num protowire.Number, v uint64) []byte {
	return protowire.AppendVarint(tag(b, num, protowire.VarintType), v)
}

func bytesOf(b []byte, num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(tag(b, num, protowire.BytesType), v)
}

func str(b []byte, num protowire.Number, s string) []byte { return bytesOf(b, num, []byte(s)) }

func packedVarints(b []byte, num protowire.Number, vs ...int64) []byte {
	var p []byte
	for _, v := range vs {
		p = protowire.AppendVarint(p, uint64(v))
	}
	return bytesOf(b, num, p)
}

// model wraps a graph message in a ModelProto with opset 17.
func model(graph []byte) []byte {
	var b []byte
	b = varintField(b, 1, 8)
	b = bytesOf(b, 8, varintField(nil, 2, 17))
	b = str(b, 2, "test")
	return bytesOf(b, 7, graph)
}

func TestDecodeSharedModels(t *testing.T) {
	// Node and initializer counts of the shared models; node counts are those
	// of testdata/onnx/README.md.
	cases := []struct {
		name         string
		nodes, inits int
		input        string
		inputDims    []int64
	}{
		{"bert_base", 755, 78, "input_ids", []int64{1, 128}},
		{"deeplabv3_mobilenet_v3", 219, 89, "input", []int64{1, 3, 513, 513}},
		{"densenet121", 617, 184, "input", []int64{1, 3, 224, 224}},
		{"efficientnet_b0", 298, 105, "input", []int64{1, 3, 224, 224}},
		{"inception_v3", 298, 107, "input", []int64{1, 3, 299, 299}},
		{"mobilenet_v2", 209, 67, "input", []int64{1, 3, 224, 224}},
		{"resnet50", 169, 61, "input", []int64{1, 3, 224, 224}},
		{"squeezenet1_1", 83, 34, "input", []int64{1, 3, 224, 224}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := ReadFile(filepath.Join(modelDir, c.name+".onnx"))
			if err != nil {
				t.Fatal(err)
			}
			if m.IRVersion != 8 || m.Opset("") != 17 || m.Opset("ai.onnx") != 17 || m.ProducerName != "pytorch" {
				t.Errorf("header: ir %d opset %d producer %q", m.IRVersion, m.Opset(""), m.ProducerName)
			}
			g := m.Graph
			if len(g.Nodes) != c.nodes || len(g.Initializers) != c.inits {
				t.Errorf("nodes %d initializers %d, want %d %d", len(g.Nodes), len(g.Initializers), c.nodes, c.inits)
			}
			if len(g.Inputs) != 1 || g.Inputs[0].Name != c.input {
				t.Fatalf("inputs %+v", g.Inputs)
			}
			if dims, ok := g.Inputs[0].Type.Static(); !ok || !reflect.DeepEqual(dims, c.inputDims) {
				t.Errorf("input dims %v %v, want %v", dims, ok, c.inputDims)
			}
			// Every initializer is external with a location, offset and length
			// that match its size; none carries inline data.
			for _, in := range g.Initializers {
				e, err := in.External()
				if err != nil || e == nil {
					t.Fatalf("initializer %q: external %v %v", in.Name, e, err)
				}
				n, err := NumElements(in.Dims)
				if err != nil {
					t.Fatal(err)
				}
				if e.Location != c.name+".weights" || !e.HasLength || e.Length != n*int64(in.DataType.Bits()/8) {
					t.Errorf("initializer %q %v %v: external %+v", in.Name, in.Dims, in.DataType, e)
				}
				if in.RawData != nil {
					t.Errorf("initializer %q has inline data", in.Name)
				}
				if _, err := in.Int64s(); !errors.Is(err, ErrNoData) {
					t.Errorf("Int64s on external tensor: %v, want ErrNoData", err)
				}
			}
			for _, n := range g.Nodes {
				if n.OpType == "" || len(n.Outputs) == 0 {
					t.Fatalf("node %+v", n)
				}
			}
		})
	}
}

func TestDecodeConstantAttribute(t *testing.T) {
	// bert_base's first Constant node holds the position ids 0..127 as an
	// inline INT64 tensor.
	m, err := ReadFile(filepath.Join(modelDir, "bert_base.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range m.Graph.Nodes {
		if n.OpType != "Constant" {
			continue
		}
		a := n.Attr("value")
		if a == nil || a.Type != AttrTensor || a.T == nil {
			t.Fatalf("constant %q: value attribute %+v", n.Name, a)
		}
		v, err := a.T.Int64s()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a.T.Dims, []int64{1, 128}) || len(v) != 128 || v[0] != 0 || v[127] != 127 {
			t.Fatalf("first constant: dims %v values %v", a.T.Dims, v)
		}
		return
	}
	t.Fatal("no Constant node")
}

func TestDecodeHandBuilt(t *testing.T) {
	// A node with every attribute kind, in packed and unpacked encodings.
	var attrInts []byte
	attrInts = str(attrInts, 1, "ints")
	attrInts = varintField(attrInts, 20, uint64(AttrInts))
	attrInts = packedVarints(attrInts, 8, 1, -2)
	attrInts = varintField(attrInts, 8, 3) // unpacked element appended

	var attrFloats []byte
	attrFloats = str(attrFloats, 1, "floats")
	fl := make([]byte, 8)
	binary.LittleEndian.PutUint32(fl, math.Float32bits(1.5))
	binary.LittleEndian.PutUint32(fl[4:], math.Float32bits(-2))
	attrFloats = bytesOf(attrFloats, 7, fl)
	attrFloats = protowire.AppendFixed32(tag(attrFloats, 7, protowire.Fixed32Type), math.Float32bits(4))

	var sub []byte // subgraph with one node
	sub = str(sub, 2, "body")
	sub = bytesOf(sub, 1, str(str(nil, 4, "Relu"), 1, "x"))
	var attrG []byte
	attrG = str(attrG, 1, "then_branch")
	attrG = bytesOf(attrG, 6, sub) // no type field: inferred as GRAPH

	var tensor []byte
	tensor = varintField(tensor, 1, 2) // unpacked dims
	tensor = varintField(tensor, 1, 3)
	tensor = varintField(tensor, 2, uint64(Int32))
	tensor = packedVarints(tensor, 5, 1, 2, 3, -4, 5, 6)
	tensor = str(tensor, 8, "w")
	var attrT []byte
	attrT = str(attrT, 1, "value")
	attrT = varintField(attrT, 20, uint64(AttrTensor))
	attrT = bytesOf(attrT, 5, tensor)

	var node []byte
	node = str(node, 1, "x")
	node = str(node, 1, "")
	node = str(node, 2, "y")
	node = str(node, 3, "n0")
	node = str(node, 4, "If")
	node = str(node, 7, "ai.onnx")
	for _, a := range [][]byte{attrInts, attrFloats, attrG, attrT} {
		node = bytesOf(node, 5, a)
	}

	var ext []byte // external initializer
	ext = packedVarints(ext, 1, 4, 4)
	ext = varintField(ext, 2, uint64(Float))
	ext = str(ext, 8, "ext")
	for _, kv := range [][2]string{{"location", "w.bin"}, {"offset", "4096"}, {"length", "64"}} {
		ext = bytesOf(ext, 13, str(str(nil, 1, kv[0]), 2, kv[1]))
	}
	ext = varintField(ext, 14, uint64(LocationExternal))

	var shape []byte
	shape = bytesOf(shape, 1, varintField(nil, 1, 1))
	shape = bytesOf(shape, 1, str(nil, 2, "seq"))
	shape = bytesOf(shape, 1, nil)
	vi := str(nil, 1, "x")
	vi = bytesOf(vi, 2, bytesOf(nil, 1, bytesOf(varintField(nil, 1, uint64(Int64)), 2, shape)))

	var g []byte
	g = bytesOf(g, 1, node)
	g = str(g, 2, "main")
	g = bytesOf(g, 5, ext)
	g = bytesOf(g, 11, vi)
	g = bytesOf(g, 12, str(nil, 1, "y"))
	g = bytesOf(g, 15, nil)   // sparse initializer: counted, skipped
	g = varintField(g, 99, 7) // unknown field: skipped

	m, err := Decode(model(g))
	if err != nil {
		t.Fatal(err)
	}
	if m.ProducerName != "test" || m.Opset("") != 17 {
		t.Errorf("header %+v", m)
	}
	gr := m.Graph
	if gr.Name != "main" || len(gr.Nodes) != 1 || gr.SparseInitializers != 1 {
		t.Fatalf("graph %+v", gr)
	}
	n := gr.Nodes[0]
	if !reflect.DeepEqual(n.Inputs, []string{"x", ""}) || !reflect.DeepEqual(n.Outputs, []string{"y"}) ||
		n.Name != "n0" || n.OpType != "If" || n.Domain != "ai.onnx" {
		t.Errorf("node %+v", n)
	}
	if a := n.Attr("ints"); a == nil || !reflect.DeepEqual(a.Ints, []int64{1, -2, 3}) {
		t.Errorf("ints %+v", a)
	}
	if a := n.Attr("floats"); a == nil || a.Type != AttrFloats || !reflect.DeepEqual(a.Floats, []float32{1.5, -2, 4}) {
		t.Errorf("floats %+v", a)
	}
	if a := n.Attr("then_branch"); a == nil || a.Type != AttrGraph || a.G == nil || a.G.Name != "body" ||
		len(a.G.Nodes) != 1 || a.G.Nodes[0].OpType != "Relu" {
		t.Errorf("graph attribute %+v", a)
	}
	a := n.Attr("value")
	if a == nil || a.T == nil || !reflect.DeepEqual(a.T.Dims, []int64{2, 3}) {
		t.Fatalf("tensor attribute %+v", a)
	}
	if v, err := a.T.Int64s(); err != nil || !reflect.DeepEqual(v, []int64{1, 2, 3, -4, 5, 6}) {
		t.Errorf("Int64s %v %v", v, err)
	}
	if n.Attr("missing") != nil {
		t.Error("Attr of a missing name is not nil")
	}
	e, err := gr.Initializers[0].External()
	if err != nil || *e != (External{Location: "w.bin", Offset: 4096, Length: 64, HasLength: true}) {
		t.Errorf("external %+v %v", e, err)
	}
	typ := gr.Inputs[0].Type
	want := Type{Kind: TypeTensor, ElemType: Int64, HasShape: true,
		Shape: []Dim{{Value: 1, HasValue: true}, {Param: "seq"}, {}}}
	if !reflect.DeepEqual(typ, want) {
		t.Errorf("type %+v, want %+v", typ, want)
	}
	if _, ok := typ.Static(); ok {
		t.Error("symbolic shape reported static")
	}
}

func TestDecodeErrors(t *testing.T) {
	node := str(str(nil, 4, "Relu"), 1, "x")
	deep := node
	for i := 0; i < MaxGraphDepth+1; i++ {
		attr := bytesOf(str(nil, 1, "body"), 6, bytesOf(nil, 1, deep))
		deep = bytesOf(str(nil, 4, "Loop"), 5, attr)
	}
	cases := []struct {
		name string
		data []byte
		want string // substring of the error
	}{
		{"empty", nil, "ModelProto.graph (field 7): missing"},
		{"bad tag", []byte{0x80}, "bad field tag"},
		{"truncated length", []byte{0x3a, 0x05, 0x01}, "truncated or malformed"},
		{"graph as varint", varintField(nil, 7, 1), "ModelProto.graph (field 7): unexpected varint encoding"},
		{"ir_version as bytes", str(model(nil), 1, "x"), "ModelProto.ir_version (field 1): unexpected bytes encoding"},
		{"op_type as varint", model(bytesOf(nil, 1, varintField(nil, 4, 3))),
			"GraphProto.node[0]: NodeProto.op_type (field 4)"},
		{"dims fixed64", model(bytesOf(nil, 5, protowire.AppendFixed64(tag(nil, 1, protowire.Fixed64Type), 1))),
			"GraphProto.initializer[0]: TensorProto.dims (field 1): unexpected fixed64 encoding"},
		{"negative dim", model(bytesOf(nil, 5, varintField(nil, 1, uint64(1<<64-1)))), "dimension 0 is negative"},
		{"floats odd length", model(bytesOf(nil, 1, bytesOf(nil, 5, bytesOf(nil, 7, []byte{1, 2, 3})))),
			"AttributeProto.floats (field 7): packed length 3"},
		{"packed varint truncated", model(bytesOf(nil, 5, bytesOf(nil, 1, []byte{0x80}))), "malformed packed varint"},
		{"subgraphs too deep", model(bytesOf(nil, 1, deep)), "subgraphs nested deeper than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Decode(c.data)
			if err == nil {
				t.Fatalf("no error, model %+v", m)
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("error %v does not wrap ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

func TestReadFileNamesFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bad.onnx")
	if err := os.WriteFile(p, []byte{0x3a, 0x05}, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ReadFile(p)
	if err == nil || !strings.Contains(err.Error(), p) || !errors.Is(err, ErrCorrupt) {
		t.Errorf("ReadFile error %v", err)
	}
	_, err = ReadFile(filepath.Join(dir, "missing.onnx"))
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "missing.onnx") {
		t.Errorf("ReadFile missing: %v", err)
	}
}

func TestTruncatedModelsFailCleanly(t *testing.T) {
	// Every strict prefix of a real model either decodes (a prefix may end
	// on a field boundary) or fails with ErrCorrupt; it never panics.
	data, err := os.ReadFile(filepath.Join(modelDir, "squeezenet1_1.onnx"))
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < len(data); n += 97 {
		if _, err := Decode(data[:n]); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("prefix %d: %v", n, err)
		}
	}
}

func TestManyPackedFieldsStayLinear(t *testing.T) {
	// 100,000 one-element packed int64_data fields for one tensor: the slice
	// must grow geometrically, not once per field.
	tensor := varintField(nil, 2, uint64(Int64))
	for i := 0; i < 100000; i++ {
		tensor = packedVarints(tensor, 7, int64(i&0x7f))
	}
	data := model(bytesOf(nil, 5, tensor))
	var m *Model
	allocs := testing.AllocsPerRun(1, func() {
		var err error
		if m, err = Decode(data); err != nil {
			t.Fatal(err)
		}
	})
	if n := len(m.Graph.Initializers[0].Int64Data); n != 100000 {
		t.Fatalf("decoded %d values", n)
	}
	if allocs > 200 {
		t.Errorf("%v allocations for one tensor", allocs)
	}
}

// BenchmarkDecode measures decoding bert_base (212 KB, 755 nodes).
func BenchmarkDecode(b *testing.B) {
	data, err := os.ReadFile(filepath.Join(modelDir, "bert_base.onnx"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(data); err != nil {
			b.Fatal(err)
		}
	}
}
