// Package cpu implements device.Device on the host's own cores and memory:
// a "device" whose memory is host memory and whose kernels are Go
// functions (package hostmath's vector kernels, through package kernels'
// CPU registry), so that an engine written against device.Device runs a
// model with no GPU at all.
//
// # Memory
//
// Device memory is host memory addressed by its real address: Alloc maps
// anonymous pages (never Go heap memory), and a device.Ptr is the address of
// its first byte. Pinned host memory is the same (HostAlloc's DevicePtr is
// the buffer's address), and HostRegister hands back the registered slice's
// own address, so that a read-only mmap of a weight file is read in place
// by kernels and copies. Every address a copy or a kernel touches is looked
// up in the device's table of allocations and registrations; a range that
// leaves them fails with an error wrapping device.ErrInvalid that names it.
// Memory counts against Options.TotalBytes (allocations rounded up to pages,
// HostAlloc'd buffers included: it is all the host's); registered memory
// does not. There is no virtual memory (Reserve and friends return
// device.ErrUnsupported): pools over this device grow by chunks.
//
// # Streams, events, kernels
//
// Each stream is a goroutine that runs its work in order; EventRecord
// captures the work queued on a stream so far and StreamWaitEvent makes a
// stream wait for the latest record, as in CUDA. Copies and memsets run on
// the stream's goroutine; a kernel runs its Go function there, which may
// spread its work over the device's hostmath.Runner (Mem.Runner), one
// kernel at a time across streams. A kernel that fails, panics or faults
// (a write to read-only memory) fails its launch: the error is kept on the
// stream and returned by its next StreamSynchronize, successful
// StreamQuery, or by Synchronize. Work queued runs as soon as its stream
// gets to it; nothing waits for a synchronize.
package cpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cpu/hostmath"
)

// Options configure a CPU device. The zero value is usable.
type Options struct {
	// Name is reported by Info; "" describes the host's cores.
	Name string
	// TotalBytes is the memory the device reports and lets Alloc and
	// HostAlloc take in all; 0 means the host's physical memory.
	TotalBytes uint64
	// Workers is the goroutines the kernels split their work over (the
	// calling stream's included); 0 means runtime.GOMAXPROCS(0).
	Workers int
	// Variant selects hostmath's kernels; "" takes hostmath.Best. A
	// variant this CPU cannot run makes New fail.
	Variant string
	// Pages says whether HostRegister maps registered pages in at once
	// (the zero value, PagesPopulate), leaves them to fault (PagesLazy) or
	// asks for huge pages first (PagesHuge).
	Pages Pages
	// Kernels are the Go functions Function looks kernels up in, by name
	// (the first of a name wins). A program that launches memwall's
	// kernels passes kernels.CPU().
	Kernels []Kernel
}

// Device is the host as a device. Create it with New; its methods are safe
// for concurrent use.
type Device struct {
	o      Options
	info   device.Info
	math   *hostmath.Kernels
	runner *hostmath.Runner

	mu      sync.Mutex
	closed  bool
	next    uint64 // last handle given out
	mem     memory
	streams map[device.Stream]*stream
	retired []*stream      // destroyed streams whose work may still run
	live    sync.WaitGroup // stream goroutines, destroyed ones included until drained
	events  map[device.Event]*event
	modules map[device.Module]bool
	funcs   map[device.Function]*function
}

var _ device.Device = (*Device)(nil)

var errClosed = fmt.Errorf("cpu: device closed: %w", device.ErrInvalid)

// New returns a CPU device. It fails when the variant asked for is unknown
// or this CPU cannot run it, and on platforms where host memory cannot be
// mapped (wrapping device.ErrUnsupported).
func New(o Options) (*Device, error) {
	if !canMap {
		return nil, fmt.Errorf("cpu: no anonymous memory mappings on %s: %w", runtime.GOOS, device.ErrUnsupported)
	}
	v := hostmath.Best()
	if o.Variant != "" {
		var err error
		if v, err = hostmath.ParseVariant(o.Variant); err != nil {
			return nil, fmt.Errorf("cpu: %w", err)
		}
	}
	k, err := hostmath.New(v)
	if err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	if o.TotalBytes == 0 {
		o.TotalBytes = physicalMemory()
	}
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.Name == "" {
		o.Name = fmt.Sprintf("host CPU, %d cores, %s kernels (%s)", o.Workers, v, hostmath.Features())
	}
	o.Kernels = append([]Kernel(nil), o.Kernels...)
	d := &Device{o: o, math: k, runner: hostmath.NewRunner(o.Workers),
		streams: map[device.Stream]*stream{}, events: map[device.Event]*event{},
		modules: map[device.Module]bool{}, funcs: map[device.Function]*function{}}
	d.info = device.Info{
		Backend:              "cpu",
		Name:                 o.Name,
		DriverVersion:        "go " + runtime.Version() + ", " + runtime.GOARCH,
		TotalBytes:           o.TotalBytes,
		Multiprocessors:      o.Workers,
		Integrated:           true,
		HostMemory:           true,
		CanMapHostMemory:     true,
		PageableMemoryAccess: true,
		ReadOnlyHostRegister: true,
		CopyEngines:          1,
		Disabled: []string{"virtual memory: not implemented on the CPU device",
			"driver stream-ordered allocator: none on the CPU device"},
	}
	return d, nil
}

// Info describes the device: backend "cpu", Multiprocessors the workers,
// Integrated and HostMemory (device memory is host memory: residency
// reads resident weights in place from the mapped file), no compute
// capability.
func (d *Device) Info() device.Info {
	in := d.info
	in.Disabled = append([]string(nil), d.info.Disabled...)
	return in
}

// Math returns the hostmath kernels the device's kernels use.
func (d *Device) Math() *hostmath.Kernels { return d.math }

// Runner returns the workers the device's kernels split their work over.
func (d *Device) Runner() *hostmath.Runner { return d.runner }

func (d *Device) enter() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return errClosed
	}
	return nil
}

func (d *Device) handle() uint64 {
	d.next++
	return d.next
}

// Close waits for the work queued on every stream, stops the streams and
// the workers; afterwards every method fails with an error wrapping
// device.ErrInvalid. Memory still allocated stays mapped (as a driver's
// would until the process exits). Closing twice is a no-op.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	var errs []error
	for _, st := range d.streams {
		errs = append(errs, st.stop())
	}
	d.streams = nil
	d.mu.Unlock()
	d.live.Wait()
	d.runner.Close()
	return errors.Join(errs...)
}
