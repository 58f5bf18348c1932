package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/fleet"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/residency"
	"github.com/memwall/memwall/serve"
	"github.com/memwall/memwall/telemetry"
	"github.com/memwall/memwall/tokenizer"
)

func init() {
	register(verb{name: "serve", summary: "serve a Llama-family model over OpenAI's HTTP API with continuous batching", run: runServe})
}

const serveUsage = `(MODEL [MODEL...] | --config FILE) [--vram SIZE] [--follow-free] [--keep-alive SECONDS] [--unload-after SECONDS] [--addr 127.0.0.1:8080] [--max-seqs N] [--max-model-len N] [--kv-tokens N] [--api-key KEY] [--model-name NAME] [--device auto|cuda|sim] [--json]

Serves MODEL (what 'memwall run' reads) over OpenAI's API on --addr:
POST /v1/completions (prompt as text or token ids), POST /v1/chat/completions
(the model's chat template from tokenizer_config.json or GGUF metadata;
without one, a 400), GET /v1/models, GET /health and GET /metrics (vLLM's
metric names, and memwall's own). Requests join and leave one batch between
steps (continuous batching): each step runs up to --max-seqs sequences'
next prompt chunk or token together, so every weight byte, resident or
streamed, is read once per step for all of them. The KV cache holds
--kv-tokens tokens in paged blocks (default --max-seqs x --max-model-len);
when it runs out the latest admitted sequence is preempted and computed
again later. The budget, placement and chunk rules are run's; the prefill
chunk is also the most tokens one step holds. SIGINT or SIGTERM stops
taking requests, lets the running ones finish (at most --drain-seconds)
and exits 0; a second signal exits at once.

Several MODELs share the budget (package fleet): each is loaded at its
minimum, then every model keeps its minimum and the rest goes first to the
models serving requests, then to the idle ones within --keep-alive, each up
to the budget that keeps it whole. A model that loses its share streams its
weights from host memory instead of leaving the GPU; one that gains pulls
them back in at the link's rate, between steps. Requests name their model
("model"); GET /admin/budget shows every model's share and POST
/admin/budget {"vram_bytes": N} changes the budget while they serve (a
shrink is applied before the answer; 409 below the models' minimum).
--follow-free moves the budget after the device's free memory as other
processes take and release it, never above --vram (or the last POST). A
model with no request for --unload-after seconds is unloaded (its engine,
KV cache and arena freed, its file's pages no longer registered: only its
kernels stay) and loaded again when a request names it, which waits for
the load. --config FILE gives the models in a JSON file instead, each
with its own priority (the share goes to the higher first), keep-alive and
unload-after (the flags' values where absent; paths relative to the file):

  {"models": [{"path": "chat.gguf", "name": "chat", "priority": 2, "keep_alive_s": -1},
              {"path": "code.gguf", "keep_alive_s": 60, "unload_after_s": 600}]}

With several models (or --follow-free) the prefill chunk defaults to 512
tokens.

  curl -s http://127.0.0.1:8080/v1/completions -H 'Content-Type: application/json' \
    -d '{"prompt": "The model runs", "max_tokens": 16, "temperature": 0}'`

// defaultUnloadAfterS is --unload-after's default: half an hour without a
// request takes a model off (its keep-alive gave its share back long
// before).
const defaultUnloadAfterS = 1800

type serveFlags struct {
	df                        deviceFlag
	vram, addr, apiKey, name  string
	config                    string
	source                    string
	maxSeqs, maxLen, kvTokens int
	keepAliveS, unloadAfterS  int
	chunk, maxQueue           int
	drainS                    int
	asJSON, followFree        bool
	keepAlive, unloadAfter    time.Duration
}

// serveJSON is what `memwall serve --json` prints once it listens.
type serveJSON struct {
	URL          string `json:"url"`
	Model        string `json:"model"`
	ModelName    string `json:"model_name"`
	Device       string `json:"device"`
	BudgetBytes  uint64 `json:"budget_bytes"`
	MaxSeqs      int    `json:"max_seqs"`
	MaxModelLen  int    `json:"max_model_len"`
	StepTokens   int    `json:"step_tokens"`
	KVBlocks     int    `json:"kv_blocks"`
	KVBlockBytes uint64 `json:"kv_block_bytes"`
	// ResidentBytes are the weights kept on the device, StreamedBytes
	// those copied per step, HostBytes those the host computes per step.
	ResidentBytes uint64 `json:"resident_weight_bytes"`
	StreamedBytes uint64 `json:"streamed_weight_bytes_per_step"`
	HostBytes     uint64 `json:"host_weight_bytes_per_step"`
	ChatTemplate  string `json:"chat_template"`
	// With several models (package fleet): the model's priority, the
	// seconds it keeps more than its minimum when idle (-1: forever) and
	// those without a request before it is unloaded (0: never).
	Priority           float64  `json:"priority,omitempty"`
	KeepAliveSeconds   *float64 `json:"keep_alive_seconds,omitempty"`
	UnloadAfterSeconds *float64 `json:"unload_after_seconds,omitempty"`
}

