package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/format"
)

// writeSharded writes shards (name → specs) and an index mapping every
// tensor to its shard, plus extra weight_map entries; it returns the index path.
func writeSharded(t *testing.T, dir string, shards map[string][]format.TensorSpec, extra map[string]string) string {
	t.Helper()
	wm := map[string]string{}
	for shard, specs := range shards {
		file, _ := buildFile(t, specs, map[string]string{"format": "pt"})
		if err := os.WriteFile(filepath.Join(dir, shard), file, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, s := range specs {
			wm[s.Name] = shard
		}
	}
	for k, v := range extra {
		wm[k] = v
	}
	ix, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 1234}, "weight_map": wm})
	p := filepath.Join(dir, "model.safetensors.index.json")
	if err := os.WriteFile(p, ix, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var shardSpecs = map[string][]format.TensorSpec{
	"model-00001-of-00002.safetensors": {
		{Name: "model.embed_tokens.weight", DType: "BF16", Shape: []uint64{8, 4}},
		{Name: "model.layers.0.self_attn.q_proj.weight", DType: "BF16", Shape: []uint64{4, 4}},
	},
	"model-00002-of-00002.safetensors": {
		{Name: "model.norm.weight", DType: "F32", Shape: []uint64{4}},
		{Name: "lm_head.weight", DType: "F8_E4M3", Shape: []uint64{8, 4}},
	},
}

func TestOpenIndex(t *testing.T) {
	dir := t.TempDir()
	p := writeSharded(t, dir, shardSpecs, nil)
	m, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if len(m.Tensors) != 4 {
		t.Fatalf("%d tensors, want 4", len(m.Tensors))
	}
	if got := m.Files(); len(got) != 2 {
		t.Fatalf("Files() = %v, want 2 shards", got)
	}
	if m.Metadata["total_size"] != uint64(1234) {
		t.Errorf("metadata total_size = %#v", m.Metadata["total_size"])
	}
	for shard, specs := range shardSpecs {
		raw, err := os.ReadFile(filepath.Join(dir, shard))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range specs {
			tt, ok := m.Tensor(s.Name)
			if !ok {
				t.Fatalf("tensor %q missing", s.Name)
			}
			if tt.File != filepath.Join(dir, shard) {
				t.Errorf("%s: File = %s", s.Name, tt.File)
			}
			if !bytes.Equal(m.Data(tt), raw[tt.Offset:tt.Offset+tt.Bytes]) {
				t.Errorf("%s: data differs from its shard", s.Name)
			}
		}
	}
}

func TestOpenIndexErrors(t *testing.T) {
	cases := []struct {
		name   string
		setup  func(t *testing.T, dir string) string
		want   []string // substrings the error must contain
		tensor string
	}{
		{"tensor missing from shard", func(t *testing.T, dir string) string {
			return writeSharded(t, dir, shardSpecs, map[string]string{"model.layers.9.mlp.up_proj.weight": "model-00002-of-00002.safetensors"})
		}, []string{"model.safetensors.index.json", "model-00002-of-00002.safetensors", "does not contain it"}, "model.layers.9.mlp.up_proj.weight"},
		{"shard file missing", func(t *testing.T, dir string) string {
			return writeSharded(t, dir, shardSpecs, map[string]string{"x": "model-00003-of-00002.safetensors"})
		}, []string{"model.safetensors.index.json", "model-00003-of-00002.safetensors"}, ""},
		{"shard escapes directory", func(t *testing.T, dir string) string {
			return writeSharded(t, dir, shardSpecs, map[string]string{"x": "../secret.safetensors"})
		}, []string{"model.safetensors.index.json", "../secret.safetensors", "not a file name inside"}, "x"},
		{"absolute shard", func(t *testing.T, dir string) string {
			return writeSharded(t, dir, shardSpecs, map[string]string{"x": "/etc/passwd"})
		}, []string{"not a file name inside"}, "x"},
		{"corrupt shard", func(t *testing.T, dir string) string {
			p := writeSharded(t, dir, shardSpecs, nil)
			shard := filepath.Join(dir, "model-00002-of-00002.safetensors")
			b, _ := os.ReadFile(shard)
			os.WriteFile(shard, b[:len(b)-3], 0o644)
			return p
		}, []string{"model.safetensors.index.json", "model-00002-of-00002.safetensors", "lm_head.weight", "past the end of the data section"}, "lm_head.weight"},
		{"no weight_map", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "model.safetensors.index.json")
			os.WriteFile(p, []byte(`{"metadata":{}}`), 0o644)
			return p
		}, []string{"weight_map: missing"}, ""},
		{"weight_map not strings", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "model.safetensors.index.json")
			os.WriteFile(p, []byte(`{"weight_map":{"a":3}}`), 0o644)
			return p
		}, []string{"want a shard file name"}, "a"},
		{"duplicate weight_map key", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "model.safetensors.index.json")
			os.WriteFile(p, []byte(`{"weight_map":{"a":"s","a":"t"}}`), 0o644)
			return p
		}, []string{"appears twice"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.setup(t, t.TempDir())
			m, err := Open(p)
			if err == nil {
				m.Close()
				t.Fatal("Open succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if c.tensor != "" {
				var fe *format.Error
				if !errors.As(err, &fe) || fe.Tensor != c.tensor {
					t.Errorf("error %q: want *format.Error naming tensor %q", err, c.tensor)
				}
			}
		})
	}
}
