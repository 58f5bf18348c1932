package safetensors

import (
	"fmt"
	"math/bits"
)

// DTypeBits returns the width in bits of one element of a safetensors dtype,
// and false for a name the format does not define. The names and widths
// follow the reference implementation's Dtype enum, sub-byte floating-point
// types (F4, F6_*) included.
func DTypeBits(dtype string) (uint64, bool) {
	switch dtype {
	case "F4":
		return 4, true
	case "F6_E2M3", "F6_E3M2":
		return 6, true
	case "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ":
		return 8, true
	case "I16", "U16", "F16", "BF16":
		return 16, true
	case "I32", "U32", "F32":
		return 32, true
	case "I64", "U64", "F64", "C64":
		return 64, true
	}
	return 0, false
}

// DTypes lists every dtype DTypeBits knows, narrowest first.
func DTypes() []string {
	return []string{
		"F4", "F6_E2M3", "F6_E3M2",
		"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
		"I16", "U16", "F16", "BF16",
		"I32", "U32", "F32",
		"I64", "U64", "F64", "C64",
	}
}

// errUnknownDType and friends are reasons; callers wrap them in *format.Error.
type sizeError struct {
	reason      string
	unsupported bool
}

func (e *sizeError) Error() string { return e.reason }

// TensorBytes returns the exact byte length of a tensor of the given dtype
// and outermost-first shape. It fails if the dtype is unknown, if the element
// count or bit count overflows 64 bits, or if the bit count is not a whole
// number of bytes (possible for F4 and F6 types).
func TensorBytes(dtype string, shape []uint64) (uint64, error) {
	width, ok := DTypeBits(dtype)
	if !ok {
		return 0, &sizeError{reason: fmt.Sprintf("dtype %q unknown", dtype), unsupported: true}
	}
	n := uint64(1)
	for _, d := range shape {
		hi, lo := bits.Mul64(n, d)
		if hi != 0 {
			return 0, &sizeError{reason: fmt.Sprintf("shape %v: element count overflows 64 bits", shape)}
		}
		n = lo
	}
	hi, nbits := bits.Mul64(n, width)
	if hi != 0 {
		return 0, &sizeError{reason: fmt.Sprintf("shape %v of %s: size overflows 64 bits", shape, dtype)}
	}
	if nbits%8 != 0 {
		return 0, &sizeError{reason: fmt.Sprintf("shape %v of %s is %d bits, not a whole number of bytes", shape, dtype, nbits)}
	}
	return nbits / 8, nil
}
