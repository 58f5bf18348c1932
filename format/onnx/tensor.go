package onnx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/memwall/memwall/half"
)

// MaxElements bounds the element count of any tensor whose size is computed
// from its dims (2^50, a petabyte of bytes); larger products are rejected
// rather than overflowing.
const MaxElements = int64(1) << 50

// ErrNoData is returned by Tensor.Int64s and Tensor.Float64s when the tensor's
// values are not stored inline (external data, or no data field at all).
var ErrNoData = errors.New("tensor has no inline data")

// Bits returns the size of one element in bits, or 0 for UNDEFINED, STRING
// and codes this package does not know.
func (d DataType) Bits() int {
	switch d {
	case Float, Int32, Uint32:
		return 32
	case Uint8, Int8, Bool, Float8E4M3FN, Float8E4M3FNUZ, Float8E5M2, Float8E5M2FNUZ, Float8E8M0:
		return 8
	case Uint16, Int16, Float16, BFloat16:
		return 16
	case Int64, Double, Uint64, Complex64:
		return 64
	case Complex128:
		return 128
	case Uint4, Int4, Float4E2M1:
		return 4
	case Uint2, Int2:
		return 2
	}
	return 0
}

// NumElements returns the product of dims. It fails for a negative dimension
// or a product above MaxElements (checked before any overflow can occur).
func NumElements(dims []int64) (int64, error) {
	n := int64(1)
	for i, d := range dims {
		if d < 0 {
			return 0, fmt.Errorf("dimension %d is negative (%d)", i, d)
		}
		if d == 0 {
			return 0, nil
		}
	}
	for _, d := range dims {
		if n > MaxElements/d {
			return 0, fmt.Errorf("shape %v has more than %d elements", dims, MaxElements)
		}
		n *= d
	}
	return n, nil
}

// External describes where an external tensor's bytes are, from its
// external_data entries. Location is relative to the model file's directory.
// Offset and Length are byte counts; HasLength is false when the file gives
// no length (the data then runs to the end of the file).
type External struct {
	Location  string
	Offset    int64
	Length    int64
	HasLength bool
	Checksum  string
}

// External returns the tensor's external-data reference, or nil and no error
// when the tensor is stored inline. It fails when the entries are malformed:
// no location, or an offset or length that is not a non-negative integer.
func (t *Tensor) External() (*External, error) {
	if t.DataLocation != LocationExternal {
		return nil, nil
	}
	var e External
	for _, kv := range t.ExternalData {
		switch kv.Key {
		case "location":
			e.Location = kv.Value
		case "offset", "length":
			v, err := strconv.ParseInt(kv.Value, 10, 64)
			if err != nil || v < 0 {
				return nil, fmt.Errorf("tensor %q: external_data %s %q is not a non-negative integer", t.Name, kv.Key, kv.Value)
			}
			if kv.Key == "offset" {
				e.Offset = v
			} else {
				e.Length, e.HasLength = v, true
			}
		case "checksum":
			e.Checksum = kv.Value
		}
	}
	if e.Location == "" {
		return nil, fmt.Errorf("tensor %q: external data without a location", t.Name)
	}
	return &e, nil
}

// Int64s returns the tensor's values as int64 for integer and boolean element
// types (INT8..INT64, UINT8..UINT64, BOOL), decoded from raw_data or the typed
// field. UINT64 values above math.MaxInt64 wrap. It returns ErrNoData when
// the values are not inline, and an error when the element type is not an
// integer type or the data length does not match the dims.
func (t *Tensor) Int64s() ([]int64, error) {
	n, err := t.inlineCount()
	if err != nil {
		return nil, err
	}
	out := make([]int64, 0, n)
	if t.RawData != nil {
		b := t.RawData
		size := t.DataType.Bits() / 8
		for i := 0; i < int(n); i++ {
			p := b[i*size:]
			var v int64
			switch t.DataType {
			case Int8:
				v = int64(int8(p[0]))
			case Uint8, Bool:
				v = int64(p[0])
			case Int16:
				v = int64(int16(binary.LittleEndian.Uint16(p)))
			case Uint16:
				v = int64(binary.LittleEndian.Uint16(p))
			case Int32:
				v = int64(int32(binary.LittleEndian.Uint32(p)))
			case Uint32:
				v = int64(binary.LittleEndian.Uint32(p))
			case Int64, Uint64:
				v = int64(binary.LittleEndian.Uint64(p))
			default:
				return nil, fmt.Errorf("tensor %q: %v is not an integer type", t.Name, t.DataType)
			}
			out = append(out, v)
		}
		return out, nil
	}
	switch t.DataType {
	case Int8, Uint8, Int16, Uint16, Int32, Bool:
		for _, v := range t.Int32Data {
			out = append(out, int64(v))
		}
	case Int64:
		out = append(out, t.Int64Data...)
	case Uint32, Uint64:
		for _, v := range t.Uint64Data {
			out = append(out, int64(v))
		}
	default:
		return nil, fmt.Errorf("tensor %q: %v is not an integer type", t.Name, t.DataType)
	}
	return out, nil
}

