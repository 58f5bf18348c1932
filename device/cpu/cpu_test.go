package cpu_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cpu"
	"github.com/memwall/memwall/device/devicetest"
)

// fillKernel is memwall_fill_u32 for the conformance suite, written over the
// workers as memwall's kernels are.
var fillKernel = cpu.Kernel{
	Name: devicetest.FillKernel,
	Run: func(m *cpu.Mem, grid, block device.Dim3, args []any) error {
		if len(args) != 3 {
			return fmt.Errorf("want 3 arguments, got %d", len(args))
		}
		dst, ok1 := args[0].(device.Ptr)
		n, ok2 := args[1].(uint64)
		seed, ok3 := args[2].(uint32)
		if !ok1 || !ok2 || !ok3 {
			return fmt.Errorf("want (Ptr, uint64, uint32), got (%T, %T, %T)", args[0], args[1], args[2])
		}
		b, err := m.Writable(dst, 4*n)
		if err != nil {
			return err
		}
		m.Runner().Run(int(n), 1024, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				binary.LittleEndian.PutUint32(b[4*i:], devicetest.Pattern(seed, uint64(i)))
			}
		})
		return nil
	},
}

func open(t *testing.T, o cpu.Options) device.Device {
	t.Helper()
	d, err := cpu.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    cpu.Options
	}{
		{"default", cpu.Options{Kernels: []cpu.Kernel{fillKernel}}},
		{"one-worker-generic", cpu.Options{Kernels: []cpu.Kernel{fillKernel}, Workers: 1, Variant: "generic", TotalBytes: 2 << 30}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devicetest.Run(t, func(t *testing.T) device.Device { return open(t, tc.o) },
				devicetest.Options{LoadKernels: func(d device.Device) (device.Module, error) { return d.LoadModule(nil) }})
		})
	}
}

// TestReadOnlyWriteFailsLaunch: a kernel that writes read-only registered
// memory (a PROT_READ mapping) fails its launch, and the device goes on.
func TestReadOnlyWriteFailsLaunch(t *testing.T) {
	d := open(t, cpu.Options{Kernels: []cpu.Kernel{
		{Name: "write", Run: func(m *cpu.Mem, _, _ device.Dim3, args []any) error {
			b, err := m.Bytes(args[0].(device.Ptr), 8)
			if err != nil {
				return err
			}
			b[0] = 1 // faults: the mapping is read-only
			return nil
		}},
		{Name: "writable", Run: func(m *cpu.Mem, _, _ device.Dim3, args []any) error {
			_, err := m.Writable(args[0].(device.Ptr), 8)
			return err
		}},
	}})
	ro := mapReadOnly(t, 4096)
	hb, err := d.HostRegister(ro, device.RegisterReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	defer d.HostFree(hb)
	mod, _ := d.LoadModule(nil)
	s, _ := d.NewStream()
	one := device.Dim3{X: 1, Y: 1, Z: 1}
	for _, name := range []string{"write", "writable"} {
		f, err := d.Function(mod, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Launch(f, one, one, 0, s, hb.DevicePtr); err != nil {
			t.Fatal(err)
		}
		if err := d.StreamSynchronize(s); !errors.Is(err, device.ErrInvalid) {
			t.Errorf("kernel %s writing read-only memory: synchronize = %v, want ErrInvalid", name, err)
		}
	}
	p, err := d.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Memset8(p, 3, 64, s); err != nil {
		t.Fatal(err)
	}
	if err := d.StreamSynchronize(s); err != nil {
		t.Errorf("the stream after a failed launch: %v", err)
	}
	if err := d.Free(p); err != nil {
		t.Fatal(err)
	}
}

// TestDevicePtrIsTheAddress: memory handed out is addressed by its real
// address, so kernels read a registered buffer in place.
func TestDevicePtrIsTheAddress(t *testing.T) {
	d := open(t, cpu.Options{})
	b := make([]byte, 100)
	b[42] = 7
	hb, err := d.HostRegister(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.HostFree(hb)
	s, _ := d.NewStream()
	got := make([]byte, 1)
	if err := d.CopyDtoH(got, hb.DevicePtr+42, s); err != nil {
		t.Fatal(err)
	}
	if err := d.StreamSynchronize(s); err != nil || got[0] != 7 {
		t.Fatalf("read through DevicePtr: %v, %d", err, got[0])
	}
	if _, err := d.HostRegister(b[10:20], 0); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("registering memory already registered = %v, want ErrInvalid", err)
	}
	if in := d.Info(); in.Backend != "cpu" || !in.Integrated || in.Multiprocessors <= 0 {
		t.Errorf("Info = %+v", in)
	}
}
