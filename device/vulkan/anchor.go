package vulkan

import (
	"fmt"

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

// DriverAllocator opens vkAllocateMemory/vkFreeMemory of device-local
// memory, the anchor memwall's pool is measured against on Vulkan: alloc
// and free go through one prepared allocate-info, so no binding work is
// added per call beyond the foreign call itself. Handles are VkDeviceMemory
// (each size rounded up to 256 bytes). async fails with ErrUnsupported.
// alloc and free may be called only from the calling goroutine until
// release, which unpins the allocate-info and frees nothing: blocks still
// allocated are the caller's to free first.
func (d *Device) DriverAllocator(async bool) (alloc func(size uint64) (uint64, error), free func(mem uint64) error, release func() error, err error) {
	if async {
		return nil, nil, nil, fmt.Errorf("vulkan: no stream-ordered allocator: %w", device.ErrUnsupported)
	}
	pn := new(pinned)
	ai := &memoryAllocateInfo{sType: stMemoryAllocateInfo, typeIdx: d.deviceType}
	if d.hasBDA {
		ai.pNext = ref(pn, &memoryAllocateFlagsInfo{sType: stMemoryAllocateFlagsInfo, flags: memoryAllocateDeviceAddress})
	}
	mem := new(uint64)
	allocFn, freeFn := d.vk.allocateMemory, d.vk.freeMemory
	aip, memp := ref(pn, ai), ref(pn, mem) // pinned: the caller runs other code between calls
	alloc = func(size uint64) (uint64, error) {
		ai.size = (size + 255) &^ 255
		r, _, _ := purego.SyscallN(allocFn, d.dev, aip, 0, memp)
		if err := check("vkAllocateMemory", vkResult(int32(uint32(r)))); err != nil {
			return 0, fmt.Errorf("vulkan: driver alloc of %d bytes: %w", size, err)
		}
		return *mem, nil
	}
	free = func(m uint64) error {
		purego.SyscallN(freeFn, d.dev, uintptr(m), 0)
		return nil
	}
	release = func() error {
		pn.release()
		return nil
	}
	return alloc, free, release, nil
}
