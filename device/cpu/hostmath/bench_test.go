package hostmath

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkMatmul times products of decode shapes and reports the weight
// bytes read per second (GB/s): the figure a memory-bound product is
// judged by. Sub-benchmarks: variant, native (activations in the weights'
// dtype, as memwall's kernels take them) or f32 activations, dtype, shape,
// tokens, workers.
func BenchmarkMatmul(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	shapes := [][2]int{{4096, 4096}, {11008, 4096}}
	if testing.Short() {
		shapes = shapes[:1]
	}
	for _, sh := range shapes {
		M, K := sh[0], sh[1]
		for _, dt := range []DType{BF16, F16, F32} {
			w, _ := randWeights(r, dt, M*K, 0)
			for _, T := range []int{1, 8} {
				x := randF32(r, T*K, 0)
				xn := make([]byte, T*K*dt.Size())
				Narrow(xn, x, dt)
				y := make([]float32, T*M)
				for _, workers := range []int{1, 2} {
					run := NewRunner(workers)
					for _, k := range variants(b) {
						for _, native := range []bool{true, false} {
							if native && dt != BF16 {
								continue // the same kernels as f32 activations after a widening
							}
							act := "f32"
							if native {
								act = "native"
							}
							name := fmt.Sprintf("%v/%s/%v/%dx%d/T%d/workers%d", k.Variant(), act, dt, M, K, T, workers)
							b.Run(name, func(b *testing.B) {
								for b.Loop() {
									if native {
										k.MatmulNative(run, y, w, xn, dt, M, K, T)
									} else {
										k.Matmul(run, y, w, dt, x, M, K, T)
									}
								}
								b.ReportMetric(float64(len(w))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
								b.ReportMetric(float64(len(w))*float64(b.N)/b.Elapsed().Seconds()/1e9/float64(workers), "GB/s/core")
							})
						}
					}
					run.Close()
				}
			}
		}
	}
}

// BenchmarkRunner times an empty Run over the workers: the fixed cost each
// parallel kernel call pays.
func BenchmarkRunner(b *testing.B) {
	for _, workers := range []int{1, 2} {
		run := NewRunner(workers)
		b.Run(fmt.Sprintf("workers%d", workers), func(b *testing.B) {
			var sink [2]int
			for b.Loop() {
				run.Run(8, 4, func(lo, hi int) { sink[lo/4] += hi })
			}
		})
		run.Close()
	}
}
