package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Dtype names accepted by Matmul, ShapeFor and the host functions. Matrix
// bytes are little-endian, as on the GPU.
const (
	BF16 = "bf16" // bfloat16: the top half of a float32
	F16  = "f16"  // IEEE 754 binary16
	F32  = "f32"  // IEEE 754 binary32
)

// DTypes lists the supported dtypes in a fixed order.
func DTypes() []string { return []string{F32, BF16, F16} }

// ElemSize returns the bytes per element of dtype, or an error wrapping
// ErrDType.
func ElemSize(dtype string) (int, error) {
	switch dtype {
	case BF16, F16:
		return 2, nil
	case F32:
		return 4, nil
	}
	return 0, fmt.Errorf("dtype %q (want %s, %s or %s): %w", dtype, BF16, F16, F32, ErrDType)
}

// BF16ToF32 widens a bfloat16 bit pattern exactly.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 rounds f to the nearest bfloat16, ties to even; NaN stays a
// (quiet) NaN with its sign, overflow becomes ±Inf.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7FFFFFFF > 0x7F800000 { // NaN: keep sign and top payload bits, force quiet
		return uint16(u>>16) | 0x0040
	}
	u += 0x7FFF + (u>>16)&1
	return uint16(u >> 16)
}

// F16ToF32 widens an IEEE binary16 bit pattern exactly (subnormals, ±Inf
// and NaN included).
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1F
	mant := uint32(h & 0x3FF)
	switch exp {
	case 0:
		// ±mant × 2^-24, exact in float32.
		v := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(math.Float32bits(v) | sign)
	case 0x1F:
		return math.Float32frombits(sign | 0x7F800000 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// F32ToF16 rounds f to the nearest IEEE binary16, ties to even: values past
// the largest half (65504) round to ±Inf, tiny values to subnormals or ±0;
// NaN stays a quiet NaN with its sign.
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
			return sign // below half the smallest subnormal: rounds to zero
		}
		m := mant | 0x800000 // float32 subnormals have e < -10, so the bit is implicit
		shift := uint(14 - e)
		h := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || rem == half && h&1 == 1 {
			h++ // may carry into the smallest normal, which is the right encoding
		}
		return sign | uint16(h)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1FFF
	if rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++ // a carry into the exponent is right, up to Inf
	}
	return sign | uint16(h)
}

// Encode converts src to dtype bytes (little-endian, rounding to nearest
// even). It returns a new slice, or an error wrapping ErrDType.
func Encode(dtype string, src []float32) ([]byte, error) {
	elt, err := ElemSize(dtype)
	if err != nil {
		return nil, fmt.Errorf("kernels: encode: %w", err)
	}
	out := make([]byte, len(src)*elt)
	for i, v := range src {
		switch dtype {
		case F32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		case BF16:
			binary.LittleEndian.PutUint16(out[2*i:], F32ToBF16(v))
		case F16:
			binary.LittleEndian.PutUint16(out[2*i:], F32ToF16(v))
		}
	}
	return out, nil
}

// Decode widens dtype bytes to float32 exactly. It returns a new slice, or
// an error wrapping ErrDType, or ErrShape when len(src) is not a multiple of
// the element size.
func Decode(dtype string, src []byte) ([]float32, error) {
	elt, err := ElemSize(dtype)
	if err != nil {
		return nil, fmt.Errorf("kernels: decode: %w", err)
	}
	if len(src)%elt != 0 {
		return nil, fmt.Errorf("kernels: decode %s: %d bytes is not a multiple of %d: %w", dtype, len(src), elt, ErrShape)
	}
	out := make([]float32, len(src)/elt)
	decodeInto(dtype, out, src)
	return out, nil
}

// decodeInto widens len(dst) elements of src (which must hold them) into
// dst. dtype must be valid.
func decodeInto(dtype string, dst []float32, src []byte) {
	switch dtype {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	}
}
