package bench

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
)

// InterleavedResult compares one pool configuration on Goroutines
// goroutines with the driver's stream-ordered allocator on one, the two
// timed in alternating windows: a window runs WindowPoolPairs of the
// pool's pairs on every goroutine at once, then WindowAnchorPairs of the
// driver's on the first goroutine alone, in batches of BatchPairs, the
// driver on the first goroutine's request stream; every working set is
// live throughout. A host whose speed moves from one moment to the next (a
// virtual machine's CPU shared with others, a clock that steps) then moves
// both the same way, which rows timed one after the other cannot promise:
// their ratio compares two moments as well as two allocators. Against the
// driver on one goroutine, the ratios on several are the strictest
// reading of "×N goroutines against the driver" (the driver on as many
// goroutines only slows down: see the rows timed apart).
type InterleavedResult struct {
	Pool   string `json:"pool"`   // e.g. "memwall bestfit/virtual"
	Anchor string `json:"anchor"` // DriverAsync (DriverVulkan on Vulkan)
	Mix    string `json:"mix"`
	// Goroutines run the pool's side of each window at once.
	Goroutines int `json:"goroutines"`
	Live       int `json:"live"`
	// Windows is the number of windows; PoolPairs (over all goroutines)
	// and AnchorPairs count the pairs timed in them.
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
	// PoolPairsPerSec is the pool's pairs over the time of its windows
	// (each window's longest goroutine in its batches), AnchorPairsPerSec
	// the driver's batched pairs over their time (stalls included in
	// both); ThroughputRatio is the first over the second.
	PoolPairsPerSec   float64 `json:"pool_pairs_per_sec"`
	AnchorPairsPerSec float64 `json:"anchor_pairs_per_sec"`
	ThroughputRatio   float64 `json:"throughput_ratio"`
	// DeviceCalls counts the pool's driver calls from the first window to
	// the last (maps, unmaps, creates and releases: each tens of µs on
	// the goroutine that makes it).
	DeviceCalls uint64 `json:"device_calls"`
	Note        string `json:"note,omitempty"`
}

// WindowPoolPairs and WindowAnchorPairs are how many pairs of the pool's
// (per goroutine) and of the driver's an interleaved window holds: on an
// H200 host about as long each (some 100 µs), long enough that the caches
// each leaves to the other cost little, short against the host's changes
// of speed.
const (
	WindowPoolPairs   = 40 * BatchPairs
	WindowAnchorPairs = 4 * BatchPairs
)

// interleaved times g's pool (strategy s) on n goroutines against the
// anchor's allocator as InterleavedResult says, for o.DriverPairs of the
// driver's pairs (WindowAnchorPairs a window) and as many windows of the
// pool's, after every goroutine ran o.Pairs/4 warm-up pairs untimed on
// each. A failure of the driver becomes the row's note; one of the pool
// is returned.
func interleaved(anchor DriverAnchor, name string, async bool, d device.Device, s string, g Policy, mix Mix, n int, o AllocOptions) (InterleavedResult, error) {
	windows := max(1, o.DriverPairs/WindowAnchorPairs)
	live := liveBlocks(d, mix, n+1, o)
	res := InterleavedResult{Pool: fmt.Sprintf("memwall %s/%s", s, g.Name), Anchor: name, Mix: mix.Name, Goroutines: n, Live: live}
	po := g.Options
	po.Name, po.Strategy = "bench", s
	p, err := pool.New(d, po)
	if err != nil {
		return res, err
	}
	defer p.Close()
	ws := make([]AllocWorkload, n)
	for gi := range ws {
		ws[gi] = workload(mix, uint64(gi)+1, live, o.Pairs/4, windows*WindowPoolPairs)
	}
	pw, err := newPoolWindows(p, ws)
	if err != nil {
		return res, err
	}
	defer pw.close()
	calls := p.Stats().DeviceCalls()
	poolBatches, anchorBatches, ratios, poolTime, err := interleave(anchor, async, ws[0], windows, time.Now, pw.window)
	res.DeviceCalls = p.Stats().DeviceCalls() - calls
	if err != nil {
		if _, ok := err.(poolError); ok {
			return res, err
		}
		res.Note = err.Error()
		return res, nil
	}
	res.fill(poolBatches, anchorBatches, ratios, poolTime)
	return res, nil
}

// poolError marks a failure of the pool (not the driver) in interleave.
type poolError struct{ error }

func (e poolError) Unwrap() error { return e.error }

