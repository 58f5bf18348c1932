// Package cuda implements device.Device on an NVIDIA GPU through the CUDA
// driver API, bound at run time from libcuda.so.1 with purego: the binary
// builds with CGO_ENABLED=0 and needs no CUDA toolkit.
//
// Threading: CUDA makes a context current per OS thread. Every call here locks
// its goroutine to the OS thread, makes the device's primary context current
// and calls the driver, so any goroutine may use a Device.
//
// Optional driver features (virtual memory, host registration, kernels, the
// driver's own stream-ordered allocator) are bound when present; a missing
// symbol or a device attribute of 0 disables the feature, listed in
// Info.Disabled, and its methods return errors wrapping device.ErrUnsupported.
package cuda

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/memwall/memwall/device"
)

// Options configure Open.
type Options struct {
	// Ordinal selects the GPU (0 = first).
	Ordinal int
	// Getenv reads MEMWALL_LIBCUDA; nil means os.Getenv.
	Getenv func(string) string
}

// Device is one CUDA GPU through its primary context.
type Device struct {
	d    *driver
	dev  int32
	ctx  uintptr
	info device.Info
	// wrapped: ctx is the caller's (Wrap), not a retained primary context.
	wrapped bool
	// ctxMem is the primary context's own device memory (context.go).
	ctxMem contextMemory

	getenv func(string) string // Options.Getenv, for EnvLibCublasLt
	blas   blasLt              // cuBLASLt, loaded on first use (blaslt.go)

	mu      sync.Mutex
	host    map[uintptr]hostEntry // base address → how it was obtained
	streams map[device.Stream]struct{}
	events  map[device.Event]struct{}
	// graphs are the instantiated graphs (graph.go), capturing the streams
	// between BeginCapture and EndCapture; both made on first use.
	graphs    map[device.Graph]struct{}
	capturing map[device.Stream]struct{}
}

type hostEntry struct {
	kind device.HostMemoryKind
	size int
}

var _ device.Device = (*Device)(nil)

// device attribute numbers (CUdevice_attribute).
const (
	attrMultiprocessors       = 16
	attrIntegrated            = 18
	attrCanMapHostMemory      = 19
	attrPCIBusID              = 33
	attrPCIDeviceID           = 34
	attrMemoryBusWidth        = 37
	attrAsyncEngineCount      = 40
	attrPCIDomainID           = 50
	attrComputeMajor          = 75
	attrComputeMinor          = 76
	attrPageableMemoryAccess  = 88
	attrHostRegisterSupported = 99
	attrVirtualMemory         = 102
	attrReadOnlyHostRegister  = 113
	attrMemoryPools           = 115
)

