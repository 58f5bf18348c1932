package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/memwall/memwall/format"
)

var update = flag.Bool("update", false, "rewrite testdata files from the writer")

// tinySpecs exercises every width class, sub-byte and F8 types included.
var tinySpecs = []format.TensorSpec{
	{Name: "embed.weight", DType: "BF16", Shape: []uint64{4, 3}},
	{Name: "scale", DType: "F32", Shape: []uint64{}},
	{Name: "fp8.weight", DType: "F8_E4M3", Shape: []uint64{2, 5}},
	{Name: "fp8.scale", DType: "F8_E8M0", Shape: []uint64{2}},
	{Name: "fp4.packed", DType: "F4", Shape: []uint64{2, 3}},
	{Name: "fp6", DType: "F6_E2M3", Shape: []uint64{4}},
	{Name: "ids", DType: "I64", Shape: []uint64{3}},
	{Name: "mask", DType: "BOOL", Shape: []uint64{0, 7}},
	{Name: "half", DType: "F16", Shape: []uint64{2, 2, 2}},
	{Name: "e5m2", DType: "F8_E5M2", Shape: []uint64{3}},
}

// buildFile writes specs with a deterministic byte pattern and returns the
// file and the layout.
func buildFile(t testing.TB, specs []format.TensorSpec, meta map[string]string) ([]byte, []format.Tensor) {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, specs, meta)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, w.DataBytes())
	for i := range data {
		data[i] = byte(i*7 + 3)
	}
	// Write in uneven pieces to exercise the streaming path.
	for len(data) > 0 {
		n := min(len(data), 5)
		if _, err := w.Write(data[:n]); err != nil {
			t.Fatal(err)
		}
		data = data[n:]
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), w.Tensors()
}

