package quant

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// row draws n values of one of several shapes: weight-like, uniform, with
// outliers, sparse, constant, all of one sign, tiny, huge.
func row(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	kind := r.IntN(8)
	scale := math.Pow(10, r.Float64()*5-3) // 1e-3 .. 1e2: f16 scales stay normal
	for i := range x {
		var v float64
		switch kind {
		case 0:
			v = r.NormFloat64()
		case 1:
			v = r.Float64()*2 - 1
		case 2:
			v = r.NormFloat64()
			if r.IntN(50) == 0 {
				v *= 100
			}
		case 3:
			if r.IntN(4) == 0 {
				v = r.NormFloat64()
			}
		case 4:
			v = 0.7
		case 5:
			v = r.Float64() + 0.5
		case 6:
			v = -r.Float64() - 0.1
		case 7:
			v = r.NormFloat64() * math.Ldexp(1, -r.IntN(8)) // powers of two: ties
		}
		x[i] = float32(v * scale)
	}
	return x
}

// bound is the most a dequantized element may differ from its source, as a
// share of the range of its block (max − min, with 0 included): half a
// level of the type's levels over that range, with room for the f16
// rounding of scales and, for the k-quants, the 6- and 8-bit scales.
var bound = map[Type]float64{
	Q8_0: 1.0 / 254 * 1.01 * 2, // levels over ±amax: a step is 2·amax/254 of a range up to 2·amax
	Q4_0: 1.0 / 8 * 1.01,       // the side opposite the largest clips at 7·d: a whole step
	Q5_0: 1.0 / 16 * 1.01,
	Q5_1: 1.0 / 62 * 1.05,
	// The k-quants minimize a weighted squared error over the sub-blocks
	// and quantize the sub-blocks' scales: an element may land a few
	// levels off (worst seen over 3000 rows: 0.086, 0.076, 0.114).
	Q4_K: 0.15,
	Q5_K: 0.12,
	Q6_K: 0.15,
}

func TestRoundTripBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for _, typ := range Quantized() {
		t.Run(typ.String(), func(t *testing.T) {
			be := typ.BlockElems()
			var worst float64
			for range 400 {
				n := be * (1 + r.IntN(12))
				x := row(r, n)
				nb, _ := RowBytes(typ, n)
				q := make([]byte, nb)
				if err := Quantize(typ, q, x); err != nil {
					t.Fatal(err)
				}
				y := make([]float32, n)
				if err := Dequantize(typ, y, q); err != nil {
					t.Fatal(err)
				}
				for b := 0; b < n; b += be {
					lo, hi := 0.0, 0.0
					for _, v := range x[b : b+be] {
						lo, hi = min(lo, float64(v)), max(hi, float64(v))
					}
					for i := b; i < b+be; i++ {
						e := math.Abs(float64(y[i]) - float64(x[i]))
						if e > 0 {
							worst = max(worst, e/(hi-lo))
						}
						if e > bound[typ]*(hi-lo)+1e-30 {
							t.Fatalf("row of %d, element %d: %g became %g, error %.3g of the block's range %g (bound %.3g)", n, i, x[i], y[i], e/(hi-lo), hi-lo, bound[typ])
						}
					}
				}
			}
			t.Logf("worst error %.4f of a block's range (bound %.4f)", worst, bound[typ])
		})
	}
}

// TestRequantize: quantizing dequantized values again gives the same
// bytes for the legacy types (each block's largest value is a level, so
// the scale comes back exactly); the k-quants search their scales again
// and may land elsewhere (a quarter to a half of the rows do), but within
// their bound of the values they start from.
func TestRequantize(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 13))
	legacy := map[Type]bool{Q8_0: true, Q4_0: true, Q5_0: true, Q5_1: true}
	for _, typ := range Quantized() {
		be := typ.BlockElems()
		same := 0
		for range 300 {
			n := be * (1 + r.IntN(6))
			x := row(r, n)
			nb, _ := RowBytes(typ, n)
			q1, q2 := make([]byte, nb), make([]byte, nb)
			y1, y2 := make([]float32, n), make([]float32, n)
			if Quantize(typ, q1, x) != nil || Dequantize(typ, y1, q1) != nil || Quantize(typ, q2, y1) != nil || Dequantize(typ, y2, q2) != nil {
				t.Fatal("round trip failed")
			}
			if bytes.Equal(q1, q2) {
				same++
			} else if legacy[typ] {
				t.Fatalf("%v: row of %d quantizes to other bytes the second time", typ, n)
			}
			for b := 0; b < n; b += be {
				lo, hi := 0.0, 0.0
				for _, v := range y1[b : b+be] {
					lo, hi = min(lo, float64(v)), max(hi, float64(v))
				}
				for i := b; i < b+be; i++ {
					if e := math.Abs(float64(y2[i]) - float64(y1[i])); e > bound[typ]*(hi-lo)+1e-30 {
						t.Fatalf("%v: element %d: %g requantized to %g (block range %g)", typ, i, y1[i], y2[i], hi-lo)
					}
				}
			}
		}
		t.Logf("%v: %d of 300 rows requantize to the same bytes", typ, same)
	}
}

