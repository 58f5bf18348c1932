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

// Launch runs f with the given arguments, each passed by value.
func (c *Device) Launch(f device.Function, grid, block device.Dim3, sharedBytes uint32, s device.Stream, args ...any) error {
	if err := c.kernelsOK("launch"); err != nil {
		return err
	}
	hs, err := c.stream(s)
	if err != nil {
		return err
	}
	// Each argument lives in its own 8-byte slot of one pinned array; the
	// parameter array points at the slots.
	slots := make([]uint64, len(args)+1)
	params := make([]unsafe.Pointer, len(args)+1)
	for i, a := range args {
		p := unsafe.Pointer(&slots[i])
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
			return fmt.Errorf("cuda: launch: argument %d has unsupported type %T: %w", i, a, device.ErrInvalid)
		}
		params[i] = p
	}
	var pin runtime.Pinner
	pin.Pin(&slots[0])
	pin.Pin(&params[0])
	defer pin.Unpin()
	var pp uintptr
	if len(args) > 0 {
		pp = uintptr(unsafe.Pointer(&params[0]))
	}
	return c.call("cuLaunchKernel", c.d.cuLaunchKernel, uintptr(f),
		uintptr(grid.X), uintptr(grid.Y), uintptr(grid.Z),
		uintptr(block.X), uintptr(block.Y), uintptr(block.Z),
		uintptr(sharedBytes), hs, pp, 0)
}
