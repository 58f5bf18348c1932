package serve

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memwall/memwall/kvcache"
	"github.com/memwall/memwall/telemetry"
)

// Memory is where the model's weights live, for memwall's own gauges.
type Memory struct {
	// BudgetBytes is the device budget the process runs under.
	BudgetBytes uint64
	// GrantBytes is this model's share of a budget shared with other
	// models (0: not shared).
	GrantBytes uint64
	// ResidentBytes are the weights kept on the device; StreamedBytes the
	// weights copied to it each step; HostBytes those the host computes.
	ResidentBytes, StreamedBytes, HostBytes uint64
}

// metrics are the server's Prometheus metrics: vLLM's names (so that its
// dashboards and the Gateway API Inference Extension read them as they
// are), each with model_name, and memwall's own.
type metrics struct {
	promptTokens, generationTokens prometheus.Counter
	prefixQueries, prefixHits      prometheus.Counter
	preemptions, aborted           prometheus.Counter
	success                        *prometheus.CounterVec
	ttft, itl, e2e, queueSeconds   prometheus.Histogram
	stepSeconds, loadSeconds       prometheus.Histogram
	loads, unloads                 prometheus.Counter
}

// kvSource is the cache of the batch loaded now, for the KV collector.
type kvSource struct{ s *Server }

func (k kvSource) Stats() kvcache.CacheStats { return k.s.kvStats() }

// register makes the metrics and registers them, the gauges reading s,
// with reg (nil: none).
func (s *Server) register(reg prometheus.Registerer) error {
	l := prometheus.Labels{"model_name": s.o.ModelName}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: l})
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: l, Buckets: buckets})
	}
	m := &s.m
	m.promptTokens = counter("vllm:prompt_tokens_total", "Prefill tokens processed (prompt tokens of requests admitted).")
	m.generationTokens = counter("vllm:generation_tokens_total", "Generation tokens processed.")
	m.prefixQueries = counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in prompt tokens.")
	m.prefixHits = counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in prompt tokens.")
	m.preemptions = counter("vllm:num_preemptions_total", "Sequences preempted (their KV blocks freed, to be computed again).")
	m.aborted = counter("memwall_serve_aborted_requests_total", "Requests whose client went away or that were stopped before their end.")
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total", Help: "Requests finished, by reason.", ConstLabels: l},
		[]string{"finished_reason"})
	m.ttft = hist("vllm:time_to_first_token_seconds", "Time from arrival to the first token.",
		[]float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80})
	m.itl = hist("vllm:inter_token_latency_seconds", "Time between two tokens of a request.",
		[]float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80})
	m.e2e = hist("vllm:e2e_request_latency_seconds", "Time from arrival to the last token.",
		[]float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960})
	m.queueSeconds = hist("vllm:request_queue_time_seconds", "Time a request waited before its first admission.",
		[]float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80})
	m.stepSeconds = hist("memwall_serve_step_seconds", "Wall time of one batched step.",
		[]float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5})
	m.loads = counter("memwall_serve_loads_total", "Loads of the model after it was unloaded.")
	m.unloads = counter("memwall_serve_unloads_total", "Unloads of the model after it was idle --unload-after.")
	m.loadSeconds = hist("memwall_serve_load_seconds", "Wall time of one load after an unload.",
		[]float64{0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64})
	if reg == nil {
		return nil
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: l}, f)
	}
	snap := func(f func(st *snapshot) float64) func() float64 {
		return func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return f(&s.snap)
		}
	}
	mem := func() Memory {
		if s.o.MemoryNow != nil {
			return s.o.MemoryNow()
		}
		return s.o.Memory
	}
	cs := []prometheus.Collector{m.promptTokens, m.generationTokens, m.prefixQueries, m.prefixHits, m.preemptions, m.aborted,
		m.success, m.ttft, m.itl, m.e2e, m.queueSeconds, m.stepSeconds,
		gauge("vllm:num_requests_running", "Requests in the batch (holding KV blocks).", snap(func(st *snapshot) float64 { return float64(st.running) })),
		gauge("vllm:num_requests_waiting", "Requests waiting for admission.", snap(func(st *snapshot) float64 { return float64(st.waiting) })),
		gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks held by sequences (1 = 100%).", func() float64 { return s.kvStats().Usage() }),
		gauge("memwall_serve_streamed_bytes", "Weight bytes streamed to the device so far.", snap(func(st *snapshot) float64 { return float64(st.streamed) })),
		gauge("memwall_serve_budget_bytes", "The device budget the server runs under.", func() float64 { return float64(mem().BudgetBytes) }),
		gauge("memwall_serve_grant_bytes", "This model's share of the pools' budget when models share it (0: not shared).", func() float64 { return float64(mem().GrantBytes) }),
		gauge("memwall_serve_resident_weight_bytes", "Weight bytes resident on the device.", func() float64 { return float64(mem().ResidentBytes) }),
		gauge("memwall_serve_streamed_weight_bytes_per_step", "Weight bytes streamed to the device per step.", func() float64 { return float64(mem().StreamedBytes) }),
		gauge("memwall_serve_host_weight_bytes_per_step", "Weight bytes the host computes per step.", func() float64 { return float64(mem().HostBytes) }),
		gauge("memwall_serve_max_seqs", "The most sequences one step holds.", func() float64 { return float64(s.o.MaxSeqs) }),
		gauge("memwall_serve_step_tokens", "The most tokens one step holds.", func() float64 { return float64(s.shape.maxTokens) }),
		gauge("memwall_serve_loaded", "1 while the model is loaded, 0 while it is unloaded after --unload-after idle.", func() float64 {
			if s.Loaded() {
				return 1
			}
			return 0
		}),
		m.loads, m.unloads, m.loadSeconds,
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("serve: register metrics: %w", err)
		}
	}
	// The KV cache's and the pools' collectors carry no model label of
	// their own: one is added, so that several servers share a registry.
	lreg := prometheus.WrapRegistererWith(l, reg)
	if _, err := telemetry.RegisterKV(lreg, kvSource{s}); err != nil {
		return err
	}
	if len(s.o.Pools) > 0 {
		if _, err := telemetry.RegisterPool(lreg, s.o.Pools...); err != nil {
			return fmt.Errorf("serve: register pool metrics: %w", err)
		}
	}
	return nil
}

// snapshot is what the scheduler last published for the gauges.
type snapshot struct {
	running, waiting int
	streamed         uint64
}

// publish copies the scheduler's counts for the gauges and the drain.
func (s *Server) publish() {
	var streamed uint64
	if s.o.StreamedBytes != nil {
		streamed = s.o.StreamedBytes()
	}
	s.mu.Lock()
	s.snap = snapshot{running: len(s.running), waiting: len(s.waiting) + len(s.incoming), streamed: streamed}
	s.mu.Unlock()
	s.cond.Broadcast()
}
