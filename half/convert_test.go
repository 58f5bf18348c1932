package half

import (
	"math"
	"math/big"
	"math/rand/v2"
	"sort"
	"testing"

	_ "github.com/memwall/memwall/internal/longtest"
)

// f16Value is an independent decoding of a binary16 bit pattern.
func f16Value(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1F
	mant := float64(h & 0x3FF)
	switch exp {
	case 0:
		return sign * math.Ldexp(mant, -24)
	case 31:
		if mant != 0 {
			return math.NaN()
		}
		return sign * math.Inf(1)
	}
	return sign * math.Ldexp(1+mant/1024, exp-15)
}

func TestF16Exhaustive(t *testing.T) {
	for h := range 1 << 16 {
		h := uint16(h)
		got, want := F16ToF32(h), f16Value(h)
		if math.IsNaN(want) {
			if !math.IsNaN(float64(got)) {
				t.Fatalf("F16ToF32(%#04x) = %v, want NaN", h, got)
			}
			if back := F32ToF16(got); back&0x7C00 != 0x7C00 || back&0x3FF == 0 || back&0x8000 != h&0x8000 {
				t.Fatalf("F32ToF16(NaN from %#04x) = %#04x, want a NaN with the same sign", h, back)
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, got, want)
		}
		if back := F32ToF16(got); back != h {
			t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x", h, back)
		}
	}
}

// Midpoints between adjacent halves are exact float32 values: they must
// round to the even neighbour, and one float32 ulp either side to the near one.
func TestF16RoundingTies(t *testing.T) {
	for h := uint16(0); h < 0x7BFF; h++ {
		lo, hi := f16Value(h), f16Value(h+1)
		mid := float32((lo + hi) / 2)
		if float64(mid) != (lo+hi)/2 {
			t.Fatalf("midpoint of %#04x not exact", h)
		}
		even := h
		if h%2 == 1 {
			even = h + 1
		}
		for _, sign := range []uint16{0, 0x8000} {
			s := float32(1)
			if sign != 0 {
				s = -1
			}
			if got := F32ToF16(s * mid); got != sign|even {
				t.Fatalf("F32ToF16(%v) = %#04x, want %#04x (tie to even)", s*mid, got, sign|even)
			}
			up := math.Nextafter32(mid, float32(math.Inf(1)))
			down := math.Nextafter32(mid, 0)
			if got := F32ToF16(s * up); got != sign|(h+1) {
				t.Fatalf("F32ToF16(%v) = %#04x, want %#04x", s*up, got, sign|(h+1))
			}
			if got := F32ToF16(s * down); got != sign|h {
				t.Fatalf("F32ToF16(%v) = %#04x, want %#04x", s*down, got, sign|h)
			}
		}
	}
}

func TestF16Specials(t *testing.T) {
	tests := []special{
		{0, 0},
		{float32(math.Copysign(0, -1)), 0x8000},
		{1, 0x3C00},
		{-2, 0xC000},
		{65504, 0x7BFF},
		{65519.996, 0x7BFF},
		{65520, 0x7C00},
		{1e10, 0x7C00},
		{-1e10, 0xFC00},
		{float32(math.Inf(1)), 0x7C00},
		{float32(math.Inf(-1)), 0xFC00},
		{math.Float32frombits(1), 0},               // float32 subnormal
		{float32(math.Ldexp(1, -24)), 0x0001},      // smallest half subnormal
		{float32(math.Ldexp(1, -25)), 0x0000},      // half of it: tie to even (0)
		{float32(math.Ldexp(1.5, -25)), 0x0001},    // above the tie
		{float32(math.Ldexp(3, -25)), 0x0002},      // 1.5 × 2^-24: tie to even (2)
		{float32(math.Ldexp(1, -14)), 0x0400},      // smallest normal
		{float32(math.Ldexp(1023.5, -24)), 0x0400}, // rounds up into the normals
		{0.1, 0x2E66}, {0.05, 0x2A66}, {0.5, 0x3800},
		{float32(math.Ldexp(0.75, -24)), 0x0001}, // 0.75 of the smallest subnormal rounds up
		{1 + 1.0/2048, 0x3C00},                   // tie between 1 and 1+2^-10: even
		{1 + 3.0/2048, 0x3C02},                   // tie: rounds up to even
		{math.Float32frombits(0x7FC00000), 0x7E00},
		{math.Float32frombits(0xFFC00000), 0xFE00},
	}
	checkSpecials(t, "F32ToF16", F32ToF16, tests)
}

