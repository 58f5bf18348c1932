package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
)

// Mix is a named distribution of allocation sizes.
type Mix struct {
	Name string
	// Min and Max bound a log-uniform distribution; Min == Max is fixed.
	Min, Max uint64
}

// DefaultMixes are the size mixes `memwall bench alloc` measures.
func DefaultMixes() []Mix {
	return []Mix{
		{"random 512B-64MiB", 512, 64 << 20},
		{"fixed 4KiB", 4 << 10, 4 << 10},
		{"fixed 1MiB", 1 << 20, 1 << 20},
		{"fixed 64MiB", 64 << 20, 64 << 20},
	}
}

// mean is the expected size.
func (m Mix) mean() float64 {
	if m.Min >= m.Max {
		return float64(m.Min)
	}
	return float64(m.Max-m.Min) / math.Log(float64(m.Max)/float64(m.Min))
}

func (m Mix) sample(r *rand.Rand) uint64 {
	if m.Min >= m.Max {
		return m.Min
	}
	lo, hi := math.Log(float64(m.Min)), math.Log(float64(m.Max))
	return uint64(math.Exp(lo + r.Float64()*(hi-lo)))
}

// Policy is a named pool configuration (strategy is set per run).
type Policy struct {
	Name    string
	Options pool.Options
}

// DefaultPolicies are the pool's default (virtual memory, with its soft
// memory target that moves pages to stay near peak use), the same keeping
// every page it mapped (no driver calls once warm: the latency end of the
// trade-off), and chunk growth.
func DefaultPolicies() []Policy {
	return []Policy{
		{"virtual", pool.Options{Growth: pool.GrowVirtual}},
		{"virtual-keep", pool.Options{Growth: pool.GrowVirtual, TargetRatio: pool.NoTarget}},
		{"chunks", pool.Options{Growth: pool.GrowChunks}},
	}
}

// AllocOptions configure Alloc.
type AllocOptions struct {
	Mixes      []Mix
	Strategies []string // pool strategies (default bestfit, tlsf)
	// Policies are the pool configurations measured per strategy
	// (default DefaultPolicies).
	Policies   []Policy
	Goroutines []int // default 1, 4, 16
	// Pairs is the number of timed free+alloc pairs per goroutine (default 20000).
	Pairs int
	// Live is the working set each goroutine keeps (default 32 blocks).
	Live int
	// DriverPairs is the number of driver free+alloc pairs timed for the
	// anchors (default 2000), on the same request stream as the pool's
	// first goroutine (its working set, victims and sizes), and again
	// with each allocation freed at once; for each goroutine count above
	// one, that many per goroutine, every goroutine on the request stream
	// of the pool's goroutine of the same index.
	DriverPairs int
	Progress    func(done, total int, name string)
}

// LatencyResult is one configuration's numbers.
type LatencyResult struct {
	Allocator  string `json:"allocator"` // e.g. "memwall bestfit/virtual", "cuMemAllocAsync"
	Mix        string `json:"mix"`
	Goroutines int    `json:"goroutines"`
	Pairs      int    `json:"pairs"`
	// Live is the working set of each goroutine: every pair frees one of
	// Live blocks and allocates its replacement; 0 when every allocation
	// is freed at once (a driver row labelled "freed at once").
	Live int `json:"live"`
	// BatchP50ns is the median latency of one free+alloc pair measured
	// over batches of BatchPairs pairs timed together, so the two clock
	// reads (TimerOverheadNs, as much as a tenth of a driver pair on some
	// hosts) are spread over the batch; the ratios use it.
	BatchP50ns float64 `json:"batch_p50_ns"`
	// P50ns and P99ns time every pair on its own: clock overhead included,
	// an upper bound.
	P50ns      float64 `json:"p50_ns"`
	P99ns      float64 `json:"p99_ns"`
	AllocP50ns float64 `json:"alloc_p50_ns"`
	FreeP50ns  float64 `json:"free_p50_ns"`
	// PairsPerSec is total throughput over all goroutines, for every
	// allocator the same way: the pairs timed in batches (two clock
	// reads per BatchPairs pairs) over the longest goroutine's time in
	// them, so that it counts neither the clock reads of the pairs timed
	// one by one nor the goroutines' start. TotalPairs counts every timed
	// pair (batched, one by one, and split), the pairs DeviceCalls were
	// made in.
	PairsPerSec  float64 `json:"pairs_per_sec"`
	TotalPairs   int     `json:"total_pairs,omitempty"`
	DeviceCalls  uint64  `json:"device_calls,omitempty"`
	ReservedPeak uint64  `json:"peak_reserved_bytes,omitempty"`
	// VsAnchor is BatchP50ns over the anchor's on one goroutine and the
	// same mix (cuMemAllocAsync; vkAllocateMemory on Vulkan), the ratio
	// the goals are stated in; 0 without an anchor row.
	VsAnchor float64 `json:"vs_anchor,omitempty"`
	Note     string  `json:"note,omitempty"`
}

