package hostmath

import (
	"fmt"
	"math/rand/v2"
	"runtime"
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

// BenchmarkMatmulCold is BenchmarkMatmul's bf16 4096×4096 product over 16
// different weight matrices in turn (512 MiB, more than the caches of the
// machines it was written on), so that every product reads its weights from
// memory as a decode step does, not from the last level cache.
func BenchmarkMatmulCold(b *testing.B) {
	const M, K, copies = 4096, 4096, 16
	ws := make([][]byte, copies)
	for i := range ws {
		ws[i] = make([]byte, M*K*2)
		for j := 0; j < len(ws[i]); j += 2 {
			ws[i][j+1] = byte(0x3c + j%3) // bf16 values near 0.01..0.02
		}
	}
	r := rand.New(rand.NewPCG(2, 2))
	for _, T := range []int{1, 8} {
		x := randF32(r, T*K, 0)
		xn := make([]byte, T*K*2)
		Narrow(xn, x, BF16)
		y := make([]float32, T*M)
		for _, workers := range workerCounts() {
			run := NewRunner(workers)
			for _, k := range variants(b) {
				b.Run(fmt.Sprintf("%v/bf16/%dx%d/T%d/workers%d", k.Variant(), M, K, T, workers), func(b *testing.B) {
					i := 0
					for b.Loop() {
						k.MatmulNative(run, y, ws[i%copies], xn, BF16, M, K, T)
						i++
					}
					gbps := float64(M*K*2) * float64(b.N) / b.Elapsed().Seconds() / 1e9
					b.ReportMetric(gbps, "GB/s")
					b.ReportMetric(gbps/float64(workers), "GB/s/core")
				})
			}
			run.Close()
		}
	}
}

// workerCounts is 1, 2, 4, ... up to the machine's cores, and the cores
// themselves: how the host's memory rate scales with the workers reading it.
func workerCounts() []int {
	n := runtime.NumCPU()
	var ws []int
	for w := 1; w < n; w *= 2 {
		ws = append(ws, w)
	}
	return append(ws, n)
}

// BenchmarkQMatmulCold is the quantized 4096×4096 product (Q4_K, Q6_K,
// Q8_0) over 16 different weight matrices in turn, larger together than
// the last level cache, at 1 and 8 tokens and each worker count: GB/s of
// quantized bytes read. The "godeq" rows run the variant's dots over the
// Go dequantizer, to show what the assembly dequantizers buy.
func BenchmarkQMatmulCold(b *testing.B) {
	const M, K, copies = 4096, 4096, 16
	r := rand.New(rand.NewPCG(3, 3))
	for _, q := range []QType{Q4_K, Q6_K, Q8_0} {
		ws := make([][]byte, copies)
		for i := range ws {
			ws[i] = randBlocks(r, q, M*K/q.BlockElems(), 0, false)
		}
		bytes := float64(len(ws[0]))
		for _, T := range []int{1, 8} {
			x := randF32(r, T*K, 0)
			y := make([]float32, T*M)
			for _, workers := range workerCounts() {
				run := NewRunner(workers)
				for _, k := range variants(b) {
					godeq := *k
					godeq.arch.deq = [numQTypes]deqFunc{}
					for _, c := range []struct {
						name string
						k    *Kernels
					}{{k.Variant().String(), k}, {k.Variant().String() + "-godeq", &godeq}} {
						if c.k != k && k.arch.deq[q] == nil {
							continue // no assembly dequantizers: the same as the row above
						}
						b.Run(fmt.Sprintf("%s/%v/%dx%d/T%d/workers%d", c.name, q, M, K, T, workers), func(b *testing.B) {
							i := 0
							for b.Loop() {
								c.k.QMatmul(run, y, ws[i%copies], q, x, M, K, T)
								i++
							}
							gbps := bytes * float64(b.N) / b.Elapsed().Seconds() / 1e9
							b.ReportMetric(gbps, "GB/s")
							b.ReportMetric(gbps/float64(workers), "GB/s/core")
						})
					}
				}
				run.Close()
			}
		}
	}
}
