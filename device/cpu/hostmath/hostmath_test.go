package hostmath

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// variants returns the kernels of every variant this CPU runs.
func variants(t testing.TB) []*Kernels {
	t.Helper()
	var out []*Kernels
	for _, v := range Available() {
		k, err := New(v)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, k)
	}
	return out
}

var dtypes = []DType{F32, BF16, F16}

// randWeights returns n elements of dt at byte offset off of a new slice
// (so the elements start unaligned for odd off), values normal(0, 1)
// rounded to dt, and their float32 values.
func randWeights(r *rand.Rand, dt DType, n, off int) ([]byte, []float32) {
	b := make([]byte, off+n*dt.Size()+3)
	f := make([]float32, n)
	for i := range f {
		f[i] = Round(dt, float32(r.NormFloat64()))
		Store(dt, b[off:], i, f[i])
	}
	return b[off : off+n*dt.Size()], f
}

// randRows returns rows of k elements of dt, normal(0, 1), row i at byte
// i·pitch of a slice starting at byte offset off of its allocation.
func randRows(r *rand.Rand, dt DType, rows, k, pitch, off int) []byte {
	b := make([]byte, off+(rows-1)*pitch+k*dt.Size())[off:]
	for i := range rows {
		for j := range k {
			Store(dt, b[i*pitch:], j, float32(r.NormFloat64()))
		}
	}
	return b
}

func randF32(r *rand.Rand, n, off int) []float32 {
	f := make([]float32, off+n)
	for i := range f {
		f[i] = float32(r.NormFloat64())
	}
	return f[off:]
}

// within fails t when got differs from the float64 sum ref by more than
// float32 accumulation can explain: (k+8)·2⁻²³ of the sum of the terms'
// magnitudes, abs.
func within(t *testing.T, what string, got float32, ref, abs float64, k int) {
	t.Helper()
	tol := float64(k+8)*0x1p-23*abs + 1e-30
	if d := math.Abs(float64(got) - ref); !(d <= tol) {
		t.Fatalf("%s = %g, reference %g: off by %g, tolerance %g", what, got, ref, d, tol)
	}
}

// sum returns Σ term(i) for i < n in float64 and Σ |term(i)|, starting
// from init.
func sum(init float64, n int, term func(i int) float64) (ref, abs float64) {
	ref, abs = init, math.Abs(init)
	for i := range n {
		p := term(i)
		ref += p
		abs += math.Abs(p)
	}
	return ref, abs
}

// shapes are the product shapes the tests draw from: K around the vector
// steps (8, 16, 32), M odd and around the row blocks, T through MaxTile and
// past it.
func shapes(r *rand.Rand, n int) [][3]int {
	out := [][3]int{{1, 1, 1}, {1, 7, 1}, {5, 8, 1}, {7, 16, 2}, {9, 31, 3}, {13, 32, 8}, {3, 33, 9}, {17, 64, 5}, {4, 65, 7}, {11, 100, 4}, {6, 257, 6}}
	for range n {
		out = append(out, [3]int{1 + r.IntN(40), 1 + r.IntN(300), 1 + r.IntN(12)})
	}
	return out
}

func TestMatmulVariants(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ks := variants(t)
	runner := NewRunner(3)
	defer runner.Close()
	for _, sh := range shapes(r, 60) {
		M, K, T := sh[0], sh[1], sh[2]
		for _, dt := range dtypes {
			off := r.IntN(4)
			w, wf := randWeights(r, dt, M*K, off)
			x := randF32(r, T*K, r.IntN(3))
			for _, k := range ks {
				for _, run := range []*Runner{nil, runner} {
					y := make([]float32, T*M+1)[1:]
					for i := range y {
						y[i] = float32(math.NaN()) // every output must be written
					}
					k.Matmul(run, y, w, dt, x, M, K, T)
					for ti := range T {
						for m := range M {
							ref, abs := sum(0, K, func(kk int) float64 { return float64(wf[m*K+kk]) * float64(x[ti*K+kk]) })
							within(t, fmt.Sprintf("%v %v M=%d K=%d T=%d w+%d workers %d: y[%d, %d]", k.Variant(), dt, M, K, T, off, run.Workers(), ti, m),
								y[ti*M+m], ref, abs, K)
						}
					}
				}
			}
		}
	}
}

func TestMatmulNative(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	runner := NewRunner(2)
	defer runner.Close()
	for _, sh := range shapes(r, 40) {
		M, K, T := sh[0], sh[1], sh[2]
		for _, dt := range dtypes {
			w, wf := randWeights(r, dt, M*K, r.IntN(4))
			x, xf := randWeights(r, dt, T*K, r.IntN(4))
			for _, k := range variants(t) {
				y := make([]float32, T*M)
				k.MatmulNative(runner, y, w, x, dt, M, K, T)
				for ti := range T {
					for m := range M {
						ref, abs := sum(0, K, func(kk int) float64 { return float64(wf[m*K+kk]) * float64(xf[ti*K+kk]) })
						within(t, fmt.Sprintf("%v native %v M=%d K=%d T=%d: y[%d, %d]", k.Variant(), dt, M, K, T, ti, m), y[ti*M+m], ref, abs, K)
					}
				}
			}
		}
	}
}

