package kernels

import (
	"os"
	"strings"
	"testing"
)

// patternSpec spells out the documented formula step by step.
func patternSpec(seed uint32, i uint64) uint32 {
	x := uint32(i & 0xFFFFFFFF)
	x = x * 0x9E3779B1
	x = x ^ seed
	x = x ^ (x >> 16)
	x = x * 0x85EBCA6B
	x = x ^ (x >> 13)
	x = x * 0xC2B2AE35
	x = x ^ (x >> 16)
	return x
}

func TestPatternMatchesFormula(t *testing.T) {
	seeds := []uint32{0, 1, 0xC0FFEE, 0xFFFFFFFF}
	idx := []uint64{0, 1, 2, 255, 256, 1 << 20, 1<<32 - 1, 1 << 32, 1<<32 + 5, 1<<64 - 1}
	for _, s := range seeds {
		for _, i := range idx {
			if got, want := Pattern(s, i), patternSpec(s, i); got != want {
				t.Errorf("Pattern(%#x, %d) = %#x, want %#x", s, i, got, want)
			}
		}
	}
	for i := range uint64(100000) {
		if Pattern(7, i) != patternSpec(7, i) {
			t.Fatalf("Pattern(7, %d) differs from the formula", i)
		}
	}
}

func TestPatternGolden(t *testing.T) {
	// Computed independently of this package (arbitrary-precision
	// integers masked to 32 bits); the GPU fill is checked against Pattern
	// itself (testdata/ptxcheck.cu, TestCUDAKernels).
	tests := []struct {
		seed uint32
		i    uint64
		want uint32
	}{
		{0, 0, 0},
		{0, 1, 0x11fd02eb},
		{0xC0FFEE, 12345, 0x05b3c7cb},
		{0xFFFFFFFF, 1<<32 + 7, 0x39686534},
		{42, 1_000_000_000_000, 0xea5031e6},
	}
	for _, tc := range tests {
		if got := Pattern(tc.seed, tc.i); got != tc.want {
			t.Errorf("Pattern(%#x, %d) = %#x, want %#x", tc.seed, tc.i, got, tc.want)
		}
	}
	if Pattern(0, 1) == Pattern(1, 1) || Pattern(0, 1) == Pattern(0, 2) {
		t.Error("pattern does not depend on seed and index")
	}
	if Pattern(3, 5) != Pattern(3, 5+1<<32) {
		t.Error("pattern should repeat every 2^32 words")
	}
}

// The CUDA pattern must use the same constants in the same order.
func TestCUDAPatternConstants(t *testing.T) {
	src, err := os.ReadFile("kernels.cu")
	if err != nil {
		t.Fatal(err)
	}
	s := string(src)
	start := strings.Index(s, "uint32_t pattern(uint32_t seed, uint64_t i)")
	if start < 0 {
		t.Fatal("kernels.cu: pattern function not found")
	}
	body := s[start : start+strings.Index(s[start:], "return x;")]
	want := []string{
		"((uint32_t)i * 0x9E3779B1u) ^ seed",
		"x ^= x >> 16;", "x *= 0x85EBCA6Bu;", "x ^= x >> 13;", "x *= 0xC2B2AE35u;", "x ^= x >> 16;",
	}
	pos := 0
	for _, w := range want {
		j := strings.Index(body[pos:], w)
		if j < 0 {
			t.Fatalf("kernels.cu pattern: %q missing or out of order in\n%s", w, body)
		}
		pos += j + len(w)
	}
}
