package kernels

import (
	"math/rand/v2"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cpu"
	"github.com/memwall/memwall/device/cpu/hostmath"
)

// newCPU opens the CPU device with CPU's kernels and the given hostmath
// variant ("" for the best).
func newCPU(t testing.TB, variant string) device.Device {
	d, err := cpu.New(cpu.Options{Kernels: CPU(), Variant: variant, Workers: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// cpuVariants runs f on a CPU device of every hostmath variant this CPU
// runs.
func cpuVariants(t *testing.T, f func(t *testing.T, d device.Device, s *Set)) {
	for _, v := range hostmath.Available() {
		t.Run(v.String(), func(t *testing.T) {
			d := newCPU(t, v.String())
			s, err := Load(d, nil)
			must(t, err)
			defer s.Close()
			if s.Source() != cpuSource || s.FlashAttention() || s.Overlap() {
				t.Fatalf("on the CPU device: source %q, flash %v, overlap %v", s.Source(), s.FlashAttention(), s.Overlap())
			}
			f(t, d, s)
		})
	}
}

// The device kernel suite (fill, check, spin, products of every shape
// against the float64 reference) on the CPU device.
func TestCPUKernels(t *testing.T) {
	cpuVariants(t, func(t *testing.T, d device.Device, s *Set) { kernelSuite(t, d, s, false) })
}

// The Llama kernels against their float64 references on the CPU device,
// and the attention shapes of decode and prefill (splits, GQA, odd head
// dims) through the CPU's split attention.
func TestCPULlamaKernels(t *testing.T) {
	cpuVariants(t, func(t *testing.T, d device.Device, s *Set) {
		r := newRig(t, d, s)
		cases := llamaCases(1, 3)
		rng := rand.New(rand.NewPCG(3, 3))
		cases = append(cases,
			attnCase(rng, 700, 1, 2, 4, 128, BF16),
			attnCase(rng, 2100, 1, 1, 8, 64, F16),
			attnCase(rng, 0, 37, 2, 2, 128, BF16),
			attnCase(rng, 150, 20, 1, 16, 32, F32),
			attnCase(rng, 1000, 3, 1, 1, 100, BF16),
			attnCase(rng, 33, 40, 2, 4, 128, BF16))
		for _, c := range cases {
			if e := relErr(c.run(r), c.ref); !(e <= c.tol) {
				t.Errorf("%s %s: relative error %.3g exceeds %.0e", c.kernel, c.name, e, c.tol)
			}
		}
	})
}

// TestCPUMatmulGroup: the grouped product on the CPU device equals one
// Matmul per product bit for bit, as MatmulGroup promises.
func TestCPUMatmulGroup(t *testing.T) {
	cpuVariants(t, func(t *testing.T, d device.Device, s *Set) { matmulGroupSuite(t, d, s) })
}
