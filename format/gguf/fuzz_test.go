package gguf

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzGGUF feeds arbitrary files to Parse. It must never panic, and whatever
// it accepts must be self-consistent: every tensor inside the file, aligned,
// sized by its type, and no two overlapping.
func FuzzGGUF(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("testdata", "tiny.gguf"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	for _, cut := range []int{0, 3, 4, 8, 16, 24, 40, 100, len(b) / 2, len(b) - 1} {
		if cut <= len(b) {
			f.Add(b[:cut])
		}
	}
	var e enc
	e.head(2, 2, 1).str("general.name").u32(uint32(TypeString)).str("hand")
	e.tensorInfo("b", 0, 64, 2, 3).tensorInfo("a", 8, 0, 32).padTo(32)
	e.Write(make([]byte, 96))
	f.Add(e.Bytes())

	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := Parse("fuzz", b)
		if err != nil {
			return
		}
		size := uint64(len(b))
		if g.Alignment == 0 || g.Alignment&(g.Alignment-1) != 0 {
			t.Fatalf("alignment %d", g.Alignment)
		}
		if len(g.TypeIDs) != len(g.Tensors) {
			t.Fatalf("%d type ids for %d tensors", len(g.TypeIDs), len(g.Tensors))
		}
		type iv struct{ b, e uint64 }
		var spans []iv
		for i, tt := range g.Tensors {
			ti, ok := TypeByID(g.TypeIDs[i])
			if !ok || ti.Removed || ti.Name != tt.DType {
				t.Fatalf("tensor %q: type id %d, dtype %s", tt.Name, g.TypeIDs[i], tt.DType)
			}
			if want, err := tensorBytes(ti, tt.Shape); err != nil || want != tt.Bytes {
				t.Fatalf("tensor %q: %d bytes, want %d (%v)", tt.Name, tt.Bytes, want, err)
			}
			if tt.Offset < g.DataStart || (tt.Offset-g.DataStart)%g.Alignment != 0 {
				t.Fatalf("tensor %q at %d: data starts at %d, alignment %d", tt.Name, tt.Offset, g.DataStart, g.Alignment)
			}
			if tt.Offset > size || tt.Bytes > size-tt.Offset {
				t.Fatalf("tensor %q [%d,+%d) outside a %d-byte file", tt.Name, tt.Offset, tt.Bytes, size)
			}
			if tt.Bytes > 0 {
				for _, s := range spans {
					if tt.Offset < s.e && s.b < tt.Offset+tt.Bytes {
						t.Fatalf("tensor %q overlaps [%d,%d)", tt.Name, s.b, s.e)
					}
				}
				spans = append(spans, iv{tt.Offset, tt.Offset + tt.Bytes})
			}
		}
	})
}
