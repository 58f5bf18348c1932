package hostmath

import (
	"encoding/binary"
	"math"

	"github.com/memwall/memwall/half"
)

// Round returns v rounded to dt's precision (nearest even), as a float32;
// F32 returns v.
func Round(dt DType, v float32) float32 {
	switch dt {
	case BF16:
		return half.BF16ToF32(half.F32ToBF16(v))
	case F16:
		return half.F16ToF32(half.F32ToF16(v))
	}
	return v
}

// Load returns element i of src, widened from dt.
func Load(dt DType, src []byte, i int) float32 {
	switch dt {
	case BF16:
		return half.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	case F16:
		return half.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
}

// Store writes v rounded to dt as element i of dst.
func Store(dt DType, dst []byte, i int, v float32) {
	switch dt {
	case BF16:
		binary.LittleEndian.PutUint16(dst[2*i:], half.F32ToBF16(v))
	case F16:
		binary.LittleEndian.PutUint16(dst[2*i:], half.F32ToF16(v))
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
			dst[i] = half.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case F16:
		src = src[:2*len(dst)]
		for i := range dst {
			dst[i] = half.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
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
			binary.LittleEndian.PutUint16(dst[2*i:], half.F32ToBF16(v))
		}
	case F16:
		dst = dst[:2*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], half.F32ToF16(v))
		}
	default:
		dst = dst[:4*len(src)]
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	}
}
