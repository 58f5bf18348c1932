package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/memwall/memwall/format"
)

var update = flag.Bool("update", false, "rewrite testdata files from the writer")

// enc builds GGUF bytes by hand, independently of Writer, so tests can make
// files the writer refuses to.
type enc struct{ bytes.Buffer }

func (e *enc) u32(v uint32) *enc  { e.Write(binary.LittleEndian.AppendUint32(nil, v)); return e }
func (e *enc) u64(v uint64) *enc  { e.Write(binary.LittleEndian.AppendUint64(nil, v)); return e }
func (e *enc) str(s string) *enc  { e.u64(uint64(len(s))); e.WriteString(s); return e }
func (e *enc) raw(b ...byte) *enc { e.Write(b); return e }
func (e *enc) head(version uint32, tensors, kvs uint64) *enc {
	e.WriteString("GGUF")
	return e.u32(version).u64(tensors).u64(kvs)
}

// tensorInfo appends one tensor info with dims given innermost-first.
func (e *enc) tensorInfo(name string, typ uint32, off uint64, ne ...uint64) *enc {
	e.str(name).u32(uint32(len(ne)))
	for _, d := range ne {
		e.u64(d)
	}
	return e.u32(typ).u64(off)
}

func (e *enc) padTo(a int) *enc {
	for e.Len()%a != 0 {
		e.WriteByte(0)
	}
	return e
}

var tinyKVs = []KV{
	{"general.architecture", "llama"},
	{"general.alignment", uint32(64)},
	{"u8", uint8(200)}, {"i8", int8(-3)}, {"u16", uint16(65000)}, {"i16", int16(-300)},
	{"u32", uint32(1 << 31)}, {"i32", int32(-70000)}, {"f32", float32(1.5)}, {"yes", true}, {"no", false},
	{"u64", uint64(1 << 40)}, {"i64", int64(-1 << 40)}, {"f64", math.Pi}, {"empty", ""},
	{"tokens", []string{"<s>", "</s>", "héllo"}}, {"scores", []float32{0, -1.25}}, {"types", []int32{1, 3}},
	{"bytes", []uint8{1, 2, 3}}, {"flags", []bool{true, false}}, {"i8s", []int8{-1}}, {"u16s", []uint16{9}},
	{"i16s", []int16{-9}}, {"u32s", []uint32{}}, {"u64s", []uint64{7}}, {"i64s", []int64{-7}}, {"f64s", []float64{2.5}},
	{"nested", []any{[]uint32{1, 2}, []uint32{3}}},
	{"nested2", []any{[]any{[]string{"deep"}}}},
}

var tinySpecs = []format.TensorSpec{
	{Name: "token_embd.weight", DType: "F16", Shape: []uint64{5, 8}},
	{Name: "blk.0.attn_q.weight", DType: "Q4_K", Shape: []uint64{2, 256}},
	{Name: "blk.0.ffn_down.weight", DType: "Q8_0", Shape: []uint64{3, 64}},
	{Name: "blk.0.attn_norm.weight", DType: "F32", Shape: []uint64{8}},
	{Name: "blk.0.moe.weight", DType: "MXFP4", Shape: []uint64{2, 1, 32}},
	{Name: "empty", DType: "BF16", Shape: []uint64{0, 4}},
	{Name: "output.weight", DType: "IQ2_XS", Shape: []uint64{256}},
}

