package synth

import (
	"encoding/binary"
	"fmt"
	"math"
	"testing"
)

// f16ToF32 decodes IEEE binary16, independently of the encoder under test.
func f16ToF32(h uint16) float32 {
	sign := float32(1)
	if h&0x8000 != 0 {
		sign = -1
	}
	e := int(h>>10) & 0x1F
	m := float32(h & 0x3FF)
	switch e {
	case 0:
		return sign * m * float32(math.Pow(2, -24))
	case 0x1F:
		if m != 0 {
			return float32(math.NaN())
		}
		return sign * float32(math.Inf(1))
	}
	return sign * (1 + m/1024) * float32(math.Pow(2, float64(e-15)))
}

func TestF32ToF16(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{0, 0x0000}, {float32(math.Copysign(0, -1)), 0x8000}, {1, 0x3C00}, {-2, 0xC000}, {0.5, 0x3800},
		{65504, 0x7BFF}, {65520, 0x7C00}, {1e6, 0x7C00}, {float32(math.Inf(-1)), 0xFC00},
		{0.1, 0x2E66}, {0.05, 0x2A66}, {6.103515625e-05, 0x0400}, // smallest normal
		{5.9604644775390625e-08, 0x0001}, // smallest subnormal
		{2.9802322387695312e-08, 0x0000}, // half of it: ties to even (0)
		{4.4703483581542969e-08, 0x0001}, // 0.75 of it rounds up
		{1 + 1.0/2048, 0x3C00},           // tie between 1 and 1+2^-10: even
		{1 + 3.0/2048, 0x3C02},           // tie: rounds up to even
		{float32(math.Float32frombits(0x7FC00000)), 0x7E00},
	}
	for _, c := range cases {
		if got := F32ToF16(c.in); got != c.want {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	// Every finite half converts back to itself.
	for h := 0; h < 1<<16; h++ {
		if h&0x7C00 == 0x7C00 {
			continue
		}
		if got := F32ToF16(f16ToF32(uint16(h))); got != uint16(h) {
			t.Fatalf("F32ToF16(f16ToF32(%#04x)) = %#04x", h, got)
		}
	}
}

func TestF32ToBF16(t *testing.T) {
	cases := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3F80}, {-2, 0xC000}, {0.05, 0x3D4D}, {math.Float32frombits(0x3F808000), 0x3F80}, // tie to even
		{math.Float32frombits(0x3F818000), 0x3F82}, {math.Float32frombits(0x3F808001), 0x3F81},
		{float32(math.NaN()), 0x7FC0},
	}
	for _, c := range cases {
		if got := F32ToBF16(c.in); got != c.want {
			t.Errorf("F32ToBF16(%g) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	for h := 0; h < 1<<16; h++ {
		f := math.Float32frombits(uint32(h) << 16)
		if f != f || math.IsInf(float64(f), 0) {
			continue
		}
		if got := F32ToBF16(f); got != uint16(h) {
			t.Fatalf("F32ToBF16 does not round-trip %#04x: %#04x", h, got)
		}
	}
}

// TestFillMatchesValue checks the fast path against the definition, for
// chunks starting at every alignment.
func TestFillMatchesValue(t *testing.T) {
	for _, dtype := range []string{"BF16", "F16", "F32"} {
		for _, mean := range []float32{0, 1} {
			t.Run(fmt.Sprintf("%s/mean=%g", dtype, mean), func(t *testing.T) {
				tn := Tensor{Name: "x", Key: "model.layers.3.mlp.up_proj.weight", DType: dtype, Shape: []uint64{103}, Mean: mean}
				size := 2
				if dtype == "F32" {
					size = 4
				}
				for first := uint64(0); first < 9; first++ {
					n := 103 - int(first)
					buf := make([]byte, n*size)
					if err := Expected(42, tn, first, buf); err != nil {
						t.Fatal(err)
					}
					for i := range n {
						v := Value(42, tn.Key, mean, first+uint64(i))
						var want, got uint32
						switch dtype {
						case "BF16":
							want, got = uint32(F32ToBF16(v)), uint32(binary.LittleEndian.Uint16(buf[2*i:]))
						case "F16":
							want, got = uint32(F32ToF16(v)), uint32(binary.LittleEndian.Uint16(buf[2*i:]))
						default:
							want, got = math.Float32bits(v), binary.LittleEndian.Uint32(buf[4*i:])
						}
						if got != want {
							t.Fatalf("first %d element %d: %#x, want %#x", first, i, got, want)
						}
					}
				}
			})
		}
	}
}

func TestValueDistribution(t *testing.T) {
	const n = 200000
	for _, mean := range []float32{0, 1} {
		var sum, sumSq float64
		lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
		for i := uint64(0); i < n; i++ {
			v := Value(7, "model.embed_tokens.weight", mean, i)
			lo, hi = min(lo, v), max(hi, v)
			d := float64(v - mean)
			sum += d
			sumSq += d * d
		}
		if lo <= mean-Amplitude || hi >= mean+Amplitude {
			t.Errorf("mean %g: values in [%g, %g], want strictly inside ±%g", mean, lo, hi, Amplitude)
		}
		if m := sum / n; math.Abs(m) > 0.0005 {
			t.Errorf("mean %g: sample mean offset %g", mean, m)
		}
		// Uniform on ±a has variance a²/3.
		if v, want := sumSq/n, Amplitude*Amplitude/3; math.Abs(v-want)/want > 0.02 {
			t.Errorf("mean %g: variance %g, want %g", mean, v, want)
		}
	}
	if Value(1, "a", 0, 5) == Value(2, "a", 0, 5) && Value(1, "a", 0, 6) == Value(2, "a", 0, 6) {
		t.Error("seed does not change values")
	}
	if Value(1, "a", 0, 5) == Value(1, "b", 0, 5) && Value(1, "a", 0, 6) == Value(1, "b", 0, 6) {
		t.Error("key does not change values")
	}
}

func TestExpectedErrors(t *testing.T) {
	if err := Expected(0, Tensor{Name: "x", DType: "I8"}, 0, make([]byte, 4)); err == nil {
		t.Error("dtype I8 accepted")
	}
	if err := Expected(0, Tensor{Name: "x", DType: "F32"}, 0, make([]byte, 6)); err == nil {
		t.Error("partial element accepted")
	}
}

// BenchmarkFill measures generation alone (one goroutine, no I/O).
func BenchmarkFill(b *testing.B) {
	for _, dtype := range []string{"BF16", "F32"} {
		b.Run(dtype, func(b *testing.B) {
			c, _ := newCodec(dtype, 0, Amplitude)
			buf := make([]byte, 8<<20)
			b.SetBytes(int64(len(buf)))
			for i := 0; b.Loop(); i++ {
				c.fill(buf, 12345, uint64(i)*uint64(len(buf)/c.size))
			}
		})
	}
}