// AllocReport is the whole benchmark.
type AllocReport struct {
	Device  string          `json:"device"`
	Backend string          `json:"backend"`
	Results []LatencyResult `json:"results"`
	// Interleaved compares, per mix and goroutine count, the first policy
	// and strategy with the anchor the ratios are taken against on one
	// goroutine, timed in alternating windows (InterleavedResult); empty
	// without an anchor.
	Interleaved []InterleavedResult `json:"interleaved,omitempty"`
	// TimerOverheadNs is the cost of one pair of clock reads, included in
	// every per-operation latency above.
	TimerOverheadNs float64 `json:"timer_overhead_ns"`
}

// BatchPairs is how many pairs one timed batch holds.
const BatchPairs = 16

// AnchorNamer is implemented by anchors that are not CUDA's (device/vulkan):
// AnchorName names the allocator timed with async false or true, "" for
// none.
type AnchorNamer interface {
	AnchorName(async bool) string
}

// DriverVulkan is the anchor's Allocator name on Vulkan, which has no
// stream-ordered allocator: ratios are taken against it there.
const DriverVulkan = "vkAllocateMemory"

// DriverAsync is the Allocator name of the anchor ratios are taken
// against: cuMemAllocAsync on the pool's own request stream.
const DriverAsync = "cuMemAllocAsync"

// workload draws the request stream of one goroutine: live blocks, then
// warm pairs and pairs more, each a victim slot and a new size.
func workload(mix Mix, seed uint64, live, warm, pairs int) AllocWorkload {
	w, _ := drawWorkload(context.Background(), mix, seed, live, warm, pairs)
	return w
}

// checkEvery is how many iterations a long loop runs between two looks at
// its context: a look costs tens of nanoseconds, an iteration at least a
// few, so that a cancelled run stops within milliseconds.
const checkEvery = 1024

// drawWorkload is workload, stopped with ctx's error when ctx is done.
func drawWorkload(ctx context.Context, mix Mix, seed uint64, live, warm, pairs int) (AllocWorkload, error) {
	r := rand.New(rand.NewPCG(seed, 99))
	w := AllocWorkload{Initial: make([]uint64, live), Warmup: warm,
		Sizes: make([]uint64, warm+pairs), Victims: make([]int, warm+pairs)}
	for i := range w.Initial {
		w.Initial[i] = mix.sample(r)
	}
	for i := range w.Sizes {
		if i%checkEvery == 0 {
			if err := ctx.Err(); err != nil {
				return w, fmt.Errorf("stopped while drawing the requests (%d of %d drawn), before any pair was timed: %w", i, len(w.Sizes), err)
			}
		}
		w.Sizes[i] = mix.sample(r)
		w.Victims[i] = r.IntN(live)
	}
	return w, nil
}

// liveBlocks is the working set per goroutine: o.Live, fewer when the
// working sets of all goroutines would pass a third of the device's memory
// or most of what is free.
func liveBlocks(d device.Device, mix Mix, goroutines int, o AllocOptions) int {
	n := o.Live
	budget := float64(d.Info().TotalBytes) / 3
	if free, _, err := d.MemInfo(); err == nil {
		// Another process may hold most of the device: a third of the
		// total would not fit then (on an idle device this changes nothing).
		budget = min(budget, 0.8*float64(free))
	}
	if float64(goroutines*n)*mix.mean() > budget {
		n = max(2, int(budget/(float64(goroutines)*mix.mean())))
	}
	return n
}