func buildFile(t testing.TB, kvs []KV, specs []format.TensorSpec) ([]byte, []format.Tensor) {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, kvs, specs)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, w.DataBytes())
	for i := range data {
		data[i] = byte(i*13 + 1)
	}
	for len(data) > 0 {
		n := min(len(data), 37)
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

func TestTypeTable(t *testing.T) {
	// Bytes per block as ggml's block structs lay them out, written as
	// plain numbers to check the formulas in the table.
	want := map[string][2]uint64{
		"F32": {1, 4}, "F16": {1, 2}, "BF16": {1, 2}, "F64": {1, 8}, "I8": {1, 1}, "I16": {1, 2}, "I32": {1, 4}, "I64": {1, 8},
		"Q4_0": {32, 18}, "Q4_1": {32, 20}, "Q5_0": {32, 22}, "Q5_1": {32, 24}, "Q8_0": {32, 34}, "Q8_1": {32, 40},
		"Q2_K": {256, 84}, "Q3_K": {256, 110}, "Q4_K": {256, 144}, "Q5_K": {256, 176}, "Q6_K": {256, 210}, "Q8_K": {256, 292},
		"IQ2_XXS": {256, 66}, "IQ2_XS": {256, 74}, "IQ3_XXS": {256, 98}, "IQ1_S": {256, 50}, "IQ4_NL": {32, 18},
		"IQ3_S": {256, 110}, "IQ2_S": {256, 82}, "IQ4_XS": {256, 136}, "IQ1_M": {256, 56},
		"TQ1_0": {256, 54}, "TQ2_0": {256, 66}, "MXFP4": {32, 17}, "NVFP4": {64, 36}, "Q1_0": {128, 18},
	}
	ids := map[string]uint32{"F32": 0, "Q4_K": 12, "BF16": 30, "TQ1_0": 34, "MXFP4": 39, "I8": 24, "IQ1_M": 29}
	got := Types()
	if len(got) != len(want) {
		t.Errorf("%d supported types, want %d", len(got), len(want))
	}
	for i, ti := range types {
		if ti.ID != uint32(i) {
			t.Fatalf("table entry %d has id %d", i, ti.ID)
		}
	}
	for _, ti := range got {
		w, ok := want[ti.Name]
		if !ok {
			t.Errorf("unexpected type %s", ti.Name)
			continue
		}
		if ti.BlockElems != w[0] || ti.BlockBytes != w[1] {
			t.Errorf("%s: block %d elems / %d bytes, want %d / %d", ti.Name, ti.BlockElems, ti.BlockBytes, w[0], w[1])
		}
		if id, ok := ids[ti.Name]; ok && id != ti.ID {
			t.Errorf("%s: id %d, want %d", ti.Name, ti.ID, id)
		}
		if back, ok := TypeByName(ti.Name); !ok || back != ti {
			t.Errorf("TypeByName(%s) = %v, %v", ti.Name, back, ok)
		}
	}
	if _, ok := TypeByName("Q4_0_4_4"); ok {
		t.Error("removed type found by name")
	}
}

func TestTinyGolden(t *testing.T) {
	file, _ := buildFile(t, tinyKVs, tinySpecs)
	golden := filepath.Join("testdata", "tiny.gguf")
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
	file, layout := buildFile(t, tinyKVs, tinySpecs)
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := os.WriteFile(path, file, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(path, file)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 3 || f.Alignment != 64 || f.DataStart%64 != 0 {
		t.Errorf("version %d alignment %d data start %d", f.Version, f.Alignment, f.DataStart)
	}
	if len(f.Metadata) != len(tinyKVs) {
		t.Fatalf("%d key/values, want %d", len(f.Metadata), len(tinyKVs))
	}
	for i, kv := range tinyKVs {
		if !reflect.DeepEqual(f.Metadata[i], kv) {
			t.Errorf("key/value %d = %#v, want %#v", i, f.Metadata[i], kv)
		}
	}
	if v, ok := f.Lookup("general.architecture"); !ok || v != "llama" {
		t.Errorf("Lookup = %v, %v", v, ok)
	}
	m, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Format != "gguf" || m.Metadata["llama"] != nil || m.Metadata["general.architecture"] != "llama" {
		t.Errorf("model %q metadata %v", m.Format, m.Metadata["general.architecture"])
	}
	wantBytes := map[string]uint64{
		"token_embd.weight": 80, "blk.0.attn_q.weight": 2 * 144, "blk.0.ffn_down.weight": 3 * 2 * 34,
		"blk.0.attn_norm.weight": 32, "blk.0.moe.weight": 2 * 17, "empty": 0, "output.weight": 74,
	}
	for i, want := range layout {
		got, ok := m.Tensor(want.Name)
		if !ok {
			t.Fatalf("tensor %q missing", want.Name)
		}
		if got.DType != want.DType || got.Offset != want.Offset || got.Bytes != want.Bytes || !reflect.DeepEqual(got.Shape, tinySpecs[i].Shape) {
			t.Errorf("tensor %q = %+v, want %+v", want.Name, got, want)
		}
		if got.Bytes != wantBytes[want.Name] {
			t.Errorf("tensor %q: %d bytes, want %d", want.Name, got.Bytes, wantBytes[want.Name])
		}
		if got.Offset%64 != 0 {
			t.Errorf("tensor %q at %d, not 64-aligned", want.Name, got.Offset)
		}
		if !bytes.Equal(m.Data(got), file[want.Offset:want.Offset+want.Bytes]) {
			t.Errorf("tensor %q: Data differs from the file", want.Name)
		}
	}
	if uint64(len(file))%64 != 0 {
		t.Errorf("file is %d bytes, not padded to the alignment", len(file))
	}
}

// TestHandBuilt parses a file assembled byte by byte from the specification,
// not by Writer: v2, default alignment, a tensor listed out of data order.
func TestHandBuilt(t *testing.T) {
	var e enc
	e.head(2, 2, 1)
	e.str("general.name").u32(uint32(TypeString)).str("hand")
	e.tensorInfo("b", 0, 64, 2, 3) // F32, ne = [2, 3] → shape [3, 2], 24 bytes at 64
	e.tensorInfo("a", 8, 0, 32)    // Q8_0, one block of 34 bytes at 0
	e.padTo(32)
	start := e.Len()
	e.Write(bytes.Repeat([]byte{0xAA}, 34))
	e.padTo(32)
	e.Write(bytes.Repeat([]byte{0xBB}, 24))
	f, err := Parse("hand.gguf", e.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	want := []format.Tensor{
		{Name: "b", DType: "F32", Shape: []uint64{3, 2}, Offset: uint64(start + 64), Bytes: 24, File: "hand.gguf"},
		{Name: "a", DType: "Q8_0", Shape: []uint64{32}, Offset: uint64(start), Bytes: 34, File: "hand.gguf"},
	}
	if !reflect.DeepEqual(f.Tensors, want) || f.Version != 2 || f.Alignment != 32 || !reflect.DeepEqual(f.TypeIDs, []uint32{0, 8}) {
		t.Fatalf("got %+v (v%d, align %d, ids %v)\nwant %+v", f.Tensors, f.Version, f.Alignment, f.TypeIDs, want)
	}
}

func TestParseErrors(t *testing.T) {
	valid, layout := buildFile(t, nil, tinySpecs[:2])
	last := layout[len(layout)-1]
	kv := func(key string, vt ValueType, body ...byte) []byte {
		var e enc
		e.head(3, 0, 1).str(key).u32(uint32(vt)).raw(body...)
		return e.Bytes()
	}
	arr := func(et ValueType, n uint64, body ...byte) []byte {
		var e enc
		e.u32(uint32(et)).u64(n).raw(body...)
		return e.Bytes()
	}
	nested := func(depth int) []byte {
		var e enc
		e.head(3, 0, 1).str("deep").u32(uint32(TypeArray))
		for range depth - 1 {
			e.u32(uint32(TypeArray)).u64(1)
		}
		e.u32(uint32(TypeUint8)).u64(1).raw(7)
		return e.Bytes()
	}
	tensor := func(name string, typ uint32, off uint64, data int, ne ...uint64) []byte {
		var e enc
		e.head(3, 1, 0).tensorInfo(name, typ, off, ne...).padTo(32)
		e.Write(make([]byte, data))
		return e.Bytes()
	}
	two := func(offA, offB uint64) []byte {
		var e enc
		e.head(3, 2, 0).tensorInfo("a", 0, offA, 16).tensorInfo("b", 0, offB, 16).padTo(32)
		e.Write(make([]byte, 128))
		return e.Bytes()
	}
	var hugeTensors, hugeKVs enc
	hugeTensors.head(3, 1<<60, 0)
	hugeKVs.head(3, 0, 1<<60)
	var dupTensor enc
	dupTensor.head(3, 2, 0).tensorInfo("w", 0, 0, 1).tensorInfo("w", 0, 32, 1).padTo(32).Write(make([]byte, 64))
	var dupKey enc
	dupKey.head(3, 0, 2).str("k").u32(uint32(TypeUint8)).raw(1).str("k").u32(uint32(TypeUint8)).raw(2)

	cases := []struct {
		name   string
		file   []byte
		tensor string
		want   string
		kind   error
	}{
		{"empty file", nil, "", "truncated", format.ErrCorrupt},
		{"bad magic", []byte("GGML\x03\x00\x00\x00"), "", "not a GGUF file", format.ErrCorrupt},
		{"version 1", (&enc{}).head(1, 0, 0).Bytes(), "", "GGUF v1 is not supported", format.ErrUnsupported},
		{"big-endian", append([]byte("GGUF"), 0, 0, 0, 3), "", "big-endian", format.ErrUnsupported},
		{"version 4", (&enc{}).head(4, 0, 0).Bytes(), "", "version 4", format.ErrUnsupported},
		{"version 0", (&enc{}).head(0, 0, 0).Bytes(), "", "version 0", format.ErrCorrupt},
		{"truncated counts", valid[:12], "", "truncated", format.ErrCorrupt},
		{"2^60 tensors", hugeTensors.Bytes(), "", "tensor_count", format.ErrCorrupt},
		{"2^60 key/values", hugeKVs.Bytes(), "", "cannot fit", format.ErrCorrupt},
		{"key length past end", (&enc{}).head(3, 0, 1).u64(1 << 62).u64(0).Bytes(), "", "truncated", format.ErrCorrupt},
		{"truncated value", kv("k", TypeUint64, 1, 2, 3), "", "uint64 value", format.ErrCorrupt},
		{"string past end", kv("k", TypeString, binary.LittleEndian.AppendUint64(nil, 1000)...), "", "string value", format.ErrCorrupt},
		{"array count 2^60", kv("k", TypeArray, arr(TypeUint32, 1<<60)...), "", "cannot fit", format.ErrCorrupt},
		{"string array count 2^60", kv("k", TypeArray, arr(TypeString, 1<<60)...), "", "cannot fit", format.ErrCorrupt},
		{"array of unknown type", kv("k", TypeArray, arr(ValueType(77), 1, 0)...), "", "element type 77", format.ErrCorrupt},
		{"nested too deep", nested(MaxArrayDepth + 1), "", "nested more than", format.ErrCorrupt},
		{"bool is 2", kv("k", TypeBool, 2), "", "neither 0 nor 1", format.ErrCorrupt},
		{"bool array element is 5", kv("k", TypeArray, arr(TypeBool, 2, 1, 5)...), "", "neither 0 nor 1", format.ErrCorrupt},
		{"unknown value type", kv("k", ValueType(13), 0), "", "not a GGUF type", format.ErrCorrupt},
		{"duplicate key", dupKey.Bytes(), "", "key appears twice", format.ErrCorrupt},
		{"alignment not uint32", kv("general.alignment", TypeUint64, binary.LittleEndian.AppendUint64(nil, 32)...), "", "want a uint32", format.ErrCorrupt},
		{"alignment not power of two", kv("general.alignment", TypeUint32, 48, 0, 0, 0), "", "not a power of two", format.ErrCorrupt},
		{"five dims", tensor("w", 0, 0, 32, 1, 1, 1, 1, 1), "w", "5 dimensions", format.ErrCorrupt},
		{"dims overflow", tensor("w", 0, 0, 32, 1<<32, 1<<32), "w", "overflows", format.ErrCorrupt},
		{"unknown ggml type", tensor("blk.0.attn_q.weight", 99, 0, 32, 32), "blk.0.attn_q.weight", "ggml type id 99 is unknown", format.ErrUnsupported},
		{"removed ggml type", tensor("w", 31, 0, 32, 32), "w", "Q4_0_4_4", format.ErrUnsupported},
		{"row not whole blocks", tensor("w", 12, 0, 1000, 100, 2), "w", "ne[0]=100 is not a multiple of the Q4_K block size 256", format.ErrCorrupt},
		{"misaligned offset", tensor("w", 0, 4, 64, 4), "w", "not a multiple of the alignment 32", format.ErrCorrupt},
		{"data past end", tensor("w", 0, 0, 15, 4), "w", "runs past the end", format.ErrCorrupt},
		{"offset past end", tensor("w", 0, 1<<40, 16, 4), "w", "runs past the end", format.ErrCorrupt},
		{"truncated data", valid[:last.Offset+last.Bytes-1], last.Name, "runs past the end", format.ErrCorrupt},
		{"overlap", two(0, 32), "b", `overlaps tensor "a"`, format.ErrCorrupt}, // a is [0,64)
		{"duplicate tensor", dupTensor.Bytes(), "w", "appears twice", format.ErrCorrupt},
		{"empty tensor name", tensor("", 0, 0, 32, 4), "", "empty tensor name", format.ErrCorrupt},
		{"tensor info truncated", (&enc{}).head(3, 1, 0).str("w").u32(2).u64(4).u64(4).Bytes(), "w", "truncated", format.ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const file = "bad.gguf"
			_, err := Parse(file, c.file)
			if err == nil {
				t.Fatal("Parse succeeded")
			}
			msg := err.Error()
			if !strings.Contains(msg, file) || !strings.Contains(msg, c.want) {
				t.Errorf("error %q: want it to name %s and contain %q", msg, file, c.want)
			}
			var fe *format.Error
			if !errors.As(err, &fe) || fe.Tensor != c.tensor {
				t.Errorf("error %q: want *format.Error naming tensor %q", msg, c.tensor)
			}
			if c.tensor != "" && !strings.Contains(msg, `tensor "`+c.tensor+`"`) {
				t.Errorf("error %q does not name tensor %q", msg, c.tensor)
			}
			if !errors.Is(err, c.kind) {
				t.Errorf("error %q is not %v", msg, c.kind)
			}
		})
	}
}

func TestWriterErrors(t *testing.T) {
	cases := []struct {
		name  string
		kvs   []KV
		specs []format.TensorSpec
		want  string
	}{
		{"duplicate key", []KV{{"a", uint8(1)}, {"a", uint8(2)}}, nil, "duplicate"},
		{"bad value type", []KV{{"a", 3}}, nil, "cannot be stored"},
		{"mixed nested", []KV{{"a", []any{[]uint8{1}, "x"}}}, nil, "homogeneous"},
		{"bad alignment", []KV{{"general.alignment", uint32(3)}}, nil, "power of two"},
		{"unknown type", nil, []format.TensorSpec{{Name: "w", DType: "Q9_K", Shape: []uint64{256}}}, "unknown ggml type"},
		{"partial block", nil, []format.TensorSpec{{Name: "w", DType: "Q4_0", Shape: []uint64{2, 16}}}, "block size 32"},
		{"five dims", nil, []format.TensorSpec{{Name: "w", DType: "F32", Shape: []uint64{1, 1, 1, 1, 1}}}, "dims"},
		{"duplicate tensor", nil, []format.TensorSpec{{Name: "w", DType: "F32"}, {Name: "w", DType: "F32"}}, "duplicate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewWriter(&bytes.Buffer{}, c.kvs, c.specs)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	t.Run("write past end", func(t *testing.T) {
		w, err := NewWriter(&bytes.Buffer{}, nil, []format.TensorSpec{{Name: "w", DType: "I8", Shape: []uint64{2}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(make([]byte, 3)); err == nil {
			t.Fatal("write past end succeeded")
		}
	})
	t.Run("short", func(t *testing.T) {
		w, err := NewWriter(&bytes.Buffer{}, nil, []format.TensorSpec{{Name: "w", DType: "I8", Shape: []uint64{2}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err == nil || !strings.Contains(err.Error(), "0 of 2") {
			t.Fatalf("Close = %v", err)
		}
	})
}

func TestMetadataLimit(t *testing.T) {
	file, _ := buildFile(t, tinyKVs, tinySpecs[:1])
	if _, err := parse("limit.gguf", file, 1<<20); err != nil {
		t.Fatalf("under the limit: %v", err)
	}
	_, err := parse("limit.gguf", file, 100)
	if err == nil || !strings.Contains(err.Error(), "over the 100-byte limit") || !errors.Is(err, format.ErrCorrupt) {
		t.Fatalf("over the limit: err = %v", err)
	}
}

func TestSetDelete(t *testing.T) {
	kvs := []KV{{"a", uint32(1)}, {"b", "x"}}
	got := Set(kvs, "a", uint32(2))
	if len(got) != 2 || got[1] != (KV{"a", uint32(2)}) || got[0].Key != "b" || kvs[0].Value != uint32(1) {
		t.Errorf("Set of a present key moves it to the end, as llama.cpp does: %v (source %v)", got, kvs)
	}
	got = Set(kvs, "c", true)
	if len(got) != 3 || got[2] != (KV{"c", true}) {
		t.Errorf("Set appended: %v", got)
	}
	got = Delete(got, func(k string) bool { return k == "b" })
	if len(got) != 2 || got[0].Key != "a" || got[1].Key != "c" || len(kvs) != 2 {
		t.Errorf("Delete: %v", got)
	}
}
