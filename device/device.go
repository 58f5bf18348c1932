// Package device is the boundary between memwall and a GPU.
//
// A Device is implemented twice: by package device/cuda, which binds the CUDA
// driver API at run time, and by package device/sim, a deterministic simulated
// device backed by host memory. Everything above this package (pools, the
// streamer, the KV cache) is written against the interface and tested on both.
//
// Device memory is never Go memory: it is addressed by Ptr, a uint64, and all
// allocator metadata stays on the host. Operations that take a Stream are
// asynchronous: they are ordered after earlier work on the same stream and
// after the events the stream waits on, and they complete at some later time.
// Host buffers passed to asynchronous copies must stay valid and unmodified
// until the stream (or an event recorded after the copy) has completed.
//
// Errors wrap ErrUnsupported when a feature is missing on the device or in the
// driver, ErrOutOfMemory when the device cannot satisfy an allocation, and
// ErrInvalid for bad handles or arguments.
package device

import (
	"errors"
	"time"
)

// Ptr is a device (or device-visible) address. Zero is never a valid address.
type Ptr uint64

// Add returns p advanced by n bytes.
func (p Ptr) Add(n uint64) Ptr { return p + Ptr(n) }

// Stream identifies an ordered queue of device work. Zero is never a valid
// stream; streams come from Device.NewStream.
type Stream uint64

// Event identifies a marker recorded into a stream. Zero is never valid.
type Event uint64

// PhysMem identifies a physical memory chunk created for virtual mapping.
type PhysMem uint64

// Module identifies a loaded code module; Function a kernel within it.
type (
	Module   uint64
	Function uint64
)

// Common errors. Implementations wrap them so callers can use errors.Is.
var (
	ErrUnsupported = errors.New("not supported by this device")
	ErrOutOfMemory = errors.New("device out of memory")
	ErrInvalid     = errors.New("invalid argument or handle")
	ErrNotReady    = errors.New("not ready")
)

// Info describes a device and what memwall can do with it. Zero values mean
// "unknown" for the numeric topology fields (PCIe generation and width).
type Info struct {
	Backend       string `json:"backend"` // "cuda" or "sim"
	Name          string `json:"name"`
	Ordinal       int    `json:"ordinal"`
	UUID          string `json:"uuid,omitempty"`
	DriverVersion string `json:"driver_version,omitempty"`
	TotalBytes    uint64 `json:"total_bytes"`
	ComputeMajor  int    `json:"compute_major"`
	ComputeMinor  int    `json:"compute_minor"`
	// Multiprocessors is the number of streaming multiprocessors.
	Multiprocessors int `json:"multiprocessors"`
	// Integrated is true when the GPU shares physical memory with the host
	// (unified memory SoCs): then host memory should be used zero-copy.
	Integrated bool `json:"integrated"`
	// HostMemory is true when device memory is host memory and a
	// registered host range's DevicePtr is its own host address, read by
	// kernels at host speed (the CPU device): resident weights are then
	// used in place from the mapped file, never copied.
	HostMemory bool `json:"host_memory"`
	// CanMapHostMemory reports whether pinned host memory can be mapped into
	// the device address space (zero-copy access).
	CanMapHostMemory bool `json:"can_map_host_memory"`
	// PageableMemoryAccess reports whether the device can read ordinary
	// pageable host memory directly (HMM/ATS systems).
	PageableMemoryAccess bool `json:"pageable_memory_access"`
	// ReadOnlyHostRegister reports whether read-only host memory (such as a
	// read-only mmap of a model file) can be registered.
	ReadOnlyHostRegister bool `json:"read_only_host_register"`
	// CopyEngines is the number of asynchronous copy engines.
	CopyEngines int `json:"copy_engines"`
	// VirtualMemory reports whether address reservation and physical mapping
	// (growable arenas) are available; Granularity is its page size.
	VirtualMemory bool   `json:"virtual_memory"`
	Granularity   uint64 `json:"granularity_bytes"`
	// MemoryPools reports whether the driver's stream-ordered allocator is
	// available (used only as a benchmark anchor).
	MemoryPools  bool   `json:"memory_pools"`
	PCIBusID     string `json:"pci_bus_id,omitempty"`
	PCIeGen      int    `json:"pcie_gen,omitempty"`
	PCIeWidth    int    `json:"pcie_width,omitempty"`
	MemoryBusBit int    `json:"memory_bus_bits,omitempty"`
	// Disabled lists features this device handle cannot offer, each with the
	// reason (a missing driver symbol, an attribute the device reports as 0).
	Disabled []string `json:"disabled,omitempty"`
}

