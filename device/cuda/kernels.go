package cuda

import (
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/memwall/memwall/device"
)

func (c *Device) kernelsOK(op string) error {
	if c.d.cuModuleLoadDataEx == 0 || c.d.cuModuleGetFunction == 0 || c.d.cuLaunchKernel == 0 {
		return fmt.Errorf("cuda: %s: kernels: %w", op, device.ErrUnsupported)
	}
	return nil
}

// LoadModule JIT-compiles PTX text (or loads a cubin) and returns the
// module. A compile failure includes the driver's error log.
func (c *Device) LoadModule(ptx []byte) (device.Module, error) {
	if err := c.kernelsOK("load module"); err != nil {
		return 0, err
	}
	img := make([]byte, len(ptx)+1) // NUL-terminated copy
	copy(img, ptx)
	logBuf := make([]byte, 8192)
	opts := []int32{5 /* CU_JIT_ERROR_LOG_BUFFER */, 6 /* CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES */}
	vals := []uintptr{uintptr(unsafe.Pointer(&logBuf[0])), uintptr(len(logBuf))}
	var pin runtime.Pinner
	pin.Pin(&logBuf[0])
	defer pin.Unpin()
	var m uintptr
	err := c.call("cuModuleLoadDataEx", c.d.cuModuleLoadDataEx, uintptr(unsafe.Pointer(&m)),
		uintptr(unsafe.Pointer(&img[0])), uintptr(len(opts)), uintptr(unsafe.Pointer(&opts[0])), uintptr(unsafe.Pointer(&vals[0])))
	if err != nil {
		if log := strings.TrimSpace(cString(&logBuf[0])); log != "" {
			return 0, fmt.Errorf("cuda: load module: %w: %s", err, log)
		}
		return 0, fmt.Errorf("cuda: load module: %w", err)
	}
	return device.Module(m), nil
}

// UnloadModule unloads m.
func (c *Device) UnloadModule(m device.Module) error {
	if err := c.kernelsOK("unload module"); err != nil {
		return err
	}
	return c.call("cuModuleUnload", c.d.cuModuleUnload, uintptr(m))
}

// Function looks up a kernel by name.
func (c *Device) Function(m device.Module, name string) (device.Function, error) {
	if err := c.kernelsOK("function"); err != nil {
		return 0, err
	}
	cname := append([]byte(name), 0)
	var f uintptr
	if err := c.call("cuModuleGetFunction", c.d.cuModuleGetFunction, uintptr(unsafe.Pointer(&f)), uintptr(m), uintptr(unsafe.Pointer(&cname[0]))); err != nil {
		return 0, fmt.Errorf("cuda: kernel %q: %w", name, err)
	}
	return device.Function(f), nil
}

// kernelParams holds a launch's arguments: each in its own 8-byte slot of
// one array, and the parameter array of pointers to the slots. Both must
// stay pinned for the driver call (pin).
type kernelParams struct {
	slots  []uint64
	params []unsafe.Pointer
}

func packParams(args []any) (*kernelParams, error) {
	k := &kernelParams{slots: make([]uint64, len(args)+1), params: make([]unsafe.Pointer, len(args)+1)}
	for i, a := range args {
		p := unsafe.Pointer(&k.slots[i])
		switch v := a.(type) {
		case device.Ptr:
			*(*uint64)(p) = uint64(v)
		case uint64:
			*(*uint64)(p) = v
		case int64:
			*(*int64)(p) = v
		case uint32:
			*(*uint32)(p) = v
		case int32:
			*(*int32)(p) = v
		case int:
			*(*int32)(p) = int32(v)
		case float32:
			*(*float32)(p) = v
		case float64:
			*(*float64)(p) = v
		default:
			return nil, fmt.Errorf("cuda: launch: argument %d has unsupported type %T: %w", i, a, device.ErrInvalid)
		}
		k.params[i] = p
	}
	return k, nil
}

// pin pins the slots and the parameter array and returns the driver's
// kernelParams argument (0 for no arguments).
func (k *kernelParams) pin(pin *runtime.Pinner) uintptr {
	pin.Pin(&k.slots[0])
	pin.Pin(&k.params[0])
	if len(k.params) == 1 {
		return 0
	}
	return uintptr(unsafe.Pointer(&k.params[0]))
}

