package quant

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/gguf"
)

// FuzzDequantize decodes arbitrary bytes as blocks of each type. It must
// never panic; data that is not whole blocks is an error; whole blocks
// decode, and Dot agrees with the decoded values.
func FuzzDequantize(f *testing.F) {
	for i, typ := range Quantized() {
		b, err := os.ReadFile(filepath.Join("testdata", "ggml", fixtureName(typ)+".random"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
		f.Add(uint8(i), b[:len(b)/2])
	}
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		typ := Quantized()[int(which)%len(Quantized())]
		be, bb := typ.BlockElems(), typ.BlockBytes()
		nb := len(b) / bb
		if len(b)%bb != 0 {
			if err := Dequantize(typ, make([]float32, (nb+1)*be), b); err == nil {
				t.Fatalf("%v: %d bytes decoded as %d blocks", typ, len(b), nb+1)
			}
		}
		b = b[:nb*bb]
		y := make([]float32, nb*be)
		if err := Dequantize(typ, y, b); err != nil {
			t.Fatalf("%v: %d whole blocks: %v", typ, nb, err)
		}
		x := make([]float32, len(y))
		for i := range x {
			x[i] = float32(i%5) - 2
		}
		got, err := Dot(typ, b, x)
		if err != nil {
			t.Fatal(err)
		}
		var want float64
		for i := range y {
			want += float64(y[i]) * float64(x[i])
		}
		if got != want && !(got != got && want != want) {
			t.Fatalf("%v: Dot %v, decoded values give %v", typ, got, want)
		}
	})
}

// FuzzQuantize quantizes arbitrary finite values with each type. It must
// never panic; values whose scales fit f16 come back within the type's
// bound of their block's range (and f16's smallest steps).
func FuzzQuantize(f *testing.F) {
	in, err := os.ReadFile(filepath.Join("testdata", "ggml", "input.f32"))
	if err != nil {
		f.Fatal(err)
	}
	for i := range Quantized() {
		for blk := 0; blk < len(in); blk += 1024 * 4 {
			f.Add(uint8(i), in[blk:blk+1024])
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		typ := Quantized()[int(which)%len(Quantized())]
		be := typ.BlockElems()
		x := make([]float32, len(b)/4/be*be)
		var amax float64
		first := -1
		for i := range x {
			v := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
			x[i] = v
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				if first < 0 {
					first = i
				}
				continue
			}
			amax = max(amax, math.Abs(float64(v)))
		}
		n, err := RowBytes(typ, len(x))
		if err != nil {
			t.Fatal(err)
		}
		q := make([]byte, n)
		if first >= 0 {
			var nf *NonFiniteError
			if err := Quantize(typ, q, x); !errors.As(err, &nf) || nf.Index != first {
				t.Fatalf("%v: element %d is %v: %v", typ, first, x[first], err)
			}
			return
		}
		if err := Quantize(typ, q, x); err != nil {
			t.Fatal(err)
		}
		y := make([]float32, len(x))
		if err := Dequantize(typ, y, q); err != nil {
			t.Fatal(err)
		}
		if amax > 6e4 {
			return // scales may overflow f16, as they do in ggml
		}
		for blk := 0; blk < len(x); blk += be {
			lo, hi := 0.0, 0.0
			for _, v := range x[blk : blk+be] {
				lo, hi = min(lo, float64(v)), max(hi, float64(v))
			}
			for i := blk; i < blk+be; i++ {
				if e := math.Abs(float64(y[i]) - float64(x[i])); !(e <= bound[typ]*(hi-lo)+0x1p-12) {
					t.Fatalf("%v: element %d: %g became %g (block range %g)", typ, i, x[i], y[i], hi-lo)
				}
			}
		}
	})
}

// FuzzGGUFQuantized parses arbitrary files as GGUF and decodes every tensor
// of a type this package codes. Neither may panic, and every tensor the
// parser accepts must decode: the parser's sizes and this package's agree.
func FuzzGGUFQuantized(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("testdata", "quantized.gguf"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	for _, cut := range []int{24, 100, len(b) / 2, len(b) - 1} {
		f.Add(b[:cut])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := gguf.Parse("fuzz", b)
		if err != nil {
			return
		}
		for i, tt := range g.Tensors {
			typ := Type(g.TypeIDs[i])
			if !typ.Known() {
				continue
			}
			y := make([]float32, tt.Elements()) // the parser has checked that the data is in the file
			if err := Dequantize(typ, y, b[tt.Offset:tt.Offset+tt.Bytes]); err != nil {
				t.Fatalf("tensor %q (%v %v): %v", tt.Name, typ, tt.Shape, err)
			}
		}
	})
}

// TestGGUFTypeTable: the block sizes here are the GGUF reader's.
func TestGGUFTypeTable(t *testing.T) {
	for _, typ := range Types() {
		ti, ok := gguf.TypeByID(uint32(typ))
		if !ok || ti.Name != typ.String() || ti.BlockElems != uint64(typ.BlockElems()) || ti.BlockBytes != uint64(typ.BlockBytes()) {
			t.Errorf("%v: gguf has %+v", typ, ti)
		}
	}
}

// TestWriteFuzzSeed regenerates testdata/quantized.gguf when
// MEMWALL_WRITE_SEED=1, and otherwise checks that it reads back: one small
// tensor of each quantized type and an F32 norm.
func TestWriteFuzzSeed(t *testing.T) {
	path := filepath.Join("testdata", "quantized.gguf")
	var specs []format.TensorSpec
	var data [][]byte
	in := floats(readFixture(t, "input.f32"))
	for _, typ := range Quantized() {
		n := 2 * typ.BlockElems()
		if typ.BlockElems() == 32 {
			n = 64
		}
		specs = append(specs, format.TensorSpec{Name: "t." + typ.String(), DType: typ.String(), Shape: []uint64{2, uint64(n / 2)}})
		q := make([]byte, n/typ.BlockElems()*typ.BlockBytes())
		if err := Quantize(typ, q, in[:n]); err != nil {
			t.Fatal(err)
		}
		data = append(data, q)
	}
	specs = append(specs, format.TensorSpec{Name: "norm.weight", DType: "F32", Shape: []uint64{8}})
	data = append(data, make([]byte, 32))
	var buf bytes.Buffer
	w, err := gguf.NewWriter(&buf, []gguf.KV{{Key: "general.architecture", Value: "llama"}}, specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range data {
		if _, err := w.Write(d); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("MEMWALL_WRITE_SEED") == "1" {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, buf.Bytes()) {
		t.Errorf("%s differs from what the writer makes now; regenerate it with MEMWALL_WRITE_SEED=1", path)
	}
}
