package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/residency"
	"github.com/memwall/memwall/tokenizer"
)

func init() {
	register(verb{name: "run", summary: "generate tokens with a Llama-family model within a VRAM budget", run: runRun})
}

const runUsage = `MODEL (--prompt TEXT | --prompt-ids 1,2,3) [--vram SIZE] [--max-new N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--device auto|cuda|sim] [--json]

Runs a Llama-family model — a directory with config.json, safetensors and
tokenizer.json, a .safetensors file with config.json beside it, or a .gguf
file — on the device within --vram, the process's whole device footprint
(the CUDA context's own memory counted). Weights that do not fit stream
through staging slots; K and V live in paged blocks; one planned arena holds
each step's activations. Tokens print as they are produced (text when the
model has a tokenizer), then prefill and decode tokens/s, peak device memory,
bytes streamed per token and what stayed resident. Without --vram the budget
is the device's free memory less a margin (512 MiB, or a tenth of the free
memory when smaller). --temperature 0 (the default) is greedy decoding.`

// runJSON is `memwall run --json`.
type runJSON struct {
	Model             string  `json:"model"`
	Device            string  `json:"device"`
	PromptIDs         []int   `json:"prompt_ids"`
	Tokens            []int   `json:"tokens"`
	Text              *string `json:"text,omitempty"`
	Stop              string  `json:"stop"`
	PrefillTokensPerS float64 `json:"prefill_tokens_per_s"`
	DecodeTokensPerS  float64 `json:"decode_tokens_per_s"`
	PrefillSeconds    float64 `json:"prefill_seconds"`
	// With --timing: the device time of the prefill's weight copies and
	// of its compute stream.
	PrefillCopySeconds   float64 `json:"prefill_copy_seconds,omitempty"`
	PrefillDeviceSeconds float64 `json:"prefill_device_seconds,omitempty"`
	DecodeSeconds        float64 `json:"decode_seconds"`
	PeakDeviceBytes      uint64  `json:"peak_device_bytes"`
	PoolPeakBytes        uint64  `json:"pool_peak_bytes"`
	// PredictedPeakBytes is the engine's plan: its pools' predicted peak,
	// the attention scratch and the context.
	PredictedPeakBytes uint64 `json:"predicted_peak_bytes"`
	ContextBytes       uint64 `json:"context_bytes"`
	ScratchBytes       uint64 `json:"kernel_scratch_bytes"`
	LoadedBytes        uint64 `json:"loaded_bytes"` // kernel modules and library handles, measured before the pools
	// ProcessDeviceBytes is the process's device memory as the device
	// reports it after generation (context included; 0 on the simulator).
	ProcessDeviceBytes    uint64 `json:"process_device_bytes,omitempty"`
	ContextSource         string `json:"context_source"`
	BudgetBytes           uint64 `json:"budget_bytes"`
	BudgetDefault         bool   `json:"budget_default"`
	StreamedBytesPerToken uint64 `json:"streamed_bytes_per_token"`
	ResidentBytes         uint64 `json:"resident_bytes"`
	ResidentGroups        int    `json:"resident_groups"`
	StreamedGroups        int    `json:"streamed_groups"`
	Groups                int    `json:"groups"`
	KVBytes               uint64 `json:"kv_bytes"`
	ArenaBytes            uint64 `json:"arena_bytes"`
	Source                string `json:"source"`
	Gemm                  string `json:"gemm"`
	Kernels               string `json:"kernels"`
	// KernelsDisabled lists kernels the load-time self-test turned off.
	KernelsDisabled []string `json:"kernels_disabled,omitempty"`
	Warning         string   `json:"warning,omitempty"`
}

type runFlags struct {
	df                       deviceFlag
	vram, prompt, ids        string
	maxNew, topK, chunk      int
	slots                    int
	temperature, topP        float64
	seed                     uint64
	asJSON, ignoreEOS, exact bool
	timing                   bool
	logitsOut, source        string
}

