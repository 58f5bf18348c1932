package graph

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/memwall/memwall/format/onnx"
)

// declaredModel is x → Reshape(x, shape) → y → Relu → z, with the reshape's
// target an external initializer whose data file is absent (as exporters
// leave it when the weights are not shipped), and y declared in value_info
// with yDims (nil: not declared).
func declaredModel(xDims, yDims []onnx.Dim) *onnx.Model {
	typ := func(dims []onnx.Dim) onnx.Type {
		return onnx.Type{Kind: onnx.TypeTensor, ElemType: onnx.Float, HasShape: true, Shape: dims}
	}
	g := &onnx.Graph{
		Name:   "declared",
		Inputs: []onnx.ValueInfo{{Name: "x", Type: typ(xDims)}},
		Initializers: []onnx.Tensor{{Name: "shape", Dims: []int64{int64(len(yDims))}, DataType: onnx.Int64,
			DataLocation: onnx.LocationExternal, ExternalData: []onnx.StringPair{{Key: "location", Value: "absent.data"}}}},
		Nodes: []onnx.Node{
			{Name: "reshape", OpType: "Reshape", Inputs: []string{"x", "shape"}, Outputs: []string{"y"}},
			{Name: "relu", OpType: "Relu", Inputs: []string{"y"}, Outputs: []string{"z"}},
		},
		Outputs: []onnx.ValueInfo{{Name: "z", Type: onnx.Type{Kind: onnx.TypeTensor, ElemType: onnx.Float}}},
	}
	if yDims != nil {
		g.ValueInfo = []onnx.ValueInfo{{Name: "y", Type: typ(yDims)}}
	}
	return &onnx.Model{IRVersion: 8, OpsetImports: []onnx.OpsetID{{Version: 18}}, Graph: g}
}

func dims(vs ...any) []onnx.Dim {
	var out []onnx.Dim
	for _, v := range vs {
		switch v := v.(type) {
		case int:
			out = append(out, onnx.Dim{Value: int64(v), HasValue: true})
		case string:
			out = append(out, onnx.Dim{Param: v})
		}
	}
	return out
}

// TestDeclaredShapeFallback: a reshape whose target is an absent constant
// takes the shape value_info declares (concrete or named after an input's
// symbolic dimension), is counted in Declared, and feeds inference after
// it; without a declaration, or with one that does not resolve, import
// fails as before.
func TestDeclaredShapeFallback(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		b, s := int64(r.IntN(8)+1), int64(r.IntN(64)+1)
		split := []int64{1, 2, 4}[r.IntN(3)]
		if s%split != 0 {
			s *= split
		}
		want := []int64{b, split, s / split}
		// Concrete declarations, static input.
		g, err := FromONNX(declaredModel(dims(int(b), int(s)), dims(int(b), int(split), int(s/split))), nil)
		if err != nil {
			t.Fatal(err)
		}
		check := func(g *Graph) {
			t.Helper()
			if g.Declared != 1 {
				t.Fatalf("Declared = %d, want 1", g.Declared)
			}
			for _, n := range []string{"y", "z"} {
				if tn := g.Tensor(n); !tn.Known || !slices.Equal(tn.Shape, want) || tn.Bytes != uint64(4*b*s) {
					t.Fatalf("%s: %v %v %d bytes; want %v", n, tn.Known, tn.Shape, tn.Bytes, want)
				}
			}
		}
		check(g)
		// Symbolic input, declarations in the same symbols.
		g, err = FromONNX(declaredModel(dims("batch", "seq"), dims("batch", int(split), int(s/split))),
			map[string][]int64{"x": {b, s}})
		if err != nil {
			t.Fatal(err)
		}
		check(g)
	}
	for _, c := range []struct {
		name string
		y    []onnx.Dim
	}{
		{"undeclared", nil},
		{"unbound symbol", dims("other", 4)},
		{"no dimension", []onnx.Dim{{}}},
	} {
		_, err := FromONNX(declaredModel(dims("batch", 8), c.y), map[string][]int64{"x": {2, 8}})
		if !errors.Is(err, ErrUnknownShape) {
			t.Errorf("%s: err = %v, want ErrUnknownShape", c.name, err)
		}
	}
	// With AllowUnknown, the undeclared tensor and what follows are counted
	// unknown, not declared.
	g, err := ImportONNX(declaredModel(dims(2, 8), nil), nil, Options{AllowUnknown: true})
	if err != nil || g.Unknown != 2 || g.Declared != 0 {
		t.Fatalf("AllowUnknown: %v, Unknown %d, Declared %d", err, g.Unknown, g.Declared)
	}
	// The declared shape is taken as the file states it.
	g, err = FromONNX(declaredModel(dims(2, 8), dims(4, 4)), nil)
	if err != nil || fmt.Sprint(g.Tensor("y").Shape) != "[4 4]" {
		t.Fatalf("declared [4 4]: %v %v", err, g.Tensor("y"))
	}
}