// HostMemoryKind says how a host buffer was obtained.
type HostMemoryKind int

const (
	// HostPinned memory was allocated page-locked by the device driver.
	HostPinned HostMemoryKind = iota
	// HostRegistered memory is existing host memory page-locked in place.
	HostRegistered
)

// HostBuffer is page-locked host memory usable for fast asynchronous copies.
// Bytes is valid until the buffer is freed. DevicePtr is the address through
// which the device can read the buffer directly (zero-copy), or 0 when the
// device cannot map host memory.
type HostBuffer struct {
	Bytes     []byte
	DevicePtr Ptr
	Kind      HostMemoryKind
}

// RegisterFlags modify Device.HostRegister.
type RegisterFlags uint32

const (
	// RegisterDeviceMap also maps the memory into the device address space.
	RegisterDeviceMap RegisterFlags = 1 << iota
	// RegisterReadOnly declares that the device will only read the memory;
	// required for read-only mappings such as a PROT_READ mmap of a file.
	RegisterReadOnly
)

// Dim3 is a grid or block shape for a kernel launch.
type Dim3 struct{ X, Y, Z uint32 }

// Memory is device memory management.
type Memory interface {
	// MemInfo returns the free and total device memory in bytes, as the
	// driver sees it now (other processes included).
	MemInfo() (free, total uint64, err error)
	// Alloc returns size bytes of device memory, aligned to at least 256
	// bytes. It fails with an error wrapping ErrOutOfMemory when the device
	// has no room. Alloc(0) fails with ErrInvalid.
	Alloc(size uint64) (Ptr, error)
	// Free releases memory from Alloc. It waits for work that may still use
	// it, as the driver's free does. Freeing anything else fails with ErrInvalid.
	Free(p Ptr) error
	// HostAlloc returns size bytes of pinned host memory, mapped into the
	// device when the device supports it.
	HostAlloc(size uint64) (*HostBuffer, error)
	// HostFree releases a buffer from HostAlloc or HostRegister.
	HostFree(b *HostBuffer) error
	// HostRegister page-locks existing host memory (for example an mmap'd
	// model file) in place. The returned buffer aliases b; HostFree
	// unregisters it and leaves b itself alone.
	HostRegister(b []byte, flags RegisterFlags) (*HostBuffer, error)
}

// Streams is ordered asynchronous execution.
type Streams interface {
	// NewStream creates a stream that does not synchronize with other streams
	// except through events.
	NewStream() (Stream, error)
	DestroyStream(s Stream) error
	// StreamSynchronize blocks until all work submitted to s has completed
	// and returns the first error any of it raised.
	StreamSynchronize(s Stream) error
	// StreamQuery reports whether all work submitted to s has completed.
	StreamQuery(s Stream) (bool, error)
	// StreamWaitEvent makes all future work on s wait for the work captured
	// by the most recent EventRecord of e at the time of this call. Waiting on
	// an event that was never recorded is a no-op, as in CUDA.
	StreamWaitEvent(s Stream, e Event) error

	// NewEvent creates an event; with timing, EventElapsed works on it.
	NewEvent(timing bool) (Event, error)
	DestroyEvent(e Event) error
	// EventRecord captures the work submitted to s so far.
	EventRecord(e Event, s Stream) error
	// EventQuery reports whether the captured work has completed.
	EventQuery(e Event) (bool, error)
	// EventSynchronize blocks until the captured work has completed.
	EventSynchronize(e Event) error
	// EventElapsed returns the device time between two completed timing events.
	EventElapsed(start, end Event) (time.Duration, error)
	// Synchronize blocks until all work on the device has completed.
	Synchronize() error
}

