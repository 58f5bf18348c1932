package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/memwall/memwall/device"
)

// driver is the bound CUDA driver API: one field per symbol, filled from the
// table in bind. A zero field is a symbol the library does not export.
type driver struct {
	lib  uintptr
	path string

	cuInit, cuDriverGetVersion, cuGetErrorName, cuGetErrorString            uintptr
	cuDeviceGet, cuDeviceGetCount, cuDeviceGetName, cuDeviceTotalMem        uintptr
	cuDeviceGetAttribute, cuDeviceGetUuid, cuDeviceGetPCIBusId              uintptr
	cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease, cuCtxSetCurrent    uintptr
	cuCtxSynchronize, cuMemGetInfo, cuMemAlloc, cuMemFree                   uintptr
	cuMemHostAlloc, cuMemFreeHost, cuMemHostGetDevicePointer                uintptr
	cuMemHostRegister, cuMemHostUnregister                                  uintptr
	cuStreamCreate, cuStreamDestroy, cuStreamSynchronize, cuStreamQuery     uintptr
	cuStreamWaitEvent, cuEventCreate, cuEventDestroy, cuEventRecord         uintptr
	cuEventQuery, cuEventSynchronize, cuEventElapsedTime                    uintptr
	cuMemcpyHtoDAsync, cuMemcpyDtoHAsync, cuMemcpyDtoDAsync                 uintptr
	cuMemsetD8Async, cuMemsetD32Async                                       uintptr
	cuMemAddressReserve, cuMemAddressFree, cuMemCreate, cuMemRelease        uintptr
	cuMemMap, cuMemUnmap, cuMemSetAccess, cuMemGetAllocationGranularity     uintptr
	cuModuleLoadDataEx, cuModuleUnload, cuModuleGetFunction, cuLaunchKernel uintptr
	cuMemAllocAsync, cuMemFreeAsync                                         uintptr
	cuLaunchKernelEx                                                        uintptr // CUDA 12.0+; 0 when absent

	// Graphs (graph.go), all optional: capture needs the first three, an
	// instantiate and the last three.
	cuStreamBeginCapture, cuStreamEndCapture, cuStreamIsCapturing uintptr
	cuGraphInstantiateWithFlags, cuGraphInstantiate               uintptr // CUDA 11.4+; the older five-argument form
	cuGraphLaunch, cuGraphExecDestroy, cuGraphDestroy             uintptr

	// missing lists optional symbols that were not found, for Info.Disabled.
	missing []string
}

type symbol struct {
	dst      *uintptr
	names    []string // tried in order
	required bool
}

