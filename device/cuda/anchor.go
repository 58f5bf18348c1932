package cuda

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/memwall/memwall/device"
)

// DriverAllocator opens the driver's own allocator, the anchor memwall's
// pool is measured against, for the calling goroutine: with async the
// stream-ordered pair cuMemAllocAsync/cuMemFreeAsync on a stream of its own
// (the driver's pool; ErrUnsupported without memory pools), without it
// cuMemAlloc/cuMemFree. The goroutine is locked to its OS thread with the
// context made current once, so alloc and free add no binding work per call
// beyond the foreign call itself; they may be called only from this
// goroutine until release, which waits for the stream, destroys it and
// unlocks the thread. Blocks still allocated are the caller's to free
// before release. Handles are device pointers.
func (c *Device) DriverAllocator(async bool) (alloc func(size uint64) (uint64, error), free func(ptr uint64) error, release func() error, err error) {
	if async && !c.info.MemoryPools {
		return nil, nil, nil, fmt.Errorf("cuda: cuMemAllocAsync: %w", device.ErrUnsupported)
	}
	var s device.Stream
	if async {
		if s, err = c.NewStream(); err != nil {
			return nil, nil, nil, err
		}
	}
	runtime.LockOSThread()
	purego.SyscallN(c.d.cuCtxSetCurrent, c.ctx)
	p := new(uint64)
	alloc = func(size uint64) (uint64, error) {
		var r uintptr
		if async {
			r, _, _ = purego.SyscallN(c.d.cuMemAllocAsync, uintptr(unsafe.Pointer(p)), uintptr(size), uintptr(s))
		} else {
			r, _, _ = purego.SyscallN(c.d.cuMemAlloc, uintptr(unsafe.Pointer(p)), uintptr(size))
		}
		if r != 0 {
			return 0, fmt.Errorf("cuda: driver alloc of %d bytes: %w", size, c.d.err("alloc", result(r)))
		}
		return *p, nil
	}
	free = func(ptr uint64) error {
		var r uintptr
		if async {
			r, _, _ = purego.SyscallN(c.d.cuMemFreeAsync, uintptr(ptr), uintptr(s))
		} else {
			r, _, _ = purego.SyscallN(c.d.cuMemFree, uintptr(ptr))
		}
		if r != 0 {
			return fmt.Errorf("cuda: driver free: %w", c.d.err("free", result(r)))
		}
		return nil
	}
	release = func() error {
		defer runtime.UnlockOSThread()
		runtime.KeepAlive(p)
		if !async {
			return nil
		}
		err := c.StreamSynchronize(s)
		if derr := c.DestroyStream(s); derr != nil && err == nil {
			err = derr
		}
		return err
	}
	return alloc, free, release, nil
}
