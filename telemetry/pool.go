// Package telemetry exports memwall's measurements as Prometheus metrics:
// collectors over pools and KV caches that the program registers with a
// Registerer of its choice (the pools and caches themselves import no
// metrics package).
//
//	p, _ := pool.New(dev, pool.Options{Name: "activations"})
//	telemetry.RegisterPool(prometheus.DefaultRegisterer, p)
package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memwall/memwall/pool"
)

// PoolStats is a pool's snapshot (pool.Stats), the source of the metrics.
type PoolStats = pool.Stats

// TenantStats is one tenant's accounting (pool.TenantStats).
type TenantStats = pool.TenantStats

// Histogram is the pool's latency histogram (pool.Histogram).
type Histogram = pool.Histogram

// PoolSource is what the collector reads: a snapshot of counters and the
// latency histogram. *pool.Pool implements it.
type PoolSource interface {
	Stats() pool.Stats
	AllocLatency() *pool.Histogram
}

// detailedSource is a PoolSource that can also walk its free ranges
// (*pool.Pool's DetailedStats).
type detailedSource interface {
	DetailedStats() pool.Stats
}

// RegisterPool registers a collector over the given pools with reg: the
// pools know nothing of Prometheus, the program that wants metrics
// registers them. The collector reads Stats (counters only, no stop of the
// world, no page walk) on every scrape.
func RegisterPool(reg prometheus.Registerer, pools ...PoolSource) (*PoolCollector, error) {
	c := NewPoolCollector(pools...)
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	return c, nil
}

// PoolCollector exports one or more pools as Prometheus metrics. Register it
// with a prometheus.Registerer of the caller's choice.
type PoolCollector struct {
	pools []PoolSource
	// Detailed makes every scrape also export the largest free range and
	// the fragmentation ratio, which walk each pool's free ranges under
	// its lock (DetailedStats); off by default.
	Detailed bool

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
		d, detailed := p.(detailedSource)
		if detailed = detailed && c.Detailed; detailed {
			s = d.DetailedStats()
		}
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
		if detailed {
			g(c.fragmentation, s.Fragmentation, n)
			g(c.largestFree, float64(s.LargestFreeBytes), n)
		}
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