func (d *driver) table() []symbol {
	req := func(p *uintptr, names ...string) symbol { return symbol{p, names, true} }
	opt := func(p *uintptr, names ...string) symbol { return symbol{p, names, false} }
	return []symbol{
		req(&d.cuInit, "cuInit"),
		req(&d.cuDriverGetVersion, "cuDriverGetVersion"),
		req(&d.cuGetErrorName, "cuGetErrorName"),
		req(&d.cuGetErrorString, "cuGetErrorString"),
		req(&d.cuDeviceGet, "cuDeviceGet"),
		req(&d.cuDeviceGetCount, "cuDeviceGetCount"),
		req(&d.cuDeviceGetName, "cuDeviceGetName"),
		req(&d.cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
		req(&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"),
		opt(&d.cuDeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid"),
		opt(&d.cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId"),
		req(&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
		req(&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
		req(&d.cuCtxSetCurrent, "cuCtxSetCurrent"),
		req(&d.cuCtxSynchronize, "cuCtxSynchronize"),
		req(&d.cuMemGetInfo, "cuMemGetInfo_v2"),
		req(&d.cuMemAlloc, "cuMemAlloc_v2"),
		req(&d.cuMemFree, "cuMemFree_v2"),
		req(&d.cuMemHostAlloc, "cuMemHostAlloc"),
		req(&d.cuMemFreeHost, "cuMemFreeHost"),
		opt(&d.cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
		opt(&d.cuMemHostRegister, "cuMemHostRegister_v2"),
		opt(&d.cuMemHostUnregister, "cuMemHostUnregister"),
		req(&d.cuStreamCreate, "cuStreamCreate"),
		req(&d.cuStreamDestroy, "cuStreamDestroy_v2"),
		req(&d.cuStreamSynchronize, "cuStreamSynchronize"),
		req(&d.cuStreamQuery, "cuStreamQuery"),
		req(&d.cuStreamWaitEvent, "cuStreamWaitEvent"),
		req(&d.cuEventCreate, "cuEventCreate"),
		req(&d.cuEventDestroy, "cuEventDestroy_v2"),
		req(&d.cuEventRecord, "cuEventRecord"),
		req(&d.cuEventQuery, "cuEventQuery"),
		req(&d.cuEventSynchronize, "cuEventSynchronize"),
		req(&d.cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
		req(&d.cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
		req(&d.cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
		req(&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
		req(&d.cuMemsetD8Async, "cuMemsetD8Async"),
		req(&d.cuMemsetD32Async, "cuMemsetD32Async"),
		opt(&d.cuMemAddressReserve, "cuMemAddressReserve"),
		opt(&d.cuMemAddressFree, "cuMemAddressFree"),
		opt(&d.cuMemCreate, "cuMemCreate"),
		opt(&d.cuMemRelease, "cuMemRelease"),
		opt(&d.cuMemMap, "cuMemMap"),
		opt(&d.cuMemUnmap, "cuMemUnmap"),
		opt(&d.cuMemSetAccess, "cuMemSetAccess"),
		opt(&d.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
		opt(&d.cuModuleLoadDataEx, "cuModuleLoadDataEx"),
		opt(&d.cuModuleUnload, "cuModuleUnload"),
		opt(&d.cuModuleGetFunction, "cuModuleGetFunction"),
		opt(&d.cuLaunchKernel, "cuLaunchKernel"),
		opt(&d.cuMemAllocAsync, "cuMemAllocAsync"),
		opt(&d.cuMemFreeAsync, "cuMemFreeAsync"),
		opt(&d.cuLaunchKernelEx, "cuLaunchKernelEx"),
		opt(&d.cuStreamBeginCapture, "cuStreamBeginCapture_v2"),
		opt(&d.cuStreamEndCapture, "cuStreamEndCapture"),
		opt(&d.cuStreamIsCapturing, "cuStreamIsCapturing"),
		opt(&d.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags"),
		opt(&d.cuGraphInstantiate, "cuGraphInstantiate_v2"),
		opt(&d.cuGraphLaunch, "cuGraphLaunch"),
		opt(&d.cuGraphExecDestroy, "cuGraphExecDestroy"),
		opt(&d.cuGraphDestroy, "cuGraphDestroy"),
	}
}

// LibraryCandidates returns the paths tried for libcuda, in order. When
// MEMWALL_LIBCUDA is set (through getenv) it is the only candidate.
func LibraryCandidates(getenv func(string) string) []string {
	if getenv != nil {
		if p := getenv("MEMWALL_LIBCUDA"); p != "" {
			return []string{p}
		}
	}
	return []string{
		"libcuda.so.1", // the dynamic linker's search path and ld cache
		"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
		"/usr/lib/aarch64-linux-gnu/libcuda.so.1",
		"/usr/lib64/libcuda.so.1",
		"/usr/local/nvidia/lib64/libcuda.so.1",
		"/usr/local/nvidia/lib/libcuda.so.1",
		"/usr/lib/wsl/lib/libcuda.so.1",
	}
}

// ErrNoDriver is wrapped by Open when no usable libcuda could be loaded.
var ErrNoDriver = errors.New("CUDA driver library not usable")

func loadDriver(candidates []string) (*driver, error) {
	var tried, missing []string
	for _, p := range candidates {
		if strings.ContainsRune(p, '/') {
			if _, err := os.Stat(p); err != nil {
				missing = append(missing, p)
				continue
			}
		}
		lib, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			if strings.Contains(err.Error(), "cannot open shared object file") {
				missing = append(missing, p)
			} else {
				tried = append(tried, fmt.Sprintf("%s: %v", p, err))
			}
			continue
		}
		d := &driver{lib: lib, path: p}
		if err := d.bind(); err != nil {
			_ = purego.Dlclose(lib)
			tried = append(tried, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		return d, nil
	}
	if len(missing) > 0 {
		tried = append(tried, "not found: "+strings.Join(missing, ", "))
	}
	return nil, fmt.Errorf("%w (set MEMWALL_LIBCUDA to its path): %s", ErrNoDriver, strings.Join(tried, "; "))
}

func (d *driver) bind() error {
	var missing []string
	for _, s := range d.table() {
		for _, n := range s.names {
			if p, err := purego.Dlsym(d.lib, n); err == nil && p != 0 {
				*s.dst = p
				break
			}
		}
		if *s.dst == 0 {
			if s.required {
				missing = append(missing, s.names[0])
			} else {
				d.missing = append(d.missing, s.names[0])
			}
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("not a CUDA driver: missing required symbols %s", strings.Join(missing, ", "))
	}
	return nil
}

// raw calls fn without touching the context (for cuInit, cuDeviceGet...).
//
//go:uintptrescapes
func (d *driver) raw(fn uintptr, args ...uintptr) result {
	r, _, _ := purego.SyscallN(fn, args...)
	return result(uint32(r))
}

// result is a CUresult.
type result uint32

// Error is a failed driver call: the function and the CUresult with its name.
type Error struct {
	Func string
	Code int
	Name string
	Desc string
}

func (e *Error) Error() string {
	if e.Desc != "" {
		return fmt.Sprintf("%s: %s (%d): %s", e.Func, e.Name, e.Code, e.Desc)
	}
	return fmt.Sprintf("%s: %s (%d)", e.Func, e.Name, e.Code)
}

// CUresult codes memwall branches on.
const (
	cudaSuccess             = 0
	cudaErrorInvalidValue   = 1
	cudaErrorOutOfMemory    = 2
	cudaErrorNotInitialized = 3
	cudaErrorNoDevice       = 100
	cudaErrorInvalidDevice  = 101
	cudaErrorInvalidImage   = 200
	cudaErrorInvalidContext = 201
	cudaErrorInvalidPTX     = 218
	cudaErrorInvalidHandle  = 400
	cudaErrorNotFound       = 500
	cudaErrorNotReady       = 600
	cudaErrorHostRegistered = 712
	cudaErrorNotSupported   = 801
)

// Is maps CUresults onto the device package's error kinds.
func (e *Error) Is(target error) bool {
	switch target {
	case device.ErrOutOfMemory:
		return e.Code == cudaErrorOutOfMemory
	case device.ErrInvalid:
		return e.Code == cudaErrorInvalidValue || e.Code == cudaErrorInvalidHandle ||
			e.Code == cudaErrorInvalidContext || e.Code == cudaErrorNotFound
	case device.ErrNotReady:
		return e.Code == cudaErrorNotReady
	case device.ErrUnsupported:
		return e.Code == cudaErrorNotSupported
	}
	return false
}

// err turns a CUresult into nil or an *Error naming the code.
func (d *driver) err(fn string, r result) error {
	if r == cudaSuccess {
		return nil
	}
	e := &Error{Func: fn, Code: int(r), Name: fmt.Sprintf("CUDA_ERROR_%d", r)}
	var p *byte
	if d.raw(d.cuGetErrorName, uintptr(r), uintptr(unsafe.Pointer(&p))) == cudaSuccess && p != nil {
		e.Name = cString(p)
	}
	p = nil
	if d.raw(d.cuGetErrorString, uintptr(r), uintptr(unsafe.Pointer(&p))) == cudaSuccess && p != nil {
		e.Desc = cString(p)
	}
	return e
}

// cString copies a NUL-terminated C string owned by the driver.
func cString(p *byte) string {
	var b []byte
	for i := 0; i < 4096; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// ctxCall runs fn with ctx current on the calling OS thread. CUDA binds a
// context per OS thread; locking the goroutine to its thread for the
// duration of set-current plus the call is what makes any goroutine safe to
// call the driver (the primary context may be current on many threads).
//
//go:uintptrescapes
func (d *driver) ctxCall(ctx uintptr, fn uintptr, args ...uintptr) result {
	runtime.LockOSThread()
	purego.SyscallN(d.cuCtxSetCurrent, ctx)
	r, _, _ := purego.SyscallN(fn, args...)
	runtime.UnlockOSThread()
	return result(uint32(r))
}