// Open loads the driver, initializes it and retains the primary context of
// the chosen GPU. Errors say which library paths were tried and why each
// failed (wrapping ErrNoDriver), or which driver call failed.
func Open(opts Options) (*Device, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	d, err := loadDriver(LibraryCandidates(getenv))
	if err != nil {
		return nil, err
	}
	if err := d.err("cuInit", d.raw(d.cuInit, 0)); err != nil {
		return nil, fmt.Errorf("cuda: %s: %w", d.path, err)
	}
	var count int32
	if err := d.err("cuDeviceGetCount", d.raw(d.cuDeviceGetCount, uintptr(unsafe.Pointer(&count)))); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if opts.Ordinal < 0 || int32(opts.Ordinal) >= count {
		return nil, fmt.Errorf("cuda: device ordinal %d out of range: %d device(s) visible", opts.Ordinal, count)
	}
	var dev int32
	if err := d.err("cuDeviceGet", d.raw(d.cuDeviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(opts.Ordinal))); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	var ctx uintptr
	cm, err := d.measureContext(dev, func() (uintptr, error) {
		err := d.err("cuDevicePrimaryCtxRetain", d.raw(d.cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&ctx)), uintptr(dev)))
		return ctx, err
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	c := &Device{d: d, dev: dev, ctx: ctx, ctxMem: cm, getenv: getenv,
		host:    map[uintptr]hostEntry{},
		streams: map[device.Stream]struct{}{},
		events:  map[device.Event]struct{}{},
	}
	if err := c.readInfo(opts.Ordinal); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// call runs a driver function with the context current. Out-parameters are
// passed as uintptr(unsafe.Pointer(&v)) at the call site; uintptrescapes
// moves such v to the heap and keeps it alive for the whole call chain, so a
// stack move in between cannot leave the driver writing to a stale address.
//
//go:uintptrescapes
func (c *Device) call(name string, fn uintptr, args ...uintptr) error {
	return c.d.err(name, c.d.ctxCall(c.ctx, fn, args...))
}

func (c *Device) attr(a int) int {
	var v int32
	if c.d.raw(c.d.cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(c.dev)) != cudaSuccess {
		return 0
	}
	return int(v)
}

func (c *Device) readInfo(ordinal int) error {
	d := c.d
	in := device.Info{Backend: "cuda", Ordinal: ordinal}
	name := make([]byte, 256)
	if err := d.err("cuDeviceGetName", d.raw(d.cuDeviceGetName, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name)), uintptr(c.dev))); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	in.Name = cString(&name[0])
	var total uint64
	if err := d.err("cuDeviceTotalMem_v2", d.raw(d.cuDeviceTotalMem, uintptr(unsafe.Pointer(&total)), uintptr(c.dev))); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	in.TotalBytes = total
	var ver int32
	if d.raw(d.cuDriverGetVersion, uintptr(unsafe.Pointer(&ver))) == cudaSuccess {
		in.DriverVersion = fmt.Sprintf("%d.%d", ver/1000, (ver%1000)/10)
	}
	if d.cuDeviceGetUuid != 0 {
		var u [16]byte
		if d.raw(d.cuDeviceGetUuid, uintptr(unsafe.Pointer(&u[0])), uintptr(c.dev)) == cudaSuccess {
			in.UUID = fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
		}
	}
	in.ComputeMajor = c.attr(attrComputeMajor)
	in.ComputeMinor = c.attr(attrComputeMinor)
	in.Multiprocessors = c.attr(attrMultiprocessors)
	in.Integrated = c.attr(attrIntegrated) != 0
	in.CanMapHostMemory = c.attr(attrCanMapHostMemory) != 0 && d.cuMemHostGetDevicePointer != 0
	in.PageableMemoryAccess = c.attr(attrPageableMemoryAccess) != 0
	in.CopyEngines = c.attr(attrAsyncEngineCount)
	in.MemoryBusBit = c.attr(attrMemoryBusWidth)
	in.MemoryPools = c.attr(attrMemoryPools) != 0 && d.cuMemAllocAsync != 0 && d.cuMemFreeAsync != 0
	hostReg := c.attr(attrHostRegisterSupported) != 0 && d.cuMemHostRegister != 0 && d.cuMemHostUnregister != 0
	in.ReadOnlyHostRegister = hostReg && c.attr(attrReadOnlyHostRegister) != 0
	in.PCIBusID = fmt.Sprintf("%04x:%02x:%02x.0", c.attr(attrPCIDomainID), c.attr(attrPCIBusID), c.attr(attrPCIDeviceID))
	in.PCIeGen, in.PCIeWidth = pcieLink(in.PCIBusID)

	vmmSyms := d.cuMemAddressReserve != 0 && d.cuMemAddressFree != 0 && d.cuMemCreate != 0 &&
		d.cuMemRelease != 0 && d.cuMemMap != 0 && d.cuMemUnmap != 0 && d.cuMemSetAccess != 0 &&
		d.cuMemGetAllocationGranularity != 0
	switch {
	case !vmmSyms:
		in.Disabled = append(in.Disabled, "virtual memory: driver lacks cuMem{AddressReserve,Create,Map,...}")
	case c.attr(attrVirtualMemory) == 0:
		in.Disabled = append(in.Disabled, "virtual memory: device reports VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED=0")
	default:
		g, err := c.granularity()
		if err != nil {
			in.Disabled = append(in.Disabled, "virtual memory: "+err.Error())
		} else {
			in.VirtualMemory, in.Granularity = true, g
		}
	}
	if !hostReg {
		in.Disabled = append(in.Disabled, "host register: driver lacks cuMemHostRegister or device reports HOST_REGISTER_SUPPORTED=0")
	} else if !in.ReadOnlyHostRegister {
		in.Disabled = append(in.Disabled, "read-only host register: device reports READ_ONLY_HOST_REGISTER_SUPPORTED=0")
	}
	if d.cuModuleLoadDataEx == 0 || d.cuModuleGetFunction == 0 || d.cuLaunchKernel == 0 {
		in.Disabled = append(in.Disabled, "kernels: driver lacks cuModuleLoadDataEx/cuLaunchKernel")
	}
	if !c.graphSymbols() {
		in.Disabled = append(in.Disabled, "graphs: driver lacks cuStreamBeginCapture_v2/cuStreamEndCapture/cuGraphInstantiate*/cuGraphLaunch")
	}
	if !in.MemoryPools {
		in.Disabled = append(in.Disabled, "driver stream-ordered allocator (cuMemAllocAsync): not available")
	}
	for _, m := range d.missing {
		in.Disabled = append(in.Disabled, "missing optional symbol "+m)
	}
	c.info = in
	return nil
}