func runRun(e *env, args []string) error {
	fs := newFlags(e, "run", runUsage)
	var f runFlags
	f.df.add(fs)
	fs.StringVar(&f.vram, "vram", "", "the process's device memory budget, context included (default: free memory less a margin)")
	fs.StringVar(&f.prompt, "prompt", "", "prompt text (needs a tokenizer)")
	fs.StringVar(&f.ids, "prompt-ids", "", "prompt token ids, comma separated")
	fs.IntVar(&f.maxNew, "max-new", 32, "most tokens to generate")
	fs.Float64Var(&f.temperature, "temperature", 0, "sampling temperature; 0 is greedy")
	fs.IntVar(&f.topK, "top-k", 0, "keep the K most likely tokens (0: all)")
	fs.Float64Var(&f.topP, "top-p", 0, "keep the smallest set of tokens reaching probability P (0: all)")
	fs.Uint64Var(&f.seed, "seed", 0, "sampling seed")
	fs.IntVar(&f.chunk, "prefill-chunk", 512, "most prompt tokens per prefill step")
	fs.IntVar(&f.slots, "slots", 2, "staging slots for streamed weights (2..16; one more lets copies run further ahead of long products)")
	fs.BoolVar(&f.ignoreEOS, "ignore-eos", false, "keep generating after an end-of-sequence token")
	fs.BoolVar(&f.timing, "timing", false, "time the prefill's weight copies and compute on the device (prefill_copy_seconds, prefill_device_seconds)")
	fs.BoolVar(&f.exact, "exact", false, "keep activations in float32 instead of rounding to the model dtype like transformers")
	fs.StringVar(&f.logitsOut, "logits-out", "", "write the first generated token's logits to FILE (little-endian float32)")
	fs.StringVar(&f.source, "source", "auto", "host side of streamed copies: auto, registered-mmap, pinned-copy or bounce")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want one MODEL argument, got %d", len(pos))
	}
	if err := f.df.check(); err != nil {
		return err
	}
	var vram uint64
	if f.vram != "" {
		if vram, err = flagSize("vram", f.vram, false); err != nil {
			return err
		}
	}
	if (f.prompt == "") == (f.ids == "") {
		return usagef("give exactly one of --prompt and --prompt-ids")
	}
	var ids []int
	if f.ids != "" {
		if ids, err = parseIDs(f.ids); err != nil {
			return usagef("--prompt-ids: %v", err)
		}
	}
	if f.maxNew < 1 || f.maxNew > 1<<20 {
		return usagef("--max-new %d: want 1..%d", f.maxNew, 1<<20)
	}
	if f.chunk < 1 || f.chunk > 1<<16 {
		return usagef("--prefill-chunk %d: want 1..65536", f.chunk)
	}
	if f.slots < 2 || f.slots > 16 {
		return usagef("--slots %d: want 2..16", f.slots)
	}
	sampling := engine.Sampling{MaxNew: f.maxNew, Temperature: f.temperature, TopK: f.topK, TopP: f.topP, Seed: f.seed, IgnoreEOS: f.ignoreEOS}
	if err := sampling.Validate(); err != nil {
		return usagef("%s", strings.TrimPrefix(err.Error(), "engine: "))
	}
	source, err := residency.ParseSource(f.source)
	if err != nil {
		return usagef("--source: %v", err)
	}
	logits, err := checkOutput("--logits-out", f.logitsOut)
	if err != nil {
		return err
	}
	return runModel(e, &f, pos[0], ids, vram, sampling, source, logits)
}

// parseIDs reads "1,2,3".
func parseIDs(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > math.MaxInt32 {
			return nil, fmt.Errorf("%q is not a token id (a non-negative integer)", p)
		}
		out = append(out, n)
	}
	return out, nil
}

// runModel does the work of `memwall run` once the command line is valid.
func runModel(e *env, f *runFlags, path string, ids []int, vram uint64, sampling engine.Sampling, source residency.Source, logits *outputFile) error {
	m, err := llama.Open(path)
	if err != nil {
		return err
	}
	defer m.Close()
	tok, err := openTokenizer(m)
	if err != nil {
		return err
	}
	if f.prompt != "" {
		if tok == nil {
			return fmt.Errorf("%s: no tokenizer (no tokenizer.json beside the weights, no GGUF vocabulary): give --prompt-ids", path)
		}
		ids = tok.Encode(f.prompt, true)
	}
	so := sim.DefaultOptions()
	so.Kernels = kernels.Sim()
	// 64 KiB pages, so that the pools' page rounding does not swamp a tiny
	// model's budget on the simulator.
	so.Granularity = 64 << 10
	d, ch, err := auto.Open(f.df.backend, auto.Options{Getenv: e.getenv, Sim: &so})
	if err != nil {
		return err
	}
	defer d.Close()
	g := generation{model: m, path: path, tok: tok, ids: ids, vram: vram, sampling: sampling,
		opts: engine.Options{PrefillChunk: f.chunk, Slots: f.slots, Source: source, Exact: f.exact, Timing: f.timing}, quiet: f.asJSON}
	out, res, err := g.run(e, d, ch.Backend)
	if err != nil {
		return err
	}
	if err := logits.write(float32Bytes(res.FirstLogits)); err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(e.stdout, out)
	}
	printRun(e, out)
	return nil
}

