package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/kernels"
)

// runSimOptions are the simulated device `memwall run` opens, and `memwall
// fit` for a Llama model, so that both plan for the same pages.
func runSimOptions() sim.Options {
	so := sim.DefaultOptions()
	so.Kernels = kernels.Sim()
	// 64 KiB pages, so that the pools' page rounding does not swamp a tiny
	// model's budget on the simulator.
	so.Granularity = 64 << 10
	return so
}

// llamaFitFlags are fit's flags for a Llama model, as `memwall run` takes
// them.
type llamaFitFlags struct {
	prompt, maxNew, chunk int
}

func (lf *llamaFitFlags) add(fs *flag.FlagSet) {
	intVar(fs, &lf.prompt, "prompt-tokens", 0, 0, 1<<24, fmt.Sprintf("Llama models: the prompt's length in tokens, as memwall run will get it (default: --ctx less --max-new, else %d within the model's context less --max-new)", fitDefaultPrompt))
	intVar(fs, &lf.maxNew, "max-new", 32, 1, 1<<20, "Llama models: tokens to generate, as memwall run's --max-new")
	intVar(fs, &lf.chunk, "prefill-chunk", 0, 0, 1<<16, "Llama models: as memwall run's --prefill-chunk (0: chosen from the budget)")
}

// fitDefaultPrompt is the prompt fit plans for without --prompt-tokens or
// --ctx: a short chat turn, as a user's first run is; the whole context as
// a prompt made the chosen prefill chunk fill any budget.
const fitDefaultPrompt = 512

// tokens returns the prompt's length and the KV cache's tokens that `memwall
// run` would plan for: a prompt of --prompt-tokens (or --ctx less
// --max-new, or fitDefaultPrompt within the model's context less
// --max-new) and --max-new tokens after it, within the model's context.
func (lf *llamaFitFlags) tokens(ctxFlag, context int, path string) (prompt, maxTokens int, err error) {
	if lf.prompt != 0 && ctxFlag != 0 {
		return 0, 0, usagef("give at most one of --prompt-tokens and --ctx for a Llama model")
	}
	prompt = lf.prompt
	switch {
	case prompt == 0 && ctxFlag != 0:
		prompt = min(ctxFlag, context) - lf.maxNew
	case prompt == 0:
		prompt = min(fitDefaultPrompt, context-lf.maxNew)
	}
	if prompt < 1 || prompt >= context {
		return 0, 0, usagef("%s: a prompt of %d tokens (--prompt-tokens, or --ctx less --max-new %d) does not fit the model's context of %d (max_position_embeddings) with one position left for a new token",
			path, prompt, lf.maxNew, context)
	}
	return prompt, min(prompt+lf.maxNew, context), nil
}

// isLlamaModel says whether fit should plan path as `memwall run` would:
// a directory, a safetensors file or index with config.json beside it, or
// a GGUF file whose general.architecture is llama. Anything else is
// planned as plain weights.
func isLlamaModel(path string) bool {
	st, err := os.Stat(path)
	if err != nil {
		return false
	}
	if st.IsDir() {
		return true
	}
	if isGGUF, err := llamaGGUF(path); err == nil && isGGUF {
		return true
	}
	kind, err := checkModelFile(path)
	if err != nil || kind == kindONNX || kind == kindGGUF {
		return false
	}
	_, err = os.Stat(filepath.Join(filepath.Dir(path), "config.json"))
	return err == nil
}

// llamaGGUF reports whether path is a GGUF file of the llama architecture.
func llamaGGUF(path string) (bool, error) {
	kind, err := checkModelFile(path)
	if err != nil || kind != kindGGUF {
		return false, err
	}
	m, err := gguf.Open(path)
	if err != nil {
		return false, err
	}
	defer m.Close()
	arch, _ := m.Metadata["general.architecture"].(string)
	return arch == "llama", nil
}

// fitRunJSON is what fit adds for a Llama model: the `memwall run` it
// predicts and the parts of its footprint.
type fitRunJSON struct {
	PromptTokens       int    `json:"prompt_tokens"`
	MaxTokens          int    `json:"max_tokens"`
	PrefillChunk       int    `json:"prefill_chunk"`
	Slots              int    `json:"slots"`
	ChunkChosen        bool   `json:"prefill_chunk_chosen"`
	SlotsChosen        bool   `json:"slots_chosen"`
	PoolBudgetBytes    uint64 `json:"pool_budget_bytes"`
	PoolPeakBytes      uint64 `json:"pool_peak_bytes"`
	ScratchBytes       uint64 `json:"kernel_scratch_bytes"`
	ContextBytes       uint64 `json:"context_bytes"`
	ContextSource      string `json:"context_source"`
	LoadedBytes        uint64 `json:"loaded_bytes"`
	ReserveBytes       uint64 `json:"reserve_bytes"`
	PredictedPeakBytes uint64 `json:"predicted_peak_bytes"`
}

