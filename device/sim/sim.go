// Package sim implements device.Device on host memory: a deterministic
// simulated GPU for tests, demos and trace replay on machines without one.
//
// # Memory
//
// Device allocations, physical chunks of virtual memory and host-mapped
// buffers live in one simulated address space starting at 0x7f0000000000.
// With Options.Backing, every allocation is backed by host bytes created on
// first access (untouched allocations cost no host memory; on Linux a large
// one costs only the pages written, given back when it is freed), copies
// really move bytes and kernels run their Go implementation. Without Backing only
// metadata is kept: addresses are still checked, but copies, memsets and
// kernels only advance simulated time, so traces of many GiB can be replayed.
// Any interior address of an allocation may be used; an access that crosses
// the end of an allocation or touches unmapped memory fails with an error
// wrapping device.ErrInvalid that names the address.
//
// # Streams and events
//
// Work is queued per stream and runs lazily, in the calling goroutine, when
// something forces it: StreamSynchronize, EventSynchronize, Synchronize, a
// Query call (which reports the state first and then runs one pending
// operation, so polling loops make progress), Free, HostFree and Unmap (which
// wait for all pending work, as the driver's free does), Close, and the
// Options.MaxPending limit. Because host buffers are read and written only
// when their copy runs, a program that reuses a buffer too early sees wrong
// data here, as it would on a GPU.
//
// Ordering follows CUDA: a stream runs its work in order; EventRecord
// captures all work submitted to the stream so far; StreamWaitEvent makes
// later work on the waiting stream depend on the latest record of the event
// at the time of the call (re-recording later does not affect it; waiting on a
// never-recorded event is a no-op). Among the streams that can run, the
// default is to run the operation that starts earliest in simulated time
// (ties: first submitted). With Options.Shuffle a seeded random generator
// picks among them instead, so a missing cross-stream dependency produces
// wrong data in some seeds.
//
// Errors raised while an operation runs (a bad address in a kernel, a write to
// read-only host memory) are kept on the stream and returned once by the next
// StreamSynchronize or successful StreamQuery of that stream, or by the next
// Synchronize (which joins the errors of all streams). EventQuery and
// EventSynchronize do not report them. Copy and memset arguments are also
// checked when the call is made and rejected at once when invalid.
//
// # Time model
//
// Simulated time is computed when work is submitted and is deterministic.
// Each stream has a cursor (the end of its latest work) and there are three
// engines: host-to-device copies, device-to-host copies (the same engine as
// host-to-device when Options.CopyEngines is 1) and compute (kernels, memsets
// and device-to-device copies). An operation starts at the latest of its
// stream's cursor, the times of the events its stream waits on, its engine's
// free time and the host clock (the latest completion the host has observed
// through a synchronize or a successful query); it lasts its latency plus its
// bytes over the bandwidth that applies:
//
//   - host-to-device and device-to-host: CopyLatency + bytes/PinnedHtoDGBps
//     (or PinnedDtoHGBps) when the host slice lies inside a HostAlloc'd or
//     registered buffer, bytes/PageableGBps otherwise;
//   - device-to-device: CopyLatency + 2·bytes/DeviceGBps (DeviceGBps counts
//     read plus write traffic); when either side is host memory mapped into
//     the device (zero-copy), the PCIe pinned rate applies instead;
//   - memsets: LaunchLatency + bytes/DeviceGBps (write traffic only);
//   - kernels: Cost.Fixed when positive, else LaunchLatency +
//     max(Cost.FLOPs/PeakFLOPS, Cost.Bytes/DeviceGBps).
//
// With Options.Integrated the device shares host memory: pinned copies and
// zero-copy accesses move at DeviceGBps (read plus write), and HostAlloc'd
// memory counts against TotalBytes. Driver allocation calls do not advance
// simulated time; their modelled cost is reported in Stats.DriverTime.
//
// A Device is safe for concurrent use; one mutex guards it, and kernels run
// with it held.
package sim