// stepTokens lists the token counts of a prompt's prefill chunks and of a
// decode step.
func stepTokens(prompt, chunk int) []int {
	if chunk <= 0 {
		chunk = 512
	}
	ts := []int{min(prompt, chunk), 1}
	if r := prompt % chunk; prompt > chunk && r != 0 {
		ts = append(ts, r)
	}
	return ts
}

// generation is one prompt run through a model on an open device.
type generation struct {
	model    *llama.Model
	path     string
	tok      textCodec // nil: print ids
	ids      []int
	vram     uint64 // 0: the default budget
	sampling engine.Sampling
	opts     engine.Options // Budget and MaxTokens are filled in
	quiet    bool           // print no tokens as they come
}

// run plans the budget, makes the pools and the engine, generates
// (printing tokens as they come unless quiet) and reports.
func (g *generation) run(e *env, d device.Device, backend string) (runJSON, *engine.Result, error) {
	m, ids := g.model, g.ids
	var out runJSON
	if len(ids) == 0 {
		return out, nil, fmt.Errorf("the prompt encodes to no tokens")
	}
	if len(ids) >= m.Config.Context {
		return out, nil, fmt.Errorf("%s: max_position_embeddings: prompt of %d tokens does not fit the context of %d (one position must stay for a new token)",
			m.Config.Source, len(ids), m.Config.Context)
	}
	maxTokens := min(len(ids)+g.sampling.MaxNew, m.Config.Context)
	o := g.opts
	o.MaxTokens = maxTokens
	// The kernels load and the GEMM library warms up on the compute
	// stream first, so that the budget counts their modules and workspace.
	if b := d.Info().Backend; b == "vulkan" {
		return out, nil, fmt.Errorf("the %s backend has no Llama kernels yet (they are PTX and Go only): use --device cuda or --device sim", b)
	}
	ks, err := kernels.Load(d, e.getenv)
	if err != nil {
		return out, nil, err
	}
	defer ks.Close()
	st, err := d.NewStream()
	if err != nil {
		return out, nil, err
	}
	defer d.DestroyStream(st)
	o.Stream = st
	if err := engine.WarmProducts(d, ks, m, st, stepTokens(len(ids), o.PrefillChunk)); err != nil {
		return out, nil, err
	}
	budget, err := residency.PlanBudget(d, g.vram)
	if err != nil {
		return out, nil, g.belowMinimum(e, d, o, budget, err)
	}
	if budget.Warning != "" && !g.quiet {
		fmt.Fprintf(e.stderr, "memwall run: warning: %s\n", budget.Warning)
	}
	po := pool.DefaultOptions(d)
	po.Name, po.Limit = "run", budget.PoolBytes
	dev, err := pool.New(d, po)
	if err != nil {
		return out, nil, err
	}
	defer dev.Close()
	host, err := pool.NewHost(d, pool.Options{Name: "run-host"})
	if err != nil {
		return out, nil, err
	}
	defer host.Close()
	o.Budget = budget.PoolBytes
	eng, err := engine.New(e.ctx, d, ks, dev, host, m, o)
	if err != nil {
		var be *engine.BudgetError
		if errors.As(err, &be) {
			return out, nil, g.minimum(budget, be, maxTokens, err)
		}
		return out, nil, err
	}
	defer eng.Close()
	out = runJSON{Model: g.path, Device: backend + ": " + d.Info().Name, PromptIDs: ids, BudgetBytes: budget.VRAMBytes,
		BudgetDefault: budget.Default, ContextBytes: budget.ContextBytes, ContextSource: budget.ContextSource, LoadedBytes: budget.LoadedBytes,
		Gemm: eng.GemmLibrary(), Kernels: ks.Source(), KernelsDisabled: ks.Disabled(), Warning: budget.Warning}
	var dec *tokenizer.StreamDecoder
	if g.tok != nil {
		dec = g.tok.NewDecoder()
	}
	onToken := func(id int) error {
		switch {
		case g.quiet:
		case dec != nil:
			fmt.Fprint(e.stdout, dec.Add(id))
		default:
			fmt.Fprintf(e.stdout, "%d ", id)
		}
		return nil
	}
	res, err := eng.Generate(e.ctx, ids, g.sampling, onToken)
	if err != nil {
		return out, nil, err
	}
	if n, ok := residency.Footprint(d); ok {
		out.ProcessDeviceBytes = n
	}
	if dec != nil && !g.quiet {
		fmt.Fprint(e.stdout, dec.Flush())
	}
	fillRunJSON(&out, eng, dev, res)
	if g.tok != nil {
		text := g.tok.Decode(res.Tokens, true)
		out.Text = &text
	}
	return out, res, nil
}