// pcieLink reads the maximum PCIe link generation and width from sysfs.
// Zeros mean unknown (virtual machines often hide it).
func pcieLink(busID string) (gen, width int) {
	base := "/sys/bus/pci/devices/" + strings.ToLower(busID) + "/"
	if b, err := os.ReadFile(base + "max_link_speed"); err == nil {
		var gts float64
		if _, err := fmt.Sscanf(string(b), "%g", &gts); err == nil {
			switch {
			case gts >= 60:
				gen = 6
			case gts >= 30:
				gen = 5
			case gts >= 15:
				gen = 4
			case gts >= 7.5:
				gen = 3
			case gts >= 4.5:
				gen = 2
			case gts > 0:
				gen = 1
			}
		}
	}
	if b, err := os.ReadFile(base + "max_link_width"); err == nil {
		fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &width)
	}
	return gen, width
}

// Info describes the GPU.
func (c *Device) Info() device.Info { return c.info }

// DriverPath is the libcuda that was loaded.
func (c *Device) DriverPath() string { return c.d.path }

// Close releases the primary context (nothing, for a wrapped context).
func (c *Device) Close() error {
	if c.wrapped {
		return nil
	}
	return c.d.err("cuDevicePrimaryCtxRelease", c.d.raw(c.d.cuDevicePrimaryCtxRelease, uintptr(c.dev)))
}

// MemInfo returns the driver's free and total memory.
func (c *Device) MemInfo() (free, total uint64, err error) {
	err = c.call("cuMemGetInfo_v2", c.d.cuMemGetInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
	return free, total, err
}

// Alloc calls cuMemAlloc.
func (c *Device) Alloc(size uint64) (device.Ptr, error) {
	if size == 0 {
		return 0, fmt.Errorf("cuda: alloc of 0 bytes: %w", device.ErrInvalid)
	}
	var p uint64
	if err := c.call("cuMemAlloc_v2", c.d.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size)); err != nil {
		return 0, fmt.Errorf("cuda: alloc %d bytes: %w", size, err)
	}
	return device.Ptr(p), nil
}

// Free calls cuMemFree.
func (c *Device) Free(p device.Ptr) error {
	if p == 0 {
		return fmt.Errorf("cuda: free of null pointer: %w", device.ErrInvalid)
	}
	return c.call("cuMemFree_v2", c.d.cuMemFree, uintptr(p))
}

const (
	hostAllocPortable  = 0x01
	hostAllocDeviceMap = 0x02
	hostRegPortable    = 0x01
	hostRegDeviceMap   = 0x02
	hostRegReadOnly    = 0x08
)

// HostAlloc allocates pinned, portable host memory, mapped into the device
// when the device can map host memory.
func (c *Device) HostAlloc(size uint64) (*device.HostBuffer, error) {
	if size == 0 {
		return nil, fmt.Errorf("cuda: host alloc of 0 bytes: %w", device.ErrInvalid)
	}
	flags := uintptr(hostAllocPortable)
	if c.info.CanMapHostMemory {
		flags |= hostAllocDeviceMap
	}
	var p unsafe.Pointer
	if err := c.call("cuMemHostAlloc", c.d.cuMemHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size), flags); err != nil {
		return nil, fmt.Errorf("cuda: pinned host alloc %d bytes: %w", size, err)
	}
	b := &device.HostBuffer{Bytes: unsafe.Slice((*byte)(p), size), Kind: device.HostPinned}
	if c.info.CanMapHostMemory {
		var dp uint64
		if err := c.call("cuMemHostGetDevicePointer_v2", c.d.cuMemHostGetDevicePointer, uintptr(unsafe.Pointer(&dp)), uintptr(p), 0); err == nil {
			b.DevicePtr = device.Ptr(dp)
		}
	}
	c.mu.Lock()
	c.host[uintptr(p)] = hostEntry{kind: device.HostPinned, size: int(size)}
	c.mu.Unlock()
	return b, nil
}

