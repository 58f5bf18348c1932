//go:build amd64

package hostmath

import "unsafe"

// The AVX-512 dequantizers (quant_amd64.s), by QType.

//go:noescape
func deqQ8_0AVX512(dst, src unsafe.Pointer, nb uintptr)

//go:noescape
func deqQ4_0AVX512(dst, src unsafe.Pointer, nb uintptr)

//go:noescape
func deqQ4_KAVX512(dst, src unsafe.Pointer, nb uintptr)

//go:noescape
func deqQ5_KAVX512(dst, src unsafe.Pointer, nb uintptr)

//go:noescape
func deqQ6_KAVX512(dst, src unsafe.Pointer, nb uintptr)

var deqAVX512 = [numQTypes]deqFunc{
	Q8_0: deqQ8_0AVX512,
	Q4_0: deqQ4_0AVX512,
	Q4_K: deqQ4_KAVX512,
	Q5_K: deqQ5_KAVX512,
	Q6_K: deqQ6_KAVX512,
}
