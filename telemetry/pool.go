package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// PoolStats is a snapshot of one memory pool, the JSON stats memwall prints
// and the source of the Prometheus metrics. Sizes are bytes.
type PoolStats struct {
	Name     string `json:"name"`
	Backend  string `json:"backend"`
	Strategy string `json:"strategy"`
	Growth   string `json:"growth"`

	// ReservedBytes is device memory the pool holds (allocated chunks or
	// mapped pages); PeakReservedBytes its high-water mark.
	ReservedBytes     uint64 `json:"reserved_bytes"`
	PeakReservedBytes uint64 `json:"peak_reserved_bytes"`
	LimitBytes        uint64 `json:"limit_bytes"`
	// UsedBytes is bytes in live blocks as handed out (after rounding);
	// RequestedBytes what callers asked for.
	UsedBytes      uint64 `json:"used_bytes"`
	RequestedBytes uint64 `json:"requested_bytes"`
	PeakUsedBytes  uint64 `json:"peak_used_bytes"`
	// CachedBytes are freed blocks kept in per-processor caches;
	// PendingBytes blocks freed on a stream whose work may still run.
	CachedBytes  uint64 `json:"cached_bytes"`
	PendingBytes uint64 `json:"pending_bytes"`
	LiveBlocks   int    `json:"live_blocks"`
	// FreeBytes is free space inside reserved memory; LargestFreeBytes its
	// largest contiguous range.
	FreeBytes        uint64  `json:"free_bytes"`
	LargestFreeBytes uint64  `json:"largest_free_bytes"`
	Utilization      float64 `json:"utilization"`   // used / reserved
	Fragmentation    float64 `json:"fragmentation"` // largest free / total free (1 = one range)

	ByPurpose map[string]uint64 `json:"by_purpose"`
	Tenants   []TenantStats     `json:"tenants,omitempty"`

	Allocs uint64 `json:"allocs"`
	Frees  uint64 `json:"frees"`
	OOMs   uint64 `json:"ooms"`
	// Device calls the pool made: the fallback count of the seed's metrics.
	DeviceAllocs uint64 `json:"device_allocs"`
	DeviceFrees  uint64 `json:"device_frees"`
	Maps         uint64 `json:"maps"`
	Unmaps       uint64 `json:"unmaps"`

	AllocP50 time.Duration `json:"alloc_p50_ns"`
	AllocP99 time.Duration `json:"alloc_p99_ns"`
}

// DeviceCalls is the total number of driver allocations, frees, maps and
// unmaps.
func (s PoolStats) DeviceCalls() uint64 { return s.DeviceAllocs + s.DeviceFrees + s.Maps + s.Unmaps }

// TenantStats is one tenant's accounting.
type TenantStats struct {
	Name      string `json:"name"`
	UsedBytes uint64 `json:"used_bytes"`
	PeakBytes uint64 `json:"peak_bytes"`
	Quota     uint64 `json:"quota_bytes"` // 0 = none
	OOMs      uint64 `json:"ooms"`
}

// PoolSource is what the collector reads: a snapshot and the latency
// histogram. *pool.Pool implements it.
type PoolSource interface {
	Stats() PoolStats
	AllocLatency() *Histogram
}

// PoolCollector exports one or more pools as Prometheus metrics. Register it
// with a prometheus.Registerer of the caller's choice.
type PoolCollector struct {
	pools []PoolSource

	reserved, peakReserved, limit, used, byPurpose, tenantUsed, tenantQuota *prometheus.Desc
	utilization, fragmentation, largestFree, cached, pending                *prometheus.Desc
	deviceCalls, ooms, allocs, frees, tenantOOMs, latency                   *prometheus.Desc
}

// latencyBounds are the exported histogram's upper bounds.
var latencyBounds = []time.Duration{
	100 * time.Nanosecond, 250 * time.Nanosecond, 500 * time.Nanosecond, time.Microsecond,
	2500 * time.Nanosecond, 5 * time.Microsecond, 10 * time.Microsecond, 50 * time.Microsecond,
	100 * time.Microsecond, time.Millisecond, 10 * time.Millisecond,
}

