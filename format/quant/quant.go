// Package quant encodes and decodes the block-quantized tensor types of GGUF
// files — Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K — exactly as ggml
// does: Dequantize gives the float32 values llama.cpp's dequantizers give,
// bit for bit, and Quantize writes the bytes ggml's reference quantizers
// write (the ones llama-quantize uses without an importance matrix), so
// that a file memwall quantizes is the file llama-quantize would write.
// Both are the oracle for every faster kernel (GPU, CPU assembly): a kernel
// is right when it agrees with them.
//
// Every type stores a row as consecutive blocks of BlockElems elements in
// BlockBytes bytes; blocks are independent, so any whole number of blocks
// can be coded on its own, in any order, on any goroutine. F32, F16 and BF16
// are handled too, as blocks of one element, so that callers treat every
// type alike.
//
// Choose gives each tensor of a model the type llama.cpp's file types
// (Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0) give it.
//
// The arithmetic follows ggml's single-precision expressions operation by
// operation. Products are converted to float32 before they are added, which
// in Go forbids fusing them into a multiply-add, so the results are the same
// on every architecture.
package quant

import (
	"fmt"
	"math"
	"strings"

	"github.com/memwall/memwall/half"
)

// Type is a ggml tensor type, numbered as ggml.h numbers them (the ids GGUF
// files store).
type Type uint32

// The types this package codes.
const (
	F32  Type = 0
	F16  Type = 1
	Q4_0 Type = 2
	Q5_0 Type = 6
	Q5_1 Type = 7
	Q8_0 Type = 8
	Q4_K Type = 12
	Q5_K Type = 13
	Q6_K Type = 14
	BF16 Type = 30
)

// superBlock is the k-quants' block size (ggml's QK_K).
const superBlock = 256

type typeInfo struct {
	name       string
	blockElems int
	blockBytes int
}

// Block layouts, as ggml-common.h declares them (all little-endian, f16
// scales as IEEE binary16):
//
//	Q8_0  32 elems, 34 B: d f16, qs [32]int8                x = d·q
//	Q4_0  32 elems, 18 B: d f16, qs [16] nibbles            x = d·(q−8); element j in the low nibble of qs[j], j+16 in the high
//	Q5_0  32 elems, 22 B: d f16, qh u32, qs [16]            x = d·(q−16); bit j of qh is element j's fifth bit
//	Q5_1  32 elems, 24 B: d f16, m f16, qh u32, qs [16]     x = d·q + m
//	Q4_K 256 elems, 144 B: d, dmin f16, scales [12], qs [128]
//	      8 sub-blocks of 32 with 6-bit scale and min packed in scales;
//	      x = d·sc·q − dmin·m; per 64 elements, 32 bytes: low nibbles then high nibbles
//	Q5_K 256 elems, 176 B: d, dmin f16, scales [12], qh [32], qs [128]
//	      as Q4_K with a fifth bit: bit 2i (low half) and 2i+1 (high half) of qh[l] for 64-element group i
//	Q6_K 256 elems, 210 B: ql [128], qh [64], scales [16]int8, d f16
//	      16 sub-blocks of 16, x = d·sc·(q−32); per 128 elements, 64 bytes of ql and 32 of qh
var types = map[Type]typeInfo{
	F32:  {"F32", 1, 4},
	F16:  {"F16", 1, 2},
	BF16: {"BF16", 1, 2},
	Q8_0: {"Q8_0", 32, 34},
	Q4_0: {"Q4_0", 32, 18},
	Q5_0: {"Q5_0", 32, 22},
	Q5_1: {"Q5_1", 32, 24},
	Q4_K: {"Q4_K", superBlock, 144},
	Q5_K: {"Q5_K", superBlock, 176},
	Q6_K: {"Q6_K", superBlock, 210},
}

// Types returns every type this package codes, in id order.
func Types() []Type { return []Type{F32, F16, Q4_0, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16} }

// Quantized returns the block-quantized types, in id order.
func Quantized() []Type { return []Type{Q4_0, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K} }

