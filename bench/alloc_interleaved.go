package bench

import (
	"fmt"
	"runtime"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
)

// InterleavedResult compares one pool configuration with the driver's
// stream-ordered allocator on one goroutine, the two timed in alternating
// windows: a window runs WindowPoolPairs of the pool's pairs, then
// WindowAnchorPairs of the driver's, in batches of BatchPairs, on the same
// request stream
// (the pool's first goroutine's), each with a working set of its own live
// at once. A host whose speed moves from one moment to the next (a virtual
// machine's CPU shared with others, a clock that steps) then moves both
// the same way, which rows timed one after the other cannot promise: their
// ratio compares two moments as well as two allocators.
type InterleavedResult struct {
	Pool   string `json:"pool"`   // e.g. "memwall bestfit/virtual"
	Anchor string `json:"anchor"` // DriverAsync (DriverVulkan on Vulkan)
	Mix    string `json:"mix"`
	Live   int    `json:"live"`
	// Windows is the number of windows; PoolPairs and AnchorPairs count
	// the pairs timed in them.
	Windows     int `json:"windows"`
	PoolPairs   int `json:"pool_pairs"`
	AnchorPairs int `json:"anchor_pairs"`
	// PoolBatchP50ns and AnchorBatchP50ns are the median pair of every
	// batch timed, as LatencyResult.BatchP50ns; P50Ratio is the first over
	// the second.
	PoolBatchP50ns   float64 `json:"pool_batch_p50_ns"`
	AnchorBatchP50ns float64 `json:"anchor_batch_p50_ns"`
	P50Ratio         float64 `json:"p50_ratio"`
	// WindowRatioP50 and WindowRatioP90 are quantiles over the windows of
	// the window's median pool batch over its median driver batch: the
	// ratio taken moment by moment.
	WindowRatioP50 float64 `json:"window_ratio_p50"`
	WindowRatioP90 float64 `json:"window_ratio_p90"`
	// PoolPairsPerSec and AnchorPairsPerSec are each one's batched pairs
	// over the time spent in them (every window's, stalls included);
	// ThroughputRatio is the first over the second.
	PoolPairsPerSec   float64 `json:"pool_pairs_per_sec"`
	AnchorPairsPerSec float64 `json:"anchor_pairs_per_sec"`
	ThroughputRatio   float64 `json:"throughput_ratio"`
	Note              string  `json:"note,omitempty"`
}

// WindowPoolPairs and WindowAnchorPairs are how many pairs of the pool's
// and of the driver's an interleaved window holds: on an H200 host about
// as long each (some 100 µs), long enough that the caches each leaves to
// the other cost little, short against the host's changes of speed.
const (
	WindowPoolPairs   = 40 * BatchPairs
	WindowAnchorPairs = 4 * BatchPairs
)

// interleaved times g's pool (strategy s) against the anchor's allocator
// as InterleavedResult says, for o.DriverPairs of the driver's pairs
// (WindowAnchorPairs a window) and as many windows of the pool's, after both ran the
// same o.Pairs/4 warm-up pairs untimed. A failure of the driver becomes
// the row's note; one of the pool is returned.
func interleaved(anchor DriverAnchor, name string, async bool, d device.Device, s string, g Policy, mix Mix, o AllocOptions) (InterleavedResult, error) {
	windows := max(1, o.DriverPairs/WindowAnchorPairs)
	live := liveBlocks(d, mix, 2, o)
	w := workload(mix, 1, live, o.Pairs/4, windows*WindowPoolPairs)
	res := InterleavedResult{Pool: fmt.Sprintf("memwall %s/%s", s, g.Name), Anchor: name, Mix: mix.Name, Live: live}
	po := g.Options
	po.Name, po.Strategy = "bench", s
	p, err := pool.New(d, po)
	if err != nil {
		return res, err
	}
	defer p.Close()
	blocks := make([]pool.Block, 0, live)
	defer func() {
		for _, b := range blocks {
			_ = p.Free(b) // the pool closes next; its error, if any, is the run's
		}
	}()
	for _, size := range w.Initial {
		b, err := p.Alloc(size, pool.AllocOptions{})
		if err != nil {
			return res, err
		}
		blocks = append(blocks, b)
	}
	if _, err := poolPairs(p, blocks, w.Sizes[:w.Warmup], w.Victims[:w.Warmup]); err != nil {
		return res, err
	}
	poolBatches, anchorBatches, ratios, err := interleave(anchor, async, w, windows, time.Now, func(from int) (time.Duration, error) {
		return poolPairs(p, blocks, w.Sizes[from:from+BatchPairs], w.Victims[from:from+BatchPairs])
	})
	if err != nil {
		if _, ok := err.(poolError); ok {
			return res, err
		}
		res.Note = err.Error()
		return res, nil
	}
	res.fill(poolBatches, anchorBatches, ratios)
	return res, nil
}

