package hostmath

import (
	"encoding/binary"
	"math"
)

// BF16ToF32 widens a bfloat16 bit pattern exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds f to the nearest bfloat16, ties to even; NaN stays a
// quiet NaN with its sign, overflow becomes ±Inf.
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
		v := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(v) | sign)
	case 0x1F:
		return math.Float32frombits(sign | 0x7F800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// F32ToF16 rounds f to the nearest IEEE binary16, ties to even: values past
// 65504 round to ±Inf, tiny ones to subnormals or ±0; NaN stays a quiet NaN
// with its sign.
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
			h++
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1FFF
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++
	}
	return sign | uint16(h)
}

// Round returns v rounded to dt's precision (nearest even), as a float32;
// F32 returns v.
func Round(dt DType, v float32) float32 {
	switch dt {
	case BF16:
		return BF16ToF32(F32ToBF16(v))
	case F16:
		return F16ToF32(F32ToF16(v))
	}
	return v
}

// Load returns element i of src, widened from dt.
func Load(dt DType, src []byte, i int) float32 {
	switch dt {
	case BF16:
		return BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	case F16:
		return F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
}

// Store writes v rounded to dt as element i of dst.
func Store(dt DType, dst []byte, i int, v float32) {
	switch dt {
	case BF16:
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
	case F16:
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
	default:
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
	}
}

// Widen writes the len(dst) elements of src (dt) to dst as float32,
// exactly.
func Widen(dst []float32, src []byte, dt DType) {
	switch dt {
	case BF16:
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	case F16:
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	default:
		src = src[:4*len(dst)]
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	}
}

// Narrow writes src rounded to dt (nearest even) into dst, which must hold
// len(src) elements of dt.
func Narrow(dst []byte, src []float32, dt DType) {
	switch dt {
	case BF16:
		dst = dst[:2*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(v))
		}
	case F16:
		dst = dst[:2*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(v))
		}
	default:
		dst = dst[:4*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	}
}