// interleave opens the anchor (its stream-ordered allocator with async) on
// this goroutine with w's working set, runs w's warm-up pairs on it
// untimed, then windows times: window k of the pool's through poolWindow
// (which appends its batch times per pair to its argument and returns the
// time the window took), then the driver's batches on the window's first
// WindowAnchorPairs of w. It returns the pool's and the driver's batch
// times, per pair, each window's ratio and the pool's time over all
// windows; the driver's times are read from now.
func interleave(anchor DriverAnchor, async bool, w AllocWorkload, windows int, now func() time.Time,
	poolWindow func(k int, into []float64) ([]float64, time.Duration, error)) (poolBatches, anchorBatches, ratios []float64, poolTime time.Duration, err error) {
	r, err := openAnchor(anchor, async, w.Initial)
	if err != nil {
		return nil, nil, nil, 0, err
	}
	defer func() {
		if cerr := r.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	warm := AllocWorkload{Initial: w.Initial, Sizes: w.Sizes[:w.Warmup], Victims: w.Victims[:w.Warmup], Warmup: w.Warmup}
	if _, _, r.live, err = timePairs(warm, r.alloc, r.free, r.live, now, false, BatchPairs); err != nil {
		return nil, nil, nil, 0, err
	}
	runtime.GC() // no collection while the two are timed
	// Nothing grows while the two are timed: no allocation for a collection
	// to follow.
	anchorBatches = make([]float64, 0, windows*WindowAnchorPairs/BatchPairs)
	ratios = make([]float64, 0, windows)
	var window []float64
	drv := make([]float64, 0, WindowAnchorPairs/BatchPairs)
	for k := 0; k < windows; k++ {
		var dt time.Duration
		window, dt, err = poolWindow(k, window[:0])
		if err != nil {
			return nil, nil, nil, 0, poolError{err}
		}
		poolTime += dt
		if poolBatches == nil {
			poolBatches = make([]float64, 0, windows*len(window))
		}
		poolBatches = append(poolBatches, window...)
		first := w.Warmup + k*WindowPoolPairs
		ws := AllocWorkload{Initial: w.Initial, Sizes: w.Sizes[first : first+WindowAnchorPairs], Victims: w.Victims[first : first+WindowAnchorPairs]}
		var ts []time.Duration
		if ts, _, r.live, err = timePairs(ws, r.alloc, r.free, r.live, now, false, BatchPairs); err != nil {
			return nil, nil, nil, 0, err
		}
		drv = drv[:0]
		for _, t := range ts {
			drv = append(drv, float64(t)/BatchPairs)
		}
		anchorBatches = append(anchorBatches, drv...)
		ratios = append(ratios, quantile(window, 0.5)/quantile(drv, 0.5))
	}
	return poolBatches, anchorBatches, ratios, poolTime, nil
}

// fill sets the result's figures from the batch times per pair, the
// windows' ratios and the pool's time in its windows.
func (res *InterleavedResult) fill(poolBatches, anchorBatches, ratios []float64, poolTime time.Duration) {
	res.Windows = len(ratios)
	res.PoolPairs, res.AnchorPairs = len(poolBatches)*BatchPairs, len(anchorBatches)*BatchPairs
	var anchorSum float64
	for _, x := range anchorBatches {
		anchorSum += x
	}
	if poolTime > 0 && anchorSum > 0 {
		res.PoolPairsPerSec = float64(res.PoolPairs) / poolTime.Seconds()
		// Each batch time is per pair: pairs over time is batches over
		// their sum.
		res.AnchorPairsPerSec = float64(len(anchorBatches)) / anchorSum * 1e9
		res.ThroughputRatio = res.PoolPairsPerSec / res.AnchorPairsPerSec
	}
	res.PoolBatchP50ns, res.AnchorBatchP50ns = quantile(poolBatches, 0.5), quantile(anchorBatches, 0.5)
	if res.AnchorBatchP50ns > 0 {
		res.P50Ratio = res.PoolBatchP50ns / res.AnchorBatchP50ns
	}
	res.WindowRatioP50, res.WindowRatioP90 = quantile(ratios, 0.5), quantile(ratios, 0.9)
}

// poolWindows runs the pool's side of interleaved windows on as many
// goroutines as it has request streams: the caller's for the first, a
// worker of its own for each other. Between windows the workers wait
// spinning (for up to spinFor, then yielding as they spin), not parked: a
// parked goroutine wakes on whichever processor is free, away from the
// pool's per-processor cache and shard it used, and on a cold CPU; the
// rows timed apart keep their goroutines running too.
type poolWindows struct {
	p      *pool.Pool
	ws     []AllocWorkload
	blocks [][]pool.Block
	times  [][]float64     // per goroutine: the window's batch times per pair
	spent  []time.Duration // per goroutine: the window's time in batches
	errs   []error
	k      int          // the window to run (-1: working sets and warm-up); written before seq moves
	seq    atomic.Int64 // windows started
	ended  atomic.Int64 // windows the workers ended, over all workers
	stop   atomic.Bool
	exited sync.WaitGroup
}

// spinFor is how long a goroutine waiting between windows spins before it
// yields its processor at every turn (so that a machine with fewer
// processors than goroutines still makes progress).
const spinFor = time.Millisecond

// spinUntil spins until done reports true, yielding at every turn after
// spinFor.
func spinUntil(done func() bool) {
	t0 := time.Now()
	for i := 0; !done(); i++ {
		if i%64 == 63 && time.Since(t0) > spinFor {
			runtime.Gosched()
		}
	}
}

// newPoolWindows allocates every stream's working set on p and runs its
// warm-up pairs, each on the goroutine that will run its windows.
func newPoolWindows(p *pool.Pool, ws []AllocWorkload) (*poolWindows, error) {
	n := len(ws)
	pw := &poolWindows{p: p, ws: ws, blocks: make([][]pool.Block, n), times: make([][]float64, n),
		spent: make([]time.Duration, n), errs: make([]error, n)}
	for gi := range ws {
		pw.times[gi] = make([]float64, 0, WindowPoolPairs/BatchPairs)
	}
	for gi := 1; gi < n; gi++ {
		pw.exited.Add(1)
		go func() {
			defer pw.exited.Done()
			for seen := int64(0); ; seen++ {
				spinUntil(func() bool { return pw.seq.Load() > seen || pw.stop.Load() })
				if pw.stop.Load() {
					return
				}
				pw.run(gi, pw.k)
				pw.ended.Add(1)
			}
		}()
	}
	if _, _, err := pw.window(-1, nil); err != nil {
		pw.close()
		return nil, err
	}
	return pw, nil
}

// window runs window k (-1: the working sets and the warm-up) on every
// goroutine at once, appends every batch time per pair to into and
// returns it with the longest goroutine's time in its batches.
func (pw *poolWindows) window(k int, into []float64) ([]float64, time.Duration, error) {
	workers := int64(len(pw.ws) - 1)
	pw.k = k
	want := (pw.seq.Add(1)) * workers
	pw.run(0, k)
	spinUntil(func() bool { return pw.ended.Load() == want })
	var longest time.Duration
	for gi := range pw.ws {
		if pw.errs[gi] != nil {
			return into, 0, fmt.Errorf("goroutine %d: %w", gi, pw.errs[gi])
		}
		into = append(into, pw.times[gi]...)
		longest = max(longest, pw.spent[gi])
	}
	return into, longest, nil
}

// run runs window k of goroutine gi's stream on its working set.
func (pw *poolWindows) run(gi, k int) {
	w, p := pw.ws[gi], pw.p
	pw.times[gi], pw.spent[gi] = pw.times[gi][:0], 0
	if pw.errs[gi] != nil {
		return
	}
	if k < 0 {
		for _, size := range w.Initial {
			b, err := p.Alloc(size, pool.AllocOptions{})
			if err != nil {
				pw.errs[gi] = err
				return
			}
			pw.blocks[gi] = append(pw.blocks[gi], b)
		}
		_, pw.errs[gi] = poolPairs(p, pw.blocks[gi], w.Sizes[:w.Warmup], w.Victims[:w.Warmup])
		return
	}
	first := w.Warmup + k*WindowPoolPairs
	for b := first; b < first+WindowPoolPairs; b += BatchPairs {
		dt, err := poolPairs(p, pw.blocks[gi], w.Sizes[b:b+BatchPairs], w.Victims[b:b+BatchPairs])
		if err != nil {
			pw.errs[gi] = err
			return
		}
		pw.spent[gi] += dt
		pw.times[gi] = append(pw.times[gi], float64(dt)/BatchPairs)
	}
}

// close stops the workers and frees every block still held.
func (pw *poolWindows) close() {
	pw.stop.Store(true)
	pw.exited.Wait()
	for _, bs := range pw.blocks {
		for _, b := range bs {
			_ = pw.p.Free(b) // the pool closes next; its error, if any, is the run's
		}
	}
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
