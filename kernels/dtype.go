package kernels

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/memwall/memwall/half"
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
			binary.LittleEndian.PutUint16(out[2*i:], half.F32ToBF16(v))
		case F16:
			binary.LittleEndian.PutUint16(out[2*i:], half.F32ToF16(v))
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
			dst[i] = half.BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = half.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	}
}