func runServe(e *env, args []string) error {
	fs := newFlags(e, "serve", serveUsage)
	var f serveFlags
	f.df.add(fs)
	fs.StringVar(&f.vram, "vram", "", "the process's device memory budget, context included (default: free memory less a margin)")
	fs.StringVar(&f.addr, "addr", "127.0.0.1:8080", "address to listen on (host:port; port 0 picks a free one)")
	intVar(fs, &f.maxSeqs, "max-seqs", 32, 1, 1024, "most sequences in one step")
	intVar(fs, &f.maxLen, "max-model-len", 0, 0, 1<<22, "longest sequence, prompt and output (0: the model's context)")
	intVar(fs, &f.kvTokens, "kv-tokens", 0, 0, 1<<28, "tokens the KV cache holds for all sequences (0: --max-seqs x --max-model-len)")
	intVar(fs, &f.chunk, "prefill-chunk", 0, 0, 1<<16, "most tokens per step (0: the largest up to 2048 that the budget holds)")
	intVar(fs, &f.maxQueue, "max-queue", 1024, 1, 1<<20, "most requests waiting; more get 429")
	intVar(fs, &f.drainS, "drain-seconds", 60, 0, 3600, "how long a shutdown waits for running requests, in seconds")
	fs.StringVar(&f.apiKey, "api-key", "", "require this key as Authorization: Bearer KEY on /v1/")
	fs.StringVar(&f.name, "model-name", "", "the model's id in the API (default: MODEL's base name)")
	fs.StringVar(&f.source, "source", "auto", "host side of streamed copies: auto, registered-mmap, pinned-copy or bounce")
	fs.BoolVar(&f.asJSON, "json", false, "print one JSON object when listening instead of the human summary")
	fs.BoolVar(&f.followFree, "follow-free", false, "move the budget after the device's free memory as other processes take and release it (at most --vram)")
	intVar(fs, &f.keepAliveS, "keep-alive", int(fleet.DefaultKeepAlive/time.Second), -1, 1<<30, "with several models: seconds an idle one keeps more than its minimum (0: none, -1: forever)")
	intVar(fs, &f.unloadAfterS, "unload-after", defaultUnloadAfterS, 0, 1<<30, "with several models: seconds without a request after which a model is unloaded, to load again at the next (0: never)")
	fs.StringVar(&f.config, "config", "", "a JSON file of the models to serve instead of MODEL arguments: {\"models\": [{\"path\": ..., \"name\": ..., \"priority\": 1, \"keep_alive_s\": 300, \"unload_after_s\": 1800}]}")
	pos, vram, err := parseModelsFlags(fs, args, &f.df, &f.vram, 0)
	if err != nil {
		return err
	}
	f.keepAlive = keepAliveOf(int64(f.keepAliveS))
	f.unloadAfter = time.Duration(f.unloadAfterS) * time.Second
	switch {
	case f.config != "" && len(pos) > 0:
		return usagef("--config %s and MODEL arguments: give the models one way", f.config)
	case f.config != "" && f.name != "":
		return usagef("--config %s and --model-name: name the models in the file (\"name\")", f.config)
	case f.config == "" && len(pos) == 0:
		return usagef("want a MODEL argument (or several sharing the budget) or --config FILE")
	}
	if _, _, err := net.SplitHostPort(f.addr); err != nil {
		return usagef("--addr %q: want host:port (%v)", f.addr, err)
	}
	source, err := residency.ParseSource(f.source)
	if err != nil {
		return usagef("--source: %v", err)
	}
	if f.config != "" || len(pos) > 1 || f.followFree {
		specs, err := f.fleetSpecs(pos)
		if err != nil {
			return err
		}
		for _, s := range specs {
			if s.path == "-" {
				return usagef("MODEL -: a model read from standard input serves alone (without --follow-free)")
			}
			if err := checkFiles(e, modelInputs("MODEL", s.path)); err != nil {
				return err
			}
		}
		return serveFleet(e, &f, specs, vram, source)
	}
	if err := checkFiles(e, modelInputs("MODEL", pos[0])); err != nil {
		return err
	}
	remove, err := spoolModel(e, pos[0], true)
	if err != nil {
		return err
	}
	defer remove()
	return serveModel(e, &f, pos[0], vram, source)
}

