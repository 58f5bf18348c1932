package safetensors

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzSafetensorsHeader feeds arbitrary files to Parse. It must never panic,
// and whatever it accepts must be self-consistent: every tensor inside the
// file, after the header, and no two overlapping.
func FuzzSafetensorsHeader(f *testing.F) {
	for _, name := range []string{"tiny.safetensors", "reference-example.safetensors"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		for _, cut := range []int{0, 7, 8, 9, 20, len(b) / 2, len(b) - 1} {
			if cut <= len(b) {
				f.Add(b[:cut])
			}
		}
	}
	f.Add(rawFile(`{"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[16],"data_offsets":[8,24]}}`, make([]byte, 24)))
	f.Add(rawFile(`{"w":{"dtype":"F4","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, nil))
	f.Add(rawFile(`{"__metadata__":{"k":"v"},"e":{"dtype":"BOOL","shape":[0],"data_offsets":[0,0]}}`, nil))

	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := Parse("fuzz", b)
		if err != nil {
			return
		}
		size := uint64(len(b))
		if h.DataStart < 8 || h.DataStart > size {
			t.Fatalf("data start %d outside a %d-byte file", h.DataStart, size)
		}
		type iv struct{ b, e uint64 }
		var spans []iv
		for _, tt := range h.Tensors {
			if tt.Offset < h.DataStart || tt.Offset > size || tt.Bytes > size-tt.Offset {
				t.Fatalf("tensor %q [%d,+%d) outside data [%d,%d)", tt.Name, tt.Offset, tt.Bytes, h.DataStart, size)
			}
			want, err := TensorBytes(tt.DType, tt.Shape)
			if err != nil || want != tt.Bytes {
				t.Fatalf("tensor %q: %d bytes, TensorBytes says %d (%v)", tt.Name, tt.Bytes, want, err)
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
		if _, err := (Options{Strict: true}).Parse("fuzz", b); err == nil {
			var sum uint64
			for _, tt := range h.Tensors {
				sum += tt.Bytes
			}
			if sum != size-h.DataStart {
				t.Fatalf("strict accepted tensors of %d bytes in a %d-byte data section", sum, size-h.DataStart)
			}
		}
	})
}

// FuzzSafetensorsIndex feeds arbitrary index files to ParseIndex: it must
// never panic, and every shard it accepts must be a local file name.
func FuzzSafetensorsIndex(f *testing.F) {
	f.Add([]byte(`{"metadata":{"total_size":1234},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}`))
	f.Add([]byte(`{"weight_map":{"a":"../x"}}`))
	f.Add([]byte(`{"weight_map":{"a":"s","a":"t"}}`))
	f.Add([]byte(`{"metadata":{"n":-1.5e300,"s":"x","o":{"k":[1,2]}},"weight_map":{}}`))
	f.Add([]byte(`{"weight_map":`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ix, err := ParseIndex("fuzz.index.json", b)
		if err != nil {
			return
		}
		if ix.WeightMap == nil {
			t.Fatal("accepted an index without a weight map")
		}
		for name, shard := range ix.WeightMap {
			if !filepath.IsLocal(shard) {
				t.Fatalf("tensor %q: accepted shard %q", name, shard)
			}
		}
	})
}