// rmsBound is the most the RMS error may be, relative to the RMS of the
// values, on normally distributed rows: about 1.2 times what the reference
// quantizers reach (which TestQuantizeMatchesGGML pins), so that a change
// that loses precision fails.
var rmsBound = map[Type]float64{
	Q8_0: 0.0065, // measured 0.00534
	Q4_0: 0.103,  // 0.0858
	Q5_0: 0.052,  // 0.0427
	Q5_1: 0.046,  // 0.0379
	Q4_K: 0.086,  // 0.0714
	Q5_K: 0.043,  // 0.0361
	Q6_K: 0.021,  // 0.0178
}

func TestRoundTripRMS(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	x := make([]float32, 256*512)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 0.02)
	}
	for _, typ := range Quantized() {
		nb, _ := RowBytes(typ, len(x))
		q := make([]byte, nb)
		y := make([]float32, len(x))
		if err := Quantize(typ, q, x); err != nil {
			t.Fatal(err)
		}
		if err := Dequantize(typ, y, q); err != nil {
			t.Fatal(err)
		}
		var se, sx float64
		for i := range x {
			d := float64(y[i]) - float64(x[i])
			se += d * d
			sx += float64(x[i]) * float64(x[i])
		}
		rel := math.Sqrt(se / sx)
		t.Logf("%v: relative RMS error %.5f", typ, rel)
		if b := rmsBound[typ]; rel > b {
			t.Errorf("%v: relative RMS error %.5f, more than %.5f", typ, rel, b)
		}
	}
}

func TestLengthErrors(t *testing.T) {
	for _, typ := range Types() {
		be, bb := typ.BlockElems(), typ.BlockBytes()
		x := make([]float32, 2*be)
		q := make([]byte, 2*bb)
		if err := Quantize(typ, q, x); err != nil {
			t.Errorf("%v: %v", typ, err)
		}
		if err := Dequantize(typ, x, q); err != nil {
			t.Errorf("%v: %v", typ, err)
		}
		if _, err := Dot(typ, q, x); err != nil {
			t.Errorf("%v: %v", typ, err)
		}
		if err := Quantize(typ, q[:len(q)-1], x); err == nil {
			t.Errorf("%v: Quantize into a short buffer: no error", typ)
		}
		if err := Dequantize(typ, x, q[:len(q)-1]); err == nil {
			t.Errorf("%v: Dequantize of short data: no error", typ)
		}
		if _, err := Dot(typ, q, x[:len(x)-1]); err == nil {
			t.Errorf("%v: Dot with a short vector: no error", typ)
		}
		if be > 1 {
			if err := Quantize(typ, q, x[:be+1]); err == nil {
				t.Errorf("%v: %d elements, not whole blocks: no error", typ, be+1)
			}
		}
	}
	if err := Quantize(Type(99), nil, nil); err == nil {
		t.Error("unknown type: no error")
	}
	if _, err := RowBytes(Q4_K, 100); err == nil {
		t.Error("RowBytes(Q4_K, 100): no error")
	}
	if n, err := RowBytes(Q4_K, 4096); err != nil || n != 16*144 {
		t.Errorf("RowBytes(Q4_K, 4096) = %d, %v", n, err)
	}
}

func TestNames(t *testing.T) {
	for _, typ := range Types() {
		got, ok := TypeByName(strings.ToLower(typ.String()))
		if !ok || got != typ {
			t.Errorf("TypeByName(%q) = %v, %v", strings.ToLower(typ.String()), got, ok)
		}
	}
	if _, ok := TypeByName("Q4_K_M"); ok {
		t.Error("Q4_K_M is a file type, not a tensor type")
	}
	if Type(99).String() != "type(99)" {
		t.Error(Type(99).String())
	}
}

// TestBlocksIndependent: a row coded in pieces of whole blocks gives the
// bytes of the row coded at once, which lets callers split the work.
func TestBlocksIndependent(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, typ := range Quantized() {
		be, bb := typ.BlockElems(), typ.BlockBytes()
		x := row(r, 8*be)
		whole := make([]byte, 8*bb)
		if err := Quantize(typ, whole, x); err != nil {
			t.Fatal(err)
		}
		parts := make([]byte, 8*bb)
		for _, cut := range [][2]int{{0, 3}, {3, 4}, {4, 8}} {
			if err := Quantize(typ, parts[cut[0]*bb:cut[1]*bb], x[cut[0]*be:cut[1]*be]); err != nil {
				t.Fatal(err)
			}
		}
		if !bytes.Equal(whole, parts) {
			t.Errorf("%v: a row in three pieces differs from the row", typ)
		}
	}
}

func TestDot(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	for _, typ := range Types() {
		n := typ.BlockElems() * 8
		w, x := row(r, n), row(r, n)
		nb, _ := RowBytes(typ, n)
		q := make([]byte, nb)
		if err := Quantize(typ, q, w); err != nil {
			t.Fatal(err)
		}
		y := make([]float32, n)
		if err := Dequantize(typ, y, q); err != nil {
			t.Fatal(err)
		}
		var want float64
		for i := range y {
			want += float64(y[i]) * float64(x[i])
		}
		got, err := Dot(typ, q, x)
		if err != nil || got != want {
			t.Errorf("%v: Dot = %v, %v; the dequantized row's float64 product is %v", typ, got, err, want)
		}
	}
}

