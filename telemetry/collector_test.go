package telemetry_test

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/telemetry"
)

// fakeSource is a PoolSource with made-up figures: the collector tested
// alone, without a pool under it. It counts DetailedStats calls (the walk
// a scrape must not make unless asked).
type fakeSource struct {
	stats, detailed pool.Stats
	hist            pool.Histogram
	walks           atomic.Int32
}

func (f *fakeSource) Stats() pool.Stats             { return f.stats }
func (f *fakeSource) AllocLatency() *pool.Histogram { return &f.hist }
func (f *fakeSource) DetailedStats() pool.Stats     { f.walks.Add(1); return f.detailed }
func randomStats(r *rand.Rand, name string) pool.Stats {
	u := func() uint64 { return r.Uint64N(1 << 40) }
	s := pool.Stats{Name: name, ReservedBytes: u(), PeakReservedBytes: u(), LimitBytes: u(), UsedBytes: u(),
		CachedBytes: u(), PendingBytes: u(), Utilization: r.Float64(), Allocs: u(), Frees: u(), OOMs: u(),
		DeviceAllocs: u(), DeviceFrees: u(), Maps: u(), Unmaps: u(), ByPurpose: map[string]uint64{}}
	for _, p := range []string{"weights", "kv", "activations"}[:r.IntN(4)] {
		s.ByPurpose[p] = u()
	}
	for i := range r.IntN(3) {
		s.Tenants = append(s.Tenants, pool.TenantStats{Name: fmt.Sprintf("t%d", i), UsedBytes: u(), Quota: u(), OOMs: u()})
	}
	return s
}

// TestCollectorAlone scrapes random figures of several sources and finds
// each one in its metric, labelled by pool (and purpose, tenant, call);
// the detailed figures, and the walk behind them, only when Detailed.
func TestCollectorAlone(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for iter := 0; iter < 50; iter++ {
		var srcs []*fakeSource
		var ps []telemetry.PoolSource
		for i := range 1 + r.IntN(3) {
			f := &fakeSource{stats: randomStats(r, fmt.Sprintf("p%d", i))}
			f.detailed = f.stats
			f.detailed.LargestFreeBytes, f.detailed.Fragmentation = r.Uint64N(1<<30), r.Float64()
			for range r.IntN(100) {
				f.hist.Observe(time.Duration(r.IntN(1e6)))
			}
			srcs, ps = append(srcs, f), append(ps, f)
		}
		c := telemetry.NewPoolCollector(ps...)
		c.Detailed = iter%2 == 1
		reg := prometheus.NewRegistry()
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.Metric {
				key := mf.GetName()
				for _, l := range m.Label {
					key += "," + l.GetName() + "=" + l.GetValue()
				}
				// One of the three is set; the others read as zero.
				got[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
			}
		}
		for _, f := range srcs {
			s := f.stats
			want := map[string]float64{
				"memwall_pool_reserved_bytes":        float64(s.ReservedBytes),
				"memwall_pool_peak_reserved_bytes":   float64(s.PeakReservedBytes),
				"memwall_pool_limit_bytes":           float64(s.LimitBytes),
				"memwall_pool_used_bytes":            float64(s.UsedBytes),
				"memwall_pool_cached_bytes":          float64(s.CachedBytes),
				"memwall_pool_pending_bytes":         float64(s.PendingBytes),
				"memwall_pool_utilization_ratio":     s.Utilization,
				"memwall_pool_oom_total":             float64(s.OOMs),
				"memwall_pool_allocs_total":          float64(s.Allocs),
				"memwall_pool_frees_total":           float64(s.Frees),
				"memwall_pool_alloc_latency_seconds": float64(f.hist.Count()),
			}
			for k, v := range want {
				if g, ok := got[k+",pool="+s.Name]; !ok || g != v {
					t.Fatalf("%s{pool=%s} = %v (present %v), want %v", k, s.Name, g, ok, v)
				}
			}
			for call, v := range map[string]uint64{"alloc": s.DeviceAllocs, "free": s.DeviceFrees, "map": s.Maps, "unmap": s.Unmaps} {
				if g := got["memwall_pool_device_calls_total,call="+call+",pool="+s.Name]; g != float64(v) {
					t.Fatalf("device calls %s of %s: %v, want %d", call, s.Name, g, v)
				}
			}
			for p, v := range s.ByPurpose {
				if g := got["memwall_pool_purpose_used_bytes,pool="+s.Name+",purpose="+p]; g != float64(v) {
					t.Fatalf("purpose %s of %s: %v, want %d", p, s.Name, g, v)
				}
			}
			for _, tn := range s.Tenants {
				if g := got["memwall_pool_tenant_used_bytes,pool="+s.Name+",tenant="+tn.Name]; g != float64(tn.UsedBytes) {
					t.Fatalf("tenant %s of %s: %v, want %d", tn.Name, s.Name, g, tn.UsedBytes)
				}
			}
			lf, ok := got["memwall_pool_largest_free_bytes,pool="+s.Name]
			switch {
			case c.Detailed && (!ok || lf != float64(f.detailed.LargestFreeBytes)):
				t.Fatalf("detailed: largest free of %s = %v (present %v), want %d", s.Name, lf, ok, f.detailed.LargestFreeBytes)
			case !c.Detailed && ok:
				t.Fatalf("not detailed, yet largest free of %s exported", s.Name)
			case !c.Detailed && f.walks.Load() != 0:
				t.Fatalf("a plain scrape walked %s's free ranges %d times", s.Name, f.walks.Load())
			}
		}
	}
}
