package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/auto"
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

const runUsage = `MODEL (--prompt TEXT | --prompt-ids 1,2,3) [--vram SIZE] [--max-new N] [--temperature T] [--top-k K] [--top-p P] [--seed S] [--prefill-chunk N] [--slots N] [--device auto|cuda|sim] [--json] [--oom-snapshot FILE] [--pool-log FILE]

Runs a Llama-family model — a directory with config.json, safetensors and
tokenizer.json, a .safetensors file with config.json beside it, or a .gguf
file (its own vocabulary, else tokenizer.json beside it) — on the device within --vram, the process's whole device footprint
(the CUDA context's own memory counted). Weights that do not fit stream
through staging slots; K and V live in paged blocks; one planned arena holds
each step's activations. Tokens print as they are produced (text when the
model has a tokenizer), then prefill and decode tokens/s, peak device memory,
bytes streamed per token and what stayed resident. Without --vram the budget
is the device's free memory less a margin (512 MiB, or a tenth of the free
memory when smaller). --temperature 0 (the default) is greedy decoding.

Every prefill chunk streams the non-resident weights once. Without
--prefill-chunk the chunk is the largest, up to the prompt's length and
2048 tokens, whose activations fit the budget next to the weights' minimum
(so a 2048-token prompt prefills in one pass when it can); without --slots
there are 3 staging slots when weights stream, the chunk is 1024 tokens or
more and the budget holds the third, else 2. Flags given win; a
--prefill-chunk that does not fit is an error stating the minimum budget
and the largest chunk that fits. 'memwall fit MODEL --vram SIZE
--prompt-tokens N' predicts what this command reserves.`

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
	// With --profile: engine.Result's decode profile.
	DecodeStepDeviceSeconds float64                     `json:"decode_step_device_seconds,omitempty"`
	DecodeProfile           map[string]float64          `json:"decode_profile_seconds,omitempty"`
	DecodeProfileOps        map[string]engine.ProfileOp `json:"decode_profile_ops,omitempty"`
	DecodeProfileSeconds    float64                     `json:"decode_profile_step_seconds,omitempty"`
	DecodeProfileSegments   int                         `json:"decode_profile_segments,omitempty"`
	DecodeProfileQueue      float64                     `json:"decode_profile_queue_seconds,omitempty"`
	ProductWeightBytes      uint64                      `json:"product_weight_bytes"`
	// DecodeGraph says whether decode steps replayed a captured graph
	// (--graph auto), DecodeGraphReason why not, DecodeGraphSteps how many
	// did.
	DecodeGraph       bool   `json:"decode_graph"`
	DecodeGraphReason string `json:"decode_graph_reason,omitempty"`
	DecodeGraphSteps  int    `json:"decode_graph_steps"`
	// DecodeGraphStepDeviceSeconds (with --profile, when decode replays a
	// graph) is one replay's device time, to set beside
	// decode_step_device_seconds (a plain step timed the same way).
	DecodeGraphStepDeviceSeconds float64 `json:"decode_graph_step_device_seconds,omitempty"`
	// DecodeLaunchGapSeconds (with --profile) is the wall time per decode
	// token less the profiled step's device time: what launching, the
	// host's sampling and synchronizing add per token.
	DecodeLaunchGapSeconds float64 `json:"decode_launch_gap_seconds,omitempty"`
	PeakDeviceBytes        uint64  `json:"peak_device_bytes"`
	PoolPeakBytes          uint64  `json:"pool_peak_bytes"`
	// PredictedPeakBytes is the engine's plan: its pools' predicted peak,
	// the attention scratch and the context.
	PredictedPeakBytes uint64 `json:"predicted_peak_bytes"`
	// PrefillChunk and Slots are what ran; ChunkChosen and SlotsChosen say
	// they came from the budget (no flag given).
	PrefillChunk int    `json:"prefill_chunk"`
	Slots        int    `json:"slots"`
	ChunkChosen  bool   `json:"prefill_chunk_chosen"`
	SlotsChosen  bool   `json:"slots_chosen"`
	ContextBytes uint64 `json:"context_bytes"`
	ScratchBytes uint64 `json:"kernel_scratch_bytes"`
	LoadedBytes  uint64 `json:"loaded_bytes"` // kernel modules and library handles, measured before the pools
	// ProcessDeviceBytes is the process's device memory as the device
	// reports it after generation (context included; 0 on the simulator).
	ProcessDeviceBytes    uint64 `json:"process_device_bytes,omitempty"`
	ContextSource         string `json:"context_source"`
	BudgetBytes           uint64 `json:"budget_bytes"`
	BudgetDefault         bool   `json:"budget_default"`
	StreamedBytesPerToken uint64 `json:"streamed_bytes_per_token"`
	ResidentBytes         uint64 `json:"resident_bytes"`
	// MappedBytes are weights the device reads in place from the
	// registered file (the embedding table; --embedding).
	MappedBytes uint64 `json:"mapped_bytes,omitempty"`
	// Gather is the embedding gather's measured cost (engine.GatherCost),
	// which decided whether the table is read in place; absent where
	// the table could not be mapped.
	Gather         *gatherJSON `json:"embedding_gather,omitempty"`
	ResidentGroups int         `json:"resident_groups"`
	StreamedGroups int         `json:"streamed_groups"`
	Groups         int         `json:"groups"`
	KVBytes        uint64      `json:"kv_bytes"`
	ArenaBytes     uint64      `json:"arena_bytes"`
	Source         string      `json:"source"`
	Gemm           string      `json:"gemm"`
	Kernels        string      `json:"kernels"`
	// KernelsOverlap: kernels launch overlapped (programmatic dependent
	// launch; MEMWALL_KERNELS_PDL=0 turns it off), for comparing profiles.
	KernelsOverlap bool `json:"kernels_overlap"`
	// KernelsQ8: single-token products over Q4_K and Q6_K weights quantize
	// their activations to 8 bits (--quant-decode q8, where the kernels
	// have them).
	KernelsQ8 bool `json:"kernels_q8_activations"`
	// KernelsDisabled lists kernels the load-time self-test turned off.
	KernelsDisabled []string `json:"kernels_disabled,omitempty"`
	Warning         string   `json:"warning,omitempty"`
	// With a tokenizer: how many generated ids it has no token for (text
	// leaves them out), and the first of them.
	UndecodableTokens *int `json:"undecodable_tokens,omitempty"`
	FirstUndecodable  *int `json:"first_undecodable_id,omitempty"`

	// HostBytesPerToken is the weight bytes the host's cores read per
	// decode step (blocks placed on the host); Placement says, per block,
	// "resident", "streamed" or "host"; Rates are what chose it.
	HostBytesPerToken uint64        `json:"host_bytes_per_token"`
	Placement         []string      `json:"placement"`
	Rates             *engine.Rates `json:"rates,omitempty"`
}