// HostRegister page-locks b in place.
func (c *Device) HostRegister(b []byte, flags device.RegisterFlags) (*device.HostBuffer, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("cuda: host register of empty buffer: %w", device.ErrInvalid)
	}
	if c.d.cuMemHostRegister == 0 || c.d.cuMemHostUnregister == 0 {
		return nil, fmt.Errorf("cuda: host register: %w", device.ErrUnsupported)
	}
	f := uintptr(hostRegPortable)
	if flags&device.RegisterDeviceMap != 0 && c.info.CanMapHostMemory {
		f |= hostRegDeviceMap
	}
	if flags&device.RegisterReadOnly != 0 {
		if !c.info.ReadOnlyHostRegister {
			return nil, fmt.Errorf("cuda: read-only host register: %w", device.ErrUnsupported)
		}
		f |= hostRegReadOnly
	}
	p := unsafe.Pointer(&b[0])
	if err := c.call("cuMemHostRegister_v2", c.d.cuMemHostRegister, uintptr(p), uintptr(len(b)), f); err != nil {
		return nil, fmt.Errorf("cuda: host register %d bytes: %w", len(b), err)
	}
	hb := &device.HostBuffer{Bytes: b, Kind: device.HostRegistered}
	if f&hostRegDeviceMap != 0 {
		var dp uint64
		if err := c.call("cuMemHostGetDevicePointer_v2", c.d.cuMemHostGetDevicePointer, uintptr(unsafe.Pointer(&dp)), uintptr(p), 0); err == nil {
			hb.DevicePtr = device.Ptr(dp)
		}
	}
	c.mu.Lock()
	c.host[uintptr(p)] = hostEntry{kind: device.HostRegistered, size: len(b)}
	c.mu.Unlock()
	return hb, nil
}

// HostFree frees pinned memory or unregisters registered memory.
func (c *Device) HostFree(b *device.HostBuffer) error {
	if b == nil || len(b.Bytes) == 0 {
		return fmt.Errorf("cuda: host free of empty buffer: %w", device.ErrInvalid)
	}
	p := unsafe.Pointer(&b.Bytes[0])
	c.mu.Lock()
	e, ok := c.host[uintptr(p)]
	if ok {
		delete(c.host, uintptr(p))
	}
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("cuda: host free of a buffer this device did not allocate or register: %w", device.ErrInvalid)
	}
	if e.kind == device.HostPinned {
		return c.call("cuMemFreeHost", c.d.cuMemFreeHost, uintptr(p))
	}
	return c.call("cuMemHostUnregister", c.d.cuMemHostUnregister, uintptr(p))
}

// NewStream creates a non-blocking stream.
func (c *Device) NewStream() (device.Stream, error) {
	var s uintptr
	if err := c.call("cuStreamCreate", c.d.cuStreamCreate, uintptr(unsafe.Pointer(&s)), 1 /* CU_STREAM_NON_BLOCKING */); err != nil {
		return 0, fmt.Errorf("cuda: %w", err)
	}
	c.mu.Lock()
	c.streams[device.Stream(s)] = struct{}{}
	c.mu.Unlock()
	return device.Stream(s), nil
}

func (c *Device) stream(s device.Stream) (uintptr, error) {
	c.mu.Lock()
	_, ok := c.streams[s]
	c.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("cuda: unknown stream %#x: %w", uint64(s), device.ErrInvalid)
	}
	return uintptr(s), nil
}

func (c *Device) event(e device.Event) (uintptr, error) {
	c.mu.Lock()
	_, ok := c.events[e]
	c.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("cuda: unknown event %#x: %w", uint64(e), device.ErrInvalid)
	}
	return uintptr(e), nil
}

// DestroyStream destroys s; pending work still completes.
func (c *Device) DestroyStream(s device.Stream) error {
	h, err := c.stream(s)
	if err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.streams, s)
	c.mu.Unlock()
	return c.call("cuStreamDestroy_v2", c.d.cuStreamDestroy, h)
}

// StreamSynchronize waits for s.
func (c *Device) StreamSynchronize(s device.Stream) error {
	h, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("cuStreamSynchronize", c.d.cuStreamSynchronize, h)
}

// StreamQuery reports whether s is idle.
func (c *Device) StreamQuery(s device.Stream) (bool, error) {
	h, err := c.stream(s)
	if err != nil {
		return false, err
	}
	return c.query("cuStreamQuery", c.d.cuStreamQuery, h)
}

func (c *Device) query(name string, fn, h uintptr) (bool, error) {
	switch r := c.d.ctxCall(c.ctx, fn, h); r {
	case cudaSuccess:
		return true, nil
	case cudaErrorNotReady:
		return false, nil
	default:
		return false, c.d.err(name, r)
	}
}

