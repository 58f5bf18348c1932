package graph

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/memwall/memwall/format/onnx"
)

func TestDTypeTable(t *testing.T) {
	cases := []struct {
		d            DType
		name         string
		bits         int
		float, integ bool
	}{
		{Float32, "float32", 32, true, false},
		{Float16, "float16", 16, true, false},
		{BFloat16, "bfloat16", 16, true, false},
		{Float64, "float64", 64, true, false},
		{Int8, "int8", 8, false, true},
		{Int16, "int16", 16, false, true},
		{Int32, "int32", 32, false, true},
		{Int64, "int64", 64, false, true},
		{Uint8, "uint8", 8, false, true},
		{Uint16, "uint16", 16, false, true},
		{Uint32, "uint32", 32, false, true},
		{Uint64, "uint64", 64, false, true},
		{Bool, "bool", 8, false, false},
		{String, "string", 0, false, false},
		{Complex64, "complex64", 64, false, false},
		{Complex128, "complex128", 128, false, false},
		{Float8E4M3FN, "float8e4m3fn", 8, true, false},
		{Float8E4M3FNUZ, "float8e4m3fnuz", 8, true, false},
		{Float8E5M2, "float8e5m2", 8, true, false},
		{Float8E5M2FNUZ, "float8e5m2fnuz", 8, true, false},
		{Float8E8M0, "float8e8m0", 8, true, false},
		{Int4, "int4", 4, false, true},
		{Uint4, "uint4", 4, false, true},
		{Float4E2M1, "float4e2m1", 4, true, false},
		{Int2, "int2", 2, false, true},
		{Uint2, "uint2", 2, false, true},
		{DTypeUnknown, "unknown", 0, false, false},
		{DType(200), "DType(200)", 0, false, false},
	}
	for _, c := range cases {
		if c.d.String() != c.name || c.d.Bits() != c.bits || c.d.IsFloat() != c.float || c.d.IsInteger() != c.integ {
			t.Errorf("%v: name %q bits %d float %v int %v", c.d, c.d.String(), c.d.Bits(), c.d.IsFloat(), c.d.IsInteger())
		}
	}
	// Every ONNX element type with a fixed size maps to a DType of the same
	// width.
	for code := onnx.DataType(0); code <= onnx.Int2; code++ {
		d, ok := dtypeFromONNX(code)
		if code == onnx.Undefined {
			if ok {
				t.Error("UNDEFINED maps to a type")
			}
			continue
		}
		if !ok || d.Bits() != code.Bits() {
			t.Errorf("%v -> %v (%d bits), want %d bits", code, d, d.Bits(), code.Bits())
		}
	}
}

func TestByteSize(t *testing.T) {
	cases := []struct {
		d       DType
		n       uint64
		want    uint64
		wantErr string
	}{
		{Float32, 10, 40, ""},
		{BFloat16, 3, 6, ""},
		{Int4, 3, 2, ""}, // 12 bits round up to 2 bytes
		{Int2, 5, 2, ""},
		{Bool, 0, 0, ""},
		{String, 1, 0, "no fixed size"},
		{Float64, 1 << 61, 0, "overflow"},
		{Complex128, 1 << 60, 0, "overflow"},
	}
	for _, c := range cases {
		got, err := c.d.ByteSize(c.n)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%v.ByteSize(%d) = %d, %v; want error %q", c.d, c.n, got, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%v.ByteSize(%d) = %d, %v; want %d", c.d, c.n, got, err, c.want)
		}
	}
}

func TestNumElements(t *testing.T) {
	cases := []struct {
		shape   []int64
		want    int64
		wantErr string
	}{
		{nil, 1, ""},
		{[]int64{1, 3, 224, 224}, 150528, ""},
		{[]int64{0, 5}, 0, ""},
		{[]int64{0, 1 << 60}, 0, "exceeds"}, // a zero does not excuse a huge dimension
		{[]int64{-1}, 0, "negative"},
		{[]int64{1 << 26, 1 << 26}, 0, "more than"},
		{make([]int64, MaxRank+1), 0, "rank"},
	}
	for _, c := range cases {
		got, err := NumElements(c.shape)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("NumElements(%v) = %d, %v; want error %q", c.shape, got, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("NumElements(%v) = %d, %v; want %d", c.shape, got, err, c.want)
		}
	}
}

func TestBuilder(t *testing.T) {
	f := func(name string, shape ...int64) Spec { return Spec{Name: name, DType: Float32, Shape: shape} }
	g, err := NewBuilder("tiny").
		Input(f("x", 1, 8)).
		Initializer(f("w", 8, 8)).
		Node("MatMul", []string{"x", "w"}, f("h", 1, 8)).
		Node("Relu", []string{"h"}, f("r", 1, 8)).
		Node("Add", []string{"r", "h"}, f("y", 1, 8)).
		Output("y").
		Build()
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Nodes) != 3 || len(g.Tensors) != 5 || !reflect.DeepEqual(g.Inputs, []int{1}) {
		t.Fatalf("graph %+v", g)
	}
	h := g.Tensor("h")
	if h.Producer != 0 || !reflect.DeepEqual(h.Consumers, []int{1, 2}) || h.Bytes != 32 || !h.Known {
		t.Errorf("h %+v", h)
	}
	if w := g.Tensor("w"); !w.Initializer || !w.Constant || w.Producer != -1 || w.Bytes != 256 {
		t.Errorf("w %+v", w)
	}
	if y := g.Tensor("y"); !y.Output || y.Constant {
		t.Errorf("y %+v", y)
	}
	if g.Tensor("nope") != nil {
		t.Error("Tensor of a missing name")
	}
	if i, ok := g.Lookup("r"); !ok || g.Tensors[i].Name != "r" {
		t.Error("Lookup")
	}

	_, err = NewBuilder("dup").Input(f("x", 1)).Node("Relu", []string{"x"}, f("x", 1)).Build()
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `"x" declared twice`) {
		t.Errorf("duplicate: %v", err)
	}
	_, err = NewBuilder("huge").Input(f("x", 1<<40, 1<<40)).Build()
	if !errors.Is(err, ErrShapeMismatch) {
		t.Errorf("huge: %v", err)
	}
}

func TestOpClasses(t *testing.T) {
	for op, want := range map[string][2]bool{
		"Reshape": {true, false}, "Identity": {true, false}, "Dropout": {true, false}, "Squeeze": {true, false},
		"Relu": {false, true}, "Add": {false, true}, "Where": {false, true}, "BatchNormalization": {false, true},
		"Cast":    {false, true},
		"Softmax": {false, false}, "Conv": {false, false}, "Transpose": {false, false}, "Concat": {false, false},
		"LayerNormalization": {false, false}, "MatMul": {false, false},
	} {
		if IsView(op) != want[0] || IsElementwise(op) != want[1] {
			t.Errorf("%s: view %v elementwise %v, want %v", op, IsView(op), IsElementwise(op), want)
		}
	}
	// Every view or elementwise operator has a shape function.
	for _, set := range []map[string]bool{viewOps, elementwiseOps} {
		for op := range set {
			if !supportedOp(op) {
				t.Errorf("%s is classified but not inferred", op)
			}
		}
	}
}
