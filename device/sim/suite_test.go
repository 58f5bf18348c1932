package sim_test

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/devicetest"
	"github.com/memwall/memwall/device/sim"
)

// fillKernel is a Go memwall_fill_u32 for the conformance suite.
var fillKernel = sim.Kernel{
	Name: devicetest.FillKernel,
	Run: func(m *sim.Mem, grid, block device.Dim3, args []any) error {
		dst, n, seed, err := fillArgs(args)
		if err != nil {
			return err
		}
		b, err := m.Bytes(dst, 4*n)
		if err != nil {
			return err
		}
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], devicetest.Pattern(seed, i))
		}
		return nil
	},
	Cost: func(grid, block device.Dim3, args []any) sim.Cost {
		_, n, _, _ := fillArgs(args)
		return sim.Cost{FLOPs: 10 * float64(n), Bytes: 4 * float64(n)}
	},
}

func fillArgs(args []any) (dst device.Ptr, n uint64, seed uint32, err error) {
	if len(args) != 3 {
		return 0, 0, 0, fmt.Errorf("want 3 arguments, got %d", len(args))
	}
	var ok [3]bool
	dst, ok[0] = args[0].(device.Ptr)
	n, ok[1] = args[1].(uint64)
	seed, ok[2] = args[2].(uint32)
	if !ok[0] || !ok[1] || !ok[2] {
		return 0, 0, 0, fmt.Errorf("want (Ptr, uint64, uint32), got (%T, %T, %T)", args[0], args[1], args[2])
	}
	return dst, n, seed, nil
}

func loadKernels(d device.Device) (device.Module, error) { return d.LoadModule(nil) }

func openWith(o sim.Options) func(t *testing.T) device.Device {
	return func(t *testing.T) device.Device {
		d := sim.New(o)
		t.Cleanup(func() { d.Close() })
		return d
	}
}

func TestConformance(t *testing.T) {
	def := sim.DefaultOptions()
	def.Kernels = []sim.Kernel{fillKernel}
	shuffle := def
	shuffle.Shuffle, shuffle.Seed = true, 7
	oneEngine := def
	oneEngine.CopyEngines = 1
	integrated := def
	integrated.Integrated = true
	bare := def
	bare.VirtualMemory, bare.CanMapHostMemory, bare.ReadOnlyHostRegister = false, false, false
	tiny := def
	tiny.MaxPending = 2
	for _, tc := range []struct {
		name string
		o    sim.Options
	}{
		{"default", def},
		{"shuffle", shuffle},
		{"one-copy-engine", oneEngine},
		{"integrated", integrated},
		{"no-vmm-no-host-map", bare},
		{"max-pending-2", tiny},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devicetest.Run(t, openWith(tc.o), devicetest.Options{LoadKernels: loadKernels})
		})
	}
}