// Alloc measures memwall's pool against the driver's allocators.
func Alloc(ctx context.Context, d device.Device, o AllocOptions) (AllocReport, error) {
	if len(o.Mixes) == 0 {
		o.Mixes = DefaultMixes()
	}
	if len(o.Strategies) == 0 {
		o.Strategies = []string{"bestfit", "tlsf"}
	}
	if len(o.Policies) == 0 {
		o.Policies = DefaultPolicies()
	}
	if len(o.Goroutines) == 0 {
		o.Goroutines = []int{1, 4, 16}
	}
	if o.Pairs <= 0 {
		o.Pairs = 20000
	}
	if o.Live <= 0 {
		o.Live = 32
	}
	if o.DriverPairs <= 0 {
		o.DriverPairs = 2000
	}
	in := d.Info()
	rep := AllocReport{Device: in.Name, Backend: in.Backend, TimerOverheadNs: timerOverhead()}
	anchor, hasAnchor := d.(DriverAnchor)
	total := len(o.Mixes) * (len(o.Strategies)*len(o.Policies) + 2) * len(o.Goroutines)
	if hasAnchor {
		total += len(o.Mixes) * len(o.Goroutines)
	}
	done := 0
	step := func(name string) {
		done++
		if o.Progress != nil {
			o.Progress(done, total, name)
		}
	}
	for _, mix := range o.Mixes {
		for _, g := range o.Policies {
			if g.Options.Growth == pool.GrowVirtual && !in.VirtualMemory {
				continue
			}
			for _, s := range o.Strategies {
				for _, n := range o.Goroutines {
					if err := ctx.Err(); err != nil {
						return rep, err
					}
					r, err := poolLatency(ctx, d, s, g, mix, n, o)
					if err != nil {
						return rep, fmt.Errorf("bench alloc: %s/%s %s ×%d: %w", s, g.Name, mix.Name, n, err)
					}
					rep.Results = append(rep.Results, r)
					step(r.Allocator)
				}
			}
		}
		for _, async := range []bool{false, true} {
			name := "cuMemAlloc"
			if async {
				name = DriverAsync
			}
			if nm, named := d.(AnchorNamer); named {
				if name = nm.AnchorName(async); name == "" {
					continue // the backend has no such allocator
				}
			}
			if !hasAnchor {
				for range o.Goroutines {
					step(name)
				}
				continue
			}
			for _, n := range o.Goroutines {
				if err := ctx.Err(); err != nil {
					return rep, err
				}
				if n > 1 {
					rep.Results = append(rep.Results, driverConcurrent(anchor, d, name, mix, n, async, o))
					step(name)
					continue
				}
				// The pool's request stream (its first goroutine's), and
				// the same sizes with each block freed at once.
				w := workload(mix, 1, liveBlocks(d, mix, 1, o), o.DriverPairs/4, o.DriverPairs)
				for _, ws := range []AllocWorkload{w, {Sizes: w.Sizes, Warmup: w.Warmup}} {
					label := name
					if len(ws.Initial) == 0 {
						label += " (freed at once)"
					}
					rep.Results = append(rep.Results, driverLatency(anchor, label, mix, ws, async))
				}
				step(name)
			}
		}
		for _, n := range o.Goroutines {
			if !hasAnchor {
				break // no driver to interleave with
			}
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			r, err := interleavedRow(anchor, d, mix, n, o)
			if err != nil {
				return rep, fmt.Errorf("bench alloc: interleaved %s ×%d: %w", mix.Name, n, err)
			}
			if r != nil {
				rep.Interleaved = append(rep.Interleaved, *r)
			}
			step("interleaved")
		}
	}
	rep.fillRatios()
	return rep, nil
}