func fillRunJSON(out *runJSON, eng *engine.Engine, dev *pool.Pool, res *engine.Result) {
	out.Tokens, out.Stop = res.Tokens, res.Stop
	out.PrefillTokensPerS, out.DecodeTokensPerS = res.PrefillTokensPerS, res.DecodeTokensPerS
	out.PrefillSeconds, out.DecodeSeconds = res.PrefillSeconds, res.DecodeSeconds
	out.PrefillCopySeconds, out.PrefillDeviceSeconds = res.PrefillCopySeconds, res.PrefillDeviceSeconds
	out.StreamedBytesPerToken = res.StreamedBytesPerToken
	st := dev.Stats()
	out.PoolPeakBytes = st.PeakReservedBytes
	out.ScratchBytes = eng.ScratchBytes()
	out.PredictedPeakBytes = eng.Footprint().DeviceBytes + out.ContextBytes + out.LoadedBytes
	out.PeakDeviceBytes = st.PeakReservedBytes + out.ContextBytes + out.LoadedBytes + out.ScratchBytes
	rs := eng.Residency().Stats()
	out.ResidentBytes, out.ResidentGroups, out.Groups = rs.ResidentBytes, rs.ResidentGroups, rs.Groups
	out.StreamedGroups = rs.Groups - rs.ResidentGroups
	out.Source = rs.Source
	out.KVBytes, out.ArenaBytes = eng.KVBytes(), eng.ArenaBytes()
}

func printRun(e *env, o runJSON) {
	w := e.stdout
	fmt.Fprintf(w, "\n\n%d prompt tokens, %d generated (stop: %s) on %s\n", len(o.PromptIDs), len(o.Tokens), o.Stop, o.Device)
	fmt.Fprintf(w, "  prefill %.1f tokens/s, decode %.2f tokens/s (products: %s)\n", o.PrefillTokensPerS, o.DecodeTokensPerS, o.Gemm)
	if o.PrefillDeviceSeconds > 0 {
		fmt.Fprintf(w, "  prefill %.4f s: device %.4f s, of which weight copies %.4f s\n", o.PrefillSeconds, o.PrefillDeviceSeconds, o.PrefillCopySeconds)
	}
	fmt.Fprintf(w, "  peak device memory %s of the %s budget (pools %s + context %s + modules %s + attention scratch %s)\n",
		humanBytes(o.PeakDeviceBytes), humanBytes(o.BudgetBytes), humanBytes(o.PoolPeakBytes), humanBytes(o.ContextBytes),
		humanBytes(o.LoadedBytes), humanBytes(o.ScratchBytes))
	fmt.Fprintf(w, "  resident: %d of %d weight groups (%s); streamed %s per token (%s)\n",
		o.ResidentGroups, o.Groups, humanBytes(o.ResidentBytes), humanBytes(o.StreamedBytesPerToken), o.Source)
	fmt.Fprintf(w, "  KV cache %s, activation arena %s\n", humanBytes(o.KVBytes), humanBytes(o.ArenaBytes))
}

