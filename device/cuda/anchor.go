package cuda

import (
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/memwall/memwall/device"
)

// DriverAllocTimes times the driver's own allocator, the anchor memwall's
// pool is measured against: for each size, one allocation and its free,
// timed separately. With async, the stream-ordered pair
// cuMemAllocAsync/cuMemFreeAsync on one stream (the driver's pool); without,
// cuMemAlloc/cuMemFree. The calls run back to back on one locked OS thread
// with the context made current once, so no binding overhead is added per
// call beyond the foreign call itself.
func (c *Device) DriverAllocTimes(sizes []uint64, async bool) (alloc, free []time.Duration, err error) {
	return c.driverTimes(sizes, async, true, 1)
}

// DriverPairTimes is DriverAllocTimes timing each allocation and its free
// together, with one clock read before and one after (no read between the
// two calls), the way bench measures memwall's pairs.
func (c *Device) DriverPairTimes(sizes []uint64, async bool) ([]time.Duration, error) {
	pairs, _, err := c.driverTimes(sizes, async, false, 1)
	return pairs, err
}

// DriverBatchTimes times batches of batch pairs (allocation then free, back
// to back) with one clock read before and one after each batch, the way
// bench times memwall's batches; it returns one duration per whole batch.
func (c *Device) DriverBatchTimes(sizes []uint64, async bool, batch int) ([]time.Duration, error) {
	if batch < 1 {
		return nil, fmt.Errorf("cuda: batch of %d pairs: %w", batch, device.ErrInvalid)
	}
	ts, _, err := c.driverTimes(sizes, async, false, batch)
	return ts, err
}

// driverTimes runs the loop; with split it returns alloc and free times,
// without it the times of batches of batch pairs (and a nil second slice).
func (c *Device) driverTimes(sizes []uint64, async, split bool, batch int) (alloc, free []time.Duration, err error) {
	if async && !c.info.MemoryPools {
		return nil, nil, fmt.Errorf("cuda: cuMemAllocAsync: %w", device.ErrUnsupported)
	}
	var s device.Stream
	if async {
		if s, err = c.NewStream(); err != nil {
			return nil, nil, err
		}
		defer c.DestroyStream(s)
	}
	alloc = make([]time.Duration, 0, len(sizes))
	free = make([]time.Duration, 0, len(sizes))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	purego.SyscallN(c.d.cuCtxSetCurrent, c.ctx)
	p := new(uint64)
	var t0 time.Time
	for i, size := range sizes {
		var r uintptr
		if i%batch == 0 {
			t0 = time.Now()
		}
		if async {
			r, _, _ = purego.SyscallN(c.d.cuMemAllocAsync, uintptr(unsafe.Pointer(p)), uintptr(size), uintptr(s))
		} else {
			r, _, _ = purego.SyscallN(c.d.cuMemAlloc, uintptr(unsafe.Pointer(p)), uintptr(size))
		}
		var t1 time.Time
		if split {
			t1 = time.Now()
		}
		if r != 0 {
			return alloc, free, fmt.Errorf("cuda: driver alloc of %d bytes: %w", size, c.d.err("alloc", result(r)))
		}
		if async {
			r, _, _ = purego.SyscallN(c.d.cuMemFreeAsync, uintptr(*p), uintptr(s))
		} else {
			r, _, _ = purego.SyscallN(c.d.cuMemFree, uintptr(*p))
		}
		if r != 0 {
			return alloc, free, fmt.Errorf("cuda: driver free: %w", c.d.err("free", result(r)))
		}
		if (i+1)%batch != 0 {
			continue
		}
		t2 := time.Now()
		if split {
			alloc = append(alloc, t1.Sub(t0))
			free = append(free, t2.Sub(t1))
		} else {
			alloc = append(alloc, t2.Sub(t0))
		}
	}
	if async {
		err = c.StreamSynchronize(s)
	}
	runtime.KeepAlive(p)
	return alloc, free, err
}