// rawFile assembles a file from a literal JSON header and a data section.
func rawFile(header string, data []byte) []byte {
	b := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

func TestTinyGolden(t *testing.T) {
	file, _ := buildFile(t, tinySpecs, map[string]string{"format": "pt", "note": "memwall test \"quoted\""})
	golden := filepath.Join("testdata", "tiny.safetensors")
	if *update {
		if err := os.WriteFile(golden, file, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(file, want) {
		t.Fatalf("writer output differs from %s (run with -update if the change is intended)", golden)
	}
}

func TestOpenRoundTrip(t *testing.T) {
	meta := map[string]string{"format": "pt"}
	file, layout := buildFile(t, tinySpecs, meta)
	path := filepath.Join(t.TempDir(), "tiny.safetensors")
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, strict := range []bool{false, true} {
		m, err := Options{Strict: strict}.Open(path)
		if err != nil {
			t.Fatalf("strict=%v: %v", strict, err)
		}
		if m.Format != "safetensors" || m.Path != path {
			t.Errorf("Format, Path = %q, %q", m.Format, m.Path)
		}
		if !reflect.DeepEqual(m.Metadata, map[string]any{"format": "pt"}) {
			t.Errorf("Metadata = %v", m.Metadata)
		}
		if len(m.Tensors) != len(tinySpecs) {
			t.Fatalf("%d tensors, want %d", len(m.Tensors), len(tinySpecs))
		}
		var total uint64
		for _, want := range layout {
			got, ok := m.Tensor(want.Name)
			if !ok {
				t.Fatalf("tensor %q missing", want.Name)
			}
			if got.DType != want.DType || got.Offset != want.Offset || got.Bytes != want.Bytes || got.File != path ||
				len(got.Shape) != len(want.Shape) || (len(want.Shape) > 0 && !reflect.DeepEqual(got.Shape, want.Shape)) {
				t.Errorf("tensor %q = %+v, want %+v", want.Name, got, want)
			}
			if d := m.Data(got); !bytes.Equal(d, file[want.Offset:want.Offset+want.Bytes]) {
				t.Errorf("tensor %q: Data returned %d bytes not matching the file", want.Name, len(d))
			}
			total += want.Bytes
		}
		if m.DataBytes != total {
			t.Errorf("DataBytes = %d, want %d", m.DataBytes, total)
		}
		for i := 1; i < len(m.Tensors); i++ {
			if m.Tensors[i].Offset < m.Tensors[i-1].Offset {
				t.Errorf("tensors not in storage order at %d", i)
			}
		}
		// Sizes the format fixes: F4 [2,3] = 3 bytes, F6 [4] = 3 bytes, BOOL [0,7] = 0.
		for name, want := range map[string]uint64{"fp4.packed": 3, "fp6": 3, "mask": 0, "scale": 4, "fp8.weight": 10} {
			if tt, _ := m.Tensor(name); tt.Bytes != want {
				t.Errorf("%s: %d bytes, want %d", name, tt.Bytes, want)
			}
		}
		if m.Data(format.Tensor{File: "elsewhere", Bytes: 1}) != nil {
			t.Error("Data of a foreign tensor is not nil")
		}
		if m.Data(format.Tensor{File: path, Offset: uint64(len(file)), Bytes: 1}) != nil {
			t.Error("Data past the mapping is not nil")
		}
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if d := m.Data(m.Tensors[0]); d != nil {
			t.Error("Data after Close is not nil")
		}
	}
}

// TestReferenceExample parses the example file from the reference
// implementation's documentation.
func TestReferenceExample(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "reference-example.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := Options{Strict: true}.Parse("ref", b)
	if err != nil {
		t.Fatal(err)
	}
	want := []format.Tensor{{Name: "test", DType: "I32", Shape: []uint64{2, 2}, Offset: 68, Bytes: 16, File: "ref"}}
	if !reflect.DeepEqual(h.Tensors, want) || h.DataStart != 68 {
		t.Fatalf("got %+v (data at %d), want %+v", h.Tensors, h.DataStart, want)
	}
}

func TestParseErrors(t *testing.T) {
	valid, layout := buildFile(t, tinySpecs[:3], nil)
	lastEnd := layout[len(layout)-1].Offset + layout[len(layout)-1].Bytes
	huge := make([]byte, 16)
	binary.LittleEndian.PutUint64(huge, 1<<62)
	over := make([]byte, 16)
	binary.LittleEndian.PutUint64(over, MaxHeaderBytes+1)

	cases := []struct {
		name   string
		file   []byte
		strict bool
		tensor string // tensor the error must name ("" = none required)
		want   string // substring of the message
		kind   error
	}{
		{"empty file", nil, false, "", "shorter than the 8-byte length", format.ErrCorrupt},
		{"truncated length", []byte{1, 0, 0}, false, "", "shorter than the 8-byte length", format.ErrCorrupt},
		{"header length past end", valid[:40], false, "", "runs past the end of the file", format.ErrCorrupt},
		{"header length absurd", huge, false, "", "exceeds the", format.ErrCorrupt},
		{"header length over limit", over, false, "", "exceeds the", format.ErrCorrupt},
		{"truncated data", valid[:lastEnd-1], false, layout[2].Name, "past the end of the data section", format.ErrCorrupt},
		{"invalid JSON", rawFile(`{"a":`, nil), false, "a", "unexpected end of JSON", format.ErrCorrupt},
		{"truncated key", rawFile(`{"a`, nil), false, "", "JSON", format.ErrCorrupt},
		{"not an object", rawFile(`[1,2]`, nil), false, "", "want an object", format.ErrCorrupt},
		{"trailing garbage", rawFile(`{} x`, nil), false, "", "JSON", format.ErrCorrupt},
		{"second object", rawFile(`{}{}`, nil), false, "", "after the closing brace", format.ErrCorrupt},
		{"invalid UTF-8", rawFile("{\"\xff\":1}", nil), false, "", "UTF-8", format.ErrCorrupt},
		{"duplicate tensor", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, make([]byte, 2)), false, "", `"w" appears twice`, format.ErrCorrupt},
		{"empty name", rawFile(`{"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, make([]byte, 1)), false, "", "empty tensor name", format.ErrCorrupt},
		{"unknown dtype", rawFile(`{"w":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}}`, make([]byte, 1)), false, "w", `"F7" is not a safetensors dtype`, format.ErrUnsupported},
		{"lower-case dtype", rawFile(`{"w":{"dtype":"bf16","shape":[1],"data_offsets":[0,2]}}`, make([]byte, 2)), false, "w", "not a safetensors dtype", format.ErrUnsupported},
		{"shape does not match range", rawFile(`{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}}`, make([]byte, 24)), false, "w", "spans 20 bytes but F32 [2 3] needs 24", format.ErrCorrupt},
		{"dtype does not match range", rawFile(`{"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,4]}}`, make([]byte, 8)), false, "w", "needs 8", format.ErrCorrupt},
		{"element count overflow", rawFile(`{"w":{"dtype":"U8","shape":[4294967296,4294967296,2],"data_offsets":[0,0]}}`, nil), false, "w", "overflows", format.ErrCorrupt},
		{"byte size overflow", rawFile(`{"w":{"dtype":"F64","shape":[4294967296,1073741824],"data_offsets":[0,0]}}`, nil), false, "w", "overflows", format.ErrCorrupt},
		{"sub-byte remainder", rawFile(`{"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, make([]byte, 2)), false, "w", "not a whole number of bytes", format.ErrCorrupt},
		{"begin after end", rawFile(`{"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}}`, make([]byte, 4)), false, "w", "begin 4 is after end 2", format.ErrCorrupt},
		{"end past data", rawFile(`{"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}`, make([]byte, 4)), false, "w", "past the end of the data section", format.ErrCorrupt},
		{"huge offsets", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}}`, make([]byte, 4)), false, "w", "past the end", format.ErrCorrupt},
		{"overlap", rawFile(`{"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},"b":{"dtype":"U8","shape":[16],"data_offsets":[8,24]}}`, make([]byte, 24)), false, "b", `overlaps tensor "a"`, format.ErrCorrupt},
		{"identical ranges", rawFile(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}}`, make([]byte, 4)), false, "b", "overlaps", format.ErrCorrupt},
		{"missing dtype", rawFile(`{"w":{"shape":[1],"data_offsets":[0,1]}}`, make([]byte, 1)), false, "w", "dtype: missing", format.ErrCorrupt},
		{"missing shape", rawFile(`{"w":{"dtype":"U8","data_offsets":[0,1]}}`, make([]byte, 1)), false, "w", "shape: missing", format.ErrCorrupt},
		{"missing offsets", rawFile(`{"w":{"dtype":"U8","shape":[1]}}`, make([]byte, 1)), false, "w", "data_offsets: missing", format.ErrCorrupt},
		{"three offsets", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}`, make([]byte, 2)), false, "w", "has 3 values", format.ErrCorrupt},
		{"negative dim", rawFile(`{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}`, make([]byte, 1)), false, "w", "entry", format.ErrCorrupt},
		{"fractional dim", rawFile(`{"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}`, make([]byte, 1)), false, "w", "entry", format.ErrCorrupt},
		{"entry not object", rawFile(`{"w":[1]}`, nil), false, "w", "entry", format.ErrCorrupt},
		{"metadata not strings", rawFile(`{"__metadata__":{"n":1}}`, nil), false, "", "__metadata__", format.ErrCorrupt},
		{"strict gap", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, make([]byte, 2)), true, "w", "tile", format.ErrCorrupt},
		{"strict trailing bytes", rawFile(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, make([]byte, 3)), true, "", "data section is 3 bytes", format.ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const file = "bad.safetensors"
			_, err := Options{Strict: c.strict}.Parse(file, c.file)
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			msg := err.Error()
			if !strings.Contains(msg, file) || !strings.Contains(msg, c.want) {
				t.Errorf("error %q: want it to name %s and contain %q", msg, file, c.want)
			}
			if c.tensor != "" && !strings.Contains(msg, `tensor "`+c.tensor+`"`) {
				t.Errorf("error %q does not name tensor %q", msg, c.tensor)
			}
			var fe *format.Error
			if !errors.As(err, &fe) || fe.File != file || fe.Tensor != c.tensor {
				t.Errorf("error %#v: want *format.Error with File %q, Tensor %q", err, file, c.tensor)
			}
			if !errors.Is(err, c.kind) {
				t.Errorf("error %q is not %v", msg, c.kind)
			}
		})
	}
}

func TestLenientAcceptsGapsAndEmptyTensors(t *testing.T) {
	f := rawFile(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"e":{"dtype":"F32","shape":[0],"data_offsets":[5,5]},"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, make([]byte, 9))
	h, err := Parse("gaps", f)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Tensors) != 3 || h.Tensors[0].Name != "a" || h.Tensors[0].Offset != h.DataStart+4 {
		t.Fatalf("tensors %+v", h.Tensors)
	}
}

func TestWriterErrors(t *testing.T) {
	cases := []struct {
		name  string
		specs []format.TensorSpec
		want  string
	}{
		{"empty name", []format.TensorSpec{{Name: "", DType: "U8"}}, "empty name"},
		{"reserved name", []format.TensorSpec{{Name: "__metadata__", DType: "U8"}}, "reserved"},
		{"duplicate", []format.TensorSpec{{Name: "a", DType: "U8"}, {Name: "a", DType: "U8"}}, "duplicate"},
		{"unknown dtype", []format.TensorSpec{{Name: "a", DType: "Q4_K"}}, "unknown"},
		{"odd F4", []format.TensorSpec{{Name: "a", DType: "F4", Shape: []uint64{1}}}, "whole number"},
		{"overflow", []format.TensorSpec{{Name: "a", DType: "U8", Shape: []uint64{1 << 63}}, {Name: "b", DType: "U8", Shape: []uint64{1 << 63}}}, "overflows"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewWriter(&bytes.Buffer{}, c.specs, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	t.Run("write past end", func(t *testing.T) {
		var buf bytes.Buffer
		w, err := NewWriter(&buf, []format.TensorSpec{{Name: "a", DType: "U8", Shape: []uint64{2}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(make([]byte, 3)); err == nil {
			t.Fatal("write past end succeeded")
		}
		if err := w.Close(); err == nil {
			t.Fatal("Close after failed write succeeded")
		}
	})
	t.Run("short", func(t *testing.T) {
		w, err := NewWriter(&bytes.Buffer{}, []format.TensorSpec{{Name: "a", DType: "U8", Shape: []uint64{2}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte{1})
		if err := w.Close(); err == nil || !strings.Contains(err.Error(), "1 of 2") {
			t.Fatalf("Close = %v", err)
		}
	})
}

func TestOpenMissingFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "none.safetensors")
	if _, err := Open(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("err = %v", err)
	}
}