// interleavedRow times the first policy the device can run, with the first
// strategy, on n goroutines, against the anchor the ratios are taken
// against (DriverAsync, or the AnchorNamer's) on one, in alternating
// windows; nil when there is no such policy or anchor.
func interleavedRow(anchor DriverAnchor, d device.Device, mix Mix, n int, o AllocOptions) (*InterleavedResult, error) {
	name, async := DriverAsync, true
	if nm, named := d.(AnchorNamer); named {
		if name = nm.AnchorName(true); name == "" {
			name, async = nm.AnchorName(false), false
		}
	}
	if name == "" {
		return nil, nil
	}
	for _, g := range o.Policies {
		if g.Options.Growth == pool.GrowVirtual && !d.Info().VirtualMemory {
			continue
		}
		r, err := interleaved(anchor, name, async, d, o.Strategies[0], g, mix, n, o)
		return &r, err
	}
	return nil, nil
}

// driverConcurrent times the driver's allocator on n goroutines at once,
// each replaying the request stream of the pool's goroutine of the same
// index (its own working set, victims and sizes) on a stream of its own:
// batches of pairs timed together, then, all together again, pairs timed
// one by one. PairsPerSec is the timed pairs of all goroutines over the
// longest time one goroutine spent in its timed batches (the goroutines
// start together and run the same number of pairs). A failure becomes the
// row's note.
func driverConcurrent(anchor DriverAnchor, d device.Device, name string, mix Mix, n int, async bool, o AllocOptions) LatencyResult {
	live := liveBlocks(d, mix, n, o)
	res := LatencyResult{Allocator: name, Mix: mix.Name, Goroutines: n, Live: live}
	batches := make([][]time.Duration, n)
	pairs := make([][]time.Duration, n)
	errs := make([]error, n)
	phase := func(batched bool) {
		runtime.GC() // as for the pool: no collection while the driver is timed
		var wg sync.WaitGroup
		for gi := 0; gi < n; gi++ {
			wg.Add(1)
			go func(gi int) {
				defer wg.Done()
				w := workload(mix, uint64(gi)+1, live, o.DriverPairs/4, o.DriverPairs)
				var err error
				if batched {
					batches[gi], err = anchorBatchTimes(anchor, w, async, BatchPairs)
				} else {
					pairs[gi], err = anchorPairTimes(anchor, w, async)
				}
				if err != nil && errs[gi] == nil {
					errs[gi] = err
				}
			}(gi)
		}
		wg.Wait()
	}
	phase(true)
	phase(false)
	var batch, one []float64
	var longest time.Duration
	timed := 0
	for gi := 0; gi < n; gi++ {
		if errs[gi] != nil {
			res.Note = fmt.Sprintf("goroutine %d: %v", gi, errs[gi])
			return res
		}
		var sum time.Duration
		for _, b := range batches[gi] {
			sum += b
			batch = append(batch, float64(b)/BatchPairs)
		}
		longest = max(longest, sum)
		timed += len(batches[gi]) * BatchPairs
		one = append(one, durs(pairs[gi])...)
	}
	res.Pairs = len(one)
	res.BatchP50ns = quantile(batch, 0.5)
	res.P50ns, res.P99ns = quantile(one, 0.5), quantile(one, 0.99)
	if longest > 0 {
		res.PairsPerSec = float64(timed) / longest.Seconds()
	}
	return res
}

// driverLatency times the driver's allocator on w; a failure becomes the
// row's note.
func driverLatency(anchor DriverAnchor, name string, mix Mix, w AllocWorkload, async bool) LatencyResult {
	res := LatencyResult{Allocator: name, Mix: mix.Name, Goroutines: 1, Live: len(w.Initial)}
	runtime.GC() // as for the pool: no collection while the driver is timed
	pt, err := anchorPairTimes(anchor, w, async)
	var a, f, bt []time.Duration
	if err == nil {
		bt, err = anchorBatchTimes(anchor, w, async, BatchPairs)
	}
	if err == nil {
		quarter := w
		quarter.Sizes = w.Sizes[:w.Warmup+max(1, (len(w.Sizes)-w.Warmup)/4)]
		if len(w.Victims) > 0 {
			quarter.Victims = w.Victims[:len(quarter.Sizes)]
		}
		a, f, err = anchorAllocTimes(anchor, quarter, async)
	}
	if err != nil {
		res.Note = err.Error()
		return res
	}
	var sum time.Duration
	for _, x := range bt {
		sum += x
	}
	batch := durs(bt)
	for i := range batch {
		batch[i] /= BatchPairs
	}
	res.Pairs = len(pt)
	res.BatchP50ns = quantile(batch, 0.5)
	res.P50ns, res.P99ns = quantile(durs(pt), 0.5), quantile(durs(pt), 0.99)
	res.AllocP50ns, res.FreeP50ns = quantile(durs(a), 0.5), quantile(durs(f), 0.5)
	if sum > 0 {
		res.PairsPerSec = float64(len(bt)*BatchPairs) / sum.Seconds()
	}
	return res
}

