package onnx_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/onnx"
	"github.com/memwall/memwall/format/onnx/onnxtest"
	"github.com/memwall/memwall/format/weights"
)

// initializer is a shorthand for onnxtest.Initializer.
type initializer = onnxtest.Initializer

func writeModel(t *testing.T, inits []initializer, data []byte) string {
	t.Helper()
	dir := t.TempDir()
	if data != nil {
		if err := os.WriteFile(filepath.Join(dir, "model.bin"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, "model.onnx")
	if err := os.WriteFile(p, onnxtest.Model(inits), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOpenWeights(t *testing.T) {
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	inline := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	p := writeModel(t, []initializer{
		{Name: "model.layers.0.self_attn.q_proj.weight", Dims: []int64{16, 32}, DataType: int32(onnx.BFloat16), Location: "model.bin", Offset: 0, Length: 1024},
		{Name: "model.layers.1.self_attn.q_proj.weight", Dims: []int64{16, 32}, DataType: int32(onnx.BFloat16), Location: "model.bin", Offset: 1024, Length: -1},
		{Name: "model.norm.weight", Dims: []int64{2}, DataType: int32(onnx.Float), RawData: inline},
		{Name: "shape_const", Dims: []int64{2}, DataType: int32(onnx.Float), FloatData: []float32{1, 2}},
	}, data)
	// The same call the streamer makes: by extension.
	m, err := weights.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Format != onnx.FormatName || len(m.Tensors) != 3 {
		t.Fatalf("format %q, %d tensors", m.Format, len(m.Tensors))
	}
	if m.Metadata["onnx.unmapped_initializers"] != 1 {
		t.Fatalf("metadata %v", m.Metadata)
	}
	for _, tc := range []struct {
		name string
		want []byte
	}{
		{"model.layers.0.self_attn.q_proj.weight", data[:1024]},
		{"model.layers.1.self_attn.q_proj.weight", data[1024:2048]},
		{"model.norm.weight", inline},
	} {
		ts, ok := m.Tensor(tc.name)
		if !ok {
			t.Fatalf("no tensor %s", tc.name)
		}
		if got := m.Data(ts); !bytes.Equal(got, tc.want) {
			t.Fatalf("%s: %d bytes differ from the file's", tc.name, len(got))
		}
	}
	if ts, _ := m.Tensor("model.layers.0.self_attn.q_proj.weight"); ts.DType != "BF16" || len(ts.Shape) != 2 || ts.Shape[1] != 32 {
		t.Fatalf("tensor %+v", ts)
	}
}

func TestOpenWeightsBadInput(t *testing.T) {
	data := make([]byte, 2048)
	ext := func(name string, off, n int64) initializer {
		return initializer{Name: name, Dims: []int64{16, 32}, DataType: int32(onnx.BFloat16), Location: "model.bin", Offset: off, Length: n}
	}
	cases := []struct {
		name  string
		inits []initializer
		data  []byte
		want  []string
	}{
		{"past the end", []initializer{ext("w", 1536, 1024)}, data, []string{`"w"`, "past the end", "truncated"}},
		{"length does not match dims", []initializer{ext("w", 0, 1000)}, data, []string{`"w"`, "length 1000", "1024 bytes"}},
		{"missing data file", []initializer{ext("w", 0, 1024)}, nil, []string{`"w"`, "model.bin"}},
		{"location leaves the folder", []initializer{{Name: "w", Dims: []int64{4}, DataType: int32(onnx.Float), Location: "../etc/passwd", Length: -1}}, data, []string{`"w"`, "leaves the model's folder"}},
		{"overlap", []initializer{ext("a", 0, 1024), ext("b", 512, 1024)}, data, []string{`"a"`, `"b"`, "overlap"}},
		{"string tensor", []initializer{{Name: "s", Dims: []int64{1}, DataType: int32(onnx.String), RawData: []byte("x")}}, data, []string{`"s"`, "not a streamable"}},
		{"raw size mismatch", []initializer{{Name: "r", Dims: []int64{3}, DataType: int32(onnx.Float), RawData: make([]byte, 8)}}, data, []string{`"r"`, "raw_data holds 8 bytes"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := writeModel(t, tc.inits, tc.data)
			m, err := onnx.OpenWeights(p)
			if err == nil {
				m.Close()
				t.Fatal("opened")
			}
			for _, w := range append(tc.want, p) {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// A truncated .onnx file is corrupt, not a panic.
	p := writeModel(t, []initializer{ext("w", 0, 1024)}, data)
	b, _ := os.ReadFile(p)
	if err := os.WriteFile(p, b[:len(b)-7], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := onnx.OpenWeights(p); !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("truncated model: %v", err)
	}
}

// The shared graphs point at external weights that are not shipped: opening
// their weights must say which file is missing.
func TestOpenWeightsSharedModelsWithoutData(t *testing.T) {
	_, err := onnx.OpenWeights("../../testdata/onnx/squeezenet1_1.onnx")
	if err == nil || !strings.Contains(err.Error(), "external data") {
		t.Fatalf("err %v", err)
	}
}

// FuzzOpenWeights feeds arbitrary bytes as a model file next to a small
// data file: opening must fail cleanly or give tensors whose bytes lie in
// their files.
func FuzzOpenWeights(f *testing.F) {
	ext := onnxtest.Initializer{Name: "w", Dims: []int64{16, 32}, DataType: int32(onnx.BFloat16), Location: "model.bin", Length: 1024}
	f.Add(onnxtest.Model([]onnxtest.Initializer{ext}))
	f.Add(onnxtest.Model([]onnxtest.Initializer{{Name: "r", Dims: []int64{2}, DataType: int32(onnx.Float), RawData: make([]byte, 8)}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, model []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "model.bin"), make([]byte, 4096), 0o644); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "model.onnx")
		if err := os.WriteFile(p, model, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := onnx.OpenWeights(p)
		if err != nil {
			return
		}
		defer m.Close()
		for _, ts := range m.Tensors {
			if b := m.Data(ts); uint64(len(b)) != ts.Bytes {
				t.Fatalf("tensor %q: %d bytes mapped, %d described", ts.Name, len(b), ts.Bytes)
			}
		}
	})
}
