package sim

import (
	"bytes"
	"fmt"
	"math"
	"time"

	"github.com/memwall/memwall/device"
)

// Kernel is a Go implementation of a device kernel that the simulator runs.
type Kernel struct {
	Name string // the extern "C" name used by Function
	// Run does the kernel's work through m. It runs with the device locked:
	// it must not call the Device. An error (or a panic) is reported as the
	// launch's error by the next synchronize of its stream. Run is skipped
	// without Options.Backing; nil Run does nothing.
	Run func(m *Mem, grid, block device.Dim3, args []any) error
	// Cost models the launch's duration; nil costs only LaunchLatency.
	Cost func(grid, block device.Dim3, args []any) Cost
}

// Cost is the modelled work of one launch: its duration is LaunchLatency +
// max(FLOPs/PeakFLOPS, Bytes/DeviceGBps), Bytes counting reads plus writes.
type Cost struct {
	FLOPs, Bytes float64
	Fixed        time.Duration // Fixed, when >0, overrides the model
}

// Mem gives a kernel access to simulated device memory (device allocations,
// mapped VA, host-mapped buffers). It is valid only during the Run call it
// was passed to.
type Mem struct {
	d     *Device
	name  string
	views []view
}

// view is a Bytes result that is not the memory itself: a gathered copy of a
// range spanning several chunks (scattered back after Run) or of read-only
// host memory (checked unchanged after Run).
type view struct {
	addr     device.Ptr
	pieces   [][]byte
	tmp      []byte
	readOnly bool
}

// Bytes returns a writable view of [p, p+n). It is the memory itself when the
// range lies in one allocation or chunk; a range across virtual-memory chunks
// gets a copy that is written back when Run returns, and read-only host
// memory gets a copy that must be left unchanged (the launch fails if Run
// wrote it). Views of overlapping ranges do not see each other's writes
// until Run returns. Unmapped or out-of-range addresses fail with
// ErrInvalid naming the address.
func (m *Mem) Bytes(p device.Ptr, n uint64) ([]byte, error) {
	if m == nil || m.d == nil {
		return nil, fmt.Errorf("sim: kernel memory used outside its Run: %w", device.ErrInvalid)
	}
	if n == 0 {
		return []byte{}, nil
	}
	pieces, ro, err := m.d.span(p, n, false)
	if err != nil {
		return nil, err
	}
	if len(pieces) == 1 && !ro {
		return pieces[0], nil
	}
	tmp := make([]byte, 0, n)
	for _, b := range pieces {
		tmp = append(tmp, b...)
	}
	m.views = append(m.views, view{addr: p, pieces: pieces, tmp: tmp, readOnly: ro})
	return tmp, nil
}

// finish writes gathered views back and checks read-only ones.
func (m *Mem) finish() error {
	var err error
	for _, v := range m.views {
		if !v.readOnly {
			copyPieces(v.pieces, [][]byte{v.tmp})
			continue
		}
		at := v.tmp
		for _, b := range v.pieces {
			if !bytes.Equal(b, at[:len(b)]) && err == nil {
				err = fmt.Errorf("sim: kernel %s wrote read-only host memory in the %d bytes at %#x: %w",
					m.name, len(v.tmp), uint64(v.addr), device.ErrInvalid)
			}
			at = at[len(b):]
		}
	}
	m.views, m.d = nil, nil
	return err
}

type module struct{ loaded bool }

type function struct {
	k   *Kernel
	mod *module
}

type launch struct {
	fn          *function
	grid, block device.Dim3
	args        []any
}

// kernelTable is the loaded modules and functions, guarded by Device.mu.
type kernelTable struct {
	modules map[device.Module]*module
	funcs   map[device.Function]*function
}

func (k *kernelTable) init() {
	k.modules = map[device.Module]*module{}
	k.funcs = map[device.Function]*function{}
}

// LoadModule returns a module whose functions are looked up by name in
// Options.Kernels; the bytes (PTX text on a GPU) are ignored.
func (d *Device) LoadModule(ptx []byte) (device.Module, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	m := device.Module(d.handle())
	d.kern.modules[m] = &module{loaded: true}
	return m, nil
}

// UnloadModule unloads m; its functions can no longer be launched (launches
// already queued still run). An unknown module fails with ErrInvalid.
func (d *Device) UnloadModule(m device.Module) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	mod := d.kern.modules[m]
	if mod == nil {
		return fmt.Errorf("sim: unload module %d: unknown module: %w", uint64(m), device.ErrInvalid)
	}
	mod.loaded = false
	delete(d.kern.modules, m)
	return nil
}

