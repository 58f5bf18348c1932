package pool

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram is the pool's latency histogram (Pool.AllocLatency,
// Counter.AllocLatency), which package telemetry exports: it counts
// durations in log-linear buckets: 8 sub-buckets per power
// of two of nanoseconds, so any quantile is reported within 12.5%. Observe
// is lock-free and safe for concurrent use; the zero value is ready.
type Histogram struct {
	counts [64 * subBuckets]atomic.Uint64
	sumNs  atomic.Uint64
	n      atomic.Uint64
}

const subBits = 3
const subBuckets = 1 << subBits

func bucketOf(ns uint64) int {
	if ns < subBuckets {
		return int(ns)
	}
	exp := bits.Len64(ns) - 1 // ≥ subBits
	sub := (ns >> (exp - subBits)) & (subBuckets - 1)
	return (exp-subBits+1)*subBuckets + int(sub)
}

// bucketUpper returns the largest value that falls in bucket i.
func bucketUpper(i int) uint64 {
	if i < subBuckets {
		return uint64(i)
	}
	exp := i/subBuckets + subBits - 1
	sub := uint64(i % subBuckets)
	lo := (uint64(1) << exp) | sub<<(exp-subBits)
	return lo + (uint64(1) << (exp - subBits)) - 1
}

// Observe records one duration (negative durations count as 0).
func (h *Histogram) Observe(d time.Duration) {
	ns := uint64(0)
	if d > 0 {
		ns = uint64(d)
	}
	h.counts[bucketOf(ns)].Add(1)
	h.sumNs.Add(ns)
	h.n.Add(1)
}

// Count returns the number of observations.
func (h *Histogram) Count() uint64 { return h.n.Load() }

// Sum returns the total of all observations.
func (h *Histogram) Sum() time.Duration { return time.Duration(h.sumNs.Load()) }

// Quantile returns an upper estimate of the q-quantile (0 ≤ q ≤ 1), within
// one bucket (12.5%); 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return time.Duration(bucketUpper(i))
		}
	}
	return time.Duration(bucketUpper(len(h.counts) - 1))
}

// Buckets returns cumulative counts at the given upper bounds, for export.
func (h *Histogram) Buckets(bounds []time.Duration) []uint64 {
	out := make([]uint64, len(bounds))
	for i := range h.counts {
		c := h.counts[i].Load()
		if c == 0 {
			continue
		}
		up := time.Duration(bucketUpper(i))
		for j, b := range bounds {
			if up <= b {
				out[j] += c
			}
		}
	}
	return out
}

// Reset clears the histogram. It is not atomic with concurrent Observe calls.
func (h *Histogram) Reset() {
	for i := range h.counts {
		h.counts[i].Store(0)
	}
	h.sumNs.Store(0)
	h.n.Store(0)
}

// Merge adds o's observations to h.
func (h *Histogram) Merge(o *Histogram) {
	for i := range o.counts {
		if c := o.counts[i].Load(); c != 0 {
			h.counts[i].Add(c)
		}
	}
	h.sumNs.Add(o.sumNs.Load())
	h.n.Add(o.n.Load())
}