// StreamWaitEvent orders later work on s after e's captured work.
func (c *Device) StreamWaitEvent(s device.Stream, e device.Event) error {
	hs, err := c.stream(s)
	if err != nil {
		return err
	}
	he, err := c.event(e)
	if err != nil {
		return err
	}
	return c.call("cuStreamWaitEvent", c.d.cuStreamWaitEvent, hs, he, 0)
}

// NewEvent creates an event.
func (c *Device) NewEvent(timing bool) (device.Event, error) {
	flags := uintptr(0)
	if !timing {
		flags = 2 // CU_EVENT_DISABLE_TIMING
	}
	var e uintptr
	if err := c.call("cuEventCreate", c.d.cuEventCreate, uintptr(unsafe.Pointer(&e)), flags); err != nil {
		return 0, fmt.Errorf("cuda: %w", err)
	}
	c.mu.Lock()
	c.events[device.Event(e)] = struct{}{}
	c.mu.Unlock()
	return device.Event(e), nil
}

// DestroyEvent destroys e.
func (c *Device) DestroyEvent(e device.Event) error {
	h, err := c.event(e)
	if err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.events, e)
	c.mu.Unlock()
	return c.call("cuEventDestroy_v2", c.d.cuEventDestroy, h)
}

// EventRecord records e on s.
func (c *Device) EventRecord(e device.Event, s device.Stream) error {
	he, err := c.event(e)
	if err != nil {
		return err
	}
	hs, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("cuEventRecord", c.d.cuEventRecord, he, hs)
}

// EventQuery reports whether e's captured work is done.
func (c *Device) EventQuery(e device.Event) (bool, error) {
	h, err := c.event(e)
	if err != nil {
		return false, err
	}
	return c.query("cuEventQuery", c.d.cuEventQuery, h)
}

// EventSynchronize waits for e.
func (c *Device) EventSynchronize(e device.Event) error {
	h, err := c.event(e)
	if err != nil {
		return err
	}
	return c.call("cuEventSynchronize", c.d.cuEventSynchronize, h)
}

// EventElapsed returns the time between two recorded timing events.
func (c *Device) EventElapsed(start, end device.Event) (time.Duration, error) {
	hs, err := c.event(start)
	if err != nil {
		return 0, err
	}
	he, err := c.event(end)
	if err != nil {
		return 0, err
	}
	var ms float32
	if err := c.call("cuEventElapsedTime", c.d.cuEventElapsedTime, uintptr(unsafe.Pointer(&ms)), hs, he); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Synchronize waits for all work in the context.
func (c *Device) Synchronize() error {
	return c.call("cuCtxSynchronize", c.d.cuCtxSynchronize)
}

// CopyHtoD copies src to dst on s.
func (c *Device) CopyHtoD(dst device.Ptr, src []byte, s device.Stream) error {
	if len(src) == 0 {
		return nil
	}
	h, err := c.stream(s)
	if err != nil {
		return err
	}
	err = c.call("cuMemcpyHtoDAsync_v2", c.d.cuMemcpyHtoDAsync, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)), h)
	runtime.KeepAlive(src)
	return err
}

// CopyDtoH copies src to dst on s.
func (c *Device) CopyDtoH(dst []byte, src device.Ptr, s device.Stream) error {
	if len(dst) == 0 {
		return nil
	}
	h, err := c.stream(s)
	if err != nil {
		return err
	}
	err = c.call("cuMemcpyDtoHAsync_v2", c.d.cuMemcpyDtoHAsync, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)), h)
	runtime.KeepAlive(dst)
	return err
}

// CopyDtoD copies n bytes on s.
func (c *Device) CopyDtoD(dst, src device.Ptr, n uint64, s device.Stream) error {
	if n == 0 {
		return nil
	}
	h, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("cuMemcpyDtoDAsync_v2", c.d.cuMemcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), h)
}

// Memset8 sets n bytes on s.
func (c *Device) Memset8(dst device.Ptr, v byte, n uint64, s device.Stream) error {
	h, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("cuMemsetD8Async", c.d.cuMemsetD8Async, uintptr(dst), uintptr(v), uintptr(n), h)
}

// Memset32 sets count words on s.
func (c *Device) Memset32(dst device.Ptr, v uint32, count uint64, s device.Stream) error {
	h, err := c.stream(s)
	if err != nil {
		return err
	}
	return c.call("cuMemsetD32Async", c.d.cuMemsetD32Async, uintptr(dst), uintptr(v), uintptr(count), h)
}
