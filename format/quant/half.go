package quant

import "math"

// F16ToF32 widens an IEEE binary16 exactly (subnormals, infinities and NaN
// included), as ggml's GGML_FP16_TO_FP32 does.
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	e := int(h>>10) & 0x1F
	m := uint32(h & 0x3FF)
	switch {
	case e == 0x1F:
		return math.Float32frombits(sign | 0x7F800000 | m<<13)
	case e == 0:
		v := float32(m) / (1 << 24) // exact: m < 2^10
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | uint32(e-15+127)<<23 | m<<13)
}

// F32ToF16 rounds f to IEEE binary16, to nearest even, with subnormals,
// infinity on overflow and a quiet NaN for NaN: the value ggml's
// GGML_FP32_TO_FP16 gives.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	e := int(b>>23) & 0xFF
	mant := b & 0x7FFFFF
	if e == 0xFF {
		if mant != 0 {
			return sign | 0x7E00
		}
		return sign | 0x7C00
	}
	exp := e - 127 + 15
	if exp >= 0x1F {
		return sign | 0x7C00
	}
	if exp <= 0 {
		if exp < -10 {
			return sign
		}
		m := mant | 0x800000
		shift := uint(14 - exp)
		q, rem, half := m>>shift, m&(1<<shift-1), uint32(1)<<(shift-1)
		if rem > half || (rem == half && q&1 == 1) {
			q++
		}
		return sign | uint16(q)
	}
	h := uint32(exp)<<10 | mant>>13
	rem := mant & 0x1FFF
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // may carry into the exponent, up to infinity: correct rounding
	}
	return sign | uint16(h)
}

// BF16ToF32 widens a bfloat16 exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds f to bfloat16, to nearest even; a NaN stays a NaN (made
// quiet), as ggml converts.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7FFFFFFF > 0x7F800000 {
		return uint16(b>>16) | 0x40
	}
	b += 0x7FFF + (b>>16)&1
	return uint16(b >> 16)
}
