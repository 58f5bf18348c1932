package hostmath

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestRMSNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, H := range []int{1, 7, 64, 333} {
		for _, odt := range dtypes {
			x, w := randF32(r, H, 0), randF32(r, H, 1)
			out := make([]float32, H)
			RMSNorm(out, x, w, odt, 1e-5)
			var ss float64
			for _, v := range x {
				ss += float64(v) * float64(v)
			}
			rr := 1 / math.Sqrt(ss/float64(H)+1e-5)
			for i := range H {
				want := float64(x[i]) * rr * float64(w[i])
				// Two roundings to odt and float32's sum of squares.
				tol := 3*relEps(odt)*math.Abs(want) + 1e-6*math.Abs(want)
				if d := math.Abs(float64(out[i]) - want); d > tol || Round(odt, out[i]) != out[i] {
					t.Fatalf("RMSNorm %v H=%d: out[%d] = %g, want %g (tolerance %g, rounded to %v: %v)", odt, H, i, out[i], want, tol, odt, Round(odt, out[i]) == out[i])
				}
			}
			in := append([]float32(nil), x...)
			RMSNorm(in, in, w, odt, 1e-5) // in place
			for i := range in {
				if in[i] != out[i] {
					t.Fatalf("RMSNorm in place differs at %d", i)
				}
			}
		}
	}
}

// relEps is half a unit in the last place of dt, relative.
func relEps(dt DType) float64 {
	switch dt {
	case BF16:
		return 0x1p-8
	case F16:
		return 0x1p-11
	}
	return 0x1p-24
}

// TestRoPEPairs checks that RoPE over whole heads is RopePairIn on every
// pair, bit for bit, in both layouts and every dtype.
func TestRoPEPairs(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, hd := range []int{2, 8, 130, 256} {
		nH := 3
		inv := make([]float32, hd/2)
		for i := range inv {
			inv[i] = float32(math.Pow(10000, -2*float64(i)/float64(hd)))
		}
		for _, dt := range dtypes {
			for _, il := range []bool{false, true} {
				pos := int32(r.IntN(5000))
				x := randF32(r, nH*hd, 0)
				got := append([]float32(nil), x...)
				RoPE(got, nH, hd, pos, inv, il, dt)
				for h := range nH {
					for i := range hd / 2 {
						ia, ib := h*hd+i, h*hd+i+hd/2
						if il {
							ia, ib = h*hd+2*i, h*hd+2*i+1
						}
						a, b := RopePairIn(dt, x[ia], x[ib], pos, inv[i])
						if got[ia] != a || got[ib] != b {
							t.Fatalf("RoPE %v hd=%d interleaved=%v head %d pair %d: (%g, %g), RopePairIn (%g, %g)", dt, hd, il, h, i, got[ia], got[ib], a, b)
						}
					}
				}
				if dt == F32 {
					a, b := RopePair(x[0], x[hd/2], pos, inv[0])
					if c, s := math.Cos(float64(float32(pos)*inv[0])), math.Sin(float64(float32(pos)*inv[0])); math.Abs(float64(a)-(float64(x[0])*c-float64(x[hd/2])*s)) > 1e-5 || math.Abs(float64(b)-(float64(x[hd/2])*c+float64(x[0])*s)) > 1e-5 {
						t.Fatalf("RopePair(%g, %g) = (%g, %g): not a rotation by %g", x[0], x[hd/2], a, b, float32(pos)*inv[0])
					}
				}
			}
		}
	}
}

func TestSiluMulAddSoftmax(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	g, u := randF32(r, 100, 0), randF32(r, 100, 0)
	for _, rdt := range dtypes {
		for _, odt := range dtypes {
			out := make([]float32, len(g))
			SiluMul(out, g, u, rdt, odt)
			for i := range out {
				gg, uu := float64(Round(rdt, g[i])), float64(Round(rdt, u[i]))
				want := gg / (1 + math.Exp(-gg)) * uu
				if d := math.Abs(float64(out[i]) - want); d > 3*relEps(odt)*math.Abs(want)+1e-7 || out[i] != SiluMulValue(Round(rdt, g[i]), Round(rdt, u[i]), odt) {
					t.Fatalf("SiluMul %v→%v [%d] = %g, want %g", rdt, odt, i, out[i], want)
				}
			}
		}
	}
	x := append([]float32(nil), g...)
	Add(x, u)
	for i := range x {
		if x[i] != g[i]+u[i] {
			t.Fatalf("Add [%d] = %g, want %g", i, x[i], g[i]+u[i])
		}
	}
	s := append([]float32(nil), g[:17]...)
	m := SoftmaxScale(s, 0.5)
	l := SoftmaxExp(s, m)
	var ref float64
	for _, v := range g[:17] {
		ref = max(ref, float64(v)*0.5)
	}
	var sum float64
	for i, v := range g[:17] {
		w := math.Exp(float64(v)*0.5 - ref)
		sum += w
		if math.Abs(float64(s[i])-w) > 1e-6 {
			t.Fatalf("softmax weight %d = %g, want %g", i, s[i], w)
		}
	}
	if float64(m) != ref || math.Abs(float64(l)-sum) > 1e-5*sum {
		t.Fatalf("softmax max %g sum %g, want %g and %g", m, l, ref, sum)
	}
	if m := SoftmaxScale(nil, 1); !math.IsInf(float64(m), -1) {
		t.Fatalf("SoftmaxScale of nothing = %g, want -Inf", m)
	}
}
