package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/vulkan"
)

// vulkanInfoJSON is `memwall info --json` on the Vulkan backend: the
// common fields and the heaps, memory types and queue families.
type vulkanInfoJSON struct {
	infoJSON
	Vulkan vulkan.Details `json:"vulkan"`
}

// withVulkan adds the Vulkan details to the JSON output when d is a Vulkan
// device, and returns out unchanged otherwise.
func withVulkan(d device.Device, out infoJSON) any {
	vd, ok := d.(*vulkan.Device)
	if !ok {
		return out
	}
	return vulkanInfoJSON{infoJSON: out, Vulkan: vd.Details()}
}

// printVulkan prints the heaps (with their budget), memory types and queue
// families of a Vulkan device; other devices print nothing.
func printVulkan(w io.Writer, d device.Device) error {
	vd, ok := d.(*vulkan.Device)
	if !ok {
		return nil
	}
	v := vd.Details()
	fmt.Fprintf(w, "vulkan       API %s, %s device, loader %s\n", v.APIVersion, v.DeviceType, v.Loader)
	if v.Driver != "" {
		fmt.Fprintf(w, "driver       %s (kept loaded)\n", v.Driver)
	}
	fmt.Fprintf(w, "features     memory budget %s, memory priority %s, external host memory %s, buffer device address %s\n",
		yesNo(v.MemoryBudget), yesNo(v.MemoryPriority), yesNo(v.ExternalMemoryHost), yesNo(v.BufferDeviceAddress))
	for _, h := range v.Heaps {
		kind := "host"
		if h.DeviceLocal {
			kind = "device-local"
		}
		budget := ""
		if h.BudgetBytes > 0 {
			budget = fmt.Sprintf(", budget %s, used %s", humanBytes(h.BudgetBytes), humanBytes(h.UsageBytes))
		}
		fmt.Fprintf(w, "heap %-7d %s %s%s\n", h.Index, humanBytes(h.SizeBytes), kind, budget)
	}
	for _, t := range v.Types {
		use := ""
		if t.Use != "" {
			use = " ← memwall " + t.Use
		}
		fmt.Fprintf(w, "type %-7d heap %d: %s%s\n", t.Index, t.Heap, strings.Join(t.Flags, "|"), use)
	}
	for _, q := range v.Queues {
		use := ""
		if q.Use != "" {
			use = fmt.Sprintf(" ← memwall %s (%d taken)", q.Use, q.Taken)
		}
		fmt.Fprintf(w, "queues %-5d %d× %s, timestamps %d bits%s\n", q.Index, q.Queues, strings.Join(q.Flags, "|"), q.TimestampBits, use)
	}
	return nil
}
