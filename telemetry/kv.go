package telemetry

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memwall/memwall/kvcache"
)

// KVStats is a KV cache's snapshot (kvcache.CacheStats), the source of its
// Prometheus gauges.
type KVStats = kvcache.CacheStats

// KVSource is what the KV collector reads; *kvcache.Cache implements it.
// Stats must be safe to call while the cache is in use.
type KVSource interface {
	Stats() kvcache.CacheStats
}

// RegisterKV registers a collector over the cache src with reg: the cache
// knows nothing of Prometheus. Unregister the returned collector
// (reg.Unregister) before registering another cache with reg.
func RegisterKV(reg prometheus.Registerer, src KVSource) (*KVCollector, error) {
	c := NewKVCollector(src)
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("telemetry: register KV cache metrics: %w", err)
	}
	return c, nil
}

// KVCollector exports a KV cache as Prometheus metrics (memwall_kv_*).
type KVCollector struct {
	src                                                  KVSource
	usage, used, blocks, cachedFree, hostUsed, seqs      *prometheus.Desc
	queries, hits, evictions, cows, swapOut, swapIn, blk *prometheus.Desc
}

// NewKVCollector returns a collector over src.
func NewKVCollector(src KVSource) *KVCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("memwall_kv_"+name, help, nil, nil)
	}
	return &KVCollector{src: src,
		usage:      d("usage_ratio", "Fraction of KV blocks held by sequences."),
		used:       d("used_blocks", "KV blocks held by sequences."),
		blocks:     d("blocks", "KV blocks in the cache."),
		blk:        d("block_bytes", "Bytes per KV block."),
		cachedFree: d("cached_free_blocks", "Free KV blocks still holding a cached prefix."),
		hostUsed:   d("host_used_blocks", "Host blocks holding swapped-out sequences."),
		seqs:       d("sequences", "Sequences holding KV blocks."),
		queries:    d("prefix_queries_total", "Full prompt blocks looked up in the prefix cache."),
		hits:       d("prefix_hits_total", "Full prompt blocks found in the prefix cache."),
		evictions:  d("evictions_total", "Cached blocks evicted for reuse."),
		cows:       d("copy_on_writes_total", "Shared blocks copied on append."),
		swapOut:    d("swap_out_bytes_total", "Bytes swapped from device to host."),
		swapIn:     d("swap_in_bytes_total", "Bytes swapped from host to device."),
	}
}

// Describe implements prometheus.Collector.
func (c *KVCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.usage, c.used, c.blocks, c.blk, c.cachedFree, c.hostUsed, c.seqs,
		c.queries, c.hits, c.evictions, c.cows, c.swapOut, c.swapIn} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *KVCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Stats()
	g := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	ctr := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	g(c.usage, s.Usage())
	g(c.used, float64(s.UsedBlocks))
	g(c.blocks, float64(s.Blocks))
	g(c.blk, float64(s.BlockBytes))
	g(c.cachedFree, float64(s.CachedFreeBlocks))
	g(c.hostUsed, float64(s.HostUsedBlocks))
	g(c.seqs, float64(s.Sequences))
	ctr(c.queries, s.PrefixQueries)
	ctr(c.hits, s.PrefixHits)
	ctr(c.evictions, s.Evictions)
	ctr(c.cows, s.CopyOnWrites)
	ctr(c.swapOut, s.SwapOutBytes)
	ctr(c.swapIn, s.SwapInBytes)
}