func TestBF16Specials(t *testing.T) {
	tests := []special{
		{1, 0x3F80}, {-2, 0xC000}, {0.05, 0x3D4D},
		{math.Float32frombits(0x3F808000), 0x3F80}, // tie to even (down)
		{math.Float32frombits(0x3F818000), 0x3F82}, // tie to even (up)
		{math.Float32frombits(0x3F808001), 0x3F81}, // above the tie
		{math.MaxFloat32, 0x7F80},                  // rounds past the largest: Inf
		{float32(math.Inf(-1)), 0xFF80},
		{math.Float32frombits(1), 0},      // float32's smallest subnormal
		{math.Float32frombits(0x8000), 0}, // a tie to even at zero
		{math.Float32frombits(0x8001), 1},
		{math.Float32frombits(0x7FC00000), 0x7FC0},
	}
	checkSpecials(t, "F32ToBF16", F32ToBF16, tests)
}

// special is a narrowing's expected result on one input.
type special struct {
	in   float32
	want uint16
}

func checkSpecials(t *testing.T, name string, narrow func(float32) uint16, tests []special) {
	t.Helper()
	for _, tc := range tests {
		if got := narrow(tc.in); got != tc.want {
			t.Errorf("%s(%g) = %#04x, want %#04x", name, tc.in, got, tc.want)
		}
	}
}

func TestBF16Exhaustive(t *testing.T) {
	for h := range 1 << 16 {
		h := uint16(h)
		f := BF16ToF32(h)
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("BF16ToF32(%#04x) bits %#08x", h, math.Float32bits(f))
		}
		back := F32ToBF16(f)
		if f != f {
			if back&0x7F80 != 0x7F80 || back&0x7F == 0 || back&0x40 == 0 || back&0x8000 != h&0x8000 {
				t.Fatalf("F32ToBF16(NaN %#04x) = %#04x, want a quiet NaN with the same sign", h, back)
			}
			continue
		}
		if back != h {
			t.Fatalf("F32ToBF16(BF16ToF32(%#04x)) = %#04x", h, back)
		}
	}
	// A NaN whose payload lies only in the low half must stay NaN.
	if got := F32ToBF16(math.Float32frombits(0x7F800001)); got&0x7F == 0 {
		t.Errorf("F32ToBF16(signalling NaN) = %#04x, became Inf", got)
	}
}

func TestBF16RoundingTies(t *testing.T) {
	for h := uint16(0); h < 0x7F7F; h++ {
		lo, hi := float64(BF16ToF32(h)), float64(BF16ToF32(h+1))
		mid := float32((lo + hi) / 2)
		if float64(mid) != (lo+hi)/2 {
			t.Fatalf("midpoint of %#04x not exact", h)
		}
		even := h
		if h%2 == 1 {
			even = h + 1
		}
		if got := F32ToBF16(mid); got != even {
			t.Fatalf("F32ToBF16(%v) = %#04x, want %#04x", mid, got, even)
		}
		if got := F32ToBF16(-mid); got != 0x8000|even {
			t.Fatalf("F32ToBF16(%v) = %#04x, want %#04x", -mid, got, 0x8000|even)
		}
		if got := F32ToBF16(math.Nextafter32(mid, float32(math.Inf(1)))); got != h+1 {
			t.Fatalf("F32ToBF16(above %v) = %#04x, want %#04x", mid, got, h+1)
		}
		if got := F32ToBF16(math.Nextafter32(mid, 0)); got != h {
			t.Fatalf("F32ToBF16(below %v) = %#04x, want %#04x", mid, got, h)
		}
	}
	if got := F32ToBF16(math.MaxFloat32); got != 0x7F80 {
		t.Errorf("F32ToBF16(MaxFloat32) = %#04x, want Inf 0x7f80", got)
	}
}

