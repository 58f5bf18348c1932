package main

import (
	"context"
	"fmt"
	"os"

	"github.com/memwall/memwall/bench"
	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/format/weights"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/residency"
)

func init() {
	register(verb{name: "stream", summary: "run a model larger than its VRAM budget, streaming weights layer by layer; measure and verify", run: runStream})
}

const streamUsage = `MODEL --vram SIZE [--tokens T] [--steps N] [--slots N] [--prefetch N] [--ctx N] [--batch B] [--source S] [--link-gbps X] [--device auto|cuda|sim] [--json] [--oom-snapshot FILE] [--pool-log FILE]

The benchmark of package residency. Plans MODEL into --vram as 'memwall fit'
does (--vram is the process's whole device footprint: the device context's own
memory, measured when the device opens, is taken off the plan's budget), places
the weights with residency (the resident layers uploaded once, the others
streamed through a ring of --slots staging slots, --prefetch groups ahead, on
its copy stream), then runs --steps steps after one verified warm-up step: a
compute stream multiplies every weight matrix by a --tokens × K activation with
memwall's kernels, waiting for each streamed layer's copy. Steps follow each
other as decode steps do, so the ring fills with the next step's first layers
while a step ends. Prints predicted against measured peak memory and step time,
the streamed GB/s and how well copy and compute overlapped. --source picks the
host side of the copies: auto, registered-mmap, pinned-copy or bounce. --slots
is honoured or refused: a budget too small for that many slots is an error, not
fewer slots. On a Vulkan device the products run on memwall's SPIR-V kernel;
where the device has no virtual memory the pool grows by chunks, which pack
the allocations the plan counts in 2 MiB units: the predicted peak is then an
upper bound. MODEL may be a pipe (/dev/stdin): it is copied to a temporary file
first (in $TMPDIR, removed at the end).`

// streamJSON is `memwall stream --json`: fit's keys plus the measurements.
type streamJSON struct {
	fitJSON
	Source                string               `json:"source"`
	Steps                 int                  `json:"steps"`
	Prefetch              int                  `json:"prefetch"`
	PeakBytes             uint64               `json:"peak_bytes"`
	ContextBytes          uint64               `json:"context_bytes"`
	ContextSource         string               `json:"context_source"`
	LoadedBytes           uint64               `json:"loaded_bytes"`
	PeakFootprintBytes    uint64               `json:"peak_footprint_bytes"`
	DeviceFootprintBytes  uint64               `json:"device_footprint_bytes,omitempty"`
	PoolBudgetBytes       uint64               `json:"pool_budget_bytes"`
	SecondsPerStep        float64              `json:"seconds_per_step"`
	PredictedSteadySecond float64              `json:"predicted_steady_seconds_per_step"`
	CopySecondsPerStep    float64              `json:"copy_seconds_per_step"`
	ComputeSecondsPerStep float64              `json:"compute_seconds_per_step"`
	StallSecondsPerStep   float64              `json:"stall_seconds_per_step"`
	AchievedGBps          float64              `json:"achieved_GBps"`
	PinnedH2DGBps         float64              `json:"pinned_h2d_GBps,omitempty"`
	OverlapEfficiency     float64              `json:"overlap_efficiency"`
	Verified              bool                 `json:"verified"`
	CheckedProducts       int                  `json:"checked_products"`
	VerifyNote            string               `json:"verify_note,omitempty"`
	UploadSeconds         float64              `json:"upload_seconds"`
	StepSeconds           []float64            `json:"step_seconds"`
	Warmup                bench.StepReport     `json:"warmup"`
	Residency             residency.Stats      `json:"residency"`
	MatmulTimings         []bench.MatmulTiming `json:"matmul_timings,omitempty"`
}

