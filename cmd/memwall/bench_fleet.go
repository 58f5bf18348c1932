package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/fleet"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/residency"
)

func init() { benchVerbs["fleet"] = runBenchFleet }

const benchFleetUsage = `MODEL MODEL... [--vram SIZE] [--switches 6] [--npp 32] [--ntg 32] [--device auto|cuda|sim] [--json]

Several models sharing one budget (package fleet): each is loaded at its
minimum, then requests alternate between them, one at a time. A request
to a model that holds less than its share first moves weights: the idle
model's resident weights are given back (it streams them from host
memory when it serves again) and the serving model's are uploaded from
its pinned or registered host source. Reports per request the bytes
moved, their upload rate, the time to the first token (move included)
and the decode rate; then the budget is halved with every model active
and each generates again, its decode rate beside the rate its new plan
predicts at the measured link rate. The process's device footprint is
sampled throughout; its peak is printed beside the budget.`

type benchFleetFlags struct {
	df                 deviceFlag
	vram               string
	switches, npp, ntg int
	asJSON             bool
}

// fleetRow is one request of bench fleet.
type fleetRow struct {
	Phase string `json:"phase"` // "switch" or "halved"
	Model string `json:"model"`
	// PromotedBytes and DemotedBytes are the device bytes the move
	// before the request took for this model's weights and gave back
	// (all models); UploadSeconds the promoted weights' upload, LinkGBps
	// its rate (their tensor bytes over that time).
	PromotedBytes uint64  `json:"promoted_bytes"`
	DemotedBytes  uint64  `json:"demoted_bytes"`
	UploadSeconds float64 `json:"upload_seconds"`
	LinkGBps      float64 `json:"upload_GBps"`
	// MoveSeconds is the wall time from the request to the engine
	// being ready (Begin); TTFT adds the prefill and the first token.
	MoveSeconds float64 `json:"move_seconds"`
	TTFT        float64 `json:"ttft_seconds"`
	DecodeTokS  float64 `json:"decode_tokens_per_s"`
	// PredictedTokS is 1 / the plan's predicted step time at the
	// measured link rate.
	PredictedTokS  float64 `json:"predicted_decode_tokens_per_s"`
	StreamedGroups int     `json:"streamed_groups"`
	ResidentBytes  uint64  `json:"resident_bytes"`
}

type benchFleetJSON struct {
	Models      []string   `json:"models"`
	Device      string     `json:"device"`
	VRAMBytes   uint64     `json:"vram_bytes"`
	PoolBudget  uint64     `json:"pool_budget_bytes"`
	HalvedPools uint64     `json:"halved_pool_budget_bytes"`
	LinkGBps    float64    `json:"link_GBps"`
	Rows        []fleetRow `json:"rows"`
	// PeakFootprint is the most device memory the process held, sampled
	// every 2 ms (0 where the device cannot say: the simulator);
	// PeakPoolReserved the pools' reserved bytes together at their peak
	// sample.
	PeakFootprint    uint64 `json:"peak_footprint_bytes"`
	PeakPoolReserved uint64 `json:"peak_pool_reserved_bytes"`
}

func runBenchFleet(e *env, args []string) error {
	fs := newFlags(e, "bench fleet", benchFleetUsage)
	var f benchFleetFlags
	f.df.add(fs)
	fs.StringVar(&f.vram, "vram", "", "the process's device memory budget, context included (default: free memory less a margin)")
	intVar(fs, &f.switches, "switches", 6, 1, 1000, "requests that alternate between the models")
	intVar(fs, &f.npp, "npp", 32, 1, 1<<16, "prompt tokens per request")
	intVar(fs, &f.ntg, "ntg", 32, 1, 1<<16, "generated tokens per request")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	pos, vram, err := parseModelsFlags(fs, args, &f.df, &f.vram, 2)
	if err != nil {
		return err
	}
	for _, p := range pos {
		if err := checkFiles(e, modelInputs("MODEL", p)); err != nil {
			return err
		}
	}
	return benchFleet(e, &f, pos, vram)
}