// FuzzF32ToF16 holds both narrowings to the exact reference on any
// float32 bit pattern.
func FuzzF32ToF16(f *testing.F) {
	for _, v := range []float32{0, 1, 65504, 65520, 1e-7, 5.96e-8, -3.3} {
		f.Add(math.Float32bits(v))
	}
	f.Fuzz(func(t *testing.T, bits uint32) {
		v := math.Float32frombits(bits)
		got := F32ToF16(v)
		if v != v {
			if got != nanF16(bits) || F32ToBF16(v) != nanBF16(bits) {
				t.Fatalf("NaN %#08x: F32ToF16 %#04x, F32ToBF16 %#04x; want %#04x, %#04x", bits, got, F32ToBF16(v), nanF16(bits), nanBF16(bits))
			}
			return
		}
		if want := nearestF16(v); got != want {
			t.Fatalf("F32ToF16(%g [%#08x]) = %#04x, want %#04x", v, bits, got, want)
		}
		if got, want := F32ToBF16(v), nearestBF16(v); got != want {
			t.Fatalf("F32ToBF16(%g [%#08x]) = %#04x, want %#04x", v, bits, got, want)
		}
	})
}

// exact is an exact reference rounding of float32 to a 16-bit type: the
// type's finite non-negative values and, last, the first value past them
// (the next power of two, which stands for +Inf: IEEE rounds as if the
// exponent went on, and its pattern is even), as exact big.Floats in the
// order of their bit patterns.
type exact struct {
	vals []*big.Float
}

func newExact(n int, value func(uint16) float64, inf float64) *exact {
	e := &exact{vals: make([]*big.Float, n+1)}
	for h := range n {
		e.vals[h] = new(big.Float).SetFloat64(value(uint16(h)))
	}
	e.vals[n] = new(big.Float).SetFloat64(inf)
	return e
}

// round returns the pattern nearest to x, ties to the even pattern, with
// x's sign; x is not NaN. The arithmetic is exact (a float32 and a 16-bit
// value differ by at most 2^128 over a quantum of 2^-149: 300 bits).
func (e *exact) round(x float32) uint16 {
	var sign uint16
	if math.Signbit(float64(x)) {
		sign, x = 0x8000, -x
	}
	a := new(big.Float).SetFloat64(float64(x))
	n := len(e.vals) - 1
	if a.Cmp(e.vals[n]) >= 0 {
		return sign | uint16(n)
	}
	i := sort.Search(n+1, func(i int) bool { return e.vals[i].Cmp(a) >= 0 })
	if e.vals[i].Cmp(a) == 0 {
		return sign | uint16(i)
	}
	lo, hi := i-1, i
	below := new(big.Float).SetPrec(400).Sub(a, e.vals[lo])
	above := new(big.Float).SetPrec(400).Sub(e.vals[hi], a)
	switch c := below.Cmp(above); {
	case c < 0:
		return sign | uint16(lo)
	case c > 0:
		return sign | uint16(hi)
	case lo%2 == 0:
		return sign | uint16(lo)
	}
	return sign | uint16(hi)
}

var (
	exactF16  = newExact(0x7C00, f16Value, 65536)
	exactBF16 = newExact(0x7F80, func(h uint16) float64 { return float64(math.Float32frombits(uint32(h) << 16)) }, math.Ldexp(1, 128))
)

func nearestF16(x float32) uint16  { return exactF16.round(x) }
func nearestBF16(x float32) uint16 { return exactBF16.round(x) }

// nanF16 and nanBF16 are the documented NaN rule: sign and payload's top
// bits kept, quiet bit set.
func nanF16(bits uint32) uint16  { return uint16(bits>>16)&0x8000 | 0x7E00 | uint16(bits&0x7FFFFF>>13) }
func nanBF16(bits uint32) uint16 { return uint16(bits>>16) | 0x0040 }

