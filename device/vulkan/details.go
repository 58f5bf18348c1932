package vulkan

import (
	"strings"
	"unsafe"
)

// Heap is one memory heap of the device.
type Heap struct {
	Index       int    `json:"index"`
	SizeBytes   uint64 `json:"size_bytes"`
	DeviceLocal bool   `json:"device_local"`
	// BudgetBytes and UsageBytes come from VK_EXT_memory_budget (0 without).
	BudgetBytes uint64 `json:"budget_bytes,omitempty"`
	UsageBytes  uint64 `json:"usage_bytes,omitempty"`
}

// MemoryType is one memory type; Use says what memwall allocates from it.
type MemoryType struct {
	Index int      `json:"index"`
	Heap  int      `json:"heap"`
	Flags []string `json:"flags"`
	Use   string   `json:"use,omitempty"` // "device", "host" or both
}

// QueueFamily is one queue family; Use says what memwall submits to it.
type QueueFamily struct {
	Index         int      `json:"index"`
	Flags         []string `json:"flags"`
	Queues        int      `json:"queues"`
	Taken         int      `json:"taken"`
	TimestampBits int      `json:"timestamp_bits"`
	Use           string   `json:"use,omitempty"` // "compute", "transfer" or both
}

// Details is what `memwall info --device vulkan` shows beyond device.Info.
type Details struct {
	Loader string `json:"loader"`
	// Driver is the shared object that holds the driver's commands (""
	// when it could not be found). Open keeps the driver's libraries
	// loaded for the rest of the process (see Open).
	Driver     string        `json:"driver,omitempty"`
	APIVersion string        `json:"api_version"`
	DeviceType string        `json:"device_type"`
	Heaps      []Heap        `json:"heaps"`
	Types      []MemoryType  `json:"memory_types"`
	Queues     []QueueFamily `json:"queue_families"`
	// Features memwall uses, each on or off (the reasons are in Info.Disabled).
	MemoryBudget        bool `json:"memory_budget"`
	MemoryPriority      bool `json:"memory_priority"`
	ExternalMemoryHost  bool `json:"external_memory_host"`
	BufferDeviceAddress bool `json:"buffer_device_address"`
}

func flagNames(v uint32, names []string) []string {
	var out []string
	for i, n := range names {
		if v&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

var (
	memFlagNames   = []string{"device_local", "host_visible", "host_coherent", "host_cached", "lazily_allocated", "protected", "device_coherent_amd", "device_uncached_amd"}
	queueFlagNames = []string{"graphics", "compute", "transfer", "sparse_binding", "protected", "video_decode", "video_encode", "optical_flow"}
	deviceTypes    = []string{"other", "integrated", "discrete", "virtual", "cpu"}
)

// Details reports the device's heaps (with the budget now), memory types
// and queue families, and the optional features in use.
func (d *Device) Details() Details {
	p := d.picked
	out := Details{Loader: d.vk.path, Driver: d.driverLib, APIVersion: versionString(p.props.apiVersion), DeviceType: "other",
		MemoryBudget: d.hasBudget, MemoryPriority: d.hasPriority, ExternalMemoryHost: d.hasHostImport, BufferDeviceAddress: d.hasBDA}
	if t := int(p.props.deviceType); t < len(deviceTypes) {
		out.DeviceType = deviceTypes[t]
	}
	var pn pinned
	defer pn.release()
	b := &physicalDeviceMemoryBudget{sType: stPhysicalDeviceMemoryBudget}
	mp := &physicalDeviceMemoryProperties2{sType: stPhysicalDeviceMemoryProperties2}
	if d.hasBudget {
		mp.pNext = ref(&pn, b)
	}
	callVoid(d.vk.getPhysicalDeviceMemoryProperties2, d.phys, uintptr(unsafe.Pointer(mp)))
	m := &mp.props
	for i := range m.heapCount {
		out.Heaps = append(out.Heaps, Heap{Index: int(i), SizeBytes: m.heaps[i].size, DeviceLocal: m.heaps[i].flags&heapDeviceLocal != 0,
			BudgetBytes: b.budget[i], UsageBytes: b.usage[i]})
	}
	for i := range m.typeCount {
		var use []string
		if i == d.deviceType {
			use = append(use, "device")
		}
		if i == d.hostType {
			use = append(use, "host")
		}
		out.Types = append(out.Types, MemoryType{Index: int(i), Heap: int(m.types[i].heap), Flags: flagNames(m.types[i].flags, memFlagNames), Use: strings.Join(use, ",")})
	}
	for i, q := range p.queues {
		f := QueueFamily{Index: i, Flags: flagNames(q.flags, queueFlagNames), Queues: int(q.count), TimestampBits: int(q.timestampBits)}
		var use []string
		if uint32(i) == d.compute.index {
			use = append(use, "compute")
			f.Taken = len(d.compute.queues)
		}
		if uint32(i) == d.transfer.index {
			use = append(use, "transfer")
			f.Taken = len(d.transfer.queues)
		}
		f.Use = strings.Join(use, ",")
		out.Queues = append(out.Queues, f)
	}
	return out
}