// Function finds the kernel called name in Options.Kernels. An unknown
// module or a name without a simulated implementation fails with ErrInvalid.
func (d *Device) Function(m device.Module, name string) (device.Function, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	mod := d.kern.modules[m]
	if mod == nil {
		return 0, fmt.Errorf("sim: function %q: unknown module %d: %w", name, uint64(m), device.ErrInvalid)
	}
	for i := range d.o.Kernels {
		if d.o.Kernels[i].Name == name {
			f := device.Function(d.handle())
			d.kern.funcs[f] = &function{k: &d.o.Kernels[i], mod: mod}
			return f, nil
		}
	}
	return 0, fmt.Errorf("sim: no simulated implementation of kernel %s: %w", name, device.ErrInvalid)
}

// maxBlockThreads is CUDA's limit on threads per block.
const maxBlockThreads = 1024

// checkArgs accepts the argument types device.Kernels.Launch allows.
func checkArgs(args []any) error {
	for i, a := range args {
		switch a.(type) {
		case device.Ptr, uint32, int32, uint64, int64, float32, float64:
		default:
			return fmt.Errorf("sim: launch: argument %d has unsupported type %T: %w", i, a, device.ErrInvalid)
		}
	}
	return nil
}

// Launch queues f on s (compute engine). Its duration comes from the
// kernel's Cost, evaluated now; Run runs when the launch does. Unknown
// handles, an unloaded module, empty grid or block dimensions, more than
// 1024 threads per block, and unsupported argument types fail at once with
// ErrInvalid. sharedBytes is ignored.
func (d *Device) Launch(f device.Function, grid, block device.Dim3, sharedBytes uint32, s device.Stream, args ...any) error {
	if grid.X == 0 || grid.Y == 0 || grid.Z == 0 || block.X == 0 || block.Y == 0 || block.Z == 0 {
		return fmt.Errorf("sim: launch: grid %v and block %v must have no zero dimension: %w", grid, block, device.ErrInvalid)
	}
	if uint64(block.X)*uint64(block.Y)*uint64(block.Z) > maxBlockThreads {
		return fmt.Errorf("sim: launch: block %v has more than %d threads: %w", block, maxBlockThreads, device.ErrInvalid)
	}
	if err := checkArgs(args); err != nil {
		return err
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	fn := d.kern.funcs[f]
	if fn == nil || !fn.mod.loaded {
		return fmt.Errorf("sim: launch: unknown function %d (or its module was unloaded): %w", uint64(f), device.ErrInvalid)
	}
	st, err := d.stream(s)
	if err != nil {
		return err
	}
	l := &launch{fn: fn, grid: grid, block: block, args: append([]any(nil), args...)}
	d.submit(st, &op{kind: opKernel, launch: l}, engCompute, d.kernelTime(l))
	return nil
}

// kernelTime applies the time model to a launch's Cost.
func (d *Device) kernelTime(l *launch) time.Duration {
	if l.fn.k.Cost == nil {
		return d.o.LaunchLatency
	}
	c := l.fn.k.Cost(l.grid, l.block, l.args)
	if c.Fixed > 0 {
		return c.Fixed
	}
	ns := max(c.FLOPs/d.o.PeakFLOPS*1e9, c.Bytes/d.o.DeviceGBps, 0)
	if math.IsNaN(ns) || ns > float64(math.MaxInt64/2) {
		ns = float64(math.MaxInt64 / 2)
	}
	return d.o.LaunchLatency + time.Duration(math.Round(ns))
}

// runKernel runs a launch's Go implementation (with Backing), turning a
// panic into the launch's error.
func (d *Device) runKernel(l *launch) (err error) {
	k := l.fn.k
	if !d.o.Backing || k.Run == nil {
		return nil
	}
	m := &Mem{d: d, name: k.Name}
	defer func() {
		if r := recover(); r != nil {
			m.views = nil
			m.d = nil
			err = fmt.Errorf("sim: kernel %s panicked: %v: %w", k.Name, r, device.ErrInvalid)
		}
	}()
	runErr := k.Run(m, l.grid, l.block, l.args)
	finErr := m.finish()
	if runErr != nil {
		return fmt.Errorf("sim: kernel %s: %w", k.Name, runErr)
	}
	return finErr
}