type runFlags struct {
	df                       deviceFlag
	vram, prompt, ids        string
	maxNew, topK, chunk      int
	slots                    int
	temperature, topP        float64
	seed                     uint64
	asJSON, ignoreEOS, exact bool
	timing, profile          bool
	ungrouped                bool
	graph, quantPrefill      string
	embedding                string
	quantDecode              string
	logitsOut, source        string
	pools                    poolFlags
	place                    placementFlags
}

func runRun(e *env, args []string) error {
	fs := newFlags(e, "run", runUsage)
	var f runFlags
	f.df.add(fs)
	fs.StringVar(&f.vram, "vram", "", "the process's device memory budget, context included (default: free memory less a margin)")
	fs.StringVar(&f.prompt, "prompt", "", "prompt text (needs a tokenizer)")
	fs.StringVar(&f.ids, "prompt-ids", "", "prompt token ids, comma separated")
	intVar(fs, &f.maxNew, "max-new", 32, 1, 1<<20, "most tokens to generate")
	floatVar(fs, &f.temperature, "temperature", 0, 0, 100, false, "sampling temperature; 0 is greedy")
	intVar(fs, &f.topK, "top-k", 0, 0, 1<<22, "keep the K most likely tokens (0: all)")
	floatVar(fs, &f.topP, "top-p", 0, 0, 1, false, "keep the smallest set of tokens reaching probability P (0: all)")
	fs.Uint64Var(&f.seed, "seed", 0, "sampling seed")
	intVar(fs, &f.chunk, "prefill-chunk", 0, 0, 1<<16, "most prompt tokens per prefill step (0: the largest up to the prompt and 2048 that the budget holds)")
	intVar(fs, &f.slots, "slots", 0, 0, 16, "staging slots for streamed weights, 2 or more (0: 3 for chunks of 1024 tokens or more when the budget holds it, else 2)")
	fs.BoolVar(&f.ignoreEOS, "ignore-eos", false, "keep generating after an end-of-sequence token")
	fs.BoolVar(&f.timing, "timing", false, "time the prefill's weight copies and compute on the device (prefill_copy_seconds, prefill_device_seconds)")
	fs.BoolVar(&f.profile, "profile", false, "time two decode steps on the device, one whole and one per op class (diagnostic: it perturbs timing; those steps are left out of decode tokens/s)")
	fs.BoolVar(&f.ungrouped, "ungrouped", false, "one launch per matrix product instead of q/k/v and gate/up grouped (same results; for comparison)")
	fs.StringVar(&f.embedding, "embedding", "auto", "where the embedding table lives: auto (read in place from the registered file over the link when weights stream, the table is not tied to the LM head and the plan predicts a faster step with a row's gather as timed on the device; else on the device) or device")
	fs.StringVar(&f.graph, "graph", "auto", "decode steps as a device graph: auto (captured once and replayed per token when every weight is resident on a CUDA device; same tokens) or off (plain launches)")
	fs.StringVar(&f.quantPrefill, "quant-prefill", "bf16", "a quantized model's prefill products: bf16 (each weight dequantized to bf16 for chunks of 16 tokens or more, activations rounded to bf16; the bf16 model's rate) or quantized (the quantized kernels, float32 activations)")
	fs.StringVar(&f.quantDecode, "quant-decode", "q8", "a quantized model's single-token products over Q4_K and Q6_K weights: q8 (activations quantized to 8 bits per 32, integer dot products, as llama.cpp decodes; on GPUs and the simulator) or float (float32 activations)")
	fs.BoolVar(&f.exact, "exact", false, "keep activations in float32 instead of rounding to the model dtype like transformers")
	fs.StringVar(&f.logitsOut, "logits-out", "", "write the first generated token's logits to FILE (little-endian float32)")
	fs.StringVar(&f.source, "source", "auto", "host side of streamed copies: auto, registered-mmap, pinned-copy or bounce")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object")
	f.pools.add(fs)
	fs.StringVar(&f.place.placement, "placement", "stream", "blocks the budget cannot hold: stream (copied to the device each step; the default), host (computed on the host's cores, prefill included, so far) or auto (on a CUDA device, what the measured link and host rates predict is faster for decode; stream on the simulator)")
	floatVar(fs, &f.place.linkGBps, "link-gbps", 0, 0, 10000, false, "host-to-device GB/s for --placement auto (0: measure)")
	floatVar(fs, &f.place.hostGBps, "host-gbps", 0, 0, 10000, false, "host product GB/s (weights read) for --placement auto (0: measure)")
	pos, vram, err := parseModelFlags(fs, args, &f.df, &f.vram)
	if err != nil {
		return err
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
	if f.slots == 1 {
		return usagef("--slots 1: want 2..16 (or 0: chosen)")
	}
	if f.graph != "auto" && f.graph != "off" {
		return usagef("--graph %q: want auto or off", f.graph)
	}
	if f.embedding != "auto" && f.embedding != "device" {
		return usagef("--embedding %q: want auto or device", f.embedding)
	}
	if f.quantPrefill != "bf16" && f.quantPrefill != "quantized" {
		return usagef("--quant-prefill %q: want bf16 or quantized", f.quantPrefill)
	}
	if f.quantDecode != "q8" && f.quantDecode != "float" {
		return usagef("--quant-decode %q: want q8 or float", f.quantDecode)
	}
	sampling := engine.Sampling{MaxNew: f.maxNew, Temperature: f.temperature, TopK: f.topK, TopP: f.topP, Seed: f.seed, IgnoreEOS: f.ignoreEOS}
	if err := sampling.Validate(); err != nil {
		return usagef("%s", strings.TrimPrefix(err.Error(), "engine: "))
	}
	source, err := residency.ParseSource(f.source)
	if err != nil {
		return usagef("--source: %v", err)
	}
	logits, err := checkOutput(e.temps, "--logits-out", f.logitsOut)
	if err != nil {
		return err
	}
	if err := f.pools.check(e); err != nil {
		return err
	}
	if err := f.place.check(); err != nil {
		return err
	}
	if err := checkFiles(e, modelInputs("MODEL", pos[0]), append(f.pools.outputs(), logits)...); err != nil {
		return err
	}
	remove, err := spoolModel(e, pos[0], true)
	if err != nil {
		return err
	}
	defer remove()
	return f.pools.finish(runModel(e, &f, pos[0], ids, vram, sampling, source, logits))
}

// runReads is what run opens, for messages.
const runReads = "a Llama-family model: a directory with config.json and safetensors, a .safetensors file (or sharded index) with config.json beside it, or a .gguf file"

// checkRunModel refuses a file that is not one run reads, by its contents,
// naming what it is and what run reads (a directory is left to llama.Open).
func checkRunModel(path string) error {
	if st, err := os.Stat(path); err != nil || st.IsDir() {
		return nil // llama.Open names the path and the reason
	}
	kind, err := sniffFile(path)
	if err != nil {
		return err
	}
	switch kind {
	case kindGGUF, kindSafetensors:
		return nil
	case kindJSON:
		if strings.HasSuffix(path, ".json") {
			return nil // a sharded index; llama.Open names what is wrong
		}
	case kindONNX:
		return fmt.Errorf("%s: it is an ONNX model, which run does not read (memwall plan, fit and stream do); run reads %s", path, runReads)
	}
	return fmt.Errorf("%s: not a model file: it is %s; run reads %s", path, kindPhrase(kind), runReads)
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
	m, tok, err := openRunModel(e, path)
	if err != nil {
		return err
	}
	defer m.Close()
	if f.prompt != "" {
		if tok == nil {
			return fmt.Errorf("%s: no tokenizer (no tokenizer.json beside the weights, no GGUF vocabulary): give --prompt-ids", path)
		}
		ids = tok.Encode(f.prompt, true)
	}
	so := runSimOptions()
	d, ch, err := e.open(f.df.backend, auto.Options{Getenv: e.getenv, Sim: &so})
	if err != nil {
		return err
	}
	defer d.Close()
	g := generation{model: m, path: path, tok: tok, ids: ids, vram: vram, sampling: sampling,
		opts: engine.Options{PrefillChunk: f.chunk, Slots: f.slots, Source: source, Exact: f.exact, Timing: f.timing,
			Profile: f.profile, Ungrouped: f.ungrouped, NoGraph: f.graph == "off", QuantPrefill: f.quantPrefill == "quantized", NoMapEmbedding: f.embedding == "device"}, floatDecode: f.quantDecode == "float", quiet: f.asJSON, pools: &f.pools, placement: &f.place}
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
	if n := out.UndecodableTokens; n != nil && *n > 0 {
		fmt.Fprintf(e.stderr, "\nmemwall run: warning: %d of the %d generated ids are not in the tokenizer's %d tokens (the model's vocab_size is %d) and printed as nothing; the first is %d\n",
			*n, len(out.Tokens), tok.VocabSize(), m.Config.Vocab, *out.FirstUndecodable)
	}
	printRun(e, out)
	return nil
}

// openRunModel opens the Llama-family model at path (refusing, by its
// contents, a file run does not read) and its tokenizer (nil when it has
// none). The caller closes the model.
// parseModelFlags parses the flags of a verb that takes one MODEL and a
// --vram budget (vram, the flag's text; "" for the default): the
// positional arguments (exactly one) and the budget in bytes (0: none
// given).
func parseModelFlags(fs *flag.FlagSet, args []string, df *deviceFlag, vram *string) (pos []string, bytes uint64, err error) {
	if pos, err = parseFlags(fs, args); err != nil {
		return nil, 0, err
	}
	if len(pos) != 1 {
		return nil, 0, usagef("want one MODEL argument, got %d", len(pos))
	}
	if err := df.check(); err != nil {
		return nil, 0, err
	}
	if *vram != "" {
		if bytes, err = flagSize("vram", *vram, false); err != nil {
			return nil, 0, err
		}
	}
	return pos, bytes, nil
}

// parseModelsFlags is parseModelFlags for verbs that take least or more
// MODEL arguments (models sharing one budget).
func parseModelsFlags(fs *flag.FlagSet, args []string, df *deviceFlag, vram *string, least int) (pos []string, bytes uint64, err error) {
	if pos, err = parseFlags(fs, args); err != nil {
		return nil, 0, err
	}
	if len(pos) < least {
		return nil, 0, usagef("want %d MODEL arguments or more (models sharing the budget), got %d", least, len(pos))
	}
	if err := df.check(); err != nil {
		return nil, 0, err
	}
	if *vram != "" {
		if bytes, err = flagSize("vram", *vram, false); err != nil {
			return nil, 0, err
		}
	}
	return pos, bytes, nil
}

func openRunModel(e *env, path string) (*llama.Model, textCodec, error) {
	local := e.local(path)
	if err := checkRunModel(local); err != nil {
		if local != path {
			err = renamedError{err, local, path}
		}
		return nil, nil, err
	}
	m, err := openInput(e, path, llama.Open)
	if err != nil {
		return nil, nil, err
	}
	tok, err := openTokenizer(m)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, tok, nil
}

// undecodable counts the ids tok has no token for, and returns the first.
func undecodable(tok textCodec, ids []int) (n, first int) {
	for _, id := range ids {
		if _, ok := tok.Token(id); !ok {
			if n == 0 {
				first = id
			}
			n++
		}
	}
	return n, first
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
	// floatDecode turns the kernels' 8-bit-activation products off
	// (--quant-decode float).
	floatDecode bool
	pools       *poolFlags // --oom-snapshot and --pool-log; nil: neither
	// placement is --placement and its rates (nil: stream); rates, what
	// place measured.
	placement *placementFlags
	rates     *engine.Rates
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
	o.MaxTokens, o.PromptTokens = maxTokens, len(ids)
	l, err := g.load(e, d, backend, o, "run")
	if err != nil {
		return out, nil, err
	}
	defer l.close()
	ks, rp, dev, eng, budget := l.ks, l.rp, l.dev, l.eng, l.rp.budget
	out = runJSON{Model: g.path, Device: backend + ": " + d.Info().Name, PromptIDs: ids, BudgetBytes: budget.VRAMBytes,
		PrefillChunk: rp.foot.PrefillChunk, Slots: rp.foot.Slots, ChunkChosen: g.opts.PrefillChunk == 0, SlotsChosen: g.opts.Slots == 0,
		PredictedPeakBytes: rp.predictedPeak(),
		BudgetDefault:      budget.Default, ContextBytes: budget.ContextBytes, ContextSource: budget.ContextSource, LoadedBytes: budget.LoadedBytes,
		Gemm: eng.GemmLibrary(), Kernels: ks.Source(), KernelsOverlap: ks.Overlap(), KernelsQ8: ks.Q8Activations(), KernelsDisabled: ks.Disabled(), Warning: budget.Warning}
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
	out.HostBytesPerToken, out.Rates = res.HostBytesPerToken, g.rates
	out.Placement = blockPlacement(eng, m.Config.Layers, rp.opts.HostLayers)
	if g.tok != nil {
		text := g.tok.Decode(res.Tokens, true)
		out.Text = &text
		n, first := undecodable(g.tok, res.Tokens)
		out.UndecodableTokens = &n
		if n > 0 {
			out.FirstUndecodable = &first
		}
	}
	return out, res, nil
}

// loaded is a model placed on a device: the kernels, the compute stream,
// the reservation, the host side of hosted blocks, the pools and the
// engine, closed in the reverse order by close.
type loaded struct {
	ks        *kernels.Set
	rp        reservation
	dev, host *pool.Pool
	eng       *engine.Engine
	closers   []func()
}

func (l *loaded) close() {
	for i := len(l.closers) - 1; i >= 0; i-- {
		l.closers[i]()
	}
}

// load places g's model on d for options o (MaxTokens and PromptTokens
// set): the kernels load and the GEMM library warms up on the compute
// stream first, so that the budget counts their modules and workspace;
// then the budget is planned (reserveRun), blocks placed (place), the
// pools (named after verb) and the engine made. On error nothing stays
// open.
func (g *generation) load(e *env, d device.Device, backend string, o engine.Options, verb string) (_ *loaded, err error) {
	m := g.model
	if b := d.Info().Backend; b == "vulkan" {
		return nil, fmt.Errorf("the %s backend has no Llama kernels yet (they are PTX and Go only): use --device cuda or --device sim", b)
	}
	l := &loaded{}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	if l.ks, err = kernels.Load(d, e.getenv); err != nil {
		return nil, err
	}
	l.closers = append(l.closers, func() { l.ks.Close() })
	if g.floatDecode {
		l.ks.SetQ8Activations(false)
	}
	st, err := d.NewStream()
	if err != nil {
		return nil, err
	}
	l.closers = append(l.closers, func() { d.DestroyStream(st) })
	o.Stream = st
	if l.rp, err = reserveRun(e.ctx, d, l.ks, m, g.vram, o); err != nil {
		return nil, g.planError(e, d, o, l.rp.budget, err)
	}
	hs, err := g.place(e, d, l.ks, &l.rp, backend)
	if err != nil {
		return nil, err
	}
	if hs != nil {
		l.closers = append(l.closers, hs.close)
	}
	budget := l.rp.budget
	if budget.Warning != "" && !g.quiet {
		fmt.Fprintf(e.stderr, "memwall %s: warning: %s\n", verb, budget.Warning)
	}
	po := pool.DefaultOptions(d)
	po.Name, po.Limit = verb, budget.PoolBytes
	g.pools.device(&po)
	if l.dev, err = pool.New(d, po); err != nil {
		return nil, err
	}
	l.closers = append(l.closers, func() { l.dev.Close() })
	ho := pool.Options{Name: verb + "-host"}
	g.pools.host(&ho)
	if l.host, err = pool.NewHost(d, ho); err != nil {
		return nil, err
	}
	l.closers = append(l.closers, func() { l.host.Close() })
	if l.eng, err = engine.New(e.ctx, d, l.ks, l.dev, l.host, m, l.rp.opts); err != nil {
		var be *engine.BudgetError
		if errors.As(err, &be) {
			return nil, g.minimum(e, d, o, budget, be, err)
		}
		return nil, err
	}
	l.closers = append(l.closers, func() { l.eng.Close() })
	return l, nil
}

func fillRunJSON(out *runJSON, eng *engine.Engine, dev *pool.Pool, res *engine.Result) {
	out.Tokens, out.Stop = res.Tokens, res.Stop
	out.PrefillTokensPerS, out.DecodeTokensPerS = res.PrefillTokensPerS, res.DecodeTokensPerS
	out.PrefillSeconds, out.DecodeSeconds = res.PrefillSeconds, res.DecodeSeconds
	out.PrefillCopySeconds, out.PrefillDeviceSeconds = res.PrefillCopySeconds, res.PrefillDeviceSeconds
	out.StreamedBytesPerToken = res.StreamedBytesPerToken
	out.DecodeStepDeviceSeconds, out.DecodeProfile = res.DecodeStepDeviceSeconds, res.DecodeProfile
	out.DecodeProfileSeconds, out.ProductWeightBytes = res.DecodeProfileSeconds, res.ProductWeightBytes
	out.DecodeProfileQueue = res.DecodeProfileQueueSeconds
	out.DecodeProfileOps, out.DecodeProfileSegments = res.DecodeProfileOps, res.DecodeProfileSegments
	out.DecodeGraph, out.DecodeGraphReason = eng.GraphStatus()
	out.DecodeGraphSteps, out.DecodeGraphStepDeviceSeconds = res.DecodeGraphSteps, res.DecodeGraphStepDeviceSeconds
	if res.DecodeStepDeviceSeconds > 0 && res.DecodeTokensPerS > 0 {
		out.DecodeLaunchGapSeconds = 1/res.DecodeTokensPerS - res.DecodeStepDeviceSeconds
	}
	st := dev.Stats()
	out.PoolPeakBytes = st.PeakReservedBytes
	out.ScratchBytes = eng.ScratchBytes()
	out.PeakDeviceBytes = st.PeakReservedBytes + out.ContextBytes + out.LoadedBytes + out.ScratchBytes
	rs := eng.Residency().Stats()
	out.ResidentBytes, out.ResidentGroups, out.Groups = rs.ResidentBytes, rs.ResidentGroups, rs.Groups
	out.MappedBytes = rs.MappedBytes
	if g := eng.Gather(); g.Measured() {
		out.Gather = &gatherJSON{HostSeconds: g.Host.Seconds(), DeviceSeconds: g.Device.Seconds(), RowBytes: g.RowBytes, Mapped: rs.MappedBytes > 0}
	}
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
	if o.DecodeGraph {
		fmt.Fprintf(w, "  decode as a device graph: %d steps replayed", o.DecodeGraphSteps)
		if o.DecodeGraphStepDeviceSeconds > 0 {
			fmt.Fprintf(w, "; one replay on the device %.1f µs", o.DecodeGraphStepDeviceSeconds*1e6)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "  decode by plain launches: %s\n", o.DecodeGraphReason)
	}
	if o.DecodeStepDeviceSeconds > 0 {
		fmt.Fprintf(w, "  decode step on the device %.1f µs (products read %s: %.0f GB/s over the step); launch gap %.1f µs per token\n",
			o.DecodeStepDeviceSeconds*1e6, humanBytes(o.ProductWeightBytes), float64(o.ProductWeightBytes)/o.DecodeStepDeviceSeconds/1e9,
			o.DecodeLaunchGapSeconds*1e6)
	}
	if o.DecodeProfileSeconds > 0 {
		fmt.Fprintf(w, "  profiled step %.1f µs:", o.DecodeProfileSeconds*1e6)
		for _, c := range []string{engine.ClassProducts, engine.ClassAttention, engine.ClassNorms, engine.ClassOther} {
			fmt.Fprintf(w, " %s %.1f µs", c, o.DecodeProfile[c]*1e6)
		}
		fmt.Fprintf(w, "\n    %d ops:", o.DecodeProfileSegments)
		for _, op := range slices.Sorted(maps.Keys(o.DecodeProfileOps)) {
			p := o.DecodeProfileOps[op]
			fmt.Fprintf(w, " %s %d × %.1f µs;", op, p.Count, p.Seconds/float64(max(p.Count, 1))*1e6)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  peak device memory %s of the %s budget (pools %s + context %s + modules %s + attention scratch %s)\n",
		humanBytes(o.PeakDeviceBytes), humanBytes(o.BudgetBytes), humanBytes(o.PoolPeakBytes), humanBytes(o.ContextBytes),
		humanBytes(o.LoadedBytes), humanBytes(o.ScratchBytes))
	fmt.Fprintf(w, "  resident: %d of %d weight groups (%s); streamed %s per token (%s)\n",
		o.ResidentGroups, o.Groups, humanBytes(o.ResidentBytes), humanBytes(o.StreamedBytesPerToken), o.Source)
	if g := o.Gather; g != nil {
		how := "kept on the device"
		if o.MappedBytes > 0 {
			how = fmt.Sprintf("(%s) read in place from host memory", humanBytes(o.MappedBytes))
		}
		fmt.Fprintf(w, "  embedding table %s: a row's gather measured %.1f µs from host memory, %.1f µs from device memory\n",
			how, g.HostSeconds*1e6, g.DeviceSeconds*1e6)
	} else if o.MappedBytes > 0 {
		fmt.Fprintf(w, "  embedding table (%s) read in place from host memory\n", humanBytes(o.MappedBytes))
	}
	fmt.Fprintf(w, "  KV cache %s, activation arena %s; prefill in chunks of %d tokens (%s), %d staging slots (%s)\n", humanBytes(o.KVBytes), humanBytes(o.ArenaBytes),
		o.PrefillChunk, chosenOrGiven(o.ChunkChosen), o.Slots, chosenOrGiven(o.SlotsChosen))
	if o.HostBytesPerToken > 0 {
		fmt.Fprintf(w, "  host computes %d of %d blocks (%s of weights per token): %s\n", countOf(o.Placement, "host"), len(o.Placement),
			humanBytes(o.HostBytesPerToken), strings.Join(o.Placement, " "))
	}
}

func chosenOrGiven(chosen bool) string {
	if chosen {
		return "chosen from the budget"
	}
	return "given"
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
	Token(id int) (string, bool)
	VocabSize() int
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

// reservation is what `memwall run` reserves on a device, and what `memwall
// fit` predicts for a Llama model: one computation for both.
type reservation struct {
	budget residency.Budget
	// opts are the engine options planned: Budget is the pools' share of
	// the budget, PrefillChunk and Slots are resolved (chosen from the
	// budget when they were 0).
	opts engine.Options
	foot *engine.Footprint
}

// predictedPeak is the whole footprint the plan predicts, as nvidia-smi
// counts it: the engine's device bytes, the context and what was loaded.
func (rp reservation) predictedPeak() uint64 {
	return rp.foot.DeviceBytes + rp.budget.ContextBytes + rp.budget.LoadedBytes
}

// gatherJSON is run's account of the embedding gather's measured cost.
type gatherJSON struct {
	HostSeconds   float64 `json:"host_seconds"`
	DeviceSeconds float64 `json:"device_seconds"`
	RowBytes      uint64  `json:"row_bytes"`
	// Mapped: the plan read the table in place.
	Mapped bool `json:"mapped"`
}

// budgetRefused is residency.PlanBudget's refusal of a --vram figure.
type budgetRefused struct{ err error }

func (b *budgetRefused) Error() string { return b.err.Error() }
func (b *budgetRefused) Unwrap() error { return b.err }

// reserveRun plans m on d for options o (MaxTokens and PromptTokens set):
// it runs one product of every shape the chosen chunk multiplies on
// stream st (engine.WarmProducts: a GEMM library's lazily loaded kernels
// and per-stream workspace then count in the budget), measures the budget
// (residency.PlanBudget with vram, 0 for the default) and plans the engine
// under it (engine.Estimate, which chooses the chunk and slots left 0).
// A chunk chosen under the measured budget whose shapes were not warmed
// up is warmed and the budget measured again, at most three times. The
// pools must not exist yet. A budget PlanBudget refuses comes back as a
// *budgetRefused, one below the engine's minimum as an *engine.BudgetError.
func reserveRun(ctx context.Context, d device.Device, ks *kernels.Set, m *llama.Model, vram uint64, o engine.Options) (reservation, error) {
	var rp reservation
	if err := measureGather(d, ks, m, &o); err != nil {
		return rp, err
	}
	warmed := map[int]bool{}
	chunk := o.PrefillChunk
	if chunk == 0 {
		chunk = min(o.PromptTokens, engine.AutoChunkLimit)
	}
	for range 3 {
		var todo []int
		for _, t := range stepTokens(o.PromptTokens, chunk) {
			if !warmed[t] {
				warmed[t] = true
				todo = append(todo, t)
			}
		}
		if len(todo) > 0 {
			if err := engine.WarmProducts(d, ks, m, o.Stream, todo); err != nil {
				return rp, err
			}
		}
		b, err := residency.PlanBudget(d, vram)
		rp.budget = b
		if err != nil {
			return rp, &budgetRefused{err}
		}
		po := o
		po.Budget = b.PoolBytes
		f, err := engine.Estimate(ctx, m, po, d.Info())
		if err != nil {
			return rp, err
		}
		rp.opts, rp.foot = po, f
		chunk = f.PrefillChunk
		if allWarmed(warmed, stepTokens(o.PromptTokens, chunk)) {
			break
		}
	}
	rp.opts.PrefillChunk, rp.opts.Slots = rp.foot.PrefillChunk, rp.foot.Slots
	return rp, nil
}

// measureGather times the embedding gather on d (engine.MeasureGather)
// into o.Gather, which decides whether the table is read in place, when
// the plan could map m's table; otherwise it leaves o alone.
func measureGather(d device.Device, ks *kernels.Set, m *llama.Model, o *engine.Options) error {
	in := d.Info()
	if o.NoMapEmbedding || m.Config.TiedEmbeddings || !in.ReadOnlyHostRegister || !in.CanMapHostMemory || in.HostMemory ||
		o.Gather.Measured() || (o.Source != residency.Auto && o.Source != residency.Register) {
		return nil
	}
	g, err := engine.MeasureGather(d, ks, m, o.Stream)
	if err != nil {
		return fmt.Errorf("measure the embedding gather: %w", err)
	}
	o.Gather = g
	return nil
}

func allWarmed(warmed map[int]bool, ts []int) bool {
	for _, t := range ts {
		if !warmed[t] {
			return false
		}
	}
	return true
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

// planError turns reserveRun's error into what run reports: a budget below
// the engine's minimum (or one PlanBudget refuses while the engine would
// need more anyway) states the minimum.
func (g *generation) planError(e *env, d device.Device, o engine.Options, b residency.Budget, err error) error {
	var be *engine.BudgetError
	if errors.As(err, &be) {
		return g.minimum(e, d, o, b, be, err)
	}
	var br *budgetRefused
	if errors.As(err, &br) {
		return g.belowMinimum(e, d, o, b, br.err)
	}
	return err
}

func (g *generation) minimum(e *env, d device.Device, o engine.Options, b residency.Budget, be *engine.BudgetError, err error) error {
	overhead := b.ContextBytes + b.LoadedBytes + b.ReserveBytes
	n := be.Minimum + overhead
	msg := fmt.Sprintf("--vram %d bytes (%s): below the minimum %d bytes (%s) for %s with %d tokens of context (the context's own %s, loaded modules' %s and a reserve of %s included)",
		b.VRAMBytes, humanBytes(b.VRAMBytes), n, humanBytes(n), g.path, o.MaxTokens, humanBytes(b.ContextBytes), humanBytes(b.LoadedBytes),
		humanBytes(b.ReserveBytes))
	if o.PrefillChunk > 0 {
		msg += fmt.Sprintf(" with --prefill-chunk %d", o.PrefillChunk)
		auto := o
		auto.PrefillChunk, auto.Budget = 0, be.Budget
		if f, aerr := engine.Estimate(e.ctx, g.model, auto, d.Info()); aerr == nil {
			msg += fmt.Sprintf("; the largest chunk this budget holds is %d tokens (leave --prefill-chunk out to have it chosen)", f.PrefillChunk)
		}
	}
	return &minimumError{vram: g.vram, minimum: n, err: err, msg: msg + ": " + err.Error()}
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
	return g.minimum(e, d, o, b, be, eerr)
}

// demoRun generates with the tiny synthetic model on d under a budget that
// makes part of it stream, and says what ran where.
func demoRun(e *env, d device.Device) error {
	dir, err := e.temps.MkdirTemp("", "memwall-demo-run")
	if err != nil {
		return err
	}
	defer e.temps.RemoveAll(dir)
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
