package graph

import (
	"fmt"
	"math/bits"
)

// DType is a tensor element type.
type DType uint8

// Element types. The zero value is an unknown type.
const (
	DTypeUnknown DType = iota
	Float32
	Float16
	BFloat16
	Float64
	Int8
	Int16
	Int32
	Int64
	Uint8
	Uint16
	Uint32
	Uint64
	Bool
	String
	Complex64
	Complex128
	Float8E4M3FN
	Float8E4M3FNUZ
	Float8E5M2
	Float8E5M2FNUZ
	Float8E8M0
	Int4
	Uint4
	Float4E2M1
	Int2
	Uint2
	numDTypes
)

type dtypeInfo struct {
	name  string
	bits  int // 0: no fixed size
	class byte
}

const (
	classNone  = 0
	classFloat = 'f'
	classInt   = 'i' // signed integer
	classUint  = 'u'
	classBool  = 'b'
)

var dtypes = [numDTypes]dtypeInfo{
	DTypeUnknown:   {"unknown", 0, classNone},
	Float32:        {"float32", 32, classFloat},
	Float16:        {"float16", 16, classFloat},
	BFloat16:       {"bfloat16", 16, classFloat},
	Float64:        {"float64", 64, classFloat},
	Int8:           {"int8", 8, classInt},
	Int16:          {"int16", 16, classInt},
	Int32:          {"int32", 32, classInt},
	Int64:          {"int64", 64, classInt},
	Uint8:          {"uint8", 8, classUint},
	Uint16:         {"uint16", 16, classUint},
	Uint32:         {"uint32", 32, classUint},
	Uint64:         {"uint64", 64, classUint},
	Bool:           {"bool", 8, classBool},
	String:         {"string", 0, classNone},
	Complex64:      {"complex64", 64, classNone},
	Complex128:     {"complex128", 128, classNone},
	Float8E4M3FN:   {"float8e4m3fn", 8, classFloat},
	Float8E4M3FNUZ: {"float8e4m3fnuz", 8, classFloat},
	Float8E5M2:     {"float8e5m2", 8, classFloat},
	Float8E5M2FNUZ: {"float8e5m2fnuz", 8, classFloat},
	Float8E8M0:     {"float8e8m0", 8, classFloat},
	Int4:           {"int4", 4, classInt},
	Uint4:          {"uint4", 4, classUint},
	Float4E2M1:     {"float4e2m1", 4, classFloat},
	Int2:           {"int2", 2, classInt},
	Uint2:          {"uint2", 2, classUint},
}

func (d DType) info() dtypeInfo {
	if d < numDTypes {
		return dtypes[d]
	}
	return dtypeInfo{name: fmt.Sprintf("DType(%d)", uint8(d))}
}

// String returns the type's lower-case name ("float32", "bfloat16", ...).
func (d DType) String() string { return d.info().name }

// Bits returns the size of one element in bits, or 0 for types without a
// fixed size (unknown, string).
func (d DType) Bits() int { return d.info().bits }

// IsFloat reports whether d is a floating-point type (including float8 and
// float4 formats).
func (d DType) IsFloat() bool { return d.info().class == classFloat }

// IsInteger reports whether d is a signed or unsigned integer type.
func (d DType) IsInteger() bool { c := d.info().class; return c == classInt || c == classUint }

// ByteSize returns the bytes needed to store elements values of type d,
// rounding sub-byte types (int4, float4, int2) up to whole bytes. It fails for
// types without a fixed size and when the result does not fit in a uint64.
func (d DType) ByteSize(elements uint64) (uint64, error) {
	b := d.Bits()
	if b == 0 {
		return 0, fmt.Errorf("element type %v has no fixed size", d)
	}
	hi, lo := bits.Mul64(elements, uint64(b))
	if hi != 0 || lo > ^uint64(0)-7 {
		return 0, fmt.Errorf("%d elements of %v overflow a 64-bit byte count", elements, d)
	}
	return (lo + 7) / 8, nil
}

// MaxElements bounds the element count of any tensor (2^50); shapes with
// larger products are rejected by NumElements instead of overflowing.
const MaxElements = int64(1) << 50

// MaxRank bounds the number of dimensions of any tensor.
const MaxRank = 64

// NumElements returns the product of shape. It fails for a negative
// dimension, a rank above MaxRank, or a dimension or product above
// MaxElements (even when another dimension is 0, so that sums and products of
// dimensions of valid shapes cannot overflow).
func NumElements(shape []int64) (int64, error) {
	if len(shape) > MaxRank {
		return 0, fmt.Errorf("rank %d exceeds the limit of %d", len(shape), MaxRank)
	}
	zero := false
	for i, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("shape %v: dimension %d is negative", shape, i)
		}
		if d > MaxElements {
			return 0, fmt.Errorf("shape %v: dimension %d exceeds %d", shape, i, MaxElements)
		}
		zero = zero || d == 0
	}
	if zero {
		return 0, nil
	}
	n := int64(1)
	for _, d := range shape {
		if n > MaxElements/d {
			return 0, fmt.Errorf("shape %v has more than %d elements", shape, MaxElements)
		}
		n *= d
	}
	return n, nil
}