// fleetSpecs are the models of a shared-budget serve: --config's, or the
// MODEL arguments named by --model-name (or their base names) with the
// flags' priority 1, keep-alive and unload-after.
func (f *serveFlags) fleetSpecs(paths []string) ([]fleetSpec, error) {
	def := fleetSpec{priority: 1, keepAlive: f.keepAlive, unloadAfter: f.unloadAfter}
	if f.config != "" {
		r, err := os.Open(f.config)
		if err != nil {
			return nil, fmt.Errorf("--config: %w", err)
		}
		defer r.Close()
		return parseServeConfig(f.config, r, def)
	}
	names, err := fleetNames(f.name, paths)
	if err != nil {
		return nil, err
	}
	specs := make([]fleetSpec, len(paths))
	for i, p := range paths {
		specs[i] = def
		specs[i].path, specs[i].name = p, names[i]
	}
	return specs, nil
}

// serveModel loads the model as run does and serves it until e.ctx ends.
func serveModel(e *env, f *serveFlags, path string, vram uint64, source residency.Source) error {
	m, codec, err := openRunModel(e, path)
	if err != nil {
		return err
	}
	defer m.Close()
	tok, _ := codec.(*tokenizer.Tokenizer)
	o, err := serveOptions(f, m, source)
	if err != nil {
		return err
	}
	maxLen := o.MaxTokens
	so := runSimOptions()
	d, ch, err := e.open(f.df.backend, auto.Options{Getenv: e.getenv, Sim: &so})
	if err != nil {
		return err
	}
	defer d.Close()
	g := generation{model: m, path: path, vram: vram, opts: o, quiet: f.asJSON}
	l, b, err := g.loadBatch(e, d, ch.Backend, f.maxSeqs, "serve", "--max-seqs")
	if err != nil {
		return err
	}
	defer l.close()
	defer b.Close()
	chat, chatFrom := serveChat(e, m, tok)
	rs := l.eng.Residency().Stats()
	name := f.name
	if name == "" {
		name = filepath.Base(strings.TrimRight(path, "/"))
	}
	s, err := serve.New(b, serve.Options{ModelName: name, MaxSeqs: f.maxSeqs, MaxQueue: f.maxQueue, APIKey: f.apiKey, Tokenizer: tok, Chat: chat,
		IsEOS: m.Config.IsEOS, Pools: []telemetry.PoolSource{l.dev, l.host},
		Memory:        serve.Memory{BudgetBytes: l.rp.budget.VRAMBytes, ResidentBytes: rs.ResidentBytes, StreamedBytes: rs.PassBytes, HostBytes: l.eng.HostWeightBytes()},
		StreamedBytes: func() uint64 { return l.eng.Residency().Stats().StreamedBytes }})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	kv := b.Cache().Config()
	out := serveJSON{URL: "http://" + ln.Addr().String(), Model: path, ModelName: name, Device: ch.Backend + ": " + d.Info().Name,
		BudgetBytes: l.rp.budget.VRAMBytes, MaxSeqs: f.maxSeqs, MaxModelLen: maxLen, StepTokens: b.MaxTokens(), KVBlocks: kv.Blocks,
		KVBlockBytes: b.Cache().BlockBytes(), ResidentBytes: rs.ResidentBytes, StreamedBytes: rs.PassBytes, HostBytes: l.eng.HostWeightBytes(), ChatTemplate: chatFrom}
	if f.asJSON {
		if err := writeJSON(e.stdout, out); err != nil {
			ln.Close()
			return err
		}
	} else {
		printServe(e, out)
	}
	return serveUntilDone(e, []*serve.Server{s}, s.Handler(), ln, time.Duration(f.drainS)*time.Second)
}

// serveOptions are the engine options serve runs m with: sequences of
// --max-model-len tokens (the model's context by default), the KV cache of
// --kv-tokens, prefix caching on.
func serveOptions(f *serveFlags, m *llama.Model, source residency.Source) (engine.Options, error) {
	maxLen := m.Config.Context
	if f.maxLen > 0 {
		if f.maxLen > maxLen {
			return engine.Options{}, usagef("--max-model-len %d: above the model's context of %d (max_position_embeddings in %s)", f.maxLen, maxLen, m.Config.Source)
		}
		maxLen = f.maxLen
	}
	if maxLen < 2 {
		return engine.Options{}, fmt.Errorf("--max-model-len %d: want at least 2 tokens (a prompt token and one generated)", maxLen)
	}
	o := engine.Options{MaxTokens: maxLen, PromptTokens: maxLen - 1, PrefillChunk: f.chunk, Source: source, PrefixCache: true}
	o.BlockTokens = 16
	kvTokens := f.kvTokens
	if kvTokens == 0 {
		kvTokens = f.maxSeqs * maxLen
	}
	o.KVBlocks = max((kvTokens+o.BlockTokens-1)/o.BlockTokens, (maxLen+o.BlockTokens-1)/o.BlockTokens)
	return o, nil
}

