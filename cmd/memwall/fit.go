package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/memwall/memwall/bench"
	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/onnx"
	"github.com/memwall/memwall/format/weights"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/plan"
)

func init() {
	register(verb{name: "fit", summary: "plan a model into a VRAM budget: what stays resident, what streams, predicted peak and step time", run: runFit})
}

const fitUsage = `MODEL --vram SIZE [--tokens T] [--ctx N] [--batch B] [--slots N] [--link-gbps X] [--prompt-tokens N] [--max-new N] [--prefill-chunk N] [--plain] [--device auto|cuda|sim] [--json]

MODEL is a safetensors file, a sharded index (.json), a GGUF file, or an ONNX
model whose initializers are its weights (external data or inline). The plan
reserves a ring of --slots staging slots (each the size of the largest layer),
the activation arena for --tokens rows and the KV cache for --ctx tokens of
--batch sequences, keeps what else fits resident and streams the rest. The link
bandwidth is measured on the device (a short pinned host-to-device copy) unless
--link-gbps is given; matrix-product times are measured with memwall's kernels
on the device.

For a Llama model (a directory, safetensors with config.json beside it, or a
llama GGUF) fit plans what 'memwall run MODEL --vram SIZE' reserves, by the
same computation: a prompt of --prompt-tokens (default: --ctx less
--max-new, else 512 tokens within the model's context less --max-new) and
--max-new generated tokens (32, as run's default), the
prefill chunk and staging slots chosen from the budget as run chooses them
(or --prefill-chunk and --slots), the device context and the kernels and
GEMM library loaded and warmed up as run does; predicted_peak_bytes is
run's whole footprint as nvidia-smi shows it. --plain plans any model as
plain weights, as memwall stream runs them.

MODEL may be a pipe (/dev/stdin): it is copied to a temporary file first
(in $TMPDIR, removed at the end), as the formats are mapped into memory.`

// planFlags are the flags fit and stream share.
type planFlags struct {
	df       deviceFlag
	vram     string
	tokens   int
	ctx      int
	batch    int
	slots    int
	linkGBps float64
	asJSON   bool
}

func (f *planFlags) add(fs *flag.FlagSet) {
	f.df.add(fs)
	fs.StringVar(&f.vram, "vram", "", "VRAM budget, e.g. 8GiB (required)")
	intVar(fs, &f.tokens, "tokens", 1, 1, 1<<20, "activation rows per step: 1 is a decode step, 4096 a prefill-sized one")
	intVar(fs, &f.ctx, "ctx", 0, 0, 1<<24, "context length of the KV cache to reserve (0: none)")
	intVar(fs, &f.batch, "batch", 1, 1, 1<<16, "sequences in the KV cache")
	intVar(fs, &f.slots, "slots", 2, 2, 64, "staging slots in the ring")
	floatVar(fs, &f.linkGBps, "link-gbps", 0, 0, 1e6, true, "host-to-device bandwidth in GB/s (default: measure it)")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
}

// check validates the flags and returns the budget.
func (f *planFlags) check(pos []string) (string, uint64, error) {
	if len(pos) != 1 {
		return "", 0, usagef("want exactly one MODEL argument, got %d", len(pos))
	}
	if f.vram == "" {
		return "", 0, usagef("--vram is required")
	}
	budget, err := flagSize("vram", f.vram, false)
	if err != nil {
		return "", 0, err
	}
	if err := f.df.check(); err != nil {
		return "", 0, err
	}
	return pos[0], budget, nil
}

// simBackingLimit is the model size above which the simulated device keeps
// no data (products are timed, not computed): the Go kernels are too slow
// for large models.
const simBackingLimit = 64 << 20

// planned is a model planned on a device.
type planned struct {
	model         *format.Model
	dev           device.Device
	choice        auto.Choice
	kernels       *kernels.Set
	plan          *plan.WeightPlan
	linkSource    string
	computeSource string
	pinnedGBps    float64 // the pinned H2D figure measured, 0 if given
	timings       []bench.MatmulTiming
}

func (p *planned) close() {
	if p.kernels != nil {
		p.kernels.Close()
	}
	if p.dev != nil {
		p.dev.Close()
	}
	if p.model != nil {
		p.model.Close()
	}
}

