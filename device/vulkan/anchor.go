package vulkan

import (
	"fmt"
	"time"

	"github.com/ebitengine/purego"

	"github.com/memwall/memwall/device"
)

// AnchorAlloc is the allocator memwall's pool is measured against on
// Vulkan: vkAllocateMemory/vkFreeMemory of device-local memory, each block
// its own VkDeviceMemory (what an engine without a suballocator does; VMA
// exists to avoid it).
const AnchorAlloc = "vkAllocateMemory"

// AnchorName names the driver allocator DriverAllocTimes times: Vulkan has
// no stream-ordered allocator, so async has none ("").
func (d *Device) AnchorName(async bool) string {
	if async {
		return ""
	}
	return AnchorAlloc
}

// DriverAllocTimes times vkAllocateMemory and vkFreeMemory on the request
// stream w: for each timed pair, the allocation and the free apart. The
// calls run back to back through one prepared allocate-info, so no binding
// overhead is added per call beyond the foreign call itself. async fails
// with ErrUnsupported.
func (d *Device) DriverAllocTimes(w device.AllocWorkload, async bool) (alloc, free []time.Duration, err error) {
	return d.driverTimes(w, async, true, 1)
}

// DriverPairTimes is DriverAllocTimes timing each pair's free and
// allocation together, the way bench measures memwall's pairs.
func (d *Device) DriverPairTimes(w device.AllocWorkload, async bool) ([]time.Duration, error) {
	pairs, _, err := d.driverTimes(w, async, false, 1)
	return pairs, err
}

// DriverBatchTimes times batches of batch pairs back to back with one
// clock read before and one after each batch.
func (d *Device) DriverBatchTimes(w device.AllocWorkload, async bool, batch int) ([]time.Duration, error) {
	if batch < 1 {
		return nil, fmt.Errorf("vulkan: batch of %d pairs: %w", batch, device.ErrInvalid)
	}
	ts, _, err := d.driverTimes(w, async, false, batch)
	return ts, err
}

func (d *Device) driverTimes(w device.AllocWorkload, async, split bool, batch int) (alloc, free []time.Duration, err error) {
	if err := w.Check(); err != nil {
		return nil, nil, err
	}
	if async {
		return nil, nil, fmt.Errorf("vulkan: no stream-ordered allocator: %w", device.ErrUnsupported)
	}
	alloc = make([]time.Duration, 0, len(w.Sizes))
	free = make([]time.Duration, 0, len(w.Sizes))
	var pn pinned
	defer pn.release()
	ai := &memoryAllocateInfo{sType: stMemoryAllocateInfo, typeIdx: d.deviceType}
	if d.hasBDA {
		ai.pNext = ref(&pn, &memoryAllocateFlagsInfo{sType: stMemoryAllocateFlagsInfo, flags: memoryAllocateDeviceAddress})
	}
	mem := new(uint64)
	allocFn, freeFn := d.vk.allocateMemory, d.vk.freeMemory
	aip, memp := ref(&pn, ai), ref(&pn, mem) // pinned: the loop below calls other functions between uses
	allocOne := func(size uint64) (uint64, error) {
		ai.size = (size + 255) &^ 255
		r, _, _ := purego.SyscallN(allocFn, d.dev, aip, 0, memp)
		if err := check("vkAllocateMemory", vkResult(int32(uint32(r)))); err != nil {
			return 0, fmt.Errorf("vulkan: driver alloc of %d bytes: %w", size, err)
		}
		return *mem, nil
	}
	freeOne := func(m uint64) {
		purego.SyscallN(freeFn, d.dev, uintptr(m), 0)
	}
	live := make([]uint64, 0, len(w.Initial))
	defer func() {
		for _, m := range live {
			freeOne(m)
		}
	}()
	for _, size := range w.Initial {
		m, err := allocOne(size)
		if err != nil {
			return alloc, free, err
		}
		live = append(live, m)
	}
	var t0 time.Time
	for i, size := range w.Sizes {
		timed := i >= w.Warmup
		k := i - w.Warmup
		if timed && k%batch == 0 {
			t0 = time.Now()
		}
		var t1 time.Time
		if len(live) > 0 {
			v := w.Victims[i]
			freeOne(live[v])
			if split && timed {
				t1 = time.Now()
			}
			m, err := allocOne(size)
			if err != nil {
				live = append(live[:v], live[v+1:]...)
				return alloc, free, err
			}
			live[v] = m
		} else {
			m, err := allocOne(size)
			if err != nil {
				return alloc, free, err
			}
			if split && timed {
				t1 = time.Now()
			}
			freeOne(m)
		}
		if !timed || (k+1)%batch != 0 {
			continue
		}
		t2 := time.Now()
		switch {
		case split && len(live) > 0:
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
