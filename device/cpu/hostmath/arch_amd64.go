package hostmath

import (
	"strings"

	"golang.org/x/sys/cpu"
)

//go:generate go run gen.go

// cpuid1ECX returns ECX of CPUID leaf 1 (F16C is bit 29; golang.org/x/sys/cpu
// does not report it).
func cpuid1ECX() uint32

// hasF16C: the AVX2 variant converts f16 weights with VCVTPH2PS.
var hasF16C = cpuid1ECX()&(1<<29) != 0

func supported(v Variant) bool {
	x := &cpu.X86
	avx2 := x.HasAVX2 && x.HasFMA && hasF16C
	avx512 := avx2 && x.HasAVX512F && x.HasAVX512BW && x.HasAVX512VL
	switch v {
	case Generic:
		return true
	case AVX2:
		return avx2
	case AVX512:
		return avx512
	case AVX512BF16:
		return avx512 && x.HasAVX512BF16
	}
	return false
}

func archFor(v Variant) archKernels {
	switch v {
	case AVX2:
		return archAVX2()
	case AVX512:
		a := archAVX512()
		a.deq = deqAVX512
		return a
	case AVX512BF16:
		a := archAVX512()
		a.bwide, a.bdots, a.deq = 32, bf16Tables, deqAVX512
		return a
	}
	return archKernels{}
}

// Features lists the CPU features the variants use that this CPU has.
func Features() string {
	x := &cpu.X86
	var f []string
	for _, c := range []struct {
		name string
		has  bool
	}{{"avx2", x.HasAVX2}, {"fma", x.HasFMA}, {"f16c", hasF16C}, {"avx512f", x.HasAVX512F},
		{"avx512bw", x.HasAVX512BW}, {"avx512vl", x.HasAVX512VL}, {"avx512_bf16", x.HasAVX512BF16}} {
		if c.has {
			f = append(f, c.name)
		}
	}
	if len(f) == 0 {
		return "amd64 without AVX2"
	}
	return "amd64 " + strings.Join(f, " ")
}
