package quant

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkQuantize reports the reference quantizers' cost per element on
// weight-like rows of 4096.
func BenchmarkQuantize(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 4096*64)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 0.02)
	}
	for _, typ := range Quantized() {
		b.Run(typ.String(), func(b *testing.B) {
			n, _ := RowBytes(typ, len(x))
			dst := make([]byte, n)
			b.SetBytes(int64(4 * len(x)))
			for b.Loop() {
				if err := Quantize(typ, dst, x); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(x)), "ns/elem")
		})
	}
}

// BenchmarkDequantize reports the reference dequantizers' cost per element.
func BenchmarkDequantize(b *testing.B) {
	x := make([]float32, 4096*64)
	for i := range x {
		x[i] = float32(i%97) * 0.001
	}
	for _, typ := range Quantized() {
		b.Run(typ.String(), func(b *testing.B) {
			n, _ := RowBytes(typ, len(x))
			q := make([]byte, n)
			Quantize(typ, q, x)
			b.SetBytes(int64(n))
			for b.Loop() {
				if err := Dequantize(typ, x, q); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(x)), "ns/elem")
		})
	}
}