// loadBatch loads g's model as load does, with room kept out of the
// weight plan for a batch of maxSeqs sequences (engine.BatchBytes), and
// makes that batch. seqsFlag names the flag that set maxSeqs in the error
// a batch that does not fit gives.
func (g *generation) loadBatch(e *env, d device.Device, backend string, maxSeqs int, verb, seqsFlag string) (*loaded, *engine.Batch, error) {
	o := g.opts
	o.ReserveBytes = engine.BatchBytes(g.model.Config, o, maxSeqs)
	l, err := g.load(e, d, backend, o, verb)
	if err != nil {
		return nil, nil, err
	}
	b, err := l.eng.NewBatch(maxSeqs)
	if err != nil {
		l.close()
		return nil, nil, fmt.Errorf("%w: lower %s or raise --prefill-chunk (or --vram)", err, seqsFlag)
	}
	return l, b, nil
}

// serveChat loads the model's chat template: nil (chat requests get a
// 400) when it has none or it does not compile (a warning says why); the
// second result says where it came from.
func serveChat(e *env, m *llama.Model, tok *tokenizer.Tokenizer) (*serve.ChatTemplate, string) {
	special := func(id int, ok bool) string {
		if !ok || tok == nil {
			return ""
		}
		s, _ := tok.Token(id)
		return s
	}
	var bos, eos string
	if tok != nil {
		bos, eos = special(tok.BOS()), special(tok.EOS())
	}
	dir := ""
	if m.TokenizerPath != "" {
		dir = filepath.Dir(m.TokenizerPath)
	}
	var meta map[string]any
	if m.Weights.Format == "gguf" {
		meta = m.Weights.Metadata
	}
	ct, err := serve.LoadChatTemplate(dir, meta, bos, eos)
	switch {
	case errors.Is(err, serve.ErrNoTemplate):
		return nil, "none"
	case err != nil:
		fmt.Fprintf(e.stderr, "memwall serve: warning: %v: chat completions are off\n", err)
		return nil, "none"
	}
	return ct, ct.Source()
}

func printServe(e *env, o serveJSON) {
	fmt.Fprintf(e.stdout, "memwall serve: %s (%s) on %s, budget %s\n", o.Model, o.ModelName, o.Device, humanBytes(o.BudgetBytes))
	fmt.Fprintf(e.stdout, "  weights: %s resident, %s streamed and %s on the host per step\n", humanBytes(o.ResidentBytes), humanBytes(o.StreamedBytes), humanBytes(o.HostBytes))
	fmt.Fprintf(e.stdout, "  batch: up to %d sequences and %d tokens a step; %d-token sequences; KV cache %d blocks of 16 tokens (%s)\n",
		o.MaxSeqs, o.StepTokens, o.MaxModelLen, o.KVBlocks, humanBytes(uint64(o.KVBlocks)*o.KVBlockBytes))
	fmt.Fprintf(e.stdout, "  chat template: %s\n", o.ChatTemplate)
	fmt.Fprintf(e.stdout, "listening on %s\n", o.URL)
}

// serveUntilDone serves h on ln until e.ctx ends (a signal), then drains
// every server: no new requests, the running ones finish within drain,
// the listener closes. A scheduler that fails ends it with its error.
func serveUntilDone(e *env, servers []*serve.Server, h http.Handler, ln net.Listener, drain time.Duration) error {
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	ran := make(chan error, len(servers))
	for _, s := range servers {
		go func() { ran <- s.Run(runCtx) }()
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var failed error
	waiting := len(servers)
	select {
	case <-e.ctx.Done():
	case err := <-ran:
		waiting--
		if err != nil {
			failed = fmt.Errorf("scheduler: %w", err)
		}
	case err := <-served:
		failed = err
		served <- nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	var derrs []error
	for _, s := range servers {
		derrs = append(derrs, s.Drain(ctx))
	}
	derr := errors.Join(derrs...)
	serr := hs.Shutdown(ctx)
	stopRun()
	for range waiting {
		if err := <-ran; err != nil && failed == nil {
			failed = fmt.Errorf("scheduler: %w", err)
		}
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) && failed == nil {
		failed = err
	}
	if failed != nil {
		return failed
	}
	if derr != nil {
		return derr
	}
	if serr != nil {
		return fmt.Errorf("shutdown: %w", serr)
	}
	fmt.Fprintln(e.stderr, "memwall serve: drained, stopped")
	return nil
}
