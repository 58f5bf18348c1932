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
// pool is measured against, on the request stream w: for each timed pair,
// the allocation and the free apart. With async, the stream-ordered pair
// cuMemAllocAsync/cuMemFreeAsync on one stream (the driver's pool); without,
// cuMemAlloc/cuMemFree. The calls run back to back on one locked OS thread
// with the context made current once, so no binding overhead is added per
// call beyond the foreign call itself.
func (c *Device) DriverAllocTimes(w device.AllocWorkload, async bool) (alloc, free []time.Duration, err error) {
	return c.driverTimes(w, async, true, 1)
}

// DriverPairTimes is DriverAllocTimes timing each pair's free and
// allocation together, with one clock read before and one after (no read
// between the two calls), the way bench measures memwall's pairs.
func (c *Device) DriverPairTimes(w device.AllocWorkload, async bool) ([]time.Duration, error) {
	pairs, _, err := c.driverTimes(w, async, false, 1)
	return pairs, err
}

// DriverBatchTimes times batches of batch pairs back to back with one
// clock read before and one after each batch, the way bench times
// memwall's batches; it returns one duration per whole batch.
func (c *Device) DriverBatchTimes(w device.AllocWorkload, async bool, batch int) ([]time.Duration, error) {
	if batch < 1 {
		return nil, fmt.Errorf("cuda: batch of %d pairs: %w", batch, device.ErrInvalid)
	}
	ts, _, err := c.driverTimes(w, async, false, batch)
	return ts, err
}

// driverTimes runs the workload; with split it returns the timed pairs'
// allocation and free times, without it the times of batches of batch
// pairs (and a nil second slice).
func (c *Device) driverTimes(w device.AllocWorkload, async, split bool, batch int) (alloc, free []time.Duration, err error) {
	if err := w.Check(); err != nil {
		return nil, nil, err
	}
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
	alloc = make([]time.Duration, 0, len(w.Sizes))
	free = make([]time.Duration, 0, len(w.Sizes))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	purego.SyscallN(c.d.cuCtxSetCurrent, c.ctx)
	p := new(uint64)
	allocOne := func(size uint64) (uint64, error) {
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
	freeOne := func(ptr uint64) error {
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
	live := make([]uint64, 0, len(w.Initial))
	defer func() {
		for _, ptr := range live {
			if ferr := freeOne(ptr); ferr != nil && err == nil {
				err = ferr
			}
		}
		if async {
			if serr := c.StreamSynchronize(s); serr != nil && err == nil {
				err = serr
			}
		}
		runtime.KeepAlive(p)
	}()
	for _, size := range w.Initial {
		ptr, err := allocOne(size)
		if err != nil {
			return alloc, free, err
		}
		live = append(live, ptr)
	}
	var t0 time.Time
	for i, size := range w.Sizes {
		timed := i >= w.Warmup
		k := i - w.Warmup // index among the timed pairs
		if timed && k%batch == 0 {
			t0 = time.Now()
		}
		var t1 time.Time
		if len(live) > 0 {
			// Free the victim, then allocate in its slot.
			v := w.Victims[i]
			if err := freeOne(live[v]); err != nil {
				return alloc, free, err
			}
			if split && timed {
				t1 = time.Now()
			}
			ptr, err := allocOne(size)
			if err != nil {
				live = append(live[:v], live[v+1:]...)
				return alloc, free, err
			}
			live[v] = ptr
		} else {
			ptr, err := allocOne(size)
			if err != nil {
				return alloc, free, err
			}
			if split && timed {
				t1 = time.Now()
			}
			if err := freeOne(ptr); err != nil {
				return alloc, free, err
			}
		}
		if !timed || (k+1)%batch != 0 {
			continue
		}
		t2 := time.Now()
		switch {
		case split && len(live) > 0: // free first, then alloc
			free = append(free, t1.Sub(t0))
			alloc = append(alloc, t2.Sub(t1))
		case split:
			alloc = append(alloc, t1.Sub(t0))
			free = append(free, t2.Sub(t1))
		default:
			alloc = append(alloc, t2.Sub(t0))
		}
	}
	return alloc, free, nil
}
