package vulkan

import "unsafe"

// StructSizes reports the sizes of the hand-laid-out structures by their C
// names, for TestStructSizes.
func StructSizes() map[string]uintptr {
	return map[string]uintptr{
		"VkApplicationInfo": unsafe.Sizeof(applicationInfo{}), "VkInstanceCreateInfo": unsafe.Sizeof(instanceCreateInfo{}),
		"VkDeviceQueueCreateInfo": unsafe.Sizeof(deviceQueueCreateInfo{}), "VkDeviceCreateInfo": unsafe.Sizeof(deviceCreateInfo{}),
		"VkPhysicalDeviceProperties": unsafe.Sizeof(physicalDeviceProperties{}), "VkPhysicalDeviceProperties2": unsafe.Sizeof(physicalDeviceProperties2{}),
		"VkPhysicalDeviceVulkan11Properties": unsafe.Sizeof(physicalDeviceVulkan11Properties{}),
		"VkPhysicalDeviceDriverProperties":   unsafe.Sizeof(physicalDeviceDriverProperties{}),
		"VkPhysicalDeviceFeatures":           unsafe.Sizeof(physicalDeviceFeatures{}), "VkPhysicalDeviceFeatures2": unsafe.Sizeof(physicalDeviceFeatures2{}),
		"VkPhysicalDeviceVulkan12Features": unsafe.Sizeof(physicalDeviceVulkan12Features{}),
		"VkPhysicalDeviceMemoryProperties": unsafe.Sizeof(physicalDeviceMemoryProperties{}), "VkPhysicalDeviceMemoryProperties2": unsafe.Sizeof(physicalDeviceMemoryProperties2{}),
		"VkPhysicalDeviceMemoryBudgetPropertiesEXT": unsafe.Sizeof(physicalDeviceMemoryBudget{}),
		"VkQueueFamilyProperties":                   unsafe.Sizeof(queueFamilyProperties{}), "VkExtensionProperties": unsafe.Sizeof(extensionProperties{}),
		"VkMemoryAllocateInfo": unsafe.Sizeof(memoryAllocateInfo{}), "VkBufferCreateInfo": unsafe.Sizeof(bufferCreateInfo{}),
		"VkMemoryRequirements": unsafe.Sizeof(memoryRequirements{}), "VkSubmitInfo": unsafe.Sizeof(submitInfo{}),
		"VkTimelineSemaphoreSubmitInfo": unsafe.Sizeof(timelineSemaphoreSubmitInfo{}), "VkSemaphoreWaitInfo": unsafe.Sizeof(semaphoreWaitInfo{}),
		"VkBufferCopy": unsafe.Sizeof(bufferCopy{}), "VkComputePipelineCreateInfo": unsafe.Sizeof(computePipelineCreateInfo{}),
		"VkPipelineShaderStageCreateInfo": unsafe.Sizeof(pipelineShaderStageCreateInfo{}), "VkSpecializationInfo": unsafe.Sizeof(specializationInfo{}),
		"VkSpecializationMapEntry": unsafe.Sizeof(specializationMapEntry{}), "VkPipelineLayoutCreateInfo": unsafe.Sizeof(pipelineLayoutCreateInfo{}),
		"VkImportMemoryHostPointerInfoEXT": unsafe.Sizeof(importMemoryHostPointerInfo{}), "VkMemoryBarrier": unsafe.Sizeof(memoryBarrier{}),
		"VkSparseMemoryBind": unsafe.Sizeof(sparseMemoryBind{}), "VkBindSparseInfo": unsafe.Sizeof(bindSparseInfo{}),
		"VkCommandBufferAllocateInfo": unsafe.Sizeof(commandBufferAllocateInfo{}), "VkQueryPoolCreateInfo": unsafe.Sizeof(queryPoolCreateInfo{}),
	}
}

// PickFamilies exposes pickFamilies on (flags, count, timestamp bits)
// triples, for TestPickFamilies.
func PickFamilies(fams [][3]uint32) (compute, transfer int) {
	qs := make([]queueFamilyProperties, len(fams))
	for i, f := range fams {
		qs[i] = queueFamilyProperties{flags: f[0], count: f[1], timestampBits: f[2]}
	}
	return pickFamilies(qs)
}

// OpenUnpinned opens like Open but leaves the driver to the loader's
// unloading, for TestReopen's account of what the pin prevents.
func OpenUnpinned(o Options) (*Device, error) {
	o.unpinned = true
	return Open(o)
}

// OpenCopyFamily opens with copies on queue family f, for the transfer
// candidates.
func OpenCopyFamily(o Options, f int) (*Device, error) {
	o.copyFamily = f + 1
	return Open(o)
}

// ShaderCopy reports whether CopyDtoD can run as a shader on d.
func ShaderCopy(d *Device) bool { return d.copyKernel() != nil }

// SplitCopies counts the copies d split over several copy queues.
func SplitCopies(d *Device) uint64 { return d.splits.Load() }

// Pinned is how many shared objects d's Open kept loaded.
func Pinned(d *Device) int { return d.pinned }

// SetSplitMin sets the smallest copy d splits over its copy queues, so
// that tests split small copies too.
func SetSplitMin(d *Device, n uint64) { d.splitMin = n }