// poolError marks a failure of the pool (not the driver) in interleave.
type poolError struct{ error }

func (e poolError) Unwrap() error { return e.error }

// interleave opens the anchor (its stream-ordered allocator with async) on
// this goroutine with w's working set, runs
// w's warm-up pairs on it untimed, then windows times: batches of the
// pool's through batch (the index of the batch's first pair in w.Sizes),
// then the driver's batches on the window's first WindowAnchorPairs. It
// returns the pool's and the driver's batch times, per pair, and each
// window's ratio; the driver's are read from now.
func interleave(anchor DriverAnchor, async bool, w AllocWorkload, windows int, now func() time.Time, batch func(from int) (time.Duration, error)) (poolBatches, anchorBatches, ratios []float64, err error) {
	r, err := openAnchor(anchor, async, w.Initial)
	if err != nil {
		return nil, nil, nil, err
	}
	defer func() {
		if cerr := r.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	warm := AllocWorkload{Initial: w.Initial, Sizes: w.Sizes[:w.Warmup], Victims: w.Victims[:w.Warmup], Warmup: w.Warmup}
	if _, _, r.live, err = timePairs(warm, r.alloc, r.free, r.live, now, false, BatchPairs); err != nil {
		return nil, nil, nil, err
	}
	runtime.GC() // no collection while the two are timed
	// Nothing grows while the two are timed: no allocation for a collection
	// to follow.
	poolBatches = make([]float64, 0, windows*WindowPoolPairs/BatchPairs)
	anchorBatches = make([]float64, 0, windows*WindowAnchorPairs/BatchPairs)
	ratios = make([]float64, 0, windows)
	window := make([]float64, 0, WindowPoolPairs/BatchPairs)
	drv := make([]float64, 0, WindowAnchorPairs/BatchPairs)
	for k := 0; k < windows; k++ {
		first := w.Warmup + k*WindowPoolPairs
		window = window[:0]
		for b := first; b < first+WindowPoolPairs; b += BatchPairs {
			dt, err := batch(b)
			if err != nil {
				return nil, nil, nil, poolError{err}
			}
			window = append(window, float64(dt)/BatchPairs)
		}
		poolBatches = append(poolBatches, window...)
		ws := AllocWorkload{Initial: w.Initial, Sizes: w.Sizes[first : first+WindowAnchorPairs], Victims: w.Victims[first : first+WindowAnchorPairs]}
		var ts []time.Duration
		if ts, _, r.live, err = timePairs(ws, r.alloc, r.free, r.live, now, false, BatchPairs); err != nil {
			return nil, nil, nil, err
		}
		drv = drv[:0]
		for _, t := range ts {
			drv = append(drv, float64(t)/BatchPairs)
		}
		anchorBatches = append(anchorBatches, drv...)
		ratios = append(ratios, quantile(window, 0.5)/quantile(drv, 0.5))
	}
	return poolBatches, anchorBatches, ratios, nil
}

// fill sets the result's figures from the batch times per pair and the
// windows' ratios.
func (res *InterleavedResult) fill(poolBatches, anchorBatches, ratios []float64) {
	res.Windows = len(ratios)
	res.PoolPairs, res.AnchorPairs = len(poolBatches)*BatchPairs, len(anchorBatches)*BatchPairs
	var poolSum, anchorSum float64
	for _, x := range poolBatches {
		poolSum += x
	}
	for _, x := range anchorBatches {
		anchorSum += x
	}
	if poolSum > 0 && anchorSum > 0 {
		// Each batch time is per pair: pairs over time is batches over
		// their sum.
		res.PoolPairsPerSec = float64(len(poolBatches)) / poolSum * 1e9
		res.AnchorPairsPerSec = float64(len(anchorBatches)) / anchorSum * 1e9
		res.ThroughputRatio = res.PoolPairsPerSec / res.AnchorPairsPerSec
	}
	res.PoolBatchP50ns, res.AnchorBatchP50ns = quantile(poolBatches, 0.5), quantile(anchorBatches, 0.5)
	if res.AnchorBatchP50ns > 0 {
		res.P50Ratio = res.PoolBatchP50ns / res.AnchorBatchP50ns
	}
	res.WindowRatioP50, res.WindowRatioP90 = quantile(ratios, 0.5), quantile(ratios, 0.9)
}

// poolPairs runs one pair per size on p's working set blocks (free the
// victim, allocate its replacement in its slot) and returns the time they
// took together.
func poolPairs(p *pool.Pool, blocks []pool.Block, sizes []uint64, victims []int) (time.Duration, error) {
	t0 := time.Now()
	for j, size := range sizes {
		k := victims[j]
		err := p.Free(blocks[k])
		b, aerr := p.Alloc(size, pool.AllocOptions{})
		if err != nil || aerr != nil {
			return 0, fmt.Errorf("pair: free %v, alloc %d: %v", err, size, aerr)
		}
		blocks[k] = b
	}
	return time.Since(t0), nil
}
