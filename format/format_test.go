package format

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/memwall/memwall/format/mmap"
)

func TestErrorMessage(t *testing.T) {
	cases := []struct {
		err  *Error
		want string
	}{
		{&Error{Format: "safetensors", File: "m.safetensors", Tensor: "lm_head.weight", Field: "data_offsets", Reason: "end 9 past 8", Kind: ErrCorrupt},
			`safetensors m.safetensors: tensor "lm_head.weight": data_offsets: end 9 past 8`},
		{&Error{Format: "gguf", File: "m.gguf", Field: "version", Reason: "v1", Kind: ErrUnsupported}, `gguf m.gguf: version: v1`},
		{&Error{Format: "gguf", File: "m.gguf", Reason: "bad", Kind: ErrCorrupt}, `gguf m.gguf: bad`},
	}
	for _, c := range cases {
		if got := c.err.Error(); got != c.want {
			t.Errorf("Error() = %q, want %q", got, c.want)
		}
		if !errors.Is(c.err, c.err.Kind) {
			t.Errorf("%q does not unwrap to its kind", c.want)
		}
	}
}

func TestModel(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, []byte("0123456789"), 0o644)
	os.WriteFile(b, []byte("abcdef"), 0o644)
	ma, err := mmap.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := mmap.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	tensors := []Tensor{
		{Name: "b1", File: b, Offset: 2, Bytes: 3, Shape: []uint64{3}},
		{Name: "a2", File: a, Offset: 5, Bytes: 5, Shape: []uint64{5, 1}},
		{Name: "a1", File: a, Offset: 0, Bytes: 4, Shape: []uint64{2, 2}},
	}
	m := NewModel("model", "test", tensors, nil, map[string]*mmap.Mapping{a: ma, b: mb})
	if m.Metadata == nil || m.DataBytes != 12 {
		t.Errorf("metadata %v, data bytes %d", m.Metadata, m.DataBytes)
	}
	var order []string
	for _, tt := range m.Tensors {
		order = append(order, tt.Name)
	}
	if want := []string{"a1", "a2", "b1"}; !slices.Equal(order, want) {
		t.Errorf("order %v, want %v", order, want)
	}
	for name, want := range map[string]string{"a1": "0123", "a2": "56789", "b1": "cde"} {
		tt, ok := m.Tensor(name)
		if !ok || string(m.Data(tt)) != want {
			t.Errorf("%s: %q, want %q", name, m.Data(tt), want)
		}
	}
	if tt, _ := m.Tensor("a1"); tt.Elements() != 4 {
		t.Errorf("Elements = %d", tt.Elements())
	}
	if _, ok := m.Tensor("zz"); ok {
		t.Error("found a tensor that does not exist")
	}
	for _, bad := range []Tensor{
		{File: "elsewhere", Bytes: 1},
		{File: a, Offset: 8, Bytes: 3},
		{File: a, Offset: 11},
		{File: a, Offset: ^uint64(0), Bytes: 2},
		{File: a, Offset: 2, Bytes: ^uint64(0)},
	} {
		if d := m.Data(bad); d != nil {
			t.Errorf("Data(%+v) = %q, want nil", bad, d)
		}
	}
	if got := m.Files(); !slices.Equal(got, []string{a, b}) {
		t.Errorf("Files() = %v", got)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if d := m.Data(m.Tensors[0]); d != nil {
		t.Error("Data after Close")
	}
}