// Float64s returns the tensor's values as float64 for floating-point types
// (FLOAT, DOUBLE, FLOAT16, BFLOAT16) and, converted, for the integer types
// Int64s accepts. Errors are as for Int64s.
func (t *Tensor) Float64s() ([]float64, error) {
	switch t.DataType {
	case Float, Double, Float16, BFloat16:
	default:
		ints, err := t.Int64s()
		if err != nil {
			return nil, err
		}
		out := make([]float64, len(ints))
		for i, v := range ints {
			out[i] = float64(v)
		}
		return out, nil
	}
	n, err := t.inlineCount()
	if err != nil {
		return nil, err
	}
	out := make([]float64, 0, n)
	if t.RawData != nil {
		b := t.RawData
		for i := 0; i < int(n); i++ {
			switch t.DataType {
			case Float:
				out = append(out, float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))))
			case Double:
				out = append(out, math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:])))
			case Float16:
				out = append(out, float64(half.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))))
			case BFloat16:
				out = append(out, float64(half.BF16ToF32(binary.LittleEndian.Uint16(b[2*i:]))))
			}
		}
		return out, nil
	}
	switch t.DataType {
	case Float:
		for _, v := range t.FloatData {
			out = append(out, float64(v))
		}
	case Double:
		out = append(out, t.DoubleData...)
	case Float16:
		for _, v := range t.Int32Data {
			out = append(out, float64(half.F16ToF32(uint16(v))))
		}
	case BFloat16:
		for _, v := range t.Int32Data {
			out = append(out, float64(half.BF16ToF32(uint16(v))))
		}
	}
	return out, nil
}

// inlineCount checks that the tensor has inline data of a fixed-width type
// whose length matches its dims and returns the element count.
func (t *Tensor) inlineCount() (int64, error) {
	if t.DataLocation == LocationExternal {
		return 0, fmt.Errorf("tensor %q: %w (external)", t.Name, ErrNoData)
	}
	n, err := NumElements(t.Dims)
	if err != nil {
		return 0, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	bits := t.DataType.Bits()
	if bits == 0 || bits%8 != 0 || t.DataType == Complex64 || t.DataType == Complex128 {
		return 0, fmt.Errorf("tensor %q: values of type %v are not supported", t.Name, t.DataType)
	}
	if t.RawData != nil {
		if int64(len(t.RawData)) != n*int64(bits/8) {
			return 0, fmt.Errorf("tensor %q: raw_data holds %d bytes, dims %v of %v need %d",
				t.Name, len(t.RawData), t.Dims, t.DataType, n*int64(bits/8))
		}
		return n, nil
	}
	var have int
	switch t.DataType {
	case Float:
		have = len(t.FloatData)
	case Int64:
		have = len(t.Int64Data)
	case Double:
		have = len(t.DoubleData)
	case Uint32, Uint64:
		have = len(t.Uint64Data)
	default:
		have = len(t.Int32Data)
	}
	if have == 0 && n > 0 {
		return 0, fmt.Errorf("tensor %q: %w", t.Name, ErrNoData)
	}
	if int64(have) != n {
		return 0, fmt.Errorf("tensor %q: holds %d values, dims %v need %d", t.Name, have, t.Dims, n)
	}
	return n, nil
}
