// Package hostmath holds the host's kernels for an inference engine: products
// of bf16, f16 or f32 weights with float32 activations for a few tokens
// (GEMV and small GEMM, the decode step's work), the dot products and
// weighted sums of attention over K/V rows, and the element-wise pieces of a
// Llama layer (RMSNorm, RoPE, SiLU·mul, add).
//
// The package imports nothing of memwall: it works on Go slices, so a device
// backend can run it over host memory (an mmap'd weight file, pinned
// buffers) without copies.
//
// # Variants
//
// The products and attention kernels come in variants chosen at run time
// from the CPU's features (Available, Best): Generic (pure Go, every
// platform), AVX2 (AVX2, FMA and F16C) and AVX512 (AVX-512 F, BW and VL) on
// amd64, and AVX512BF16 (AVX512 plus AVX512_BF16's VDPBF16PS, for products
// whose weights and activations are both bf16). The amd64 kernels are
// generated Go assembly (internal/asmgen; go generate rewrites
// kernels_amd64.s, and a test checks it is up to date). Every variant
// widens the weights exactly to float32 and accumulates in float32; they
// differ only in the order of the sums (and, where FMA is used, in the
// rounding of each product), so results agree within float32 rounding, not
// bit for bit. The element-wise kernels are the same Go code in every
// variant: they are a small share of a step's work.
//
// # Parallelism
//
// A Runner holds persistent worker goroutines; the products split their
// rows over it so that each worker streams its own contiguous range of the
// weights. A nil *Runner runs everything on the calling goroutine.
//
// # Contracts
//
// Kernels take dimensions and slices; a slice shorter than the dimensions
// say is a programmer error and panics (as an index out of range would),
// before any output is written. Callers that take shapes from outside
// validate them first.
package hostmath

import (
	"fmt"
)

// DType is the element type of weights and K/V rows. Bytes are
// little-endian.
type DType uint8

// The element types.
const (
	F32  DType = iota // IEEE 754 binary32
	BF16              // bfloat16: the top half of a float32
	F16               // IEEE 754 binary16
)

// Size returns the bytes per element (0 for an unknown DType).
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case BF16, F16:
		return 2
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Variant names one implementation of the vector kernels.
type Variant uint8

// The variants, slowest first.
const (
	Generic    Variant = iota // pure Go
	AVX2                      // amd64: AVX2, FMA, F16C
	AVX512                    // amd64: AVX-512 F, BW, VL
	AVX512BF16                // AVX512 plus VDPBF16PS for bf16 × bf16 products
	numVariants
)

func (v Variant) String() string {
	switch v {
	case Generic:
		return "generic"
	case AVX2:
		return "avx2"
	case AVX512:
		return "avx512"
	case AVX512BF16:
		return "avx512bf16"
	}
	return fmt.Sprintf("Variant(%d)", uint8(v))
}

// ParseVariant returns the variant named s (as String gives it).
func ParseVariant(s string) (Variant, error) {
	for v := range numVariants {
		if v.String() == s {
			return v, nil
		}
	}
	return 0, fmt.Errorf("hostmath: unknown variant %q (want generic, avx2, avx512 or avx512bf16)", s)
}

// Available lists the variants this CPU runs, Generic first.
func Available() []Variant {
	var out []Variant
	for v := range numVariants {
		if supported(v) {
			out = append(out, v)
		}
	}
	return out
}

// Best returns the fastest variant this CPU runs.
func Best() Variant {
	a := Available()
	return a[len(a)-1]
}

// Kernels is one variant's kernels. Its methods are safe for concurrent
// use; the scratch they need comes from the caller or the stack.
type Kernels struct {
	v    Variant
	arch archKernels // nil functions: generic code
}

// New returns variant v's kernels, or an error when this CPU cannot run
// them.
func New(v Variant) (*Kernels, error) {
	if v >= numVariants {
		return nil, fmt.Errorf("hostmath: %v: unknown variant", v)
	}
	if !supported(v) {
		return nil, fmt.Errorf("hostmath: variant %v: this CPU lacks its features (%s)", v, Features())
	}
	return &Kernels{v: v, arch: archFor(v)}, nil
}

// Variant returns the variant k runs.
func (k *Kernels) Variant() Variant { return k.v }