// float32Bytes is l as little-endian float32s.
func float32Bytes(l []float32) []byte {
	b := make([]byte, 4*len(l))
	for i, v := range l {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// textCodec is what run needs of a tokenizer.
type textCodec interface {
	Encode(text string, addSpecial bool) []int
	Decode(ids []int, skipSpecial bool) string
	NewDecoder() *tokenizer.StreamDecoder
}

// openTokenizer loads the model's tokenizer: tokenizer.json beside the
// weights, or a GGUF file's tokenizer.ggml vocabulary; nil when it has
// none. A tokenizer whose vocabulary is larger than the model's is an
// error naming both.
func openTokenizer(m *llama.Model) (textCodec, error) {
	var t *tokenizer.Tokenizer
	var err error
	var from string
	switch {
	case m.TokenizerPath != "":
		from = m.TokenizerPath
		t, err = tokenizer.Load(m.TokenizerPath)
	case m.Weights.Format == "gguf" && m.Weights.Metadata["tokenizer.ggml.tokens"] != nil:
		from = m.Weights.Path + " (tokenizer.ggml.*)"
		t, err = tokenizer.FromGGUF(m.Weights.Metadata)
	default:
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if t.VocabSize() > m.Config.Vocab {
		return nil, fmt.Errorf("%s: %d tokens, more than the model's vocab_size %d (%s)", from, t.VocabSize(), m.Config.Vocab, m.Config.Source)
	}
	return t, nil
}

// minimumError is a budget below what the run needs; Minimum is the whole
// footprint's minimum, the context and loaded modules included.
type minimumError struct {
	vram, minimum uint64
	msg           string
	err           error
}

func (m *minimumError) Error() string { return m.msg }
func (m *minimumError) Unwrap() error { return m.err }

func (g *generation) minimum(b residency.Budget, be *engine.BudgetError, maxTokens int, err error) error {
	overhead := b.ContextBytes + b.LoadedBytes + b.ReserveBytes
	n := be.Minimum + overhead
	return &minimumError{vram: g.vram, minimum: n, err: err,
		msg: fmt.Sprintf("--vram %d bytes (%s): below the minimum %d bytes (%s) for %s with %d tokens of context (the context's own %s, loaded modules' %s and a reserve of %s included): %v",
			b.VRAMBytes, humanBytes(b.VRAMBytes), n, humanBytes(n), g.path, maxTokens, humanBytes(b.ContextBytes), humanBytes(b.LoadedBytes),
			humanBytes(b.ReserveBytes), err)}
}

// belowMinimum turns a budget PlanBudget refuses (one that does not even
// cover the context and loaded modules) into the minimum error when the
// engine's own minimum says more is needed.
func (g *generation) belowMinimum(e *env, d device.Device, o engine.Options, b residency.Budget, err error) error {
	if g.vram == 0 || g.vram >= b.TotalBytes && b.TotalBytes > 0 {
		return err
	}
	o.Budget = 1
	_, eerr := engine.Estimate(e.ctx, g.model, o, d.Info())
	var be *engine.BudgetError
	if !errors.As(eerr, &be) || g.vram >= be.Minimum+b.ContextBytes+b.LoadedBytes+b.ReserveBytes {
		return err
	}
	b.VRAMBytes = g.vram
	return g.minimum(b, be, o.MaxTokens, err)
}

// demoRun generates with the tiny synthetic model on d under a budget that
// makes part of it stream, and says what ran where.
func demoRun(e *env, d device.Device) error {
	dir, err := os.MkdirTemp("", "memwall-demo-run")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := synth.Tiny()
	if _, err := synth.Generate(e.ctx, cfg, filepath.Join(dir, "model.safetensors"), synth.Options{}); err != nil {
		return err
	}
	m, err := llama.Open(dir)
	if err != nil {
		return err
	}
	defer m.Close()
	ids := make([]int, 24)
	for i := range ids {
		ids[i] = 3 + (i*7919+17)%(cfg.Vocab-3)
	}
	g := generation{model: m, path: "tiny (synthetic, " + humanBytes(m.Weights.DataBytes) + ")", ids: ids,
		sampling: engine.Sampling{MaxNew: 24, IgnoreEOS: true}, opts: engine.Options{PrefillChunk: 16}, quiet: true}
	// The smallest budget the run takes, from its error at 1 byte, plus
	// one block: the other blocks stream.
	g.vram = 1
	_, _, err = g.run(e, d, d.Info().Backend)
	var me *minimumError
	if !errors.As(err, &me) {
		return fmt.Errorf("probing the minimum budget: %v", err)
	}
	b := m.Tensors.Blocks[0]
	g.vram = me.minimum + b.Q.Bytes + b.K.Bytes + b.V.Bytes + b.O.Bytes + b.Gate.Bytes + b.Up.Bytes + b.Down.Bytes
	g.quiet = false
	fmt.Fprintf(e.stdout, "  %d-layer Llama (GQA %d/%d heads), prompt of %d ids, --vram %s:\n  ", cfg.Layers, cfg.Heads, cfg.KVHeads, len(ids), humanBytes(g.vram))
	out, _, err := g.run(e, d, d.Info().Backend)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "\n  %d tokens; prefill %.0f tokens/s, decode %.1f tokens/s; %d of %d weight groups resident, %s streamed per token\n",
		len(out.Tokens), out.PrefillTokensPerS, out.DecodeTokensPerS, out.ResidentGroups, out.Groups, humanBytes(out.StreamedBytesPerToken))
	fmt.Fprintf(e.stdout, "  peak %s of the %s budget; KV cache %s in paged blocks, activations %s in one planned arena\n",
		humanBytes(out.PeakDeviceBytes), humanBytes(out.BudgetBytes), humanBytes(out.KVBytes), humanBytes(out.ArenaBytes))
	return nil
}