func runStream(e *env, args []string) error {
	fs := newFlags(e, "stream", streamUsage)
	var f planFlags
	f.add(fs)
	steps := intFlagOf(fs, "steps", 5, 1, 100000, "timed steps (after one warm-up step)")
	prefetch := intFlagOf(fs, "prefetch", 0, 0, 63, "streamed groups issued ahead of the one computing, fewer than --slots (default: --slots less one)")
	src := fs.String("source", "auto", "host side of the copies: auto, registered-mmap, pinned-copy or bounce")
	var pf poolFlags
	pf.add(fs)
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	path, budget, err := f.check(pos)
	if err != nil {
		return err
	}
	if *prefetch < 0 || *prefetch >= f.slots {
		return usagef("--prefetch %d needs %d slots; --slots is %d (want 0..%d)", *prefetch, *prefetch+1, f.slots, f.slots-1)
	}
	source, err := residency.ParseSource(*src)
	if err != nil {
		return usagef("--source: %v", err)
	}
	if err := pf.check(e); err != nil {
		return err
	}
	if err := checkFiles(e, modelInputs("MODEL", path), pf.outputs()...); err != nil {
		return err
	}
	remove, err := spoolModel(e, path, false)
	if err != nil {
		return err
	}
	defer remove()
	pl, err := fitModel(e.ctx, e, &f, path, budget, true)
	if err != nil {
		return err
	}
	defer pl.close()
	b, err := fitContext(pl, &f, budget)
	if err != nil {
		return err
	}
	if b.Warning != "" {
		fmt.Fprintf(e.stderr, "memwall: warning: %s\n", b.Warning)
	}
	if len(pl.plan.Streamed()) > 0 && pl.plan.Slots != f.slots {
		return fmt.Errorf("%s: --slots %d does not fit --vram %s: %d slots of %s with the activations and KV cache need more than the %s the pools may use; %d slots fit (pass --slots %d, or a larger --vram)",
			path, f.slots, humanBytes(budget), f.slots, humanBytes(pl.plan.SlotBytes), humanBytes(b.PoolBytes), pl.plan.Slots, pl.plan.Slots)
	}
	pb := newProgress(e, "stream")
	out, err := streamPlanned(e.ctx, pl, bench.StreamOptions{
		Residency:    residency.Options{Source: source, HostBytes: hostAvailable(), Prefetch: *prefetch},
		ContextBytes: b.ContextBytes + b.LoadedBytes,
		PoolHistory:  pf.snap.history(),
		OnPoolEvent:  pf.onEvent(),
		Progress: func(done, total int) {
			pb.update(float64(done), float64(total), fmt.Sprintf("step %d/%d", done, total))
		}}, *steps)
	pb.done()
	if err := pf.finish(err); err != nil {
		return err
	}
	out.ContextBytes, out.LoadedBytes, out.ContextSource, out.PoolBudgetBytes = b.ContextBytes, b.LoadedBytes, b.ContextSource, b.PoolBytes
	layers := out.fitJSON.Layers
	out.fitJSON = pl.json(path, &f)
	out.fitJSON.BudgetBytes = budget
	out.fitJSON.Layers = layers
	if f.asJSON {
		return writeJSON(e.stdout, out)
	}
	printFit(e, out.fitJSON)
	printStream(e, out)
	return nil
}

// fitContext takes the device context's own memory off the budget: when
// the plan was made for the whole --vram figure and the context took
// memory, the model is planned again into what is left.
func fitContext(pl *planned, f *planFlags, budget uint64) (residency.Budget, error) {
	b, err := residency.PlanBudget(pl.dev, budget)
	if err != nil {
		return b, err
	}
	if b.ContextBytes == 0 || pl.plan.Budget != budget {
		return b, nil
	}
	groups := make([]plan.WeightGroup, len(pl.plan.Groups))
	for i, g := range pl.plan.Groups {
		groups[i] = g.WeightGroup
	}
	wo := plan.WeightOptions{Budget: b.PoolBytes, Slots: f.slots, Tokens: f.tokens, Ctx: f.ctx, Batch: f.batch,
		LinkGBps: pl.plan.LinkGBps, Granule: pl.plan.Granule, PageBytes: pl.plan.PageBytes, KV: pl.plan.KV}
	if len(pl.timings) > 0 {
		wo.Cost = bench.CostFromTimings(pl.timings)
	}
	if sd, ok := pl.dev.(*sim.Device); ok {
		wo.CopyLatency = sd.Options().CopyLatency
		if len(pl.timings) == 0 {
			o := sd.Options()
			wo.Cost = plan.Roofline(o.PeakFLOPS, o.DeviceGBps*1e9, o.LaunchLatency)
		}
	}
	p, err := plan.PlanWeights(groups, wo)
	if err != nil {
		return b, budgetHint(fmt.Errorf("%s: after the device context's own %s (%s): %w", pl.model.Path, humanBytes(b.ContextBytes), b.ContextSource, err))
	}
	pl.plan = p
	return b, nil
}

