package onnx

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to Decode. Decode must never panic; every
// failure must wrap ErrCorrupt; a decoded model's accessors must not panic
// either. Seeds: the smallest shared model, prefixes of it, and the
// hand-built messages of the unit tests (testdata/fuzz/FuzzDecode holds
// regression inputs).
func FuzzDecode(f *testing.F) {
	if data, err := os.ReadFile(filepath.Join(modelDir, "squeezenet1_1.onnx")); err == nil {
		f.Add(data)
		for _, n := range []int{1, 16, 64, 200, 1000, 4096} {
			if n < len(data) {
				f.Add(data[:n])
			}
		}
	}
	f.Add(model(nil))
	f.Add(model(bytesOf(nil, 1, str(str(nil, 4, "Relu"), 1, "x"))))
	f.Add(model(bytesOf(nil, 5, packedVarints(varintField(nil, 2, uint64(Int64)), 7, 1, 2, 3))))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			if m != nil {
				t.Fatal("non-nil model with an error")
			}
			return
		}
		walkGraph(m.Graph, 0)
	})
}

// walkGraph calls every accessor on every tensor and type of g and its
// subgraphs.
func walkGraph(g *Graph, depth int) {
	if depth > MaxGraphDepth {
		panic("subgraph nesting beyond MaxGraphDepth was accepted")
	}
	tensor := func(t *Tensor) {
		_, _ = t.Int64s()
		_, _ = t.Float64s()
		_, _ = t.External()
		_, _ = NumElements(t.Dims)
	}
	for i := range g.Initializers {
		tensor(&g.Initializers[i])
	}
	for _, vs := range [][]ValueInfo{g.Inputs, g.Outputs, g.ValueInfo} {
		for _, v := range vs {
			_, _ = v.Type.Static()
		}
	}
	for _, n := range g.Nodes {
		for _, a := range n.Attributes {
			if a.T != nil {
				tensor(a.T)
			}
			for i := range a.Tensors {
				tensor(&a.Tensors[i])
			}
			if a.G != nil {
				walkGraph(a.G, depth+1)
			}
			for _, sg := range a.Graphs {
				walkGraph(sg, depth+1)
			}
		}
	}
}
