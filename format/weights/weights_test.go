package weights

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/synth"
)

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	st, err := synth.WriteTiny(ctx, dir, synth.Safetensors)
	if err != nil {
		t.Fatal(err)
	}
	gg, err := synth.WriteTiny(ctx, dir, synth.GGUF)
	if err != nil {
		t.Fatal(err)
	}
	// A GGUF file whose name says nothing is still recognised.
	renamed := filepath.Join(dir, "weights.bin")
	b, _ := os.ReadFile(gg)
	os.WriteFile(renamed, b, 0o644)
	index := filepath.Join(dir, "sharded", "model.safetensors.index.json")
	os.Mkdir(filepath.Dir(index), 0o755)
	if _, err := synth.Generate(ctx, synth.Tiny(), index, synth.Options{Shards: 2}); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ path, format string }{
		{st, "safetensors"}, {gg, "gguf"}, {renamed, "gguf"}, {index, "safetensors"},
	}
	for _, c := range cases {
		t.Run(filepath.Base(c.path), func(t *testing.T) {
			m, err := Open(c.path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.Format != c.format {
				t.Errorf("format %q, want %q", m.Format, c.format)
			}
			if err := synth.Verify(m); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short.bin")
	os.WriteFile(short, []byte("GG"), 0o644)
	badGGUF := filepath.Join(dir, "bad.gguf")
	os.WriteFile(badGGUF, []byte("GGUF\x01\x00\x00\x00"), 0o644)
	for _, c := range []struct {
		path string
		want string
		kind error
	}{
		{filepath.Join(dir, "missing.safetensors"), "missing.safetensors", nil},
		{short, "shorter than the 8-byte length", format.ErrCorrupt},
		{badGGUF, "GGUF v1 is not supported", format.ErrUnsupported},
	} {
		_, err := Open(c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), filepath.Base(c.path)) {
			t.Errorf("Open(%s) = %v, want %q", c.path, err, c.want)
		}
		if c.kind != nil && !errors.Is(err, c.kind) {
			t.Errorf("Open(%s) = %v, not %v", c.path, err, c.kind)
		}
	}
}