// Copies moves bytes asynchronously on a stream. Host slices may be pinned
// (from HostAlloc/HostRegister, fast DMA) or ordinary pageable memory (staged
// by the driver, slower).
type Copies interface {
	CopyHtoD(dst Ptr, src []byte, s Stream) error
	CopyDtoH(dst []byte, src Ptr, s Stream) error
	CopyDtoD(dst, src Ptr, n uint64, s Stream) error
	// Memset8 sets n bytes at dst to v.
	Memset8(dst Ptr, v byte, n uint64, s Stream) error
	// Memset32 sets count 32-bit words at dst (4-byte aligned) to v.
	Memset32(dst Ptr, v uint32, count uint64, s Stream) error
}

// VirtualMemory reserves address ranges and maps physical chunks into them,
// the basis of growable arenas. All sizes and addresses must be multiples of
// Info.Granularity. Devices without it return errors wrapping ErrUnsupported.
type VirtualMemory interface {
	// Reserve reserves size bytes of device address space, unbacked.
	Reserve(size uint64) (Ptr, error)
	// Unreserve releases a reservation; nothing may still be mapped in it.
	Unreserve(p Ptr, size uint64) error
	// CreatePhysical allocates a physical chunk of size bytes.
	CreatePhysical(size uint64) (PhysMem, error)
	// ReleasePhysical frees a chunk; the memory is returned once no mapping
	// refers to it any longer.
	ReleasePhysical(h PhysMem) error
	// Map maps the whole chunk h at va and grants this device read/write
	// access to it.
	Map(va Ptr, size uint64, h PhysMem) error
	// Unmap removes the mapping of [va, va+size); it waits for work that may
	// still use the range.
	Unmap(va Ptr, size uint64) error
}

// Kernels loads device code and launches it.
type Kernels interface {
	// LoadModule loads a module from PTX text (cuda) or by name from the
	// kernels registered with the simulator (sim).
	LoadModule(ptx []byte) (Module, error)
	UnloadModule(m Module) error
	// Function finds a kernel by its (unmangled, extern "C") name.
	Function(m Module, name string) (Function, error)
	// Launch runs f on s. Arguments are Ptr, uint32, int32, uint64, int64,
	// float32 or float64, passed by value in order.
	Launch(f Function, grid, block Dim3, sharedBytes uint32, s Stream, args ...any) error
}

// MatmulLibrary is an optional capability of a Device: a vendor matrix
// library (cuBLASLt on CUDA) that package kernels uses for prefill-sized
// products when the device offers one. Test for it with a type assertion.
type MatmulLibrary interface {
	// Gemm queues Y = X·Wᵀ on s: W is M×K and X is T×K, row-major in dtype
	// ("bf16" or "f16"), Y is T×M row-major float32, accumulated in
	// float32. Products it does not take fail with ErrUnsupported before
	// anything is queued, so the caller can fall back to its own kernel.
	Gemm(dtype string, W, X, Y Ptr, M, K, T uint32, s Stream) error
	// GemmName names the library ("cublaslt"), or is "" when it could not
	// be loaded (then Gemm fails with ErrUnsupported).
	GemmName() string
}

