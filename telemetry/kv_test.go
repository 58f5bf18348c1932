package telemetry_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/kvcache"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/telemetry"
)

// gather returns every metric of reg by name (one series per name).
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetCounter() != nil {
				got[mf.GetName()] = m.GetCounter().GetValue()
			} else {
				got[mf.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	return got
}

// A cache registered from outside reports its Stats under the memwall_kv_
// names, follows the cache as sequences come and go, and a second cache
// registers once the first collector is unregistered.
func TestRegisterKVReportsCache(t *testing.T) {
	d := sim.New(sim.DefaultOptions())
	dev, err := pool.New(d, pool.Options{Name: "kv-dev"})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	cfg := kvcache.Config{Layers: 2, KVHeads: 2, HeadDim: 8, ElemBytes: 2, Blocks: 12, BlockTokens: 4}
	c, err := kvcache.New(d, dev, nil, cfg, kvcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	col, err := telemetry.RegisterKV(reg, c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := telemetry.RegisterKV(reg, c); err == nil {
		t.Fatal("registering the same names twice succeeded")
	}
	prompt := make([]int32, 9) // 3 blocks of 4 tokens
	for i := range prompt {
		prompt[i] = int32(i + 1)
	}
	for seq := kvcache.SeqID(1); seq <= 2; seq++ {
		if _, err := c.Add(seq, prompt, 0); err != nil {
			t.Fatal(err)
		}
	}
	st := c.Stats()
	got := gather(t, reg)
	want := map[string]float64{
		"memwall_kv_blocks":               12,
		"memwall_kv_block_bytes":          float64(c.BlockBytes()),
		"memwall_kv_used_blocks":          float64(st.UsedBlocks),
		"memwall_kv_usage_ratio":          st.Usage(),
		"memwall_kv_sequences":            2,
		"memwall_kv_cached_free_blocks":   float64(st.CachedFreeBlocks),
		"memwall_kv_host_used_blocks":     0,
		"memwall_kv_prefix_queries_total": float64(st.PrefixQueries),
		"memwall_kv_prefix_hits_total":    float64(st.PrefixHits),
		"memwall_kv_evictions_total":      float64(st.Evictions),
		"memwall_kv_copy_on_writes_total": float64(st.CopyOnWrites),
		"memwall_kv_swap_out_bytes_total": 0,
		"memwall_kv_swap_in_bytes_total":  0,
	}
	if len(got) != len(want) {
		t.Fatalf("got %d metrics, want %d: %v", len(got), len(want), got)
	}
	for name, v := range want {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", name, g, ok, v)
		}
	}
	// Two sequences of 9 tokens hold 3 blocks of 4 tokens each; both looked
	// up their 2 full prompt blocks.
	if st.UsedBlocks != 6 || st.PrefixQueries != 4 || st.Sequences != 2 {
		t.Fatalf("stats %+v: want 6 used blocks, 4 prefix queries, 2 sequences", st)
	}
	if err := c.Free(1); err != nil {
		t.Fatal(err)
	}
	if g := gather(t, reg)["memwall_kv_sequences"]; g != 1 {
		t.Fatalf("after a free: %v sequences", g)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !reg.Unregister(col) {
		t.Fatal("unregister failed")
	}
	c2, err := kvcache.New(d, dev, nil, cfg, kvcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := telemetry.RegisterKV(reg, c2); err != nil {
		t.Fatal(err)
	}
}