// fitModel opens the model and the device, measures the link and the
// products, and plans. needKernels makes a kernel load failure an error
// (stream); otherwise the products are modeled (fit).
func fitModel(ctx context.Context, e *env, f *planFlags, path string, budget uint64, needKernels bool) (*planned, error) {
	m, err := openInput(e, path, openModel)
	if err != nil {
		return nil, err
	}
	pl := &planned{model: m}
	groups, err := plan.GroupWeights(m.Tensors)
	if err != nil {
		pl.close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	so := sim.DefaultOptions()
	so.Kernels = kernels.Sim()
	if m.DataBytes > simBackingLimit {
		so.Backing = false
	}
	d, ch, err := e.open(f.df.backend, auto.Options{Getenv: e.getenv, Sim: &so})
	if err != nil {
		pl.close()
		return nil, err
	}
	pl.dev, pl.choice = d, ch
	fail := func(err error) (*planned, error) {
		pl.close()
		return nil, err
	}
	if err := checkBudget(e, d, budget); err != nil {
		return fail(err)
	}
	info := d.Info()
	link, linkSource, err := measureLink(e, d, f.linkGBps)
	if err != nil {
		return fail(err)
	}
	pl.linkSource = linkSource
	if f.linkGBps == 0 {
		pl.pinnedGBps = link
	}
	// The device pool stream runs maps pages of the device's granularity:
	// its peak is whole pages.
	wo := plan.WeightOptions{Budget: budget, Slots: f.slots, Tokens: f.tokens, Ctx: f.ctx, Batch: f.batch, LinkGBps: link, Granule: 2 << 20,
		PageBytes: poolPageBytes(info)}
	if sd, ok := d.(*sim.Device); ok {
		o := sd.Options()
		wo.Granule = 512
		wo.CopyLatency = o.CopyLatency
		wo.Cost = plan.Roofline(o.PeakFLOPS, o.DeviceGBps*1e9, o.LaunchLatency)
		pl.computeSource = "modeled (the simulator's compute model)"
	}
	ks, kerr := loadKernels(e, d)
	switch {
	case kerr == nil:
		pl.kernels = ks
		ts, cost, err := bench.MeasureMatmuls(ctx, d, ks, groups, f.tokens, 3)
		if err != nil {
			return fail(fmt.Errorf("measure the products: %w", err))
		}
		wo.Cost, pl.timings = cost, ts
		pl.computeSource = fmt.Sprintf("measured (%d product shapes × %d tokens on the device)", len(ts), f.tokens)
	case needKernels, info.Backend == auto.Vulkan:
		// On Vulkan the products are memwall's own SPIR-V kernel: H200
		// rates would model a device that is not there.
		return fail(kerr)
	case info.Backend != "sim":
		pl.computeSource = "modeled (H200 rates; kernels did not load: " + kerr.Error() + ")"
	}
	p, err := plan.PlanWeights(groups, wo)
	if err != nil {
		return fail(budgetHint(fmt.Errorf("%s: %w", path, err)))
	}
	pl.plan = p
	return pl, nil
}

// poolPageBytes is the page size a device pool maps memory in on a device
// with virtual memory (its granularity), 0 on one without: there the pool
// grows by chunks the plan does not model.
func poolPageBytes(info device.Info) uint64 {
	if g := info.Granularity; info.VirtualMemory && g&(g-1) == 0 {
		return g
	}
	return 0
}

// measureLink returns given when it is not 0, else the pinned
// host-to-device rate measured on d (the simulator's modeled rate when it
// keeps no data), and where the figure comes from.
func measureLink(e *env, d device.Device, given float64) (float64, string, error) {
	if given != 0 {
		return given, "given (--link-gbps)", nil
	}
	if sd, ok := d.(*sim.Device); ok && !sd.Options().Backing {
		// Without backing bytes the transfer benchmark cannot check its data.
		return sd.Options().PinnedHtoDGBps, "modeled (the simulator's pinned host-to-device rate; it keeps no data for a model this size)", nil
	}
	rep, err := bench.Transfer(e.ctx, d, bench.TransferOptions{Bytes: 64 << 20, Reps: 5})
	if err != nil {
		return 0, "", fmt.Errorf("measure the link: %w", err)
	}
	r, _ := rep.Get("h2d_pinned")
	return r.GBps, "measured (pinned host-to-device, 64 MiB × 5, median)", nil
}

// layerJSON is one group in fit's and stream's JSON.
type layerJSON struct {
	Name     string `json:"name"`
	Bytes    uint64 `json:"bytes"`
	Resident bool   `json:"resident"`
	Slot     int    `json:"slot"`
	// Predicted and (stream) measured device seconds per step.
	PredictedCopy    float64  `json:"predicted_copy_seconds"`
	PredictedCompute float64  `json:"predicted_compute_seconds"`
	Copy             *float64 `json:"copy_seconds,omitempty"`
	Compute          *float64 `json:"compute_seconds,omitempty"`
	Stall            *float64 `json:"stall_seconds,omitempty"`
}

// fitJSON is `memwall fit --json`.
type fitJSON struct {
	Model                   string      `json:"model"`
	Format                  string      `json:"format"`
	Device                  string      `json:"device"`
	Backend                 string      `json:"backend"`
	DeviceChoice            string      `json:"device_choice"`
	BudgetBytes             uint64      `json:"budget_bytes"`
	Tokens                  int         `json:"tokens"`
	Ctx                     int         `json:"ctx"`
	Batch                   int         `json:"batch"`
	Slots                   int         `json:"slots"`
	ModelBytes              uint64      `json:"model_bytes"`
	ResidentBytes           uint64      `json:"resident_bytes"`
	StreamedBytes           uint64      `json:"streamed_bytes"`
	StagingBytes            uint64      `json:"staging_bytes"`
	ActivationBytes         uint64      `json:"activation_bytes"`
	KVBytes                 uint64      `json:"kv_bytes"`
	MinimumBytes            uint64      `json:"minimum_bytes"`
	PredictedPeakBytes      uint64      `json:"predicted_peak_bytes"`
	PredictedSecondsPerStep float64     `json:"predicted_seconds_per_step"`
	PredictedCopySeconds    float64     `json:"predicted_copy_seconds"`
	PredictedComputeSeconds float64     `json:"predicted_compute_seconds"`
	LinkGBps                float64     `json:"link_GBps"`
	LinkSource              string      `json:"link_source"`
	ComputeSource           string      `json:"compute_source"`
	ResidentLayers          int         `json:"resident_layers"`
	StreamedLayers          int         `json:"streamed_layers"`
	Layers                  []layerJSON `json:"layers"`
	// Run is, for a Llama model, the `memwall run` planned: the prediction
	// is run's own plan (the same computation), not the generic one.
	Run *fitRunJSON `json:"run,omitempty"`
}

func (pl *planned) json(path string, f *planFlags) fitJSON {
	p := pl.plan
	in := pl.dev.Info()
	out := fitJSON{Model: path, Format: pl.model.Format, Device: in.Name, Backend: in.Backend, DeviceChoice: pl.choice.Reason,
		BudgetBytes: p.Budget, Tokens: p.Tokens, Ctx: f.ctx, Batch: f.batch, Slots: p.Slots,
		ModelBytes: p.ModelBytes, ResidentBytes: p.ResidentBytes, StreamedBytes: p.StreamedBytes,
		StagingBytes: p.StagingBytes, ActivationBytes: p.ActivationBytes, KVBytes: p.KVBytes,
		MinimumBytes: p.MinimumBytes, PredictedPeakBytes: p.PeakBytes,
		PredictedSecondsPerStep: p.StepTime.Seconds(), PredictedCopySeconds: p.CopyTime.Seconds(),
		PredictedComputeSeconds: p.ComputeTime.Seconds(), LinkGBps: p.LinkGBps,
		LinkSource: pl.linkSource, ComputeSource: pl.computeSource}
	out.addLayers(p)
	return out
}

// addLayers lists p's groups in the JSON and counts them.
func (out *fitJSON) addLayers(p *plan.WeightPlan) {
	for _, g := range p.Groups {
		if g.Resident {
			out.ResidentLayers++
		} else {
			out.StreamedLayers++
		}
		out.Layers = append(out.Layers, layerJSON{Name: g.Name, Bytes: g.Bytes, Resident: g.Resident, Slot: g.Slot,
			PredictedCopy: g.CopyTime.Seconds(), PredictedCompute: g.ComputeTime.Seconds()})
	}
}

func runFit(e *env, args []string) error {
	fs := newFlags(e, "fit", fitUsage)
	var f planFlags
	f.add(fs)
	var lf llamaFitFlags
	lf.add(fs)
	plain := fs.Bool("plain", false, "plan a Llama model as plain weights (the generic plan memwall stream runs), not as memwall run would")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	path, budget, err := f.check(pos)
	if err != nil {
		return err
	}
	remove, err := spoolModel(e, path, false)
	if err != nil {
		return err
	}
	defer remove()
	if !*plain && isLlamaModel(e.local(path)) {
		slotsGiven := false
		fs.Visit(func(fl *flag.Flag) { slotsGiven = slotsGiven || fl.Name == "slots" })
		return fitLlama(e, &f, &lf, slotsGiven, path, budget)
	}
	pl, err := fitModel(e.ctx, e, &f, path, budget, false)
	if err != nil {
		return err
	}
	defer pl.close()
	out := pl.json(path, &f)
	if f.asJSON {
		return writeJSON(e.stdout, out)
	}
	printFit(e, out)
	return nil
}

func printFit(e *env, o fitJSON) {
	w := e.stdout
	fmt.Fprintf(w, "model      %s (%s, %s, %d groups)\n", o.Model, o.Format, humanBytes(o.ModelBytes), len(o.Layers))
	fmt.Fprintf(w, "device     %s (%s)\n", o.Device, o.Backend)
	switch r := o.Run; {
	case r == nil:
		fmt.Fprintf(w, "budget     %s: minimum to stream %s\n", humanBytes(o.BudgetBytes), humanBytes(o.MinimumBytes))
	case r.ChunkChosen:
		fmt.Fprintf(w, "budget     %s: minimum to run %s (prefilling one token per chunk; this budget holds chunks of %d tokens)\n",
			humanBytes(o.BudgetBytes), humanBytes(o.MinimumBytes), r.PrefillChunk)
	default:
		fmt.Fprintf(w, "budget     %s: minimum to run %s with --prefill-chunk %d\n", humanBytes(o.BudgetBytes), humanBytes(o.MinimumBytes), r.PrefillChunk)
	}
	fmt.Fprintf(w, "resident   %s in %d groups\n", humanBytes(o.ResidentBytes), o.ResidentLayers)
	if o.StreamedLayers > 0 {
		fmt.Fprintf(w, "streamed   %s per step in %d groups, through %d slots (%s)\n",
			humanBytes(o.StreamedBytes), o.StreamedLayers, o.Slots, humanBytes(o.StagingBytes))
	} else {
		fmt.Fprintf(w, "streamed   nothing: the whole model fits\n")
	}
	fmt.Fprintf(w, "reserved   activations %s (%d tokens), KV cache %s (ctx %d × batch %d)\n",
		humanBytes(o.ActivationBytes), o.Tokens, humanBytes(o.KVBytes), o.Ctx, o.Batch)
	fmt.Fprintf(w, "link       %.1f GB/s, %s\n", o.LinkGBps, o.LinkSource)
	fmt.Fprintf(w, "compute    %s\n", o.ComputeSource)
	fmt.Fprintf(w, "predicted  peak %s; %.4f s per step (copy %.4f s, compute %.4f s)\n",
		humanBytes(o.PredictedPeakBytes), o.PredictedSecondsPerStep, o.PredictedCopySeconds, o.PredictedComputeSeconds)
}

// openModel opens the weights of the model at path by the format its
// bytes show (not its name): a file that is not a model is refused naming
// what it is.
func openModel(path string) (*format.Model, error) {
	kind, err := checkModelFile(path)
	if err != nil {
		return nil, err
	}
	switch kind {
	case kindONNX:
		return onnx.OpenWeights(path)
	case kindGGUF:
		return gguf.Open(path)
	}
	return weights.Open(path) // safetensors, or an index
}

// checkBudget refuses a --vram budget above the device's total memory and
// warns (on stderr) when it is above the memory free now; both messages name
// the budget and the device's figure.
func checkBudget(e *env, d device.Device, budget uint64) error {
	free, total, err := d.MemInfo()
	if err != nil {
		return fmt.Errorf("memory info: %w", err)
	}
	if total == 0 {
		total = d.Info().TotalBytes
	}
	name := d.Info().Name
	switch {
	case total > 0 && budget > total:
		return fmt.Errorf("--vram %s (%d bytes) is above %s's total memory, %s (%d bytes)", humanBytes(budget), budget, name, humanBytes(total), total)
	case free > 0 && budget > free:
		fmt.Fprintf(e.stderr, "memwall: warning: --vram %s (%d bytes) is above the memory free on %s now, %s (%d bytes)\n", humanBytes(budget), budget, name, humanBytes(free), free)
	}
	return nil
}

// budgetHint adds the minimum to a budget error for people.
func budgetHint(err error) error {
	var be *plan.BudgetError
	if errors.As(err, &be) {
		return fmt.Errorf("%w; try --vram %d (%s) or more", err, be.Minimum, humanBytes(be.Minimum))
	}
	return err
}