// Known reports whether this package codes t.
func (t Type) Known() bool { _, ok := types[t]; return ok }

// String is ggml's upper-case name ("Q4_K"), or "type(N)" for a type this
// package does not code.
func (t Type) String() string {
	if ti, ok := types[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockElems is the number of elements in one block (1 for F32, F16 and
// BF16); 0 for an unknown type.
func (t Type) BlockElems() int { return types[t].blockElems }

// BlockBytes is the size of one block; 0 for an unknown type.
func (t Type) BlockBytes() int { return types[t].blockBytes }

// IsQuantized reports whether t stores blocks of more than one element.
func (t Type) IsQuantized() bool { return types[t].blockElems > 1 }

// TypeByName returns the type called name (ggml's spelling, any case).
func TypeByName(name string) (Type, bool) {
	for t, ti := range types {
		if strings.EqualFold(ti.name, name) {
			return t, true
		}
	}
	return 0, false
}

// RowBytes returns the bytes of n elements of type t, or an error when t is
// unknown or n is not a whole number of blocks.
func RowBytes(t Type, n int) (int, error) {
	ti, ok := types[t]
	switch {
	case !ok:
		return 0, fmt.Errorf("quant: %v is not a type this package codes", t)
	case n < 0 || n%ti.blockElems != 0:
		return 0, fmt.Errorf("quant: %d elements is not a whole number of %s blocks of %d", n, ti.name, ti.blockElems)
	}
	return n / ti.blockElems * ti.blockBytes, nil
}

// check returns the number of blocks that elems elements and data bytes of
// type t hold, or an error naming the mismatch.
func check(t Type, elems, data int) (int, error) {
	n, err := RowBytes(t, elems)
	if err != nil {
		return 0, err
	}
	if data != n {
		return 0, fmt.Errorf("quant: %d %s elements take %d bytes, not %d", elems, t, n, data)
	}
	return elems / types[t].blockElems, nil
}

// NonFiniteError is Quantize's error for a NaN or an infinity in its input.
type NonFiniteError struct {
	Index int     // of the first such element
	Value float32 // NaN, +Inf or -Inf
}

func (e *NonFiniteError) Error() string {
	return fmt.Sprintf("quant: element %d is %v: only finite values quantize", e.Index, e.Value)
}

// checkFinite returns a *NonFiniteError for the first NaN or infinity of x.
// The sum of x·0 is 0 for finite values and NaN otherwise, so the loop has
// no branch until it finds one.
func checkFinite(x []float32) error {
	const chunk = 256
	for lo := 0; lo < len(x); lo += chunk {
		part := x[lo:min(lo+chunk, len(x))]
		var s float32
		for _, v := range part {
			s += v * 0
		}
		if s == 0 {
			continue
		}
		for i, v := range part {
			if v != v || v > math.MaxFloat32 || v < -math.MaxFloat32 {
				return &NonFiniteError{Index: lo + i, Value: v}
			}
		}
	}
	return nil
}

// Dequantize decodes src, whole blocks of type t, into dst, as ggml's
// dequantizer for t does (the float32 values are ggml's, bit for bit).
// len(dst) must be a whole number of blocks and len(src) exactly their
// bytes; otherwise it returns an error and writes nothing. Any bytes decode:
// a scale may be an infinity or a NaN, and the values follow from it.
func Dequantize(t Type, dst []float32, src []byte) error {
	nb, err := check(t, len(dst), len(src))
	if err != nil {
		return err
	}
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(le32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = half.F16ToF32(le16(src[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = half.BF16ToF32(le16(src[2*i:]))
		}
	case Q8_0:
		for b := range nb {
			dequantQ8_0((*[32]float32)(dst[32*b:]), (*[34]byte)(src[34*b:]))
		}
	case Q4_0:
		for b := range nb {
			dequantQ4_0((*[32]float32)(dst[32*b:]), (*[18]byte)(src[18*b:]))
		}
	case Q5_0:
		for b := range nb {
			dequantQ5_0((*[32]float32)(dst[32*b:]), (*[22]byte)(src[22*b:]))
		}
	case Q5_1:
		for b := range nb {
			dequantQ5_1((*[32]float32)(dst[32*b:]), (*[24]byte)(src[24*b:]))
		}
	case Q4_K:
		for b := range nb {
			dequantQ4_K((*[256]float32)(dst[256*b:]), (*[144]byte)(src[144*b:]))
		}
	case Q5_K:
		for b := range nb {
			dequantQ5_K((*[256]float32)(dst[256*b:]), (*[176]byte)(src[176*b:]))
		}
	case Q6_K:
		for b := range nb {
			dequantQ6_K((*[256]float32)(dst[256*b:]), (*[210]byte)(src[210*b:]))
		}
	}
	return nil
}

// Quantize encodes src, a whole number of blocks of type t, into dst, which
// must hold exactly their bytes, as ggml's reference quantizer for t does
// (quantize_row_*_ref: what llama-quantize runs without an importance
// matrix); F16 and BF16 round to nearest even, as ggml converts. It returns
// an error and writes nothing when the lengths do not fit, or when a value
// is a NaN or an infinity (*NonFiniteError): ggml's quantizers are not
// defined for them, and llama-quantize refuses the rows they make.
func Quantize(t Type, dst []byte, src []float32) error {
	nb, err := check(t, len(src), len(dst))
	if err != nil {
		return err
	}
	if err := checkFinite(src); err != nil {
		return err
	}
	switch t {
	case F32:
		for i, v := range src {
			put32(dst[4*i:], math.Float32bits(v))
		}
	case F16:
		for i, v := range src {
			put16(dst[2*i:], half.F32ToF16(v))
		}
	case BF16:
		for i, v := range src {
			put16(dst[2*i:], half.F32ToBF16(v))
		}
	case Q8_0:
		for b := range nb {
			quantQ8_0((*[34]byte)(dst[34*b:]), (*[32]float32)(src[32*b:]))
		}
	case Q4_0:
		for b := range nb {
			quantQ4_0((*[18]byte)(dst[18*b:]), (*[32]float32)(src[32*b:]))
		}
	case Q5_0:
		for b := range nb {
			quantQ5_0((*[22]byte)(dst[22*b:]), (*[32]float32)(src[32*b:]))
		}
	case Q5_1:
		for b := range nb {
			quantQ5_1((*[24]byte)(dst[24*b:]), (*[32]float32)(src[32*b:]))
		}
	case Q4_K:
		for b := range nb {
			quantQ4_K((*[144]byte)(dst[144*b:]), (*[256]float32)(src[256*b:]))
		}
	case Q5_K:
		for b := range nb {
			quantQ5_K((*[176]byte)(dst[176*b:]), (*[256]float32)(src[256*b:]))
		}
	case Q6_K:
		for b := range nb {
			quantQ6_K((*[210]byte)(dst[210*b:]), (*[256]float32)(src[256*b:]))
		}
	}
	return nil
}

// Dot returns the dot product of q, len(x) elements of type t, with x: the
// reference that quantized matrix-vector kernels are tested against. Each
// weight is Dequantize's float32 value; products and their sum are in
// float64, in element order, so the only rounding is float64's. The lengths
// must fit as for Dequantize.
func Dot(t Type, q []byte, x []float32) (float64, error) {
	nb, err := check(t, len(x), len(q))
	if err != nil {
		return 0, err
	}
	be, bb := t.BlockElems(), t.BlockBytes()
	// One block at a time, so that any row length needs a fixed buffer.
	var w [superBlock]float32
	var sum float64
	for b := range nb {
		Dequantize(t, w[:be], q[b*bb:(b+1)*bb]) // lengths checked above
		for i, v := range w[:be] {
			sum += float64(float64(v) * float64(x[b*be+i]))
		}
	}
	return sum, nil
}

func le16(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }
func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
func put16(b []byte, v uint16) { b[0], b[1] = byte(v), byte(v>>8) }
func put32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}
