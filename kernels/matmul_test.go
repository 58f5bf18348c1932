package kernels

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// randMatrices returns W (M×K) and X (T×K) in dtype from values in [-1, 1).
func randMatrices(t testing.TB, dtype string, M, K, T int, seed uint64) (W, X []byte) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	gen := func(n int) []byte {
		v := make([]float32, n)
		for i := range v {
			v[i] = r.Float32()*2 - 1
		}
		b, err := Encode(dtype, v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return gen(M * K), gen(T * K)
}

func TestHostMatmulMatchesReference(t *testing.T) {
	shapes := []struct{ M, K, T int }{
		{1, 1, 1}, {7, 13, 1}, {37, 99, 3}, {129, 257, 9}, {64, 1000, 8}, {33, 4097, 2}, {5, 0, 4},
	}
	for _, dt := range DTypes() {
		for _, s := range shapes {
			t.Run(dt+"/"+itoa(s.M)+"x"+itoa(s.K)+"x"+itoa(s.T), func(t *testing.T) {
				W, X := randMatrices(t, dt, s.M, s.K, s.T, uint64(s.M*s.K+s.T))
				Y := make([]float32, s.M*s.T)
				for i := range Y {
					Y[i] = float32(math.NaN()) // every output must be written
				}
				if err := HostMatmul(dt, W, X, Y, s.M, s.K, s.T); err != nil {
					t.Fatal(err)
				}
				// Exhaustive check, and a tighter bound than the tolerance:
				// inputs are exact, so only float32 summation differs.
				var num, den float64
				for tt := range s.T {
					for m := range s.M {
						ref := ReferenceRow(dt, W, X, s.M, s.K, s.T, tt, m)
						d := float64(Y[tt*s.M+m]) - ref
						num += d * d
						den += ref * ref
					}
				}
				rel := math.Sqrt(num / max(den, 1e-300))
				if s.K == 0 {
					rel = math.Sqrt(num)
				}
				if !(rel <= 1e-5) {
					t.Fatalf("relative error %g vs float64 reference", rel)
				}
				if err := CheckMatmul(dt, W, X, Y, s.M, s.K, s.T, 0, 1); err != nil {
					t.Fatal(err)
				}
				if err := CheckMatmul(dt, W, X, Y, s.M, s.K, s.T, 16, 2); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// The float32 accumulation is reproducible: a single-goroutine sum in k order
// gives bit-identical results.
func TestHostMatmulDeterministic(t *testing.T) {
	const M, K, T = 50, 333, 5
	W, X := randMatrices(t, BF16, M, K, T, 9)
	Y := make([]float32, M*T)
	if err := HostMatmul(BF16, W, X, Y, M, K, T); err != nil {
		t.Fatal(err)
	}
	w, _ := Decode(BF16, W)
	x, _ := Decode(BF16, X)
	for tt := range T {
		for m := range M {
			var acc float32
			for k := range K {
				acc += float32(w[m*K+k] * x[tt*K+k])
			}
			if Y[tt*M+m] != acc {
				t.Fatalf("Y[%d,%d] = %v, sequential float32 sum %v", tt, m, Y[tt*M+m], acc)
			}
		}
	}
}

func TestCheckMatmulDetectsErrors(t *testing.T) {
	const M, K, T = 40, 64, 6
	for _, dt := range DTypes() {
		t.Run(dt, func(t *testing.T) {
			W, X := randMatrices(t, dt, M, K, T, 3)
			good := make([]float32, M*T)
			if err := HostMatmul(dt, W, X, good, M, K, T); err != nil {
				t.Fatal(err)
			}
			cases := []struct {
				name   string
				mutate func(y []float32)
			}{
				{"scaled", func(y []float32) {
					for i := range y {
						y[i] *= 1.1
					}
				}},
				{"one wrong corner", func(y []float32) { y[len(y)-1] += 100 }},
				{"NaN corner", func(y []float32) { y[0] = float32(math.NaN()) }},
				{"Inf", func(y []float32) { y[M-1] = float32(math.Inf(1)) }},
				{"zeros", func(y []float32) { clear(y) }},
			}
			for _, tc := range cases {
				y := append([]float32(nil), good...)
				tc.mutate(y)
				err := CheckMatmul(dt, W, X, y, M, K, T, 8, 5) // corners always checked
				var me *MatmulError
				if !errors.Is(err, ErrMismatch) || !errors.As(err, &me) {
					t.Fatalf("%s: err %v, want a MatmulError", tc.name, err)
				}
				if me.Samples != 8 || !(me.RelErr > me.Tol) || me.Tol != Tolerance(dt) {
					t.Errorf("%s: %+v", tc.name, me)
				}
			}
			// Within tolerance: a relative perturbation below it passes.
			y := append([]float32(nil), good...)
			for i := range y {
				y[i] *= float32(1 + Tolerance(dt)/4)
			}
			if err := CheckMatmul(dt, W, X, y, M, K, T, 0, 5); err != nil {
				t.Errorf("perturbation of tol/4: %v", err)
			}
		})
	}
}

func TestMatmulBadArguments(t *testing.T) {
	W, X := randMatrices(t, F16, 4, 8, 2, 1)
	Y := make([]float32, 8)
	tests := []struct {
		name    string
		dtype   string
		W, X    []byte
		Y       []float32
		M, K, T int
		want    error
	}{
		{"dtype", "fp8", W, X, Y, 4, 8, 2, ErrDType},
		{"short W", F16, W[:len(W)-1], X, Y, 4, 8, 2, ErrShape},
		{"short X", F16, W, X[:3], Y, 4, 8, 2, ErrShape},
		{"short Y", F16, W, X, Y[:7], 4, 8, 2, ErrShape},
		{"negative", F16, W, X, Y, -1, 8, 2, ErrShape},
		{"overflow", F16, W, X, Y, math.MaxInt / 2, math.MaxInt / 2, 2, ErrShape},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := HostMatmul(tc.dtype, tc.W, tc.X, tc.Y, tc.M, tc.K, tc.T); !errors.Is(err, tc.want) {
				t.Errorf("HostMatmul: err %v, want %v", err, tc.want)
			}
			if err := CheckMatmul(tc.dtype, tc.W, tc.X, tc.Y, tc.M, tc.K, tc.T, 4, 1); !errors.Is(err, tc.want) {
				t.Errorf("CheckMatmul: err %v, want %v", err, tc.want)
			}
			if tc.name != "short Y" {
				if v := ReferenceRow(tc.dtype, tc.W, tc.X, tc.M, tc.K, tc.T, 0, 0); !math.IsNaN(v) {
					t.Errorf("ReferenceRow = %v, want NaN", v)
				}
			}
		})
	}
	for _, idx := range [][2]int{{-1, 0}, {2, 0}, {0, 4}, {0, -1}} {
		if v := ReferenceRow(F16, W, X, 4, 8, 2, idx[0], idx[1]); !math.IsNaN(v) {
			t.Errorf("ReferenceRow(t=%d, m=%d) = %v, want NaN", idx[0], idx[1], v)
		}
	}
	if v := ReferenceRow(F16, W, X, 4, 8, 2, 1, 3); math.IsNaN(v) {
		t.Error("ReferenceRow in range returned NaN")
	}
}

func FuzzHostMatmul(f *testing.F) {
	f.Add(uint8(0), uint8(3), uint8(5), uint8(2), []byte("some bytes that become matrices..."))
	f.Add(uint8(1), uint8(1), uint8(0), uint8(9), []byte{})
	f.Add(uint8(2), uint8(16), uint8(16), uint8(1), make([]byte, 600))
	f.Fuzz(func(t *testing.T, dt, m, k, tk uint8, data []byte) {
		dtype := DTypes()[int(dt)%3]
		M, K, T := int(m%40), int(k%70), int(tk%12)
		elt, _ := ElemSize(dtype)
		split := min(len(data), M*K*elt)
		W, X := data[:split], data[split:]
		Y := make([]float32, M*T)
		err := HostMatmul(dtype, W, X, Y, M, K, T)
		if err != nil {
			if !errors.Is(err, ErrShape) {
				t.Fatalf("HostMatmul: unexpected error %v", err)
			}
			return
		}
		err = CheckMatmul(dtype, W, X, Y, M, K, T, 0, 1)
		if err != nil && !errors.Is(err, ErrMismatch) {
			t.Fatalf("CheckMatmul: unexpected error %v", err)
		}
		// Arbitrary bytes make huge, tiny and cancelling values, so a
		// mismatch is possible; the contract is a typed error, never a panic.
		_ = ReferenceRow(dtype, W, X, M, K, T, T-1, M-1)
	})
}