func durs(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d)
	}
	return out
}

// quantile sorts xs in place and returns the q-quantile.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

func timerOverhead() float64 {
	const n = 10000
	xs := make([]float64, n)
	for i := range xs {
		t0 := time.Now()
		xs[i] = float64(time.Since(t0))
	}
	return quantile(xs, 0.5)
}

// poolLatency times free+alloc pairs on a fresh pool: each goroutine keeps a
// working set of live blocks and replaces one per pair, on its own request
// stream (workload; the driver anchor replays the first goroutine's). Every
// goroutine looks at ctx every checkEvery pairs, between timed batches.
func poolLatency(ctx context.Context, d device.Device, strategy string, g Policy, mix Mix, goroutines int, o AllocOptions) (LatencyResult, error) {
	po := g.Options
	po.Name, po.Strategy = "bench", strategy
	p, err := pool.New(d, po)
	if err != nil {
		return LatencyResult{}, err
	}
	defer p.Close()
	liveN := liveBlocks(d, mix, goroutines, o)
	type perG struct {
		pairs, batches, allocs, frees []float64
		batched                       time.Duration // time in the batches
		err                           error
	}
	res := make([]perG, goroutines)
	var wg, ready sync.WaitGroup
	start := make(chan struct{})
	for gi := 0; gi < goroutines; gi++ {
		wg.Add(1)
		ready.Add(1)
		go func(gi int) {
			defer wg.Done()
			var once sync.Once
			signal := func() { once.Do(ready.Done) }
			defer signal()
			w, err := drawWorkload(ctx, mix, uint64(gi)+1, liveN, o.Pairs/4, o.Pairs)
			if err != nil {
				res[gi].err = fmt.Errorf("goroutine %d: %w", gi, err)
				return
			}
			// stopped is ctx's error, at every checkEvery-th pair of a
			// loop, saying how far the loop got: "stopped after 4096 of
			// 20000 batched pairs".
			stopped := func(i int, what string, of int) error {
				if i%checkEvery != 0 || ctx.Err() == nil {
					return nil
				}
				return fmt.Errorf("goroutine %d: stopped after %d of %d %s: %w", gi, i, of, what, ctx.Err())
			}
			live := make([]pool.Block, liveN)
			for i, size := range w.Initial {
				b, err := p.Alloc(size, pool.AllocOptions{})
				if err != nil {
					res[gi].err = err
					return
				}
				live[i] = b
			}
			pr := perG{pairs: make([]float64, 0, o.Pairs), allocs: make([]float64, 0, o.Pairs), frees: make([]float64, 0, o.Pairs)}
			// Warm up untimed: the pool reaches its steady-state footprint,
			// as a server's would after its first requests.
			for i := 0; i < w.Warmup; i++ {
				if err := stopped(i, "warm-up pairs", w.Warmup); err != nil {
					res[gi].err = err
					return
				}
				k := w.Victims[i]
				if err := p.Free(live[k]); err != nil {
					res[gi].err = err
					return
				}
				b, err := p.Alloc(w.Sizes[i], pool.AllocOptions{})
				if err != nil {
					res[gi].err = err
					return
				}
				live[k] = b
			}
			sizes, ks := w.Sizes[w.Warmup:], w.Victims[w.Warmup:]
			pr.batches = make([]float64, 0, o.Pairs/BatchPairs)
			signal()
			<-start
			// Batches of pairs timed together: the median pair without
			// the clock's cost.
			for i := 0; i+BatchPairs <= o.Pairs && pr.err == nil; i += BatchPairs {
				if pr.err = stopped(i, "batched pairs", o.Pairs); pr.err != nil {
					break
				}
				t0 := time.Now()
				for j := i; j < i+BatchPairs; j++ {
					k := ks[j]
					err := p.Free(live[k])
					b, aerr := p.Alloc(sizes[j], pool.AllocOptions{})
					if err != nil || aerr != nil {
						pr.err = fmt.Errorf("batched pair %d: free %v, alloc %d: %v", j, err, sizes[j], aerr)
						break
					}
					live[k] = b
				}
				dt := time.Since(t0)
				pr.batched += dt
				pr.batches = append(pr.batches, float64(dt)/BatchPairs)
			}
			// Pairs: one clock read before the free and one after the
			// allocation, nothing between them (the same stream again).
			for i := 0; i < o.Pairs && pr.err == nil; i++ {
				if pr.err = stopped(i, "pairs timed one by one", o.Pairs); pr.err != nil {
					break
				}
				k := ks[i]
				t0 := time.Now()
				err := p.Free(live[k])
				b, aerr := p.Alloc(sizes[i], pool.AllocOptions{})
				t2 := time.Now()
				if err != nil || aerr != nil {
					pr.err = fmt.Errorf("pair %d: free %v, alloc %d: %v", i, err, sizes[i], aerr)
					break
				}
				live[k] = b
				pr.pairs = append(pr.pairs, float64(t2.Sub(t0)))
			}
			// Frees and allocations timed apart, on a quarter as many.
			for i := 0; i < o.Pairs/4 && pr.err == nil; i++ {
				if pr.err = stopped(i, "pairs with the free and the alloc timed apart", o.Pairs/4); pr.err != nil {
					break
				}
				k := ks[i]
				t0 := time.Now()
				err := p.Free(live[k])
				t1 := time.Now()
				b, aerr := p.Alloc(sizes[i], pool.AllocOptions{})
				t2 := time.Now()
				if err != nil || aerr != nil {
					pr.err = fmt.Errorf("split pair %d: free %v, alloc %d: %v", i, err, sizes[i], aerr)
					break
				}
				live[k] = b
				pr.frees = append(pr.frees, float64(t1.Sub(t0)))
				pr.allocs = append(pr.allocs, float64(t2.Sub(t1)))
			}
			for _, b := range live {
				if err := p.Free(b); err != nil && pr.err == nil {
					pr.err = err
				}
			}
			res[gi] = pr
		}(gi)
	}
	ready.Wait()
	callsBefore := p.Stats().DeviceCalls()
	// Nothing is allocated while pairs are timed: with a collection done
	// now, none runs (and no write barrier slows the pool) meanwhile.
	runtime.GC()
	close(start)
	wg.Wait()
	var pairs, batches, allocs, frees []float64
	var longest time.Duration
	for _, r := range res {
		if r.err != nil {
			return LatencyResult{}, r.err
		}
		longest = max(longest, r.batched)
		pairs = append(pairs, r.pairs...)
		batches = append(batches, r.batches...)
		allocs = append(allocs, r.allocs...)
		frees = append(frees, r.frees...)
	}
	st := p.Stats()
	calls := st.DeviceCalls() - callsBefore
	return LatencyResult{
		Allocator: fmt.Sprintf("memwall %s/%s", strategy, g.Name), Mix: mix.Name, Goroutines: goroutines, Pairs: len(pairs), Live: liveN,
		BatchP50ns: quantile(batches, 0.5),
		P50ns:      quantile(pairs, 0.5), P99ns: quantile(pairs, 0.99),
		AllocP50ns: quantile(allocs, 0.5), FreeP50ns: quantile(frees, 0.5),
		PairsPerSec:  float64(len(batches)*BatchPairs) / longest.Seconds(),
		TotalPairs:   len(batches)*BatchPairs + len(pairs) + len(allocs),
		DeviceCalls:  calls,
		ReservedPeak: st.PeakReservedBytes,
	}, nil
}