import (
	"fmt"
	"sync"
	"time"

	"github.com/memwall/memwall/device"
)

// Options configure a simulated device. Start from DefaultOptions: New
// replaces zero or negative sizes, counts and bandwidths (and a Granularity
// that is not a power of two) with the defaults, and negative latencies
// (zero latencies are kept: an idealised device). Booleans are taken as
// given, so a zero Options describes a device without host mapping, virtual
// memory or backing bytes.
type Options struct {
	// Name is reported by Info.
	Name string
	// TotalBytes is the device memory size.
	TotalBytes uint64
	// HostBytes limits the pinned host memory HostAlloc hands out in total;
	// beyond it HostAlloc fails with device.ErrOutOfMemory. (Host memory is
	// real Go memory even without Backing.)
	HostBytes uint64

	ComputeMajor, ComputeMinor int
	Multiprocessors            int
	MemoryBusBits              int
	PCIeGen, PCIeWidth         int
	// CopyEngines is 1 (host-to-device and device-to-host copies share an
	// engine) or more (they run concurrently).
	CopyEngines int
	// Granularity is the virtual-memory page size, a power of two.
	Granularity uint64

	// Integrated makes the device share memory with the host (see the
	// package documentation for what changes in the time model).
	Integrated bool
	// CanMapHostMemory gives HostAlloc'd buffers (and those registered with
	// device.RegisterDeviceMap) a DevicePtr.
	CanMapHostMemory bool
	// PageableMemoryAccess is only reported by Info: the simulator never
	// lets the device address ordinary pageable host memory.
	PageableMemoryAccess bool
	// ReadOnlyHostRegister allows device.RegisterReadOnly.
	ReadOnlyHostRegister bool
	// VirtualMemory enables Reserve, CreatePhysical, Map and friends.
	VirtualMemory bool

	// Bandwidths in GB/s (1e9 bytes per second).
	PinnedHtoDGBps float64
	PinnedDtoHGBps float64
	// PageableGBps applies to copies from or to ordinary host memory, both
	// directions.
	PageableGBps float64
	// DeviceGBps is the device memory bandwidth counting read plus write
	// traffic: a device-to-device copy of n bytes moves 2n.
	DeviceGBps float64
	// PeakFLOPS is the compute rate kernels' Cost.FLOPs are divided by, in
	// floating-point operations per second.
	PeakFLOPS float64
	// CopyLatency is added to every copy, LaunchLatency to every kernel and
	// memset.
	CopyLatency   time.Duration
	LaunchLatency time.Duration
	// AllocLatency and FreeLatency are the modelled costs of one driver
	// allocation or free; they are summed in Stats.DriverTime only.
	AllocLatency time.Duration
	FreeLatency  time.Duration

	// Backing keeps real bytes behind every allocation; without it only
	// metadata is kept and no data moves.
	Backing bool
	// Shuffle picks the next operation to run at random among the streams
	// that can run, from a generator seeded with Seed.
	Shuffle bool
	Seed    uint64
	// MaxPending bounds the operations queued on the device; submitting
	// beyond it runs queued work first.
	MaxPending int
	// Kernels are the Go implementations Function looks kernels up in, by
	// name (the first of a name wins).
	Kernels []Kernel
}

