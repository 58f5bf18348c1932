package devicetest_test

import (
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/devicetest"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/kernels"
)

// TestSimWithKernels runs the suite on the simulator with package kernels'
// Go implementations, so the fill kernel the suite checks against Pattern is
// the one the simulator really runs for memwall.
func TestSimWithKernels(t *testing.T) {
	o := sim.DefaultOptions()
	o.Kernels = kernels.Sim()
	open := func(t *testing.T) device.Device {
		d := sim.New(o)
		t.Cleanup(func() { d.Close() })
		return d
	}
	devicetest.Run(t, open, devicetest.Options{
		LoadKernels: func(d device.Device) (device.Module, error) { return d.LoadModule(kernels.Embedded()) },
		LargeBytes:  4 << 20,
	})
}

func TestPatternMatchesKernels(t *testing.T) {
	for _, seed := range []uint32{0, 1, 0xC0FFEE, 1<<32 - 1} {
		for _, i := range []uint64{0, 1, 2, 1000, 1<<32 - 1, 1 << 32, 1<<40 + 3} {
			if a, b := devicetest.Pattern(seed, i), kernels.Pattern(seed, i); a != b {
				t.Errorf("Pattern(%#x, %d) = %#x, kernels.Pattern = %#x", seed, i, a, b)
			}
		}
	}
}

func TestPatternKnownValues(t *testing.T) {
	// Worked by hand from the specification, for i = 0 and seed 0:
	// x = 0; the finalizer keeps 0.
	if got := devicetest.Pattern(0, 0); got != 0 {
		t.Errorf("Pattern(0, 0) = %#x, want 0", got)
	}
	// The pattern depends only on the low 32 bits of i.
	if devicetest.Pattern(7, 5) != devicetest.Pattern(7, 5+1<<32) {
		t.Error("Pattern depends on more than the low 32 bits of i")
	}
	if devicetest.Pattern(7, 5) == devicetest.Pattern(8, 5) || devicetest.Pattern(7, 5) == devicetest.Pattern(7, 6) {
		t.Error("Pattern does not depend on seed and index")
	}
}