// TestDotsStrided runs Dots as attention does: rows at a pitch larger than
// a row, tokens at a stride larger than K, outputs at a stride larger than
// M.
func TestDotsStrided(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, sh := range shapes(r, 30) {
		M, K, T := sh[0], sh[1], sh[2]
		for _, dt := range dtypes {
			ws := K*dt.Size() + r.IntN(3)*dt.Size() + r.IntN(2)
			xs := K + r.IntN(5)
			ys := M + r.IntN(5)
			w := randRows(r, dt, M, K, ws, r.IntN(4))
			x := randF32(r, T*xs, 0)
			for _, k := range variants(t) {
				y := make([]float32, T*ys)
				k.Dots(y, ys, w, ws, dt, x, xs, M, K, T)
				for ti := range T {
					for m := range M {
						ref, abs := sum(0, K, func(kk int) float64 { return float64(Load(dt, w[m*ws:], kk)) * float64(x[ti*xs+kk]) })
						within(t, fmt.Sprintf("%v %v strided M=%d K=%d T=%d: y[%d, %d]", k.Variant(), dt, M, K, T, ti, m), y[ti*ys+m], ref, abs, K)
					}
				}
			}
		}
	}
}

func TestWeightedSum(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for range 80 {
		n, hd, T := 1+r.IntN(40), 1+r.IntN(140), 1+r.IntN(11)
		for _, dt := range dtypes {
			vs := hd*dt.Size() + r.IntN(3)*2 + r.IntN(2)
			v := randRows(r, dt, n, hd, vs, r.IntN(4))
			as, ps := hd+r.IntN(3), n+r.IntN(3)
			p := randF32(r, T*ps, r.IntN(2))
			start := randF32(r, T*as, 0)
			for _, k := range variants(t) {
				acc := append([]float32(nil), start...)
				k.WeightedSum(acc, as, p, ps, v, vs, dt, n, hd, T)
				for ti := range T {
					for j := range hd {
						ref, abs := sum(float64(start[ti*as+j]), n, func(i int) float64 { return float64(p[ti*ps+i]) * float64(Load(dt, v[i*vs:], j)) })
						within(t, fmt.Sprintf("%v %v wsum n=%d hd=%d T=%d: acc[%d, %d]", k.Variant(), dt, n, hd, T, ti, j), acc[ti*as+j], ref, abs, n)
					}
					for j := hd; j < as && ti*as+j < len(acc); j++ {
						if acc[ti*as+j] != start[ti*as+j] {
							t.Fatalf("%v wsum wrote column %d past hd %d", k.Variant(), j, hd)
						}
					}
				}
			}
		}
	}
}

func TestShortSlicesPanic(t *testing.T) {
	k, _ := New(Best())
	for name, f := range map[string]func(){
		"w": func() { k.Matmul(nil, make([]float32, 4), make([]byte, 7), BF16, make([]float32, 2), 2, 2, 2) },
		"x": func() { k.Matmul(nil, make([]float32, 4), make([]byte, 8), BF16, make([]float32, 3), 2, 2, 2) },
		"y": func() { k.Matmul(nil, make([]float32, 3), make([]byte, 8), BF16, make([]float32, 4), 2, 2, 2) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("short %s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func TestVariantsListed(t *testing.T) {
	a := Available()
	if len(a) == 0 || a[0] != Generic {
		t.Fatalf("Available() = %v, want Generic first", a)
	}
	for _, v := range a {
		p, err := ParseVariant(v.String())
		if err != nil || p != v {
			t.Errorf("ParseVariant(%q) = %v, %v", v, p, err)
		}
		if _, err := New(v); err != nil {
			t.Errorf("New(%v): %v", v, err)
		}
	}
	t.Logf("variants %v on %s", a, Features())
}

// TestMatmulGroupNative: each product of a group equals MatmulNative of it
// alone, bit for bit (a row's sum does not depend on how rows are split).
func TestMatmulGroupNative(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	run := NewRunner(3)
	defer run.Close()
	for _, K := range []int{5, 64, 100} {
		for _, T := range []int{1, 3, 11} {
			for _, dt := range dtypes {
				x, _ := randWeights(r, dt, T*K, 1)
				var ops []Product
				for _, M := range []int{7, 1, 30} {
					w, _ := randWeights(r, dt, M*K, r.IntN(3))
					ops = append(ops, Product{Y: make([]float32, T*M), W: w, M: M})
				}
				for _, k := range variants(t) {
					k.MatmulGroupNative(run, ops, x, dt, K, T)
					for i, op := range ops {
						want := make([]float32, T*op.M)
						k.MatmulNative(nil, want, op.W, x, dt, op.M, K, T)
						for j := range want {
							if op.Y[j] != want[j] {
								t.Fatalf("%v %v K=%d T=%d product %d: y[%d] = %g, alone %g", k.Variant(), dt, K, T, i, j, op.Y[j], want[j])
							}
						}
					}
				}
			}
		}
	}
}
