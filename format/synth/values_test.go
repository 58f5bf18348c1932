package synth

import (
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/memwall/memwall/half"
)

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
							want, got = uint32(half.F32ToBF16(v)), uint32(binary.LittleEndian.Uint16(buf[2*i:]))
						case "F16":
							want, got = uint32(half.F32ToF16(v)), uint32(binary.LittleEndian.Uint16(buf[2*i:]))
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
