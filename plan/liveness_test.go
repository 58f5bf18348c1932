package plan

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/memwall/memwall/format/onnx"
	"github.com/memwall/memwall/graph"
)

// liveSpec is a float32 tensor spec of the given shape.
func liveSpec(name string, shape ...int64) graph.Spec {
	return graph.Spec{Name: name, DType: graph.Float32, Shape: shape}
}

// liveMaxLive is the largest sum of sizes of buffers live at one step.
func liveMaxLive(bufs []Buffer, steps int) uint64 {
	var best uint64
	for s := 0; s < steps; s++ {
		var sum uint64
		for _, b := range bufs {
			if b.Start <= s && s < b.End {
				sum += b.Size
			}
		}
		best = max(best, sum)
	}
	return best
}

type liveWant struct {
	id         string
	start, end int
	size       uint64
	members    []string
}

func liveCheck(t *testing.T, set *ActivationSet, want []liveWant) {
	t.Helper()
	if len(set.Buffers) != len(want) {
		t.Fatalf("%d buffers %+v members %v, want %d", len(set.Buffers), set.Buffers, set.Members, len(want))
	}
	for i, w := range want {
		b := set.Buffers[i]
		if b.ID != w.id || b.Start != w.start || b.End != w.end || b.Size != w.size {
			t.Errorf("buffer %d = %+v, want %+v", i, b, w)
		}
		members := w.members
		if members == nil {
			members = []string{w.id}
		}
		if !reflect.DeepEqual(set.Members[i], members) {
			t.Errorf("buffer %d members %v, want %v", i, set.Members[i], members)
		}
		for _, m := range members {
			if set.Index[m] != i {
				t.Errorf("Index[%q] = %d, want %d", m, set.Index[m], i)
			}
		}
	}
}