// launchArgs resolves s and packs args for a launch.
func (c *Device) launchArgs(s device.Stream, args []any) (uintptr, *kernelParams, error) {
	hs, err := c.stream(s)
	if err != nil {
		return 0, nil, err
	}
	kp, err := packParams(args)
	return hs, kp, err
}

// Launch runs f with the given arguments, each passed by value.
func (c *Device) Launch(f device.Function, grid, block device.Dim3, sharedBytes uint32, s device.Stream, args ...any) error {
	if err := c.kernelsOK("launch"); err != nil {
		return err
	}
	hs, kp, err := c.launchArgs(s, args)
	if err != nil {
		return err
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	pp := kp.pin(&pin)
	return c.call("cuLaunchKernel", c.d.cuLaunchKernel, uintptr(f),
		uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z),
		uintptr(block.X), uintptr(block.Y), uintptr(block.Z),
		uintptr(sharedBytes), hs, pp, 0)
}

// launchConfig is CUlaunchConfig (cuda.h, CUDA 12): seven unsigned ints,
// padding to the 8-byte CUstream, the attribute array and its length.
type launchConfig struct {
	gridX, gridY, gridZ    uint32
	blockX, blockY, blockZ uint32
	sharedBytes            uint32
	_                      uint32
	stream                 uintptr
	attrs                  uintptr // *launchAttribute
	numAttrs               uint32
	_                      uint32
}

// launchAttribute is CUlaunchAttribute: a CUlaunchAttributeID (a 4-byte
// enum), padding to 8 bytes, and the 64-byte CUlaunchAttributeValue union,
// whose programmaticStreamSerializationAllowed member is an int at offset 0.
type launchAttribute struct {
	id    uint32
	_     uint32
	value [64]byte
}

// cuLaunchAttributeProgrammaticStreamSerialization is
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION.
const cuLaunchAttributeProgrammaticStreamSerialization = 6

// CanOverlap reports whether LaunchOverlapped works: the driver exports
// cuLaunchKernelEx (CUDA 12.0 and newer) and the GPU has compute capability
// 9.0 or newer (programmatic dependent launch).
func (c *Device) CanOverlap() bool {
	return c.kernelsOK("launch") == nil && c.d.cuLaunchKernelEx != 0 && c.info.ComputeMajor >= 9
}

// LaunchOverlapped is Launch through cuLaunchKernelEx with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION set: f's blocks may
// be scheduled before the previous kernel on s has completed, once every
// block of that kernel has executed griddepcontrol.launch_dependents (or
// exited). f must execute griddepcontrol.wait before it touches memory
// that kernel writes or reads (see device.OverlapLauncher for the full
// contract, and why an operation other than a kernel just before f keeps
// plain stream order). It fails with device.ErrUnsupported before queuing
// anything when CanOverlap is false.
func (c *Device) LaunchOverlapped(f device.Function, grid, block device.Dim3, sharedBytes uint32, s device.Stream, args ...any) error {
	if !c.CanOverlap() {
		return fmt.Errorf("cuda: overlapped launch: needs cuLaunchKernelEx (CUDA 12) and compute capability 9.0, have %d.%d: %w",
			c.info.ComputeMajor, c.info.ComputeMinor, device.ErrUnsupported)
	}
	hs, kp, err := c.launchArgs(s, args)
	if err != nil {
		return err
	}
	attr := &launchAttribute{id: cuLaunchAttributeProgrammaticStreamSerialization}
	*(*int32)(unsafe.Pointer(&attr.value[0])) = 1
	cfg := &launchConfig{gridX: grid.X, gridY: grid.Y, gridZ: grid.Z, blockX: block.X, blockY: block.Y, blockZ: block.Z,
		sharedBytes: sharedBytes, stream: hs, attrs: uintptr(unsafe.Pointer(attr)), numAttrs: 1}
	var pin runtime.Pinner
	defer pin.Unpin()
	pp := kp.pin(&pin)
	pin.Pin(attr)
	pin.Pin(cfg)
	return c.call("cuLaunchKernelEx", c.d.cuLaunchKernelEx, uintptr(unsafe.Pointer(cfg)), uintptr(f), pp, 0)
}