// streamPlanned runs a planned model and collects the measurements.
func streamPlanned(ctx context.Context, pl *planned, o bench.StreamOptions, steps int) (streamJSON, error) {
	o.Kernels = pl.kernels
	rep, err := bench.Stream(ctx, pl.dev, pl.model, pl.plan, steps, o)
	if err != nil {
		return streamJSON{}, err
	}
	out := streamJSON{Source: rep.Source, Steps: steps, Prefetch: rep.Prefetch, PeakBytes: rep.PeakBytes,
		ContextBytes: rep.ContextBytes, PeakFootprintBytes: rep.FootprintBytes, DeviceFootprintBytes: rep.DeviceFootprintBytes, SecondsPerStep: rep.SecondsPerStep,
		PredictedSteadySecond: bench.SteadyStep(pl.plan, rep.Prefetch, 8).Seconds(),
		CopySecondsPerStep:    rep.CopySecondsPerStep, ComputeSecondsPerStep: rep.ComputeSecondsPerStep,
		StallSecondsPerStep: rep.StallSecondsPerStep, AchievedGBps: rep.AchievedGBps, PinnedH2DGBps: pl.pinnedGBps,
		OverlapEfficiency: rep.OverlapEfficiency, Verified: rep.Verified, CheckedProducts: rep.Checked,
		VerifyNote: rep.VerifyNote, UploadSeconds: rep.UploadSeconds, Warmup: rep.Warmup, Residency: rep.Residency,
		MatmulTimings: pl.timings}
	out.Warmup.Layers = nil
	for _, st := range rep.Steps {
		out.StepSeconds = append(out.StepSeconds, st.Seconds)
	}
	lj := pl.json(pl.model.Path, &planFlags{})
	for i := range lj.Layers {
		l := rep.Layers[i]
		lj.Layers[i].Copy, lj.Layers[i].Compute, lj.Layers[i].Stall = &l.Copy, &l.Compute, &l.Stall
	}
	out.fitJSON.Layers = lj.Layers
	return out, nil
}

func printStream(e *env, o streamJSON) {
	w := e.stdout
	fmt.Fprintf(w, "measured   peak %s (predicted %s, %+.1f%%); with the device context's %s and %s loaded since: %s of the %s budget\n",
		humanBytes(o.PeakBytes), humanBytes(o.PredictedPeakBytes), pct(float64(o.PeakBytes), float64(o.PredictedPeakBytes)),
		humanBytes(o.ContextBytes), humanBytes(o.LoadedBytes), humanBytes(o.PeakFootprintBytes), humanBytes(o.BudgetBytes))
	fmt.Fprintf(w, "           %.4f s per step (predicted %.4f s steady, %+.1f%%; %.4f s cold), median of %d\n",
		o.SecondsPerStep, o.PredictedSteadySecond, pct(o.SecondsPerStep, o.PredictedSteadySecond), o.PredictedSecondsPerStep, o.Steps)
	fmt.Fprintf(w, "           copy %.4f s, compute %.4f s, stall %.4f s: step / max(copy, compute) = %.3f\n",
		o.CopySecondsPerStep, o.ComputeSecondsPerStep, o.StallSecondsPerStep, 1/max(o.OverlapEfficiency, 1e-9))
	link := ""
	if o.PinnedH2DGBps > 0 {
		link = fmt.Sprintf(" (%.0f%% of the %.1f GB/s pinned link)", 100*o.AchievedGBps/o.PinnedH2DGBps, o.PinnedH2DGBps)
	}
	fmt.Fprintf(w, "           streamed %.1f GB/s%s from %s, %d slots, prefetch %d\n", o.AchievedGBps, link, o.Source, o.Residency.Slots, o.Prefetch)
	if o.Verified {
		fmt.Fprintf(w, "verified   %d products against a float64 reference on sampled rows\n", o.CheckedProducts)
	} else {
		fmt.Fprintf(w, "verified   no: %s\n", o.VerifyNote)
	}
}