// FuzzDeclared: declarations of any shape (concrete, negative, symbolic,
// bound or not, any rank) never panic the import; when it succeeds, every
// tensor is sized and Declared counts at most the reshape's output.
func FuzzDeclared(f *testing.F) {
	f.Add(int64(2), int64(8), int64(4), int64(4), "", "", uint8(2))
	f.Add(int64(2), int64(8), int64(-1), int64(16), "batch", "", uint8(2))
	f.Add(int64(3), int64(5), int64(0), int64(7), "seq", "seq", uint8(3))
	f.Fuzz(func(t *testing.T, b, s, y0, y1 int64, xParam, yParam string, rank uint8) {
		x := dims(int(b&0xff)+1, int(s&0xff)+1)
		if xParam != "" {
			x[0] = onnx.Dim{Param: xParam}
		}
		var y []onnx.Dim
		for i := range int(rank % 5) {
			d := onnx.Dim{Value: y0 >> (8 * i) & 0xffff, HasValue: true}
			if i == 1 {
				d.Value = y1
			}
			if i == 0 && yParam != "" {
				d = onnx.Dim{Param: yParam}
			}
			y = append(y, d)
		}
		g, err := FromONNX(declaredModel(x, y), map[string][]int64{"x": {b&0xff + 1, s&0xff + 1}})
		if err != nil {
			return
		}
		if g.Declared > 1 || g.Unknown != 0 {
			t.Fatalf("Declared %d, Unknown %d", g.Declared, g.Unknown)
		}
		for _, tn := range g.Tensors {
			if !tn.Known {
				t.Fatalf("%s not sized", tn.Name)
			}
		}
	})
}

// unsqueezeModel is u1 = Unsqueeze(x, axes), u2 = Unsqueeze(y, axes) with
// axes one absent external int64, x declared [1, seq, 1] and y [1, 1, seq],
// u1 declared with four unnamed dimensions and u2 with u2Dims (nil: not
// declared).
func unsqueezeModel(u2Dims []onnx.Dim) *onnx.Model {
	typ := func(dims []onnx.Dim) onnx.Type {
		return onnx.Type{Kind: onnx.TypeTensor, ElemType: onnx.Float, HasShape: true, Shape: dims}
	}
	g := &onnx.Graph{
		Name:   "unsqueeze",
		Inputs: []onnx.ValueInfo{{Name: "x", Type: typ(dims(1, "seq", 1))}, {Name: "y", Type: typ(dims(1, 1, "seq"))}},
		Initializers: []onnx.Tensor{{Name: "axes", Dims: []int64{1}, DataType: onnx.Int64,
			DataLocation: onnx.LocationExternal, ExternalData: []onnx.StringPair{{Key: "location", Value: "absent.data"}}}},
		Nodes: []onnx.Node{
			{Name: "u1", OpType: "Unsqueeze", Inputs: []string{"x", "axes"}, Outputs: []string{"u1"}},
			{Name: "u2", OpType: "Unsqueeze", Inputs: []string{"y", "axes"}, Outputs: []string{"u2"}},
		},
		ValueInfo: []onnx.ValueInfo{{Name: "u1", Type: typ([]onnx.Dim{{}, {}, {}, {}})}},
		Outputs:   []onnx.ValueInfo{{Name: "u1", Type: onnx.Type{Kind: onnx.TypeTensor, ElemType: onnx.Float}}, {Name: "u2", Type: onnx.Type{Kind: onnx.TypeTensor, ElemType: onnx.Float}}},
	}
	if u2Dims != nil {
		g.ValueInfo = append(g.ValueInfo, onnx.ValueInfo{Name: "u2", Type: typ(u2Dims)})
	}
	return &onnx.Model{IRVersion: 8, OpsetImports: []onnx.OpsetID{{Version: 18}}, Graph: g}
}

// TestUnsqueezeAbsentAxes: an Unsqueeze whose axis is an absent constant
// is sized from what every Unsqueeze of the same axis tensor declares (u2's
// declaration pins the axis to the last, which sizes u1, whose own
// declaration says nothing); without that declaration, or with one no axis
// fits, the shape stays unknown.
func TestUnsqueezeAbsentAxes(t *testing.T) {
	in := map[string][]int64{"x": {1, 7, 1}, "y": {1, 1, 7}}
	g, err := FromONNX(unsqueezeModel(dims(1, 1, "seq", 1)), in)
	if err != nil {
		t.Fatal(err)
	}
	if u1, u2 := g.Tensor("u1"), g.Tensor("u2"); !slices.Equal(u1.Shape, []int64{1, 7, 1, 1}) || !slices.Equal(u2.Shape, []int64{1, 1, 7, 1}) || g.Declared != 2 {
		t.Errorf("u1 %v, u2 %v, Declared %d; want [1 7 1 1], [1 1 7 1], 2", u1.Shape, u2.Shape, g.Declared)
	}
	for _, c := range []struct {
		name string
		u2   []onnx.Dim
	}{
		{"u2 undeclared", nil},
		{"no axis fits", dims(7, 1, 1, 1)},
	} {
		if _, err := FromONNX(unsqueezeModel(c.u2), in); !errors.Is(err, ErrUnknownShape) {
			t.Errorf("%s: err = %v, want ErrUnknownShape", c.name, err)
		}
	}
}