// edges are the inputs where rounding goes wrong: every value of both
// types, the midpoints between neighbours (exact ties) and a float32 ulp
// either side, the overflow thresholds, float32's subnormals and extremes.
func edges() []float32 {
	var xs []float32
	near := func(v float32) {
		xs = append(xs, v, math.Nextafter32(v, float32(math.Inf(1))), math.Nextafter32(v, float32(math.Inf(-1))))
	}
	for h := range 0x7C00 {
		lo, hi := f16Value(uint16(h)), f16Value(uint16(h+1))
		if h == 0x7BFF {
			hi = 65536
		}
		near(float32(lo))
		near(float32((lo + hi) / 2))
	}
	for h := range 0x7F80 {
		lo := uint32(h) << 16
		near(math.Float32frombits(lo))
		near(math.Float32frombits(lo | 0x8000))
	}
	for _, v := range []float32{65504, 65519.996, 65520, 65536, math.MaxFloat32, math.SmallestNonzeroFloat32,
		math.Float32frombits(0x007FFFFF), math.Float32frombits(0x00400000), 0x1p-24, 0x1p-25, 0x1.8p-25, 0x1p-14} {
		near(v)
	}
	n := len(xs)
	for _, x := range xs[:n] {
		xs = append(xs, -x)
	}
	return xs
}

// TestNarrowExact holds F32ToF16 and F32ToBF16 to the exact reference on
// every edge input and on random ones: uniform bit patterns (every
// exponent) and values in each type's range.
func TestNarrowExact(t *testing.T) {
	xs := edges()
	r := rand.New(rand.NewPCG(29, 2))
	for range 100_000 {
		xs = append(xs, math.Float32frombits(r.Uint32()))
		xs = append(xs, float32(math.Ldexp(r.Float64()*2-1, r.IntN(50)-30)))   // f16's range and past it
		xs = append(xs, float32(math.Ldexp(r.Float64()*2-1, r.IntN(270)-140))) // bf16's, subnormals included
	}
	bad := 0
	for _, x := range xs {
		if x != x {
			continue
		}
		if got, want := F32ToF16(x), nearestF16(x); got != want {
			t.Errorf("F32ToF16(%g [%#08x]) = %#04x, want %#04x", x, math.Float32bits(x), got, want)
			bad++
		}
		if got, want := F32ToBF16(x), nearestBF16(x); got != want {
			t.Errorf("F32ToBF16(%g [%#08x]) = %#04x, want %#04x", x, math.Float32bits(x), got, want)
			bad++
		}
		if bad > 10 {
			t.Fatal("too many errors")
		}
	}
}

// TestNaN holds the one NaN rule on every float32 NaN payload class: the
// sign and top payload bits kept and the quiet bit set, never an Inf; and
// widening keeps the payload exactly.
func TestNaN(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	pats := []uint32{0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x7FA00000, 0x7F802000}
	for range 10_000 {
		pats = append(pats, 0x7F800000|r.Uint32()&0x807FFFFF|uint32(1+r.IntN(0x7FFFFF)))
	}
	for _, bits := range pats {
		x := math.Float32frombits(bits)
		if x == x {
			t.Fatalf("%#08x is not a NaN", bits)
		}
		if got := F32ToF16(x); got != nanF16(bits) {
			t.Fatalf("F32ToF16(NaN %#08x) = %#04x, want %#04x", bits, got, nanF16(bits))
		}
		if got := F32ToBF16(x); got != nanBF16(bits) {
			t.Fatalf("F32ToBF16(NaN %#08x) = %#04x, want %#04x", bits, got, nanBF16(bits))
		}
	}
	for m := uint16(1); m < 0x400; m++ {
		for _, s := range []uint16{0, 0x8000} {
			h := s | 0x7C00 | m
			if got := math.Float32bits(F16ToF32(h)); got != uint32(s)<<16|0x7F800000|uint32(m)<<13 {
				t.Fatalf("F16ToF32(NaN %#04x) = %#08x: payload not kept", h, got)
			}
			if got := F32ToF16(F16ToF32(h)); got != h|0x0200 {
				t.Fatalf("f16 NaN %#04x round-trips to %#04x, want %#04x (made quiet)", h, got, h|0x0200)
			}
		}
	}
}
