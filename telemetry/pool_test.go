package telemetry_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/telemetry"
)

// TestMetrics: a pool registered from outside exports its counters; the
// free-range gauges appear only when the collector is asked for them.
func TestMetrics(t *testing.T) {
	o := sim.DefaultOptions()
	o.Backing = false
	o.TotalBytes = 1 << 30
	d := sim.New(o)
	reg := prometheus.NewRegistry()
	p, err := pool.New(d, pool.Options{Name: "acts"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := telemetry.RegisterPool(reg, p); err != nil {
		t.Fatal(err)
	}
	tn, _ := p.Tenant("bert", 1<<30)
	b1, _ := p.Alloc(3<<20, pool.AllocOptions{Purpose: pool.KV})
	b2, _ := tn.Alloc(5<<20, pool.AllocOptions{Purpose: pool.Activations})
	_, _ = tn.Alloc(2<<30, pool.AllocOptions{}) // over quota: one OOM
	// Latency is sampled (one allocation in 32): make enough to see it.
	var small []pool.Block
	for i := 0; i < 400; i++ {
		b, err := p.Alloc(4096, pool.AllocOptions{Purpose: pool.Scratch})
		if err != nil {
			t.Fatal(err)
		}
		small = append(small, b)
	}
	for _, b := range small {
		_ = p.Free(b)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() != "pool" {
					key += "{" + l.GetName() + "=" + l.GetValue() + "}"
				}
			}
			switch {
			case m.GetGauge() != nil:
				got[key] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				got[key] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				got[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	want := map[string]float64{
		"memwall_pool_used_bytes":                              8 << 20,
		"memwall_pool_purpose_used_bytes{purpose=kv}":          3 << 20,
		"memwall_pool_purpose_used_bytes{purpose=activations}": 5 << 20,
		"memwall_pool_tenant_used_bytes{tenant=bert}":          5 << 20,
		"memwall_pool_tenant_quota_bytes{tenant=bert}":         1 << 30,
		// The tenant refused it, before the pool was asked.
		"memwall_pool_oom_total":                     0,
		"memwall_pool_tenant_oom_total{tenant=bert}": 1,
		"memwall_pool_allocs_total":                  402,
		"memwall_pool_frees_total":                   400,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	// The first allocation on each processor is timed, then one in 256.
	if n := got["memwall_pool_alloc_latency_seconds"]; n < 1 || n > 402 || n != float64(p.AllocLatency().Count()) {
		t.Errorf("latency histogram holds %v samples of 402 allocations (pool says %d)", n, p.AllocLatency().Count())
	}
	if got["memwall_pool_reserved_bytes"] < 8<<20 || got["memwall_pool_utilization_ratio"] <= 0 {
		t.Errorf("reserved %v utilization %v", got["memwall_pool_reserved_bytes"], got["memwall_pool_utilization_ratio"])
	}
	if got[`memwall_pool_device_calls_total{call=map}`]+got[`memwall_pool_device_calls_total{call=alloc}`] == 0 {
		t.Error("no device calls counted")
	}
	_ = p.Free(b1)
	_ = tn.Free(b2)
}

// TestDetailedMetrics: with Detailed the collector walks the free ranges
// and exports the largest one and the fragmentation ratio.
func TestDetailedMetrics(t *testing.T) {
	o := sim.DefaultOptions()
	o.Backing = false
	d := sim.New(o)
	p, err := pool.New(d, pool.Options{Name: "w", Cache: pool.CacheOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, detailed := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		c := telemetry.NewPoolCollector(p)
		c.Detailed = detailed
		reg.MustRegister(c)
		a, _ := p.Alloc(3<<20, pool.AllocOptions{})
		b, _ := p.Alloc(3<<20, pool.AllocOptions{})
		_ = p.Free(a)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, mf := range mfs {
			if mf.GetName() == "memwall_pool_largest_free_bytes" {
				found = true
				if v := mf.GetMetric()[0].GetGauge().GetValue(); v < 3<<20 {
					t.Errorf("largest free %v after freeing a 3 MiB block", v)
				}
			}
		}
		if found != detailed {
			t.Errorf("Detailed %v: largest-free gauge exported %v", detailed, found)
		}
		_ = p.Free(b)
	}
}