func TestActivationsLifetimes(t *testing.T) {
	// x -> a=Relu(x) -> b=Relu(a) -> c=Add(a,b) [output]; d=Dropout(c) has an
	// unread mask output m; k is a Constant read by the last node.
	g, err := graph.NewBuilder("chain").
		Input(liveSpec("x", 4, 16)).
		Node("Relu", []string{"x"}, liveSpec("a", 4, 16)).
		Node("Relu", []string{"a"}, liveSpec("b", 4, 16)).
		Node("Add", []string{"a", "b"}, liveSpec("c", 4, 16)).
		Node("Dropout", []string{"c"}, liveSpec("d", 4, 16), graph.Spec{Name: "m", DType: graph.Bool, Shape: []int64{4, 16}}).
		Node("Constant", nil, liveSpec("k", 100)).
		Node("Mul", []string{"d", "k"}, liveSpec("y", 4, 16)).
		Output("c", "y").
		Build()
	if err != nil {
		t.Fatal(err)
	}
	set, err := Activations(g, LivenessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	liveCheck(t, set, []liveWant{
		{id: "a", start: 0, end: 3, size: 256},
		{id: "b", start: 1, end: 3, size: 256},
		{id: "c", start: 2, end: 6, size: 256}, // graph output: to the end
		{id: "d", start: 3, end: 6, size: 256},
		{id: "m", start: 3, end: 4, size: 256}, // never read: one step
		{id: "k", start: 4, end: 6, size: 512}, // Constant output: 400 bytes
		{id: "y", start: 5, end: 6, size: 256},
	})
	if set.Steps != 6 || set.NaiveBytes != 8*256 || set.Skipped != 0 {
		t.Errorf("steps %d naive %d skipped %d", set.Steps, set.NaiveBytes, set.Skipped)
	}
	if _, ok := set.Index["x"]; ok {
		t.Error("graph input listed as an activation")
	}

	// Alignment: 1 keeps exact sizes, 64 rounds 400 up to 448.
	for _, c := range []struct {
		align      uint64
		k, a       uint64
		naiveBytes uint64
	}{{1, 400, 256, 5*256 + 64 + 400}, {64, 448, 256, 5*256 + 64 + 448}} {
		set, err := Activations(g, LivenessOptions{Alignment: c.align})
		if err != nil {
			t.Fatal(err)
		}
		if k := set.Buffers[set.Index["k"]].Size; k != c.k || set.Buffers[0].Size != c.a || set.NaiveBytes != c.naiveBytes {
			t.Errorf("alignment %d: k %d a %d naive %d", c.align, k, set.Buffers[0].Size, set.NaiveBytes)
		}
	}
	if _, err := Activations(nil, LivenessOptions{}); err == nil {
		t.Error("nil graph accepted")
	}
}

func TestActivationsInPlace(t *testing.T) {
	f := liveSpec
	cases := []struct {
		name  string
		build func(b *graph.Builder) *graph.Builder
		want  []liveWant
		ext   int
	}{
		{
			// Reshape aliases a; Relu then overwrites the merged group in
			// place: one buffer for the whole chain.
			name: "view then elementwise",
			build: func(b *graph.Builder) *graph.Builder {
				return b.Input(f("x", 2, 32)).Initializer(f("w", 32, 32)).
					Node("MatMul", []string{"x", "w"}, f("a", 2, 32)).
					Node("Reshape", []string{"a", "shape"}, f("r", 64)).
					Node("Relu", []string{"r"}, f("y", 64)).
					Initializer(graph.Spec{Name: "shape", DType: graph.Int64, Shape: []int64{1}}).
					Output("y")
			},
			want: []liveWant{{id: "a", start: 0, end: 3, size: 256, members: []string{"a", "r", "y"}}},
		},
		{
			// a is read after the Relu, so b cannot overwrite it; the Add
			// is the last reader of both and writes over a (its first
			// eligible input).
			name: "input read later",
			build: func(b *graph.Builder) *graph.Builder {
				return b.Input(f("x", 64)).
					Node("Neg", []string{"x"}, f("a", 64)).
					Node("Relu", []string{"a"}, f("b", 64)).
					Node("Add", []string{"a", "b"}, f("c", 64)).
					Output("c")
			},
			want: []liveWant{
				{id: "a", start: 0, end: 3, size: 256, members: []string{"a", "c"}},
				{id: "b", start: 1, end: 3, size: 256},
			},
		},
		{
			// Graph inputs are never overwritten; broadcasting and a size
			// change (Cast to float16) prevent in-place; a graph output is
			// not overwritten even when its last reader is elementwise.
			name: "not eligible",
			build: func(b *graph.Builder) *graph.Builder {
				return b.Input(f("x", 1, 64)).
					Node("Relu", []string{"x"}, f("a", 1, 64)).
					Node("Add", []string{"a", "x4"}, f("b", 4, 64)).
					Input(f("x4", 4, 1)).
					Node("Cast", []string{"b"}, graph.Spec{Name: "h", DType: graph.Float16, Shape: []int64{4, 64}}).
					Node("Neg", []string{"h"}, graph.Spec{Name: "o", DType: graph.Float16, Shape: []int64{4, 64}}).
					Node("Abs", []string{"o"}, graph.Spec{Name: "p", DType: graph.Float16, Shape: []int64{4, 64}}).
					Output("o", "p")
			},
			want: []liveWant{
				{id: "a", start: 0, end: 2, size: 256},
				{id: "b", start: 1, end: 3, size: 1024},
				{id: "h", start: 2, end: 5, size: 512, members: []string{"h", "o"}},
				{id: "p", start: 4, end: 5, size: 512},
			},
		},
		{
			// Identity of a weight aliases the weight: not an activation.
			name: "view of initializer",
			build: func(b *graph.Builder) *graph.Builder {
				return b.Input(f("x", 64)).Initializer(f("w", 64)).
					Node("Identity", []string{"w"}, f("w2", 64)).
					Node("Mul", []string{"x", "w2"}, f("y", 64)).
					Output("y")
			},
			want: []liveWant{{id: "y", start: 1, end: 2, size: 256}},
			ext:  1,
		},
		{
			// Two views of one tensor both alias it; the group lives until
			// the last reader of any of them.
			name: "fan-out views",
			build: func(b *graph.Builder) *graph.Builder {
				return b.Input(f("x", 8, 8)).
					Node("Relu", []string{"x"}, f("a", 8, 8)).
					Node("Flatten", []string{"a"}, f("v1", 1, 64)).
					Node("Unsqueeze", []string{"a"}, f("v2", 1, 8, 8)).
					Node("Softmax", []string{"v1"}, f("s", 1, 64)).
					Node("Neg", []string{"v2"}, f("n", 1, 8, 8)).
					Output("s", "n")
			},
			want: []liveWant{
				// n overwrites the a/v1/v2 group at step 4, its last read.
				{id: "a", start: 0, end: 5, size: 256, members: []string{"a", "v1", "v2", "n"}},
				{id: "s", start: 3, end: 5, size: 256},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := c.build(graph.NewBuilder(c.name)).Build()
			if err != nil {
				t.Fatal(err)
			}
			set, err := Activations(g, LivenessOptions{InPlace: true})
			if err != nil {
				t.Fatal(err)
			}
			liveCheck(t, set, c.want)
			if set.ExternalViews != c.ext {
				t.Errorf("ExternalViews %d, want %d", set.ExternalViews, c.ext)
			}
			// Without InPlace every activation is its own buffer.
			plain, err := Activations(g, LivenessOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if plain.NaiveBytes != set.NaiveBytes {
				t.Errorf("NaiveBytes depends on InPlace: %d vs %d", plain.NaiveBytes, set.NaiveBytes)
			}
			for i, m := range plain.Members {
				if len(m) != 1 || plain.Buffers[i].ID != m[0] {
					t.Errorf("plain buffer %d members %v", i, m)
				}
			}
			if liveMaxLive(set.Buffers, set.Steps) > liveMaxLive(plain.Buffers, plain.Steps) {
				t.Error("in-place raised the max-live bound")
			}
		})
	}
}

func TestActivationsSkipsUnknown(t *testing.T) {
	m := &onnx.Model{IRVersion: 8, OpsetImports: []onnx.OpsetID{{Version: 17}}, Graph: &onnx.Graph{
		Name: "u",
		Inputs: []onnx.ValueInfo{{Name: "x", Type: onnx.Type{Kind: onnx.TypeTensor, ElemType: onnx.Float, HasShape: true,
			Shape: []onnx.Dim{{Value: 4, HasValue: true}}}}},
		Nodes: []onnx.Node{
			{Name: "r", OpType: "Relu", Inputs: []string{"x"}, Outputs: []string{"a"}},
			{Name: "e", OpType: "Einsum", Inputs: []string{"a"}, Outputs: []string{"b"}},
			{Name: "n", OpType: "Neg", Inputs: []string{"b"}, Outputs: []string{"c"}},
		},
		Outputs: []onnx.ValueInfo{{Name: "c"}},
	}}
	g, err := graph.ImportONNX(m, nil, graph.Options{AllowUnknown: true})
	if err != nil {
		t.Fatal(err)
	}
	set, err := Activations(g, LivenessOptions{InPlace: true})
	if err != nil {
		t.Fatal(err)
	}
	if set.Skipped != 2 || len(set.Buffers) != 1 || set.Buffers[0].ID != "a" {
		t.Errorf("skipped %d buffers %+v", set.Skipped, set.Buffers)
	}
}

// TestActivationsSharedModels plans every shared model and logs naive bytes
// and the max-live bound with and without in-place (go test -v -run
// SharedModels ./plan).
func TestActivationsSharedModels(t *testing.T) {
	models := []struct {
		name   string
		inputs map[string][]int64
	}{
		{"mobilenet_v2", nil}, {"resnet50", nil}, {"densenet121", nil}, {"inception_v3", nil},
		{"efficientnet_b0", nil}, {"squeezenet1_1", nil}, {"deeplabv3_mobilenet_v3", nil},
		{"bert_base", map[string][]int64{"input_ids": {1, 128}}},
	}
	for _, mc := range models {
		t.Run(mc.name, func(t *testing.T) {
			g, err := graph.LoadONNX(filepath.Join("..", "testdata", "onnx", mc.name+".onnx"), mc.inputs, graph.Options{})
			if err != nil {
				t.Fatal(err)
			}
			plain, err := Activations(g, LivenessOptions{})
			if err != nil {
				t.Fatal(err)
			}
			inplace, err := Activations(g, LivenessOptions{InPlace: true})
			if err != nil {
				t.Fatal(err)
			}
			var largest uint64
			activations := 0
			for _, tn := range g.Tensors {
				if tn.Producer >= 0 {
					activations++
					largest = max(largest, tn.Bytes)
				}
			}
			if len(plain.Buffers) != activations || len(plain.Index) != activations {
				t.Errorf("%d buffers for %d activations", len(plain.Buffers), activations)
			}
			covered := inplace.ExternalViews
			for i, b := range inplace.Buffers {
				if b.Start < 0 || b.End > inplace.Steps || b.Start >= b.End || b.Size == 0 || b.Size%256 != 0 {
					t.Fatalf("buffer %+v", b)
				}
				covered += len(inplace.Members[i])
			}
			if covered != activations {
				t.Errorf("in-place groups cover %d of %d activations", covered, activations)
			}
			p, q := liveMaxLive(plain.Buffers, plain.Steps), liveMaxLive(inplace.Buffers, inplace.Steps)
			if LowerBound(plain.Buffers) != p || LowerBound(inplace.Buffers) != q {
				t.Errorf("LowerBound disagrees with the step sweep: %d/%d vs %d/%d",
					LowerBound(plain.Buffers), LowerBound(inplace.Buffers), p, q)
			}
			if !(largest <= q && q <= p && p <= plain.NaiveBytes) {
				t.Errorf("largest %d, max-live in-place %d, max-live %d, naive %d: out of order", largest, q, p, plain.NaiveBytes)
			}
			t.Logf("%-24s nodes %4d activations %4d naive %10d B  max-live %9d B  in-place max-live %9d B (%d buffers, %d weight views)",
				mc.name, len(g.Nodes), activations, plain.NaiveBytes, p, q, len(inplace.Buffers), inplace.ExternalViews)
		})
	}
}

func TestLiveAlignUp(t *testing.T) {
	for _, c := range []struct{ n, a, want uint64 }{{0, 256, 0}, {1, 256, 256}, {256, 256, 256}, {257, 256, 512},
		{10, 0, 10}, {10, 1, 10}, {10, 3, 12}} {
		if got, err := liveAlignUp(c.n, c.a); err != nil || got != c.want {
			t.Errorf("liveAlignUp(%d, %d) = %d, %v; want %d", c.n, c.a, got, err, c.want)
		}
	}
	if _, err := liveAlignUp(^uint64(0)-1, 256); err == nil || !strings.Contains(err.Error(), "overflows") {
		t.Errorf("overflow: %v", err)
	}
}
