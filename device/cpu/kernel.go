package cpu

import (
	"fmt"

	"github.com/memwall/memwall/device"
)

// Kernel is a Go implementation of a device kernel the CPU device runs.
type Kernel struct {
	Name string // the name Function looks up
	// Run does the kernel's work through m, on the launching stream's
	// goroutine (it may split work over m.Runner()). It must not call the
	// Device. An error or a panic fails the launch: the stream's next
	// synchronize reports it. nil Run does nothing.
	Run func(m *Mem, grid, block device.Dim3, args []any) error
}

type function struct {
	k   *Kernel
	mod device.Module
}

// LoadModule returns a module whose functions are looked up by name in
// Options.Kernels; the bytes are ignored.
func (d *Device) LoadModule([]byte) (device.Module, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	m := device.Module(d.handle())
	d.modules[m] = true
	return m, nil
}

// UnloadModule unloads m: its functions can no longer be launched (work
// already queued still runs). An unknown module fails with ErrInvalid.
func (d *Device) UnloadModule(m device.Module) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if !d.modules[m] {
		return fmt.Errorf("cpu: unload module %d: unknown module: %w", uint64(m), device.ErrInvalid)
	}
	delete(d.modules, m)
	for f, fn := range d.funcs {
		if fn.mod == m {
			delete(d.funcs, f)
		}
	}
	return nil
}

// Function finds the kernel called name in Options.Kernels; an unknown
// module or a name without an implementation fails with ErrInvalid.
func (d *Device) Function(m device.Module, name string) (device.Function, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	if !d.modules[m] {
		return 0, fmt.Errorf("cpu: function %q: unknown module %d: %w", name, uint64(m), device.ErrInvalid)
	}
	for i := range d.o.Kernels {
		if d.o.Kernels[i].Name == name {
			f := device.Function(d.handle())
			d.funcs[f] = &function{k: &d.o.Kernels[i], mod: m}
			return f, nil
		}
	}
	return 0, fmt.Errorf("cpu: no CPU implementation of kernel %s (put kernels.CPU() in cpu.Options.Kernels): %w", name, device.ErrInvalid)
}

// Launch queues f on s. The grid and block are passed to the kernel (the
// launch shapes package kernels computes); they must have no zero
// dimension. Arguments are device.Ptr, uint32, int32, uint64, int64,
// float32 or float64; an unknown function, an unloaded module or another
// argument type fails at once with ErrInvalid. sharedBytes is ignored.
func (d *Device) Launch(f device.Function, grid, block device.Dim3, sharedBytes uint32, s device.Stream, args ...any) error {
	if grid.X == 0 || grid.Y == 0 || grid.Z == 0 || block.X == 0 || block.Y == 0 || block.Z == 0 {
		return fmt.Errorf("cpu: launch: grid %v and block %v must have no zero dimension: %w", grid, block, device.ErrInvalid)
	}
	for i, a := range args {
		switch a.(type) {
		case device.Ptr, uint32, int32, uint64, int64, float32, float64:
		default:
			return fmt.Errorf("cpu: launch: argument %d has unsupported type %T: %w", i, a, device.ErrInvalid)
		}
	}
	if err := d.enter(); err != nil {
		return err
	}
	fn := d.funcs[f]
	d.mu.Unlock()
	if fn == nil {
		return fmt.Errorf("cpu: launch: unknown function %d (or its module was unloaded): %w", uint64(f), device.ErrInvalid)
	}
	args = append([]any(nil), args...)
	return d.queue(s, func() (err error) {
		if fn.k.Run == nil {
			return nil
		}
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("cpu: kernel %s panicked: %v: %w", fn.k.Name, r, device.ErrInvalid)
			}
		}()
		if err := fn.k.Run(&Mem{d: d}, grid, block, args); err != nil {
			return fmt.Errorf("cpu: kernel %s: %w", fn.k.Name, err)
		}
		return nil
	})
}