// TestExtremes: rows of any finite magnitude quantize without a panic and,
// while the scales fit f16, decode to values within a block bound of the
// row's largest, give or take f16's smallest step.
func TestExtremes(t *testing.T) {
	for _, typ := range Quantized() {
		for _, mag := range []float32{0, 1e-30, 1e-12, 1e-7, 1, 6e4, 1e6, math.MaxFloat32} {
			x := make([]float32, typ.BlockElems())
			for i := range x {
				x[i] = mag * (float32(i%7-3) / 3) // finite: |x| ≤ mag
			}
			nb, _ := RowBytes(typ, len(x))
			q := make([]byte, nb)
			if err := Quantize(typ, q, x); err != nil {
				t.Fatal(err)
			}
			y := make([]float32, len(x))
			if err := Dequantize(typ, y, q); err != nil {
				t.Fatal(err)
			}
			if mag > 6e4 {
				continue
			}
			for i, v := range y {
				if !(math.Abs(float64(v)) <= float64(mag)*(1+2*bound[typ])+0x1p-22) {
					t.Errorf("%v, magnitude %g: element %d decodes to %g", typ, mag, i, v)
					break
				}
			}
		}
	}
}

// TestNonFiniteRejected: a NaN or an infinity anywhere in a row is an
// error naming its index, for every type, and nothing is written.
func TestNonFiniteRejected(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, typ := range Types() {
		for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
			for range 20 {
				n := typ.BlockElems() * (1 + r.IntN(40))
				x := row(r, n)
				for i := range x {
					if math.IsNaN(float64(x[i])) || math.IsInf(float64(x[i]), 0) {
						x[i] = 0
					}
				}
				at := r.IntN(n)
				x[at] = bad
				if r.IntN(2) == 0 && at+1 < n {
					x[at+1+r.IntN(n-at-1)] = float32(math.NaN()) // a later one is not the first
				}
				nb, _ := RowBytes(typ, n)
				q := make([]byte, nb)
				for i := range q {
					q[i] = 0xA5
				}
				err := Quantize(typ, q, x)
				var nf *NonFiniteError
				if !errors.As(err, &nf) || nf.Index != at || math.Float32bits(nf.Value) != math.Float32bits(bad) {
					t.Fatalf("%v, %v at %d of %d: %v", typ, bad, at, n, err)
				}
				for i, b := range q {
					if b != 0xA5 {
						t.Fatalf("%v: byte %d written", typ, i)
					}
				}
			}
		}
	}
}

// TestPairsMatchSingle: the two-at-a-time searches give makeQKX2's and
// makeQX's results bit for bit, on every kind of row, constant sub-blocks
// and mixtures of kinds included.
func TestPairsMatchSingle(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	for n := range 4000 {
		xa, xb := row(r, 32), row(r, 32)
		if n%5 == 0 {
			copy(xb, xa)
		}
		var a, b [32]float32
		copy(a[:], xa)
		copy(b[:], xb)
		var wa, wb [32]float32
		for i := range 32 {
			wa[i], wb[i] = 0.1+abs32(a[i]), 0.1+abs32(b[i])
		}
		for _, p := range []struct {
			nmax         int32
			rmin, rdelta float32
			nstep        int
		}{{15, -1, 0.1, 20}, {31, -0.5, 0.1, 15}} {
			var La, Lb, Sa, Sb [32]uint8
			sa, ma, sb, mb := makeQKX2Pair(p.nmax, &a, &b, &wa, &wb, &La, &Lb, p.rmin, p.rdelta, p.nstep)
			s1, m1 := makeQKX2(p.nmax, &a, &wa, &Sa, p.rmin, p.rdelta, p.nstep)
			s2, m2 := makeQKX2(p.nmax, &b, &wb, &Sb, p.rmin, p.rdelta, p.nstep)
			if math.Float32bits(sa) != math.Float32bits(s1) || math.Float32bits(ma) != math.Float32bits(m1) || La != Sa ||
				math.Float32bits(sb) != math.Float32bits(s2) || math.Float32bits(mb) != math.Float32bits(m2) || Lb != Sb {
				t.Fatalf("row %d, nmax %d: pair (%v %v %v %v) single (%v %v %v %v)", n, p.nmax, sa, ma, sb, mb, s1, m1, s2, m2)
			}
		}
		qa, qb := (*[16]float32)(a[:16]), (*[16]float32)(b[16:])
		var La, Lb, Sa, Sb [16]uint8
		sa, sb := makeQXPair(32, qa, qb, &La, &Lb)
		s1, s2 := makeQX(32, qa, &Sa), makeQX(32, qb, &Sb)
		if math.Float32bits(sa) != math.Float32bits(s1) || math.Float32bits(sb) != math.Float32bits(s2) || La != Sa || Lb != Sb {
			t.Fatalf("row %d: makeQXPair (%v %v) makeQX (%v %v)", n, sa, sb, s1, s2)
		}
	}
}
