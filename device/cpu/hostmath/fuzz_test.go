package hostmath

import (
	"math"
	"math/rand/v2"
	"testing"
)

// FuzzDispatch drives every variant's dispatch — row groups of each wide
// kernel and the leftovers, vector steps and tails, tiles of tokens past
// MaxTile, strides, byte offsets, the runner's split — with shapes from the
// fuzzer, and checks each output of Matmul, MatmulNative, Dots and
// WeightedSum against a float64 sum.
func FuzzDispatch(f *testing.F) {
	for _, s := range [][6]uint16{{1, 1, 1, 0, 0, 0}, {7, 33, 9, 1, 3, 1}, {13, 64, 8, 2, 1, 2}, {5, 257, 3, 1, 0, 3}, {40, 31, 12, 0, 2, 4}} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5])
	}
	ks := variants(f)
	run := NewRunner(3)
	f.Cleanup(run.Close)
	f.Fuzz(func(t *testing.T, m, k, tt, dtc, off, seed uint16) {
		M, K, T := 1+int(m)%48, 1+int(k)%400, 1+int(tt)%20
		dt := dtypes[int(dtc)%len(dtypes)]
		r := rand.New(rand.NewPCG(uint64(seed), uint64(m)<<16|uint64(k)))
		pitch := K*dt.Size() + int(off>>2)%5
		w := randRows(r, dt, M, K, pitch, int(off)%4)
		x := randF32(r, T*K, 0)
		xn := make([]byte, T*K*dt.Size()+int(off)%3)[int(off)%3:]
		Narrow(xn, x, dt)
		xw := make([]float32, T*K)
		Widen(xw, xn, dt)
		for _, kk := range ks {
			y := make([]float32, T*M)
			yn := make([]float32, T*M)
			kk.Dots(y, M, w, pitch, dt, x, K, M, K, T)
			if pitch == K*dt.Size() {
				yp := make([]float32, T*M)
				kk.Matmul(run, yp, w, dt, x, M, K, T)
				kk.MatmulNative(run, yn, w, xn, dt, M, K, T)
				compare(t, kk, "Matmul", yp, M, K, T, w, pitch, dt, x)
				compare(t, kk, "MatmulNative", yn, M, K, T, w, pitch, dt, xw)
			}
			compare(t, kk, "Dots", y, M, K, T, w, pitch, dt, x)
			// The weighted sum over the same rows: p = x's first column of
			// each token (n = M rows of K columns).
			p := make([]float32, T*M)
			for i := range p {
				p[i] = x[i%len(x)]
			}
			acc := make([]float32, T*K)
			kk.WeightedSum(acc, K, p, M, w, pitch, dt, M, K, T)
			for ti := range T {
				for j := range K {
					ref, abs := sum(0, M, func(i int) float64 { return float64(p[ti*M+i]) * float64(Load(dt, w[i*pitch:], j)) })
					if d := math.Abs(float64(acc[ti*K+j]) - ref); d > float64(M+8)*0x1p-23*abs+1e-30 {
						t.Fatalf("%v WeightedSum %v n=%d hd=%d T=%d: acc[%d, %d] = %g, reference %g", kk.Variant(), dt, M, K, T, ti, j, acc[ti*K+j], ref)
					}
				}
			}
		}
	})
}

func compare(t *testing.T, k *Kernels, what string, y []float32, M, K, T int, w []byte, pitch int, dt DType, x []float32) {
	t.Helper()
	for ti := range T {
		for m := range M {
			ref, abs := sum(0, K, func(i int) float64 { return float64(Load(dt, w[m*pitch:], i)) * float64(x[ti*K+i]) })
			if d := math.Abs(float64(y[ti*M+m]) - ref); !(d <= float64(K+8)*0x1p-23*abs+1e-30) {
				t.Fatalf("%v %s %v M=%d K=%d T=%d pitch %d: y[%d, %d] = %g, reference %g", k.Variant(), what, dt, M, K, T, pitch, ti, m, y[ti*M+m], ref)
			}
		}
	}
}
