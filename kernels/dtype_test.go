package kernels

import (
	"errors"
	"math"
	"sort"
	"testing"
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

// f16Nearest rounds v to binary16 by searching the table of finite
// non-negative halves (monotonic in their bit patterns): nearest value, ties
// to the even pattern, 65520 and beyond to Inf.
var f16Table = func() []float64 {
	t := make([]float64, 0x7C00)
	for h := range t {
		t[h] = f16Value(uint16(h))
	}
	return t
}()

func f16Nearest(v float32) uint16 {
	if v != v {
		return 0x7E00
	}
	var sign uint16
	a := float64(v)
	if math.Signbit(a) {
		sign, a = 0x8000, -a
	}
	if a >= 65520 {
		return sign | 0x7C00
	}
	i := sort.SearchFloat64s(f16Table, a) // first h with value >= a
	if i == 0 {
		return sign
	}
	if i == len(f16Table) {
		return sign | 0x7BFF
	}
	lo, hi := f16Table[i-1], f16Table[i]
	switch {
	case a-lo < hi-a:
		return sign | uint16(i-1)
	case a-lo > hi-a:
		return sign | uint16(i)
	case (i-1)%2 == 0:
		return sign | uint16(i-1)
	default:
		return sign | uint16(i)
	}
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
	tests := []struct {
		in   float32
		want uint16
	}{
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
	}
	for _, tc := range tests {
		if got := F32ToF16(tc.in); got != tc.want {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", tc.in, got, tc.want)
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

func TestEncodeDecode(t *testing.T) {
	in := []float32{0, 1, -2.5, 3.140625, 1e-3, -65504}
	for _, dt := range DTypes() {
		t.Run(dt, func(t *testing.T) {
			b, err := Encode(dt, in)
			if err != nil {
				t.Fatal(err)
			}
			elt, _ := ElemSize(dt)
			if len(b) != len(in)*elt {
				t.Fatalf("Encode: %d bytes, want %d", len(b), len(in)*elt)
			}
			out, err := Decode(dt, b)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range in {
				var want float32
				switch dt {
				case F32:
					want = v
				case BF16:
					want = BF16ToF32(F32ToBF16(v))
				case F16:
					want = F16ToF32(F32ToF16(v))
				}
				if out[i] != want {
					t.Errorf("element %d: %v -> %v, want %v", i, v, out[i], want)
				}
			}
			if _, err := Decode(dt, make([]byte, elt+1)); !errors.Is(err, ErrShape) {
				t.Errorf("Decode of %d bytes: err %v, want ErrShape", elt+1, err)
			}
		})
	}
	if _, err := Encode("fp8", in); !errors.Is(err, ErrDType) {
		t.Errorf("Encode(fp8): err %v, want ErrDType", err)
	}
	if _, err := Decode("int4", nil); !errors.Is(err, ErrDType) {
		t.Errorf("Decode(int4): err %v, want ErrDType", err)
	}
	// Little-endian layout, as the GPU reads it.
	b, _ := Encode(BF16, []float32{1})
	if b[0] != 0x80 || b[1] != 0x3F {
		t.Errorf("bf16(1) bytes % x, want 80 3f", b)
	}
}

func FuzzF32ToF16(f *testing.F) {
	for _, v := range []float32{0, 1, 65504, 65520, 1e-7, 5.96e-8, -3.3} {
		f.Add(math.Float32bits(v))
	}
	f.Fuzz(func(t *testing.T, bits uint32) {
		v := math.Float32frombits(bits)
		got := F32ToF16(v)
		if v != v {
			if got&0x7C00 != 0x7C00 || got&0x3FF == 0 {
				t.Fatalf("F32ToF16(NaN %#08x) = %#04x", bits, got)
			}
			return
		}
		if want := f16Nearest(v); got != want {
			t.Fatalf("F32ToF16(%g [%#08x]) = %#04x, want %#04x", v, bits, got, want)
		}
		bf := F32ToBF16(v)
		// bf16 rounding error is at most half an ulp of bf16: 8 significant
		// bits, or 2^-134 among the subnormals.
		if d := math.Abs(float64(BF16ToF32(bf)) - float64(v)); !math.IsInf(float64(BF16ToF32(bf)), 0) && d > max(math.Abs(float64(v))/256, math.Ldexp(1, -134)) {
			t.Fatalf("F32ToBF16(%g) = %#04x (%g): error %g too large", v, bf, BF16ToF32(bf), d)
		}
	})
}