// pct is (a-b)/b in percent, 0 when b is 0.
func pct(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * (a - b) / b
}

// hostAvailable returns the host memory available to pin, from
// /proc/meminfo's MemAvailable, or 0 (unknown: no limit).
func hostAvailable() uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var kb uint64
	for _, line := range splitLines(string(b)) {
		if n, _ := fmt.Sscanf(line, "MemAvailable: %d kB", &kb); n == 1 {
			return kb << 10
		}
	}
	return 0
}

func splitLines(s string) []string {
	var out []string
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != '\n' {
			i++
		}
		out = append(out, s[:i])
		if i < len(s) {
			i++
		}
		s = s[i:]
	}
	return out
}

// demoStream generates the tiny model, plans it into a budget that streams
// three of its four blocks, and streams a few steps.
func demoStream(e *env, d device.Device) error {
	dir, err := e.temps.MkdirTemp("", "memwall-demo-stream-")
	if err != nil {
		return err
	}
	defer e.temps.RemoveAll(dir)
	path, err := synth.WriteTiny(e.ctx, dir, synth.Safetensors)
	if err != nil {
		return err
	}
	m, err := weights.Open(path)
	if err != nil {
		return err
	}
	defer m.Close()
	groups, err := plan.GroupWeights(m.Tensors)
	if err != nil {
		return err
	}
	ks, err := loadKernels(e, d)
	if err != nil {
		return err
	}
	defer ks.Close()
	rep, err := bench.Transfer(e.ctx, d, bench.TransferOptions{Bytes: 16 << 20, Reps: 3})
	if err != nil {
		return err
	}
	link, _ := rep.Get("h2d_pinned")
	_, cost, err := bench.MeasureMatmuls(e.ctx, d, ks, groups, 1, 3)
	if err != nil {
		return err
	}
	wo := plan.WeightOptions{Budget: 1 << 50, LinkGBps: link.GBps, Cost: cost, Granule: 512, PageBytes: poolPageBytes(d.Info())}
	if sd, ok := d.(*sim.Device); ok {
		wo.CopyLatency = sd.Options().CopyLatency
	} else {
		wo.Granule = 2 << 20
	}
	full, err := plan.PlanWeights(groups, wo)
	if err != nil {
		return err
	}
	wo.Budget = full.PeakBytes - 1
	p, err := plan.PlanWeights(groups, wo)
	if err != nil {
		return err
	}
	pl := &planned{model: m, dev: d, kernels: ks, plan: p, pinnedGBps: link.GBps}
	out, err := streamPlanned(e.ctx, pl, bench.StreamOptions{}, 3)
	if err != nil {
		return err
	}
	w := e.stdout
	fmt.Fprintf(w, "  tiny llama (%s) in a %s budget: %d of %d groups resident, %s streamed per step through %d slots\n",
		humanBytes(p.ModelBytes), humanBytes(p.Budget), len(p.Groups)-len(p.Streamed()), len(p.Groups), humanBytes(p.StreamedBytes), p.Slots)
	fmt.Fprintf(w, "  step %.3g ms (predicted %.3g ms), peak %s (predicted %s)\n",
		out.SecondsPerStep*1e3, p.StepTime.Seconds()*1e3, humanBytes(out.PeakBytes), humanBytes(p.PeakBytes))
	fmt.Fprintf(w, "  streamed at %.1f GB/s of a %.1f GB/s link from %s; overlap %.2f\n", out.AchievedGBps, link.GBps, out.Source, out.OverlapEfficiency)
	if out.Verified {
		fmt.Fprintf(w, "  verified: %d products match a float64 reference\n", out.CheckedProducts)
	} else {
		fmt.Fprintf(w, "  not verified: %s\n", out.VerifyNote)
	}
	return nil
}