// DefaultOptions describes an 8 GiB discrete GPU on PCIe 4.0 x16, modelled
// on an RTX 3070-class card: compute capability 8.6, 46 SMs, 448 GB/s of
// memory bandwidth and 20 TFLOP/s of FP32 (non-tensor-core) compute; pinned
// copies at 25 GB/s each way, pageable at 8 GB/s; 2 µs copy latency, 4 µs
// launch latency, 30 µs per driver allocation or free; virtual memory with
// 2 MiB granularity; backing bytes on; no shuffling.
func DefaultOptions() Options {
	return Options{
		Name:                 "memwall-sim (8 GiB discrete, PCIe 4.0 x16)",
		TotalBytes:           8 << 30,
		HostBytes:            16 << 30,
		ComputeMajor:         8,
		ComputeMinor:         6,
		Multiprocessors:      46,
		MemoryBusBits:        256,
		PCIeGen:              4,
		PCIeWidth:            16,
		CopyEngines:          2,
		Granularity:          2 << 20,
		CanMapHostMemory:     true,
		ReadOnlyHostRegister: true,
		VirtualMemory:        true,
		PinnedHtoDGBps:       25,
		PinnedDtoHGBps:       25,
		PageableGBps:         8,
		DeviceGBps:           448,
		PeakFLOPS:            20e12,
		CopyLatency:          2 * time.Microsecond,
		LaunchLatency:        4 * time.Microsecond,
		AllocLatency:         30 * time.Microsecond,
		FreeLatency:          30 * time.Microsecond,
		Backing:              true,
		Seed:                 1,
		MaxPending:           4096,
	}
}

// normalize fills zero numeric fields from DefaultOptions.
func (o Options) normalize() Options {
	def := DefaultOptions()
	if o.Name == "" {
		o.Name = def.Name
	}
	setU := func(v *uint64, d uint64) {
		if *v == 0 {
			*v = d
		}
	}
	setI := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	setF := func(v *float64, d float64) {
		if !(*v > 0) { // also catches NaN
			*v = d
		}
	}
	setD := func(v *time.Duration, d time.Duration) {
		if *v < 0 {
			*v = d
		}
	}
	setU(&o.TotalBytes, def.TotalBytes)
	setU(&o.HostBytes, def.HostBytes)
	setI(&o.ComputeMajor, def.ComputeMajor)
	if o.ComputeMinor < 0 {
		o.ComputeMinor = 0
	}
	setI(&o.Multiprocessors, def.Multiprocessors)
	setI(&o.MemoryBusBits, def.MemoryBusBits)
	setI(&o.CopyEngines, def.CopyEngines)
	setI(&o.MaxPending, def.MaxPending)
	if o.Granularity == 0 || o.Granularity&(o.Granularity-1) != 0 {
		o.Granularity = def.Granularity
	}
	setI(&o.PCIeGen, def.PCIeGen)
	setI(&o.PCIeWidth, def.PCIeWidth)
	setF(&o.PinnedHtoDGBps, def.PinnedHtoDGBps)
	setF(&o.PinnedDtoHGBps, def.PinnedDtoHGBps)
	setF(&o.PageableGBps, def.PageableGBps)
	setF(&o.DeviceGBps, def.DeviceGBps)
	setF(&o.PeakFLOPS, def.PeakFLOPS)
	// Zero latencies are meaningful (an idealised device); only negative
	// ones are replaced.
	setD(&o.CopyLatency, def.CopyLatency)
	setD(&o.LaunchLatency, def.LaunchLatency)
	setD(&o.AllocLatency, def.AllocLatency)
	setD(&o.FreeLatency, def.FreeLatency)
	o.Kernels = append([]Kernel(nil), o.Kernels...)
	return o
}

// Stats are the simulator's counters, for reports and tests.
type Stats struct {
	// Now is the simulated time of the latest completed operation.
	Now time.Duration
	// Busy time per engine, summed over completed operations. With one copy
	// engine, HtoDBusy and DtoHBusy share one engine timeline.
	HtoDBusy, DtoHBusy, ComputeBusy time.Duration
	// Bytes moved by completed operations.
	HtoDBytes, DtoHBytes, DtoDBytes, MemsetBytes uint64
	// Completed operations by kind.
	Copies, Memsets, Kernels uint64
	// Pending is the number of queued operations not yet run.
	Pending int
	// AllocCalls counts Alloc, HostAlloc, HostRegister and CreatePhysical
	// calls that succeeded; FreeCalls counts Free, HostFree and
	// ReleasePhysical. DriverTime is their modelled cost (AllocLatency and
	// FreeLatency each), which does not advance simulated time.
	AllocCalls, FreeCalls uint64
	DriverTime            time.Duration
	// Memory in use: device allocations (rounded to 512 bytes), physical
	// chunks not yet returned, and pinned host memory from HostAlloc.
	AllocatedBytes, PhysicalBytes, PinnedHostBytes uint64
}

