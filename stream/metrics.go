package stream

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the streamer's Prometheus collectors.
type metrics struct {
	steps    prometheus.Counter
	bytes    prometheus.Counter
	stall    prometheus.Counter
	stepTime prometheus.Histogram
	gbps     prometheus.Gauge
	overlap  prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{
		steps: prometheus.NewCounter(prometheus.CounterOpts{Name: "memwall_stream_steps_total",
			Help: "Steps run by the weight streamer."}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "memwall_stream_copied_bytes_total",
			Help: "Weight bytes copied host-to-device by the streamer."}),
		stall: prometheus.NewCounter(prometheus.CounterOpts{Name: "memwall_stream_stall_seconds_total",
			Help: "Device time the compute stream waited for streamed weights."}),
		stepTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "memwall_stream_step_seconds",
			Help:    "Device time of one streamed step.",
			Buckets: prometheus.ExponentialBuckets(1e-4, 2, 20)}),
		gbps: prometheus.NewGauge(prometheus.GaugeOpts{Name: "memwall_stream_achieved_gbps",
			Help: "Streamed bytes over step time in the latest step, GB/s."}),
		overlap: prometheus.NewGauge(prometheus.GaugeOpts{Name: "memwall_stream_overlap_efficiency",
			Help: "max(copy, compute) over step time in the latest step."}),
	}
}

func (m *metrics) all() []prometheus.Collector {
	return []prometheus.Collector{m.steps, m.bytes, m.stall, m.stepTime, m.gbps, m.overlap}
}

// register registers every collector or none.
func (m *metrics) register(r prometheus.Registerer) error {
	var done []prometheus.Collector
	for _, c := range m.all() {
		if err := r.Register(c); err != nil {
			for _, d := range done {
				r.Unregister(d)
			}
			return err
		}
		done = append(done, c)
	}
	return nil
}

func (m *metrics) unregister(r prometheus.Registerer) {
	for _, c := range m.all() {
		r.Unregister(c)
	}
}

func (m *metrics) observe(r StepReport, streamed uint64) {
	m.steps.Inc()
	m.bytes.Add(float64(streamed))
	m.stall.Add(r.StallSeconds)
	m.stepTime.Observe(r.Seconds)
	m.gbps.Set(r.GBps)
	m.overlap.Set(r.Overlap)
}