// NewPoolCollector returns a collector over the given pools.
func NewPoolCollector(pools ...PoolSource) *PoolCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("memwall_pool_"+name, help, append([]string{"pool"}, labels...), nil)
	}
	return &PoolCollector{
		pools:         pools,
		reserved:      d("reserved_bytes", "Device memory held by the pool (chunks or mapped pages)."),
		peakReserved:  d("peak_reserved_bytes", "High-water mark of reserved bytes."),
		limit:         d("limit_bytes", "Hard limit on reserved bytes (0 = none)."),
		used:          d("used_bytes", "Bytes in live blocks."),
		byPurpose:     d("purpose_used_bytes", "Bytes in live blocks by purpose.", "purpose"),
		tenantUsed:    d("tenant_used_bytes", "Bytes in live blocks by tenant.", "tenant"),
		tenantQuota:   d("tenant_quota_bytes", "Tenant quota (0 = none).", "tenant"),
		tenantOOMs:    d("tenant_oom_total", "Allocations refused by a tenant's quota.", "tenant"),
		utilization:   d("utilization_ratio", "Used over reserved bytes."),
		fragmentation: d("fragmentation_ratio", "Largest free range over total free bytes in reserved memory (1 = unfragmented)."),
		largestFree:   d("largest_free_bytes", "Largest contiguous free range in reserved memory."),
		cached:        d("cached_bytes", "Freed blocks held in per-processor caches."),
		pending:       d("pending_bytes", "Blocks freed on a stream whose work may still be running."),
		deviceCalls:   d("device_calls_total", "Driver calls made by the pool (the fallback count).", "call"),
		ooms:          d("oom_total", "Failed allocations."),
		allocs:        d("allocs_total", "Successful allocations."),
		frees:         d("frees_total", "Successful frees."),
		latency:       d("alloc_latency_seconds", "Allocation latency."),
	}
}

// Describe implements prometheus.Collector.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.reserved, c.peakReserved, c.limit, c.used, c.byPurpose, c.tenantUsed,
		c.tenantQuota, c.tenantOOMs, c.utilization, c.fragmentation, c.largestFree, c.cached, c.pending,
		c.deviceCalls, c.ooms, c.allocs, c.frees, c.latency} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ctr := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, p := range c.pools {
		s := p.Stats()
		n := s.Name
		g(c.reserved, float64(s.ReservedBytes), n)
		g(c.peakReserved, float64(s.PeakReservedBytes), n)
		g(c.limit, float64(s.LimitBytes), n)
		g(c.used, float64(s.UsedBytes), n)
		for purpose, v := range s.ByPurpose {
			g(c.byPurpose, float64(v), n, purpose)
		}
		for _, t := range s.Tenants {
			g(c.tenantUsed, float64(t.UsedBytes), n, t.Name)
			g(c.tenantQuota, float64(t.Quota), n, t.Name)
			ctr(c.tenantOOMs, t.OOMs, n, t.Name)
		}
		g(c.utilization, s.Utilization, n)
		g(c.fragmentation, s.Fragmentation, n)
		g(c.largestFree, float64(s.LargestFreeBytes), n)
		g(c.cached, float64(s.CachedBytes), n)
		g(c.pending, float64(s.PendingBytes), n)
		ctr(c.deviceCalls, s.DeviceAllocs, n, "alloc")
		ctr(c.deviceCalls, s.DeviceFrees, n, "free")
		ctr(c.deviceCalls, s.Maps, n, "map")
		ctr(c.deviceCalls, s.Unmaps, n, "unmap")
		ctr(c.ooms, s.OOMs, n)
		ctr(c.allocs, s.Allocs, n)
		ctr(c.frees, s.Frees, n)
		h := p.AllocLatency()
		counts := h.Buckets(latencyBounds)
		buckets := make(map[float64]uint64, len(latencyBounds))
		for i, b := range latencyBounds {
			buckets[b.Seconds()] = counts[i]
		}
		ch <- prometheus.MustNewConstHistogram(c.latency, h.Count(), h.Sum().Seconds(), buckets, n)
	}
}