// fleetMember is one loaded model of bench fleet.
type fleetMember struct {
	name      string
	m         *llama.Model
	dev, host *pool.Pool
	e         *engine.Engine
	// gather is the model's embedding gather timed on the device
	// (measureGather), which decides whether its table is mapped.
	gather engine.GatherCost
}

func benchFleet(e *env, f *benchFleetFlags, paths []string, vram uint64) (err error) {
	so := runSimOptions()
	d, ch, err := e.open(f.df.backend, auto.Options{Getenv: e.getenv, Sim: &so})
	if err != nil {
		return err
	}
	defer d.Close()
	ks, st, done, err := llamaKernels(e, d)
	if err != nil {
		return err
	}
	defer done()
	var ms []*fleetMember
	defer func() {
		for _, mb := range ms {
			if mb.e != nil {
				err = errors.Join(err, mb.e.Close())
			}
			if mb.dev != nil {
				mb.dev.Close()
			}
			if mb.host != nil {
				mb.host.Close()
			}
			mb.m.Close()
		}
	}()
	o := engine.Options{MaxTokens: f.npp + f.ntg + 1, PromptTokens: f.npp, PrefillChunk: min(f.npp, 512), Live: true, Stream: st}
	for i, p := range paths {
		m, _, err := openRunModel(e, p)
		if err != nil {
			return err
		}
		mb := &fleetMember{name: fmt.Sprintf("%d:%s", i, filepath.Base(p)), m: m}
		ms = append(ms, mb)
		if o.MaxTokens > m.Config.Context {
			return usagef("--npp %d + --ntg %d: above %s's context of %d", f.npp, f.ntg, p, m.Config.Context)
		}
		mo := o
		if err := measureGather(d, ks, m, &mo); err != nil {
			return err
		}
		mb.gather = mo.Gather
		if err := engine.WarmProducts(d, ks, m, st, []int{o.PrefillChunk, 1}); err != nil {
			return err
		}
	}
	b, err := residency.PlanBudget(d, vram)
	if err != nil {
		return err
	}
	link, _, err := measureLink(e, d, 0)
	if err != nil {
		return err
	}
	o.LinkGBps = link
	fl := fleet.New(b.PoolBytes, fleet.Options{})
	for _, mb := range ms {
		if err := loadMember(e, d, ks, fl, mb, o); err != nil {
			return err
		}
	}
	out := benchFleetJSON{Device: ch.Backend + ": " + d.Info().Name, VRAMBytes: b.VRAMBytes, PoolBudget: b.PoolBytes, LinkGBps: link}
	for _, mb := range ms {
		out.Models = append(out.Models, mb.name)
	}
	stop := sampleFootprint(d, ms, &out)
	defer stop()
	rng := rand.New(rand.NewPCG(3, 4))
	pb := newProgress(e, "bench fleet")
	pb.unit = "requests"
	for k := range f.switches {
		pb.update(float64(k), float64(f.switches), ms[k%len(ms)].name)
		row, err := fleetRequest(e, fl, ms[k%len(ms)], f, rng, true)
		if err != nil {
			pb.done()
			return err
		}
		row.Phase = "switch"
		out.Rows = append(out.Rows, row)
	}
	pb.done()
	// Halve the process's budget with every model active: each keeps
	// serving on what it is left.
	half := b.VRAMBytes / 2
	if half <= b.VRAMBytes-b.PoolBytes {
		return fmt.Errorf("half the budget (%s) does not cover the context and loaded modules (%s)", humanBytes(half), humanBytes(b.VRAMBytes-b.PoolBytes))
	}
	out.HalvedPools = b.PoolBytes - half
	for _, mb := range ms {
		if err := fl.Begin(e.ctx, mb.name); err != nil {
			return err
		}
	}
	if err := fl.SetBudget(e.ctx, out.HalvedPools); err != nil {
		return fmt.Errorf("halve the budget: %w", err)
	}
	for _, mb := range ms {
		row, err := fleetRequest(e, fl, mb, f, rng, false)
		if err != nil {
			return err
		}
		row.Phase = "halved"
		out.Rows = append(out.Rows, row)
	}
	for _, mb := range ms {
		if err := fl.End(e.ctx, mb.name); err != nil {
			return err
		}
	}
	stop()
	if f.asJSON {
		return writeJSON(e.stdout, out)
	}
	printBenchFleet(e, out)
	return nil
}

