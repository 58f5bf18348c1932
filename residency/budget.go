package residency

import (
	"fmt"

	"github.com/memwall/memwall/device"
)

// Margin is what PlanBudget leaves free when no budget is given: 512 MiB,
// or a tenth of the free memory when that is less (small simulated
// devices), so that other users of the device and the driver's own later
// allocations (kernel modules loaded lazily, library workspaces) find room.
const Margin = 512 << 20

// LazyReserve is what PlanBudget keeps back, on a device that measured its
// context, for device memory the driver and libraries take on first use
// after the budget was planned: cuBLASLt loads its kernels and may take a
// workspace on the first product (62 MiB above what was counted, seen on
// the H200 with the 7B model at --vram 8GiB). Warm such libraries up before
// PlanBudget so LoadedBytes counts them; this reserve covers the rest.
const LazyReserve = 64 << 20

// Budget is a device-memory budget split into what the CUDA context takes
// by itself and what memwall's pools may use.
type Budget struct {
	// VRAMBytes is the budget: the process's whole device footprint, as
	// nvidia-smi's memory.used shows it. Default says it was not given and
	// is the device's free memory plus the context's, less MarginBytes.
	VRAMBytes   uint64 `json:"vram_bytes"`
	Default     bool   `json:"default"`
	MarginBytes uint64 `json:"margin_bytes,omitempty"`
	// ContextBytes is the device context's own memory, counted in the
	// budget; ContextSource says how it was found (or why it is 0).
	ContextBytes  uint64 `json:"context_bytes"`
	ContextSource string `json:"context_source"`
	// LoadedBytes is what the process took on the device after the
	// context and still held when PlanBudget ran: kernel modules, library
	// handles and workspaces (device.FreeAfterContext less the free memory
	// then; 0 when the device cannot say). Call PlanBudget after loading
	// kernels and before allocating pools: a pool's bytes held then would
	// be counted here too.
	LoadedBytes uint64 `json:"loaded_bytes"`
	// ReserveBytes is LazyReserve on a device that measured its context
	// (a GPU), 0 on the simulator.
	ReserveBytes uint64 `json:"reserve_bytes"`
	// PoolBytes = VRAMBytes - ContextBytes - LoadedBytes - ReserveBytes:
	// what the weight plan, the activation arena and the KV cache together
	// may take from the pools (plan.WeightOptions.Budget).
	PoolBytes uint64 `json:"pool_bytes"`
	// FreeBytes and TotalBytes are the device's memory when PlanBudget ran
	// (the context already exists then, so FreeBytes excludes it).
	FreeBytes  uint64 `json:"free_bytes"`
	TotalBytes uint64 `json:"total_bytes"`
	// Warning is set when PoolBytes exceed FreeBytes: other processes hold
	// memory, and the plan may not fit at run time.
	Warning string `json:"warning,omitempty"`
}

// ContextBytes returns the device context's own memory and how it was
// found: device.ContextMemory when d implements it (package device/cuda
// measures it at Open), else 0 ("none" on the simulator, which has no
// context).
func ContextBytes(d device.Device) (uint64, string) {
	if cm, ok := d.(device.ContextMemory); ok {
		b, how, ok := cm.ContextBytes()
		if ok {
			return b, how
		}
		if how == "" {
			how = "unknown: the device did not measure its context"
		}
		return 0, how
	}
	if d.Info().Backend == "sim" {
		return 0, "none: the simulated device has no context"
	}
	return 0, "unknown: the device does not report its context's memory"
}

// PlanBudget turns vram, the process's whole device footprint in bytes (0:
// not given), into a Budget for device d: the context's own memory and
// what was loaded since are taken off. A budget above the device's total
// memory, or one that leaves nothing after the context, is an error naming
// both figures; one above the free memory gets a Warning. With vram 0 the
// budget is the free memory plus the context's and the loaded bytes, less
// the margin (Margin, or a tenth of the free memory when smaller).
func PlanBudget(d device.Device, vram uint64) (Budget, error) {
	free, total, err := d.MemInfo()
	if err != nil {
		return Budget{}, fmt.Errorf("residency: device memory info: %w", err)
	}
	in := d.Info()
	if in.TotalBytes > 0 {
		total = in.TotalBytes
	}
	b := Budget{VRAMBytes: vram, FreeBytes: free, TotalBytes: total}
	b.ContextBytes, b.ContextSource = ContextBytes(d)
	if fa, ok := d.(device.FreeAfterContext); ok && b.ContextBytes > 0 {
		if after, ok := fa.FreeAfterContext(); ok && after > free {
			b.LoadedBytes = after - free
		}
	}
	if b.ContextBytes > 0 {
		b.ReserveBytes = LazyReserve
	}
	overhead := b.ContextBytes + b.LoadedBytes + b.ReserveBytes
	if vram == 0 {
		b.Default = true
		b.MarginBytes = min(Margin, free/10)
		b.VRAMBytes = min(free+overhead-b.MarginBytes, total)
	}
	if b.VRAMBytes > total {
		return b, fmt.Errorf("residency: budget %d bytes (%s) exceeds the device's total memory %d bytes (%s, %s)",
			b.VRAMBytes, gib(b.VRAMBytes), total, gib(total), in.Name)
	}
	if b.VRAMBytes <= overhead {
		return b, fmt.Errorf("residency: budget %d bytes (%s) leaves nothing after the device context's own %d bytes (%s; %s), %d bytes loaded since and a reserve of %d for lazy loads",
			b.VRAMBytes, gib(b.VRAMBytes), b.ContextBytes, gib(b.ContextBytes), b.ContextSource, b.LoadedBytes, b.ReserveBytes)
	}
	b.PoolBytes = b.VRAMBytes - overhead
	if b.PoolBytes > free {
		b.Warning = fmt.Sprintf("budget %s less the context's %s (and %s loaded since, %s reserved) is %s, more than the %s the device has free now (%s)",
			gib(b.VRAMBytes), gib(b.ContextBytes), gib(b.LoadedBytes), gib(b.ReserveBytes), gib(b.PoolBytes), gib(free), in.Name)
	}
	return b, nil
}

func gib(n uint64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// Footprint returns the device memory the process holds now, as
// nvidia-smi counts it: the context's own memory plus what the device had
// free just after the context less what it has free now (pools, modules,
// libraries; other processes' allocations since would count too). ok is
// false when the device did not measure its context (the simulator).
func Footprint(d device.Device) (uint64, bool) {
	ctx, _ := ContextBytes(d)
	fa, ok := d.(device.FreeAfterContext)
	if !ok || ctx == 0 {
		return 0, false
	}
	after, ok := fa.FreeAfterContext()
	if !ok {
		return 0, false
	}
	free, _, err := d.MemInfo()
	if err != nil {
		return 0, false
	}
	if free > after {
		return ctx, true
	}
	return ctx + after - free, true
}
