package pool

import "github.com/memwall/memwall/device"

// PriorityAllocator is the optional device interface for memory
// priorities (Vulkan's VK_EXT_memory_priority): under memory pressure the
// driver keeps allocations of higher priority resident first. A device
// without it, or without priority support in its driver, allocates every
// chunk at its default.
type PriorityAllocator interface {
	// AllocPriority allocates like Alloc at a priority in [0, 1].
	AllocPriority(size uint64, priority float32) (device.Ptr, error)
}

// PurposePriority is the memory priority for a pool that holds blocks of
// one purpose, the seed's mapping: weights 1.0 (they are reread by every
// step and are the costliest to page back), everything else 0.5 (the
// Vulkan default). Options.Priority takes it.
func PurposePriority(p Purpose) float32 {
	if p == Weights {
		return 1
	}
	return 0.5
}

// devAlloc obtains a chunk of device memory: at priority when it is set
// and the device implements PriorityAllocator, else by Alloc.
func (p *Pool) devAlloc(size uint64, priority float32) (device.Ptr, error) {
	if priority > 0 {
		if pa, ok := p.up.(PriorityAllocator); ok {
			return pa.AllocPriority(size, priority)
		}
	}
	return p.up.Alloc(size)
}