// Device is a simulated GPU. Create it with New.
type Device struct {
	o    Options
	info device.Info

	mu     sync.Mutex
	closed bool
	mem    memory
	exec   scheduler
	kern   kernelTable
	next   uint64 // last handle given out (streams, events, chunks, modules, functions)
	stats  Stats
}

var _ device.Device = (*Device)(nil)

// errClosed is returned by every method after Close.
var errClosed = fmt.Errorf("sim: device closed: %w", device.ErrInvalid)

// New returns a simulated device configured by opts (see Options for how
// zero fields are filled).
func New(opts Options) *Device {
	o := opts.normalize()
	d := &Device{o: o}
	d.info = device.Info{
		Backend:              "sim",
		Name:                 o.Name,
		UUID:                 "GPU-51300000-0000-0000-0000-000000000000",
		DriverVersion:        "sim",
		TotalBytes:           o.TotalBytes,
		ComputeMajor:         o.ComputeMajor,
		ComputeMinor:         o.ComputeMinor,
		Multiprocessors:      o.Multiprocessors,
		Integrated:           o.Integrated,
		CanMapHostMemory:     o.CanMapHostMemory,
		PageableMemoryAccess: o.PageableMemoryAccess,
		ReadOnlyHostRegister: o.ReadOnlyHostRegister,
		CopyEngines:          o.CopyEngines,
		VirtualMemory:        o.VirtualMemory,
		PCIBusID:             "0000:00:00.0",
		PCIeGen:              o.PCIeGen,
		PCIeWidth:            o.PCIeWidth,
		MemoryBusBit:         o.MemoryBusBits,
		Disabled:             []string{"driver stream-ordered allocator: not simulated"},
	}
	if o.VirtualMemory {
		d.info.Granularity = o.Granularity
	} else {
		d.info.Disabled = append(d.info.Disabled, "virtual memory: off in sim.Options")
	}
	if !o.CanMapHostMemory {
		d.info.Disabled = append(d.info.Disabled, "host memory mapping: off in sim.Options")
	}
	if !o.ReadOnlyHostRegister {
		d.info.Disabled = append(d.info.Disabled, "read-only host register: off in sim.Options")
	}
	if o.Integrated {
		d.info.PCIeGen, d.info.PCIeWidth = 0, 0
	}
	d.mem.init()
	d.exec.init(o)
	d.kern.init()
	return d
}

// enter locks the device; it fails once the device is closed.
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

// Info describes the simulated device.
func (d *Device) Info() device.Info {
	in := d.info
	in.Disabled = append([]string(nil), d.info.Disabled...)
	return in
}

// Options returns the options in effect (after zero fields were filled).
func (d *Device) Options() Options {
	o := d.o
	o.Kernels = append([]Kernel(nil), d.o.Kernels...)
	return o
}

// Now returns the simulated time of the latest completed operation, counted
// from the device's creation. Work still queued is not included; synchronize
// first to read the end of a run.
func (d *Device) Now() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stats.Now
}

// Stats returns a snapshot of the counters.
func (d *Device) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stats
	s.Pending = d.exec.pending
	s.AllocatedBytes = d.mem.allocated
	s.PhysicalBytes = d.mem.physical
	s.PinnedHostBytes = d.mem.pinned
	return s
}

// Close runs the work still queued and releases the simulator's memory;
// afterwards every method fails with an error wrapping device.ErrInvalid.
// Closing twice is a no-op.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.drain()
	d.closed = true
	d.mem.dropAll()
	d.mem = memory{}
	d.exec = scheduler{}
	d.kern = kernelTable{}
	return nil
}
