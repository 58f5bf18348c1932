package gguf

import "strconv"

// TypeInfo describes one ggml tensor type: data is stored in blocks of
// BlockElems elements taking BlockBytes bytes each, and a tensor's row length
// (ne[0]) must be a multiple of BlockElems.
type TypeInfo struct {
	ID         uint32
	Name       string // canonical name: "F32", "Q4_K", "IQ2_XS", "MXFP4", ...
	BlockElems uint64
	BlockBytes uint64
	// Removed is set for ids that ggml once used and no longer reads
	// (the Q4_0_4_4 family of repacked layouts); BlockElems and BlockBytes
	// are 0 for them.
	Removed bool
}

// qkK is the super-block size of the k-quants and i-quants.
const qkK = 256

// types is the ggml type table: ids from ggml.h's enum ggml_type, block
// sizes and block byte sizes from ggml's type_traits (mirrored by gguf-py's
// GGML_QUANT_SIZES). The formulas spell out each block's layout.
var types = [...]TypeInfo{
	{0, "F32", 1, 4, false},
	{1, "F16", 1, 2, false},
	{2, "Q4_0", 32, 2 + 16, false},
	{3, "Q4_1", 32, 2 + 2 + 16, false},
	{4, "Q4_2", 0, 0, true},
	{5, "Q4_3", 0, 0, true},
	{6, "Q5_0", 32, 2 + 4 + 16, false},
	{7, "Q5_1", 32, 2 + 2 + 4 + 16, false},
	{8, "Q8_0", 32, 2 + 32, false},
	{9, "Q8_1", 32, 4 + 4 + 32, false},
	{10, "Q2_K", qkK, 2 + 2 + qkK/16 + qkK/4, false},
	{11, "Q3_K", qkK, 2 + qkK/4 + qkK/8 + 12, false},
	{12, "Q4_K", qkK, 2 + 2 + qkK/2 + 12, false},
	{13, "Q5_K", qkK, 2 + 2 + qkK/2 + qkK/8 + 12, false},
	{14, "Q6_K", qkK, 2 + qkK/2 + qkK/4 + qkK/16, false},
	{15, "Q8_K", qkK, 4 + qkK + qkK/8, false},
	{16, "IQ2_XXS", qkK, 2 + qkK/4, false},
	{17, "IQ2_XS", qkK, 2 + qkK/4 + qkK/32, false},
	{18, "IQ3_XXS", qkK, 2 + qkK/4 + qkK/8, false},
	{19, "IQ1_S", qkK, 2 + qkK/8 + qkK/16, false},
	{20, "IQ4_NL", 32, 2 + 16, false},
	{21, "IQ3_S", qkK, 2 + qkK/4 + qkK/8 + qkK/32 + 4, false},
	{22, "IQ2_S", qkK, 2 + qkK/4 + qkK/16, false},
	{23, "IQ4_XS", qkK, 2 + 2 + qkK/2 + qkK/64, false},
	{24, "I8", 1, 1, false},
	{25, "I16", 1, 2, false},
	{26, "I32", 1, 4, false},
	{27, "I64", 1, 8, false},
	{28, "F64", 1, 8, false},
	{29, "IQ1_M", qkK, qkK/8 + qkK/16 + qkK/32, false},
	{30, "BF16", 1, 2, false},
	{31, "Q4_0_4_4", 0, 0, true},
	{32, "Q4_0_4_8", 0, 0, true},
	{33, "Q4_0_8_8", 0, 0, true},
	{34, "TQ1_0", qkK, 2 + 4*13, false},
	{35, "TQ2_0", qkK, 2 + 64, false},
	{36, "IQ4_NL_4_4", 0, 0, true},
	{37, "IQ4_NL_4_8", 0, 0, true},
	{38, "IQ4_NL_8_8", 0, 0, true},
	{39, "MXFP4", 32, 1 + 16, false},
	{40, "NVFP4", 64, 4 + 32, false},
	{41, "Q1_0", 128, 2 + 16, false},
}

// TypeByID returns the table entry for a ggml type id. ok is false for ids
// past the table; removed ids return ok with Removed set.
func TypeByID(id uint32) (TypeInfo, bool) {
	if uint64(id) >= uint64(len(types)) {
		return TypeInfo{}, false
	}
	return types[id], true
}

// TypeByName returns the supported (not removed) type with the given
// canonical name.
func TypeByName(name string) (TypeInfo, bool) {
	for _, t := range types {
		if t.Name == name && !t.Removed {
			return t, true
		}
	}
	return TypeInfo{}, false
}

// Types returns every supported ggml type, in id order.
func Types() []TypeInfo {
	out := make([]TypeInfo, 0, len(types))
	for _, t := range types {
		if !t.Removed {
			out = append(out, t)
		}
	}
	return out
}

// ValueType is the type tag of a GGUF metadata value.
type ValueType uint32

// Metadata value types, as numbered by the GGUF specification.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return "type(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// wireSize is the encoded size of a fixed-size value type, or the minimum
// encoded size of a variable one (string: its length; array: type and count).
func (t ValueType) wireSize() uint64 {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64, TypeString:
		return 8
	case TypeArray:
		return 12
	}
	return 0
}