// fitLlama plans a Llama model exactly as `memwall run MODEL --vram`
// does — the same device options, kernels, warm-up, budget and engine
// plan (reserveRun) — so that its predicted peak is what run reserves.
func fitLlama(e *env, f *planFlags, lf *llamaFitFlags, slotsGiven bool, path string, vram uint64) error {
	m, err := openInput(e, path, llama.Open)
	if err != nil {
		return err
	}
	defer m.Close()
	prompt, maxTokens, err := lf.tokens(f.ctx, m.Config.Context, path)
	if err != nil {
		return err
	}
	so := runSimOptions()
	d, ch, err := e.open(f.df.backend, auto.Options{Getenv: e.getenv, Sim: &so})
	if err != nil {
		return err
	}
	defer d.Close()
	if err := checkBudget(e, d, vram); err != nil {
		return err
	}
	ks, st, done, err := llamaKernels(e, d)
	if err != nil {
		return err
	}
	defer done()
	o := engine.Options{MaxTokens: maxTokens, PromptTokens: prompt, PrefillChunk: lf.chunk, Stream: st}
	if slotsGiven {
		o.Slots = f.slots
	}
	g := generation{model: m, path: path, vram: vram, opts: o}
	rp, err := reserveRun(e.ctx, d, ks, m, vram, o)
	if err != nil {
		return g.planError(e, d, o, rp.budget, err)
	}
	out, err := fitLlamaJSON(e, f, &g, d, ch, rp)
	if err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(e.stdout, out)
	}
	printFit(e, out)
	r := out.Run
	fmt.Fprintf(e.stdout, "run        memwall run with a %d-token prompt and %d tokens of context: prefill chunks of %d tokens (%s), %d slots (%s)\n",
		r.PromptTokens, r.MaxTokens, r.PrefillChunk, chosenOrGiven(r.ChunkChosen), r.Slots, chosenOrGiven(r.SlotsChosen))
	fmt.Fprintf(e.stdout, "footprint  pools %s + attention scratch %s + context %s (%s) + loaded %s = %s\n",
		humanBytes(r.PoolPeakBytes), humanBytes(r.ScratchBytes), humanBytes(r.ContextBytes), r.ContextSource,
		humanBytes(r.LoadedBytes), humanBytes(r.PredictedPeakBytes))
	return nil
}

// fitLlamaJSON fills fit's JSON from run's plan: the weight plan the
// engine runs, its predictions at the measured (or given) link rate, the
// minimum budget and the footprint.
func fitLlamaJSON(e *env, f *planFlags, g *generation, d device.Device, ch auto.Choice, rp reservation) (fitJSON, error) {
	in := d.Info()
	link, linkSource, err := measureLink(e, d, f.linkGBps)
	if err != nil {
		return fitJSON{}, err
	}
	// The link rate changes the plan's predictions, not its placement.
	timed := rp.opts
	timed.LinkGBps = link
	foot, err := engine.Estimate(e.ctx, g.model, timed, in)
	if err != nil {
		return fitJSON{}, err
	}
	if foot.DeviceBytes != rp.foot.DeviceBytes {
		return fitJSON{}, fmt.Errorf("fit: the plan at %.1f GB/s takes %d bytes, at the default rate %d", link, foot.DeviceBytes, rp.foot.DeviceBytes)
	}
	// The minimum is run's: with the chunk and slots chosen (flags not
	// given), that of the smallest chunk, not of the one this budget takes.
	minimum := uint64(0)
	probe := rp.opts
	probe.Budget, probe.PrefillChunk, probe.Slots = 1, g.opts.PrefillChunk, g.opts.Slots
	var be *engine.BudgetError
	if _, err := engine.Estimate(e.ctx, g.model, probe, in); errors.As(err, &be) {
		minimum = be.Minimum + rp.budget.ContextBytes + rp.budget.LoadedBytes + rp.budget.ReserveBytes
	}
	p := foot.Plan
	out := fitJSON{Model: g.path, Format: g.model.Weights.Format, Device: in.Name, Backend: in.Backend, DeviceChoice: ch.Reason,
		BudgetBytes: rp.budget.VRAMBytes, Tokens: foot.PrefillChunk, Ctx: rp.opts.MaxTokens, Batch: 1, Slots: p.Slots,
		ModelBytes: p.ModelBytes, ResidentBytes: p.ResidentBytes, StreamedBytes: p.StreamedBytes,
		StagingBytes: p.StagingBytes, ActivationBytes: foot.ArenaBytes, KVBytes: foot.KVBytes,
		MinimumBytes: minimum, PredictedPeakBytes: rp.predictedPeak(),
		PredictedSecondsPerStep: p.StepTime.Seconds(), PredictedCopySeconds: p.CopyTime.Seconds(),
		PredictedComputeSeconds: p.ComputeTime.Seconds(), LinkGBps: link, LinkSource: linkSource,
		ComputeSource: "the weight plan's default model, not measured (memwall run --timing measures the prefill's products)"}
	out.addLayers(p)
	b := rp.budget
	out.Run = &fitRunJSON{PromptTokens: rp.opts.PromptTokens, MaxTokens: rp.opts.MaxTokens, PrefillChunk: foot.PrefillChunk, Slots: foot.Slots,
		ChunkChosen: g.opts.PrefillChunk == 0, SlotsChosen: g.opts.Slots == 0, PoolBudgetBytes: b.PoolBytes,
		PoolPeakBytes: foot.PoolPeakBytes, ScratchBytes: foot.ScratchBytes, ContextBytes: b.ContextBytes, ContextSource: b.ContextSource,
		LoadedBytes: b.LoadedBytes, ReserveBytes: b.ReserveBytes, PredictedPeakBytes: rp.predictedPeak()}
	return out, nil
}

// llamaKernels loads the kernels a Llama model runs on d and makes a
// compute stream; done gives both back. A backend without the kernels
// (Vulkan) is an error saying which to use.
func llamaKernels(e *env, d device.Device) (ks *kernels.Set, st device.Stream, done func(), err error) {
	if b := d.Info().Backend; b == "vulkan" {
		return nil, 0, nil, fmt.Errorf("the %s backend has no Llama kernels yet (they are PTX and Go only): use --device cuda or --device sim", b)
	}
	if ks, err = kernels.Load(d, e.getenv); err != nil {
		return nil, 0, nil, err
	}
	if st, err = d.NewStream(); err != nil {
		ks.Close()
		return nil, 0, nil, err
	}
	return ks, st, func() {
		d.DestroyStream(st)
		ks.Close()
	}, nil
}
