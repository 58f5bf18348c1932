package cuda

import (
	"fmt"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The context's own memory is measured with NVML, which reads a device's
// free memory without a CUDA context (cuMemGetInfo needs one): free bytes
// just before the primary context is retained, and again just after. NVML
// is the library nvidia-smi reads, so the figure is in the same terms as
// nvidia-smi's memory.used. The measurement is skipped, with the reason,
// when NVML is missing, when the primary context was already active in this
// process (it then costs nothing more), or when the free memory did not
// drop (another process freed memory meanwhile). Other processes allocating
// in the same instant make it too large; that is the known error.

// contextMemory is the measurement, kept on the Device.
type contextMemory struct {
	bytes uint64
	how   string
	ok    bool
	after uint64 // cuMemGetInfo's free bytes just after the context was created (ok only)
}

// nvml is the part of NVML the measurement uses.
type nvml struct {
	lib                          uintptr
	init, shutdown, byUUID, info uintptr
}

func nvmlCandidates() []string {
	return []string{
		"libnvidia-ml.so.1",
		"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
		"/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
		"/usr/lib64/libnvidia-ml.so.1",
		"/usr/local/nvidia/lib64/libnvidia-ml.so.1",
		"/usr/lib/wsl/lib/libnvidia-ml.so.1",
	}
}

// openNVML loads and initializes NVML, or says why it could not.
func openNVML() (*nvml, error) {
	var lastErr error
	for _, p := range nvmlCandidates() {
		lib, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			lastErr = err
			continue
		}
		n := &nvml{lib: lib}
		for _, s := range []struct {
			dst  *uintptr
			name string
		}{{&n.init, "nvmlInit_v2"}, {&n.shutdown, "nvmlShutdown"}, {&n.byUUID, "nvmlDeviceGetHandleByUUID"}, {&n.info, "nvmlDeviceGetMemoryInfo"}} {
			if *s.dst, err = purego.Dlsym(lib, s.name); err != nil || *s.dst == 0 {
				_ = purego.Dlclose(lib)
				return nil, fmt.Errorf("%s lacks %s", p, s.name)
			}
		}
		if r, _, _ := purego.SyscallN(n.init); uint32(r) != 0 {
			_ = purego.Dlclose(lib)
			return nil, fmt.Errorf("nvmlInit_v2: NVML error %d", uint32(r))
		}
		return n, nil
	}
	return nil, fmt.Errorf("NVML not found: %v", lastErr)
}

func (n *nvml) close() {
	purego.SyscallN(n.shutdown)
	_ = purego.Dlclose(n.lib)
}

// free returns the free memory of the device with this UUID
// ("GPU-xxxxxxxx-...", as Info.UUID writes it).
//
//go:uintptrescapes
func (n *nvml) free(uuid string) (uint64, error) {
	cs := append([]byte(uuid), 0)
	var h uintptr
	if r, _, _ := purego.SyscallN(n.byUUID, uintptr(unsafe.Pointer(&cs[0])), uintptr(unsafe.Pointer(&h))); uint32(r) != 0 {
		return 0, fmt.Errorf("nvmlDeviceGetHandleByUUID(%s): NVML error %d", uuid, uint32(r))
	}
	var mem struct{ total, free, used uint64 }
	if r, _, _ := purego.SyscallN(n.info, h, uintptr(unsafe.Pointer(&mem))); uint32(r) != 0 {
		return 0, fmt.Errorf("nvmlDeviceGetMemoryInfo: NVML error %d", uint32(r))
	}
	return mem.free, nil
}

// deviceUUID reads a device's UUID without a context, or "".
func (d *driver) deviceUUID(dev int32) string {
	if d.cuDeviceGetUuid == 0 {
		return ""
	}
	var u [16]byte
	if d.raw(d.cuDeviceGetUuid, uintptr(unsafe.Pointer(&u[0])), uintptr(dev)) != cudaSuccess {
		return ""
	}
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// primaryActive reports whether dev's primary context is already active
// in this process (false when the driver cannot say).
func (d *driver) primaryActive(dev int32) bool {
	fn, err := purego.Dlsym(d.lib, "cuDevicePrimaryCtxGetState")
	if err != nil || fn == 0 {
		return false
	}
	var flags uint32
	var active int32
	if d.raw(fn, uintptr(dev), uintptr(unsafe.Pointer(&flags)), uintptr(unsafe.Pointer(&active))) != cudaSuccess {
		return false
	}
	return active != 0
}

// measureContext retains the primary context with retain and measures the
// device memory it took.
func (d *driver) measureContext(dev int32, retain func() (uintptr, error)) (contextMemory, error) {
	uuid := d.deviceUUID(dev)
	var cm contextMemory
	var n *nvml
	var before uint64
	var err error
	switch {
	case uuid == "":
		cm.how = "unknown: the driver gave no device UUID to find the device in NVML"
	case d.primaryActive(dev):
		cm.how = "unknown: the primary context was already active in this process"
	default:
		if n, err = openNVML(); err != nil {
			cm.how = "unknown: " + err.Error()
		} else if before, err = n.free(uuid); err != nil {
			cm.how = "unknown: " + err.Error()
			n.close()
			n = nil
		}
	}
	ctx, err := retain()
	if err != nil {
		if n != nil {
			n.close()
		}
		return cm, err
	}
	if n == nil {
		return cm, nil
	}
	defer n.close()
	after, err := n.free(uuid)
	// The driver's own view right after, for FreeAfterContext: later
	// figures come from cuMemGetInfo, which may count free memory a little
	// differently from NVML.
	var cuFree, cuTotal uint64
	if r := d.ctxCall(ctx, d.cuMemGetInfo, uintptr(unsafe.Pointer(&cuFree)), uintptr(unsafe.Pointer(&cuTotal))); r != cudaSuccess {
		cuFree = 0
	}
	switch {
	case err != nil:
		cm.how = "unknown: " + err.Error()
	case after >= before:
		cm.how = fmt.Sprintf("unknown: free memory did not drop while the context was created (%d → %d bytes)", before, after)
	default:
		cm = contextMemory{bytes: before - after, ok: true, after: cuFree,
			how: "measured: NVML free memory before and after the primary context was created"}
	}
	return cm, nil
}

// ContextBytes returns the device memory the primary context took when
// Open created it (device.ContextMemory).
func (c *Device) ContextBytes() (uint64, string, bool) {
	return c.ctxMem.bytes, c.ctxMem.how, c.ctxMem.ok
}

// FreeAfterContext returns the device's free memory (as cuMemGetInfo,
// and so MemInfo, reports it) just after Open created the primary context, when the context's memory
// was measured: the free memory now, subtracted from it, is what the
// process (and any other) took since, modules and libraries included.
func (c *Device) FreeAfterContext() (uint64, bool) {
	return c.ctxMem.after, c.ctxMem.after != 0
}