// OverlapLauncher is an optional capability of a Device: kernel launches
// that may overlap the previous kernel on the stream (CUDA's programmatic
// dependent launch, compute capability 9.0 and newer). Test for it with a
// type assertion, then CanOverlap.
//
// Ordering: f may start before the previous kernel on s completes; f must
// execute griddepcontrol.wait (cudaGridDependencySynchronize) before it
// reads anything that kernel writes and before it writes anything that
// kernel reads or writes, and so must every kernel launched this way, for
// the ordering of later kernels to stay transitive. The overlap applies only
// between two kernels: when the operation queued on s just before f is not a
// kernel (a copy, a memset, an event record, a wait on an event), f starts
// after it completes, as a plain Launch would.
//
// Sources: cuda.h on cuLaunchKernelEx: the attribute lets the runtime
// "opportunistically allow the grid's execution to overlap with the
// previous kernel in the stream, if that kernel requests the overlap"; the
// PTX ISA: griddepcontrol.wait waits until "all prerequisite grids in flight
// have completed and all the memory operations from the prerequisite grids
// are performed and made visible to the current grid"; the CUDA Programming
// Guide, "Programmatic Dependent Launch and Synchronization": the secondary
// kernel may launch before "the primary kernel it depends on in the same
// CUDA stream" has finished. None of them names copies or events in so many
// words: the relaxation is defined for a kernel after a kernel, a copy or an
// event is no grid that could request it, and a wait on another stream's
// event is a dependency of its own that the attribute does not touch. On
// the H200, package kernels' TestCUDAOverlapChain checks the cases memwall
// relies on (a copy and a memset between kernels, a kernel right after a
// wait on an event recorded behind a late copy on another stream).
type OverlapLauncher interface {
	// LaunchOverlapped is Launch with the overlap above allowed. It fails
	// with ErrUnsupported, before queuing anything, when CanOverlap is
	// false.
	LaunchOverlapped(f Function, grid, block Dim3, sharedBytes uint32, s Stream, args ...any) error
	// CanOverlap reports whether the driver and the GPU support overlapped
	// launches (CUDA: cuLaunchKernelEx present, compute capability ≥ 9.0).
	CanOverlap() bool
}

// Graph is an instantiated graph of device work captured from a stream
// (Grapher). Zero is never valid.
type Graph uint64

// Grapher is an optional capability of a Device: recording the work queued
// on a stream once and replaying it with one call (CUDA graphs: stream
// capture, instantiate, launch). Test for it with a type assertion, then
// CanGraph; devices without it (the simulator, the CPU, Vulkan) run the same
// work by plain launches.
//
// Contract: between BeginCapture(s) and EndCapture(s) the operations queued
// on s (kernel launches, overlapped launches included, copies between
// device memory and pinned host memory, memsets) are recorded, not run.
// What may not be queued on s or issued by the capturing caller meanwhile:
// anything that waits for the device (StreamSynchronize, EventSynchronize,
// Synchronize, StreamQuery and EventQuery on s), copies from or to pageable
// host memory, Alloc and Free (and the pool growth that calls them), event
// records and waits that join other streams (not supported by memwall's
// capture), and capture of a second stream. Doing any of them fails the call
// or invalidates the capture: EndCapture then returns an error and no graph.
// Kernel arguments are recorded by value at capture: work that must change
// between replays reads what changes from device memory (a small state
// buffer filled by a captured copy from a pinned host buffer, written by the
// host before each LaunchGraph). Host buffers of captured copies must stay
// allocated while the graph lives.
type Grapher interface {
	// CanGraph reports whether capture works on this device (CUDA: the
	// capture, instantiate and launch symbols are bound).
	CanGraph() bool
	// BeginCapture starts recording the work queued on s. It fails with
	// ErrUnsupported when CanGraph is false, and with ErrInvalid when s is
	// already capturing.
	BeginCapture(s Stream) error
	// EndCapture stops recording on s and returns the instantiated graph.
	// It always ends the capture; on error (the capture was invalidated,
	// instantiation failed) nothing recorded runs and no graph is returned.
	EndCapture(s Stream) (Graph, error)
	// LaunchGraph queues one replay of g on s, ordered like any other work
	// on s. A graph may be launched again before its previous replay ends;
	// replays on one stream run one after the other.
	LaunchGraph(g Graph, s Stream) error
	// DestroyGraph frees g; replays already queued still complete.
	// Destroying an unknown graph fails with ErrInvalid.
	DestroyGraph(g Graph) error
}

// Device is one GPU (real or simulated). All methods are safe for concurrent
// use by multiple goroutines.
type Device interface {
	Info() Info
	Memory
	Streams
	Copies
	VirtualMemory
	Kernels
	// Close releases the device handle. Memory still allocated is freed by
	// the driver when the process exits; Close does not free it.
	Close() error
}