// loadMember loads mb into the fleet (loadLive) with no keep-alive
// limit.
func loadMember(e *env, d device.Device, ks *kernels.Set, fl *fleet.Fleet, mb *fleetMember, o engine.Options) (err error) {
	o.Gather = mb.gather
	if mb.dev, mb.host, mb.e, err = loadLive(e, d, ks, fl, mb.m, o, mb.name); err != nil {
		return err
	}
	return fl.Add(e.ctx, fleet.Model{Name: mb.name, Engine: mb.e, KeepAlive: -1})
}

// loadLive makes room in the fleet for m's minimum under o (engine.Options
// with Live), then loads its engine there on pools of its own named after
// name; the caller adds it to the fleet. On error what it made is given
// back.
func loadLive(e *env, d device.Device, ks *kernels.Set, fl *fleet.Fleet, m *llama.Model, o engine.Options, name string) (dev, host *pool.Pool, eng *engine.Engine, err error) {
	least, err := liveRoom(e.ctx, d, fl, m, o, name)
	if err != nil {
		return nil, nil, nil, err
	}
	po := pool.DefaultOptions(d)
	po.Name, po.Limit, po.ReserveBytes = name, least, d.Info().TotalBytes
	if dev, err = pool.New(d, po); err != nil {
		return nil, nil, nil, err
	}
	if host, err = pool.NewHost(d, pool.Options{Name: name + " host"}); err != nil {
		dev.Close()
		return nil, nil, nil, err
	}
	o.Budget = least
	if eng, err = engine.New(e.ctx, d, ks, dev, host, m, o); err != nil {
		host.Close()
		dev.Close()
		return nil, nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return dev, host, eng, nil
}

// liveRoom makes room in the fleet for the minimum budget of m's live
// engine under o (engine.Estimate's at a budget of 1) and returns it.
func liveRoom(ctx context.Context, d device.Device, fl *fleet.Fleet, m *llama.Model, o engine.Options, name string) (uint64, error) {
	o.Budget = 1
	var be *engine.BudgetError
	if _, err := engine.Estimate(ctx, m, o, d.Info()); !errors.As(err, &be) {
		return 0, fmt.Errorf("%s: the minimum budget: %v", name, err)
	}
	if err := fl.MakeRoom(ctx, be.Minimum); err != nil {
		return 0, fmt.Errorf("%s needs %s of the pools at least: %w", name, humanBytes(be.Minimum), err)
	}
	return be.Minimum, nil
}

// fleetRequest runs one request on mb: Begin (the move), the
// generation, End (when begin).
func fleetRequest(e *env, fl *fleet.Fleet, mb *fleetMember, f *benchFleetFlags, rng *rand.Rand, begin bool) (fleetRow, error) {
	row := fleetRow{Model: mb.name}
	promotedBefore := func(st []fleet.ModelStats) uint64 {
		for _, s := range st {
			if s.Name == mb.name {
				return s.PromotedBytes
			}
		}
		return 0
	}
	stBefore, before := fl.Stats()
	t0 := time.Now()
	if begin {
		if err := fl.Begin(e.ctx, mb.name); err != nil {
			return row, err
		}
	}
	row.MoveSeconds = time.Since(t0).Seconds()
	stats, after := fl.Stats()
	var uploaded uint64
	// This model's last move is the one Begin made when its promoted
	// bytes grew (another model's move leaves them as they were).
	for _, s := range stats {
		if s.Name == mb.name && s.PromotedBytes > promotedBefore(stBefore) {
			row.PromotedBytes, row.UploadSeconds = s.LastMove.PromotedBytes, s.LastMove.UploadSeconds
			uploaded = s.LastMove.UploadedBytes
		}
	}
	row.DemotedBytes = after.DemotedBytes - before.DemotedBytes
	if row.UploadSeconds > 0 {
		row.LinkGBps = float64(uploaded) / row.UploadSeconds / 1e9
	}
	eng, unlock, err := fl.Lock(mb.name)
	if err != nil {
		return row, err
	}
	prompt := make([]int, f.npp)
	for i := range prompt {
		prompt[i] = 3 + rng.IntN(mb.m.Config.Vocab-3)
	}
	var first time.Time
	res, err := eng.Generate(e.ctx, prompt, engine.Sampling{MaxNew: f.ntg, IgnoreEOS: true}, func(int) error {
		if first.IsZero() {
			first = time.Now()
		}
		return nil
	})
	p := eng.Plan()
	rs := eng.Residency().Stats()
	unlock()
	if err != nil {
		return row, fmt.Errorf("%s: %w", mb.name, err)
	}
	row.TTFT = first.Sub(t0).Seconds()
	row.DecodeTokS = res.DecodeTokensPerS
	if p.StepTime > 0 {
		row.PredictedTokS = 1 / p.StepTime.Seconds()
	}
	row.StreamedGroups, row.ResidentBytes = rs.Groups-rs.ResidentGroups, rs.ResidentBytes
	if begin {
		if err := fl.End(e.ctx, mb.name); err != nil {
			return row, err
		}
	}
	return row, nil
}

// sampleFootprint records the process's device footprint and the pools'
// reserved bytes every 2 ms until the returned stop is called (twice is
// fine).
func sampleFootprint(d device.Device, ms []*fleetMember, out *benchFleetJSON) (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	var peak, pools uint64
	wg.Go(func() {
		for !done.Load() {
			if fp, ok := residency.Footprint(d); ok {
				peak = max(peak, fp)
			}
			var sum uint64
			for _, mb := range ms {
				sum += mb.dev.ReservedBytes()
			}
			pools = max(pools, sum)
			time.Sleep(2 * time.Millisecond)
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			done.Store(true)
			wg.Wait()
			out.PeakFootprint, out.PeakPoolReserved = peak, pools
		})
	}
}

func printBenchFleet(e *env, o benchFleetJSON) {
	w := e.stdout
	fmt.Fprintf(w, "%d models on %s; budget %s (pools %s), link %.1f GB/s\n", len(o.Models), o.Device, humanBytes(o.VRAMBytes), humanBytes(o.PoolBudget), o.LinkGBps)
	fmt.Fprintf(w, "%-7s %-24s %10s %10s %8s %8s %8s %9s %9s %8s\n", "phase", "model", "promoted", "demoted", "GB/s", "move s", "TTFT s", "decode/s", "predicted", "streamed")
	for _, r := range o.Rows {
		fmt.Fprintf(w, "%-7s %-24s %10s %10s %8.1f %8.3f %8.3f %9.2f %9.2f %8d\n", r.Phase, r.Model, humanBytes(r.PromotedBytes), humanBytes(r.DemotedBytes),
			r.LinkGBps, r.MoveSeconds, r.TTFT, r.DecodeTokS, r.PredictedTokS, r.StreamedGroups)
	}
	fmt.Fprintf(w, "budget halved to pools of %s with every model active\n", humanBytes(o.HalvedPools))
	if o.PeakFootprint > 0 {
		fmt.Fprintf(w, "peak device footprint %s of the %s budget; pools reserved at most %s\n", humanBytes(o.PeakFootprint), humanBytes(o.VRAMBytes), humanBytes(o.PeakPoolReserved))
	} else {
		fmt.Fprintf(w, "pools reserved at most %s of %s (the device does not report its footprint)\n", humanBytes(o.PeakPoolReserved), humanBytes(o.PoolBudget))
	}
}
