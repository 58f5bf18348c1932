// Package half holds the conversions between float32 and the 16-bit
// floating-point element types, bfloat16 and IEEE 754 binary16 (f16): the
// one definition format, format/synth, kernels and device/cpu/hostmath's
// portable code use, so that a value written by one reads back the same
// in every other. It imports nothing.
//
// Narrowing rounds to nearest, ties to even, as IEEE 754 does: values past
// the largest finite one round to ±Inf, tiny ones to subnormals or ±0. A
// NaN stays a NaN with its sign and the top bits of its payload, made
// quiet (the quiet bit set), as x86's F16C and AVX-512 BF16 conversions
// do; a quiet NaN therefore round-trips bit for bit, a signalling one
// comes back quiet. Widening is exact, NaN payloads included.
//
//	h := half.F32ToF16(0.1)  // 0x2e66
//	x := half.F16ToF32(h)    // 0.099975586
package half

import "math"

// BF16ToF32 widens a bfloat16 bit pattern exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds f to the nearest bfloat16, ties to even; overflow
// becomes ±Inf, NaN a quiet NaN with its sign and payload's top bits.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7FFFFFFF > 0x7F800000 {
		return uint16(u>>16) | 0x0040
	}
	u += 0x7FFF + (u>>16)&1
	return uint16(u >> 16)
}

// F16ToF32 widens an IEEE binary16 bit pattern exactly (subnormals, ±Inf and
// NaN included).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1F
	mant := uint32(h & 0x3FF)
	switch exp {
	case 0:
		v := float32(mant) * (1.0 / (1 << 24)) // exact: mant < 2^10
		return math.Float32frombits(math.Float32bits(v) | sign)
	case 0x1F:
		return math.Float32frombits(sign | 0x7F800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// F32ToF16 rounds f to the nearest IEEE binary16, ties to even: values from
// 65520 on round to ±Inf, tiny ones to subnormals or ±0; NaN stays a quiet
// NaN with its sign and payload's top bits.
func F32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	exp := int(u>>23) & 0xFF
	mant := u & 0x7FFFFF
	if exp == 0xFF {
		if mant != 0 {
			return sign | 0x7E00 | uint16(mant>>13)
		}
		return sign | 0x7C00
	}
	e := exp - 127 + 15
	if e >= 0x1F {
		return sign | 0x7C00
	}
	if e <= 0 {
		if e < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint(14 - e)
		h := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || rem == half && h&1 == 1 {
			h++ // may carry into the normals: correct rounding
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1FFF
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // may carry into the exponent, up to infinity: correct rounding
	}
	return sign | uint16(h)
}
