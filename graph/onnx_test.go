package graph

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/memwall/memwall/format/onnx"
)

const modelDir = "../testdata/onnx"

// sharedModels lists the fixtures with the node counts of
// testdata/onnx/README.md and the inputs their README documents.
var sharedModels = []struct {
	name   string
	nodes  int
	inputs map[string][]int64
}{
	{"mobilenet_v2", 209, map[string][]int64{"input": {1, 3, 224, 224}}},
	{"resnet50", 169, map[string][]int64{"input": {1, 3, 224, 224}}},
	{"densenet121", 617, map[string][]int64{"input": {1, 3, 224, 224}}},
	{"inception_v3", 298, map[string][]int64{"input": {1, 3, 299, 299}}},
	{"efficientnet_b0", 298, map[string][]int64{"input": {1, 3, 224, 224}}},
	{"squeezenet1_1", 83, map[string][]int64{"input": {1, 3, 224, 224}}},
	{"deeplabv3_mobilenet_v3", 219, map[string][]int64{"input": {1, 3, 513, 513}}},
	{"bert_base", 755, map[string][]int64{"input_ids": {1, 128}}},
}

func loadShared(t testing.TB, name string) *onnx.Model {
	t.Helper()
	m, err := onnx.ReadFile(filepath.Join(modelDir, name+".onnx"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSharedModelsFullyInferred sizes every tensor of every shared model and
// checks each inferred shape against every fully static shape the file
// declares (value_info and graph outputs, written by onnx's own inference).
func TestSharedModelsFullyInferred(t *testing.T) {
	for _, sm := range sharedModels {
		t.Run(sm.name, func(t *testing.T) {
			m := loadShared(t, sm.name)
			g, err := FromONNX(m, sm.inputs)
			if err != nil {
				t.Fatal(err)
			}
			if len(g.Nodes) != sm.nodes {
				t.Errorf("%d nodes, README says %d", len(g.Nodes), sm.nodes)
			}
			if g.Unknown != 0 {
				t.Errorf("%d unknown tensors", g.Unknown)
			}
			for _, tn := range g.Tensors {
				if !tn.Known || tn.DType == DTypeUnknown {
					t.Fatalf("tensor %q not sized", tn.Name)
				}
				n, _ := NumElements(tn.Shape)
				if want, _ := tn.DType.ByteSize(uint64(n)); tn.Bytes != want {
					t.Fatalf("tensor %q: %d bytes, shape %v of %v needs %d", tn.Name, tn.Bytes, tn.Shape, tn.DType, want)
				}
			}
			// Execution order kept from the file (already topological).
			for k, n := range g.Nodes {
				if n.Name != m.Graph.Nodes[k].Name {
					t.Fatalf("node %d is %q, file has %q", k, n.Name, m.Graph.Nodes[k].Name)
				}
			}
			checked, symbolic := 0, 0
			for _, vi := range slices.Concat(m.Graph.ValueInfo, m.Graph.Outputs) {
				tn := g.Tensor(vi.Name)
				if tn == nil {
					t.Fatalf("value_info %q: no such tensor", vi.Name)
				}
				if dt, ok := dtypeFromONNX(vi.Type.ElemType); ok && dt != tn.DType {
					t.Errorf("tensor %q: dtype %v, file declares %v", vi.Name, tn.DType, dt)
				}
				want, static := vi.Type.Static()
				if !static {
					// The concrete dimensions of a partly symbolic shape
					// must still agree.
					symbolic++
					if vi.Type.HasShape {
						if len(vi.Type.Shape) != len(tn.Shape) {
							t.Errorf("tensor %q: inferred %v, file declares rank %d", vi.Name, tn.Shape, len(vi.Type.Shape))
							continue
						}
						for d, dim := range vi.Type.Shape {
							if dim.HasValue && dim.Value != tn.Shape[d] {
								t.Errorf("tensor %q: inferred %v, file fixes dimension %d at %d", vi.Name, tn.Shape, d, dim.Value)
							}
						}
					}
					continue
				}
				checked++
				if !reflect.DeepEqual(tn.Shape, want) && !(len(want) == 0 && len(tn.Shape) == 0) {
					t.Errorf("tensor %q (%s): inferred %v, file declares %v", vi.Name, producerOp(g, tn), tn.Shape, want)
				}
			}
			t.Logf("%d tensors, %d declared static shapes matched, %d symbolic in the file now sized",
				len(g.Tensors), checked, symbolic)
			if checked == 0 {
				t.Error("no static shapes to compare")
			}
		})
	}
}

func producerOp(g *Graph, t *Tensor) string {
	if t.Producer < 0 {
		return "graph input or initializer"
	}
	return g.Nodes[t.Producer].Op
}

// TestSharedModelOps lists the operators of every shared model (go test -v)
// and checks that shape inference handles each of them.
func TestSharedModelOps(t *testing.T) {
	all := map[string]int{}
	for _, sm := range sharedModels {
		m := loadShared(t, sm.name)
		ops := map[string]int{}
		for _, n := range m.Graph.Nodes {
			ops[n.OpType]++
			all[n.OpType]++
		}
		t.Logf("%s: %s", sm.name, formatCounts(ops))
	}
	t.Logf("all models: %s", formatCounts(all))
	for op := range all {
		if !supportedOp(op) {
			t.Errorf("operator %s of a shared model has no shape function", op)
		}
	}
}

func formatCounts(m map[string]int) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

// supportedOp asks inference itself: an unsupported operator is reported
// with "is not supported".
func supportedOp(op string) bool {
	b := &Graph{}
	c := &nodeCtx{imp: &importer{g: b, opts: Options{MaxFoldElements: 1}}, n: &onnx.Node{OpType: op},
		node: &Node{Op: op}}
	err := c.infer()
	return err == nil || !strings.Contains(err.Error(), "is not supported")
}

func TestBertShapeArithmetic(t *testing.T) {
	// bert_base computes its attention-mask and token-type shapes through
	// ConstantOfShape/Mul/Equal/Where/Expand chains that onnx's own shape
	// inference leaves symbolic; folding recovers the concrete shapes.
	g, err := FromONNX(loadShared(t, "bert_base"), map[string][]int64{"input_ids": {1, 128}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		shape []int64
		value []int64
	}{
		{"/m/embeddings/Where_output_0", []int64{2}, []int64{1, 1}},
		{"/m/embeddings/Expand_1_output_0", []int64{1, 128}, nil},
		{"/m/Where_output_0", []int64{4}, []int64{1, 1, 128, 128}},
		{"/m/Expand_output_0", []int64{1, 1, 128, 128}, nil},
		{"/m/encoder/layer.0/attention/self/Reshape_output_0", []int64{1, 128, 12, 64}, nil},
		{"/m/encoder/layer.0/attention/self/Softmax_output_0", []int64{1, 12, 128, 128}, nil},
		{"/m/encoder/layer.0/attention/self/Reshape_3_output_0", []int64{1, 128, 768}, nil},
		{"1343", []int64{1, 128, 768}, nil},
	}
	for _, c := range cases {
		tn := g.Tensor(c.name)
		if tn == nil {
			t.Fatalf("no tensor %q", c.name)
		}
		if !reflect.DeepEqual(tn.Shape, c.shape) {
			t.Errorf("%s: shape %v, want %v", c.name, tn.Shape, c.shape)
		}
		if c.value != nil && !reflect.DeepEqual(tn.Value, c.value) {
			t.Errorf("%s: value %v, want %v", c.name, tn.Value, c.value)
		}
	}
	if out := g.Tensor("1343"); !out.Output || out.Bytes != 128*768*4 {
		t.Errorf("output %+v", out)
	}
	// Weights shared through Identity are constant; the mask is not an input.
	if id := g.Tensor("m.encoder.layer.11.output.LayerNorm.bias"); id == nil || !id.Constant || id.Producer != 0 {
		t.Errorf("identity of an initializer: %+v", id)
	}
	if w := g.Tensor("m.embeddings.word_embeddings.weight"); !w.Initializer || w.External == nil ||
		w.External.Location != "bert_base.weights" || !w.External.HasLength || uint64(w.External.Length) != w.Bytes {
		t.Errorf("initializer %+v", w)
	}
}

func TestDeeplabResizeSizes(t *testing.T) {
	// deeplabv3's two Resize nodes take sizes built by Shape -> Slice ->
	// Concat; onnx left both outputs (and the Concat after one) symbolic.
	g, err := FromONNX(loadShared(t, "deeplabv3_mobilenet_v3"), map[string][]int64{"input": {1, 3, 513, 513}})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]int64{
		"/m/classifier/classifier.0/convs.4/Resize_output_0": {1, 256, 33, 33},
		"/m/classifier/classifier.0/Concat_output_0":         {1, 1280, 33, 33},
		"591": {1, 21, 513, 513},
	} {
		if tn := g.Tensor(name); tn == nil || !reflect.DeepEqual(tn.Shape, want) {
			t.Errorf("%s: %+v, want shape %v", name, tn, want)
		}
	}
	if v := g.Tensor("/m/Concat_output_0").Value; !reflect.DeepEqual(v, []int64{1, 21, 513, 513}) {
		t.Errorf("sizes value %v", v)
	}
}

func TestImportInputs(t *testing.T) {
	m := loadShared(t, "squeezenet1_1")
	cases := []struct {
		name    string
		inputs  map[string][]int64
		wantErr error
		want    string
	}{
		{"declared shape used", nil, nil, ""},
		{"matching dims", map[string][]int64{"input": {1, 3, 224, 224}}, nil, ""},
		{"contradicts fixed dim", map[string][]int64{"input": {2, 3, 224, 224}}, ErrShapeMismatch, "dimension 0 given as 2"},
		{"wrong rank", map[string][]int64{"input": {3, 224, 224}}, ErrShapeMismatch, "3 dimensions given"},
		{"not an input", map[string][]int64{"pixels": {1}}, ErrInvalid, `"pixels" is not a graph input (inputs: input)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := FromONNX(m, c.inputs)
			if c.wantErr == nil {
				if err != nil || g.Tensors[g.Inputs[0]].Bytes != 3*224*224*4 {
					t.Fatalf("err %v", err)
				}
				return
			}
			if !errors.Is(err, c.wantErr) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want %v containing %q", err, c.wantErr, c.want)
			}
		})
	}
}

func TestLoadONNX(t *testing.T) {
	g, err := LoadONNX(filepath.Join(modelDir, "resnet50.onnx"), nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	out := g.Tensors[g.Outputs[0]]
	if !reflect.DeepEqual(out.Shape, []int64{1, 1000}) || out.DType != Float32 {
		t.Errorf("output %+v", out)
	}
	_, err = LoadONNX(filepath.Join(modelDir, "missing.onnx"), nil, Options{})
	if err == nil || !strings.Contains(err.Error(), "missing.onnx") {
		t.Errorf("missing file: %v", err)
	}
}

// BenchmarkImportONNX measures import and shape inference (decoding
// excluded) of the largest shared graph, bert_base with 128 tokens.
func BenchmarkImportONNX(b *testing.B) {
	m := loadShared(b, "bert_base")
	inputs := map[string][]int64{"input_ids": {1, 128}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := FromONNX(m, inputs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(m.Graph.Nodes)), "ns/node")
}
