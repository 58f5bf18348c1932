package quant

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The fixtures in testdata/ggml were written by ggml's own quantizers and
// dequantizers (see testdata/ggml/README.md). These tests hold this
// package to them bit for bit.

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "ggml", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func floats(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// fixtureName is ggml_type_name's spelling of t ("q4_K", "q8_0").
func fixtureName(t Type) string {
	n := strings.ToLower(t.String())
	return strings.TrimSuffix(n, "_k") + map[bool]string{true: "_K", false: ""}[strings.HasSuffix(n, "_k")]
}

// sameFloats compares bit patterns, counting any two NaNs as equal (their
// payloads depend on the hardware that computed them).
func sameFloats(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	bad := 0
	for i := range got {
		g, w := got[i], want[i]
		if math.Float32bits(g) == math.Float32bits(w) || g != g && w != w {
			continue
		}
		if bad++; bad <= 5 {
			t.Errorf("%s: element %d (block of 256 #%d) = %g (%#08x), ggml %g (%#08x)", what, i, i/256, g, math.Float32bits(g), w, math.Float32bits(w))
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d values differ in all", what, bad)
	}
}

func TestQuantizeMatchesGGML(t *testing.T) {
	x := floats(readFixture(t, "input.f32"))
	for _, typ := range Quantized() {
		t.Run(typ.String(), func(t *testing.T) {
			want := readFixture(t, fixtureName(typ)+".quant")
			got := make([]byte, len(want))
			if err := Quantize(typ, got, x); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				bb := typ.BlockBytes()
				for b := 0; b < len(want)/bb; b++ {
					g, w := got[b*bb:(b+1)*bb], want[b*bb:(b+1)*bb]
					if !bytes.Equal(g, w) {
						i := 0
						for g[i] == w[i] {
							i++
						}
						t.Errorf("block %d (input block of 256 #%d) differs from byte %d: %x, ggml %x", b, b*typ.BlockElems()/256, i, g, w)
					}
				}
			}
		})
	}
}

func TestDequantizeMatchesGGML(t *testing.T) {
	for _, typ := range Quantized() {
		t.Run(typ.String(), func(t *testing.T) {
			for _, f := range []string{"", ".random"} {
				src := readFixture(t, fixtureName(typ)+map[string]string{"": ".quant", ".random": ".random"}[f])
				want := floats(readFixture(t, fixtureName(typ)+map[string]string{"": ".dequant.f32", ".random": ".random.f32"}[f]))
				got := make([]float32, len(want))
				if err := Dequantize(typ, got, src); err != nil {
					t.Fatal(err)
				}
				sameFloats(t, "blocks"+f, got, want)
			}
		})
	}
}
