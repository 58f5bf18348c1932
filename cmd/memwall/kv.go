package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/memwall/memwall/bench"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/weights"
	"github.com/memwall/memwall/kvcache"
	"github.com/memwall/memwall/kvcache/sched"
	"github.com/memwall/memwall/viz"
)

func init() {
	register(verb{name: "kv", summary: "simulate the paged KV cache against contiguous reservation (kv simulate)", run: runKV})
	benchVerbs["kv"] = runBenchKV
}

func runKV(e *env, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			return printSubHelp(e, "usage: memwall kv SUB-COMMAND [flags]\n\nsub-commands: simulate ('memwall help kv simulate' prints its flags alone):",
				[]string{"simulate"}, func(_ string, args []string) error { return runKVSimulate(e, args) })
		}
		return usagef("want a sub-command: simulate")
	}
	if args[0] != "simulate" {
		return usagef("unknown sub-command %q (want simulate)", args[0])
	}
	return runKVSimulate(e, args[1:])
}

const kvSimulateUsage = `(--requests FILE.jsonl | --synthetic sharegpt|alpaca|shared-prefix) --model PRESET|FILE --vram SIZE [flags]

Runs the requests through continuous batching twice on the same KV budget
(--vram less the weights): with paged blocks (prefix caching, preemption by
recompute or swap) and with a contiguous reservation of the model's context
per sequence. A step costs max((weights + K/V bytes) / HBM bandwidth,
FLOPs / rate) on the time model (default: an H200). Synthetic mixes are
log-normal lengths matched to published means (see kvcache/sched).`

type kvSimulateJSON struct {
	Source string `json:"source"`
	sched.Result
}

func runKVSimulate(e *env, args []string) error {
	fs := newFlags(e, "kv simulate", kvSimulateUsage)
	requests := fs.String("requests", "", "request file: JSON lines with arrival_s, prompt_tokens, output_tokens[, prefix_id, prefix_tokens]")
	synthetic := fs.String("synthetic", "", "synthetic mix: sharegpt, alpaca or shared-prefix")
	n := intFlagOf(fs, "n", 1000, 1, sched.MaxRequests, "synthetic requests")
	rate := floatFlagOf(fs, "rate", 0, 0, 1e9, false, "synthetic arrivals per second (Poisson); 0: all at once")
	seed := fs.Uint64("seed", 1, "seed of the synthetic mix and the token ids")
	model := fs.String("model", "", "gen-model preset (tiny, tiny-f16, llama-7b, llama3-8b-shape) or a model file or directory")
	vram := fs.String("vram", "", "device memory ("+sizeUnitsHelp+")")
	blockTokens := intFlagOf(fs, "block-tokens", 16, 1, 4096, "tokens per KV block")
	tokenBudget := intFlagOf(fs, "token-budget", 8192, 1, sched.MaxTokens, "tokens computed per step at most")
	maxSeqs := intFlagOf(fs, "max-seqs", 256, 1, 1<<20, "sequences running at once at most")
	preempt := fs.String("preempt", "recompute", "preemption when blocks run out: recompute or swap")
	host := fs.String("host", "", "swap space for --preempt swap (default: the KV budget)")
	noPrefix := fs.Bool("no-prefix-cache", false, "turn the paged policy's prefix caching off")
	timeModel := fs.String("time-model", "h200", "device time model: h200 (4.8 TB/s, 989 TFLOP/s, 55 GB/s link) or sim (the simulated device's 448 GB/s, 20 TFLOP/s, 25 GB/s); the next three flags override it")
	hbm := floatFlagOf(fs, "hbm-gbps", 0, 0, 1e6, true, "time model: device memory bandwidth, GB/s")
	tflops := floatFlagOf(fs, "tflops", 0, 0, 1e6, true, "time model: compute rate, TFLOP/s")
	link := floatFlagOf(fs, "link-gbps", 0, 0, 1e6, true, "time model: host link for swaps, GB/s")
	asJSON := fs.Bool("json", false, "print JSON")
	html := fs.String("html", "", "write the KV usage and batch timelines of both policies to this HTML file")
	events := fs.String("events", "", "write the paged policy's KV events (JSON lines) to this file")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if (*requests == "") == (*synthetic == "") {
		return usagef("give one of --requests FILE or --synthetic sharegpt|alpaca|shared-prefix")
	}
	if *model == "" {
		return usagef("--model is required: a gen-model preset or a model file")
	}
	if *vram == "" {
		return usagef("--vram is required")
	}
	vb, err := flagSize("vram", *vram, false)
	if err != nil {
		return err
	}
	var hostBytes uint64
	if *host != "" {
		if hostBytes, err = flagSize("host", *host, false); err != nil {
			return err
		}
	}
	if *preempt != "recompute" && *preempt != "swap" {
		return usagef("--preempt %q: want recompute or swap", *preempt)
	}
	switch *synthetic {
	case "", "sharegpt", "alpaca", "shared-prefix":
	default:
		return usagef("--synthetic %q: want sharegpt, alpaca or shared-prefix", *synthetic)
	}
	htmlOut, err := checkOutput(e.temps, "--html", *html)
	if err != nil {
		return err
	}
	eventsOut, err := checkOutput(e.temps, "--events", *events)
	if err != nil {
		return err
	}
	ins := []input{{"--requests", *requests}}
	if _, preset := sched.Preset(*model); !preset {
		if isPipe(*model) {
			return fmt.Errorf("--model %s: cannot read a model from a pipe (its config.json is a file beside it); give a file, a directory or a preset", *model)
		}
		ins = append(ins, modelInputs("--model", *model)...)
	}
	if err := checkFiles(e, ins, htmlOut, eventsOut); err != nil {
		return err
	}
	m, err := kvModel(*model)
	if err != nil {
		return err
	}
	reqs, source, err := kvRequests(e.ctx, *requests, *synthetic, *n, *seed, *rate, m.Context)
	if err != nil {
		return err
	}
	hw, err := kvHardware(*timeModel, *hbm, *tflops, *link)
	if err != nil {
		return err
	}
	o := sched.Options{Model: m, VRAMBytes: vb, BlockTokens: *blockTokens, TokenBudget: *tokenBudget, MaxSeqs: *maxSeqs,
		Preempt: *preempt, HostBytes: hostBytes, NoPrefixCache: *noPrefix, Seed: *seed, Hardware: hw}
	var evBuf bytes.Buffer
	var evErr func() error
	if eventsOut != nil {
		o.OnEvent, evErr = kvcache.EventWriter(&evBuf)
	}
	res, err := sched.Simulate(e.ctx, reqs, o)
	if err != nil {
		return err
	}
	// The files first, then the report (see planLifetimes); one that could
	// not be written is the error after the report.
	var werr error
	if htmlOut != nil {
		var b bytes.Buffer
		if err := viz.KVHTML(&b, kvPicture(source, res)); err != nil {
			return err
		}
		werr = htmlOut.write(b.Bytes())
	}
	if eventsOut != nil && werr == nil {
		if werr = evErr(); werr == nil {
			werr = eventsOut.write(evBuf.Bytes())
		}
	}
	if *asJSON {
		if err := writeJSON(e.stdout, kvSimulateJSON{Source: source, Result: res}); err != nil {
			return err
		}
	} else {
		printKVSimulate(e, source, res)
	}
	return werr
}

// kvHardware is the time model --time-model names, with the bandwidth and
// rate flags that are set (non-zero) in place of its figures.
func kvHardware(name string, hbm, tflops, link float64) (sched.Hardware, error) {
	var hw sched.Hardware
	switch name {
	case "h200":
		hw = sched.H200()
	case "sim":
		so := sim.DefaultOptions()
		hw = sched.Hardware{Name: "simulated device (" + so.Name + ")", HBMGBps: so.DeviceGBps, FLOPS: so.PeakFLOPS, LinkGBps: so.PinnedHtoDGBps}
	default:
		return hw, usagef("--time-model %q: want h200 or sim", name)
	}
	if hbm > 0 || tflops > 0 || link > 0 {
		if hbm > 0 {
			hw.HBMGBps = hbm
		}
		if tflops > 0 {
			hw.FLOPS = tflops * 1e12
		}
		if link > 0 {
			hw.LinkGBps = link
		}
		hw.Name = fmt.Sprintf("%g GB/s, %g TFLOP/s, link %g GB/s", hw.HBMGBps, hw.FLOPS/1e12, hw.LinkGBps)
	}
	return hw, nil
}

// kvRequests reads the request file, or draws the synthetic mix; source
// names which for the report.
func kvRequests(ctx context.Context, file, synthetic string, n int, seed uint64, rate float64, maxLen int) ([]sched.Request, string, error) {
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, "", fmt.Errorf("--requests: %w", err)
		}
		defer f.Close()
		reqs, err := sched.ReadRequests(f, file)
		return reqs, file, err
	}
	source := "synthetic " + synthetic + ": " + sched.SyntheticDescription(synthetic)
	if rate > 0 {
		source += fmt.Sprintf(", Poisson arrivals at %g/s", rate)
	} else {
		source += ", all arriving at once"
	}
	reqs, err := sched.Synthetic(ctx, sched.SyntheticOptions{Kind: synthetic, Requests: n, Seed: seed, RatePerS: rate, MaxLen: maxLen})
	return reqs, source, err
}

// kvModel resolves --model: a gen-model preset, else a model file or
// directory read with format/llama (its config and tensors).
func kvModel(name string) (sched.Model, error) {
	if m, ok := sched.Preset(name); ok {
		return m, nil
	}
	if _, err := os.Stat(name); err != nil {
		return sched.Model{}, fmt.Errorf("--model %q: not a gen-model preset (tiny, tiny-f16, llama-7b, llama3-8b-shape) and not a file: %v", name, pathErr(err))
	}
	var c *llama.Config
	var w *format.Model
	if lm, err := llama.Open(name); err == nil {
		defer lm.Close()
		c, w = lm.Config, lm.Weights
	} else {
		// Only the shapes matter here: a model the engine cannot run (a
		// quantized GGUF, say) still has a config.
		var err2 error
		if c, w, err2 = kvShapes(name); err2 != nil {
			return sched.Model{}, err
		}
		defer w.Close()
	}
	m := sched.Model{Name: name, Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim,
		ElemBytes: 2, WeightBytes: w.DataBytes, Context: c.Context}
	for _, t := range w.Tensors {
		m.Params += t.Elements()
	}
	if c.DType == "F32" {
		m.ElemBytes = 4
	}
	return m, m.Validate()
}

// kvShapes reads a model's config without binding its tensors: a GGUF
// file's metadata, or the config.json beside (or in) a safetensors model.
func kvShapes(name string) (*llama.Config, *format.Model, error) {
	st, err := os.Stat(name)
	if err != nil {
		return nil, nil, err
	}
	dir, file := filepath.Dir(name), name
	if st.IsDir() {
		dir, file = name, filepath.Join(name, "model.safetensors")
		if _, err := os.Stat(file); err != nil {
			file = filepath.Join(name, "model.safetensors.index.json")
		}
	}
	w, err := weights.Open(file)
	if err != nil {
		return nil, nil, err
	}
	var c *llama.Config
	if w.Format == "gguf" {
		c, err = llama.ParseGGUF(file, w.Metadata)
	} else {
		var b []byte
		cfgPath := filepath.Join(dir, "config.json")
		if b, err = os.ReadFile(cfgPath); err == nil {
			c, err = llama.ParseHF(cfgPath, b)
		}
	}
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	return c, w, nil
}

func kvPct(v float64) string { return strconv.FormatFloat(100*v, 'f', 1, 64) + "%" }

func printKVSimulate(e *env, source string, r sched.Result) {
	w := e.stdout
	m := r.Model
	fmt.Fprintf(w, "model %s: %d layers × %d KV heads × %d, %d-byte elements: %s of K/V per token; weights %s; context %d\n",
		m.Name, m.Layers, m.KVHeads, m.HeadDim, m.ElemBytes, humanBytes(r.BytesPerToken), humanBytes(m.WeightBytes), m.Context)
	fmt.Fprintf(w, "KV budget %s of %s: %d blocks of %d tokens (%s each)\n",
		humanBytes(r.KVBudgetBytes), humanBytes(r.VRAMBytes), r.Blocks, r.BlockTokens, humanBytes(r.BlockBytes))
	fmt.Fprintf(w, "requests: %d from %s (prompt mean %.0f, output mean %.0f tokens", r.Requests, source, r.MeanPrompt, r.MeanOutput)
	if r.Clamped > 0 {
		fmt.Fprintf(w, "; %d cut to the context", r.Clamped)
	}
	fmt.Fprintf(w, "); preemption by %s; time model %s\n\n", r.Preempt, r.Hardware.Name)
	p, c := r.Paged, r.Contiguous
	fmt.Fprintf(w, "%-16s %14s %14s\n", "", "paged", "contiguous")
	fmt.Fprintf(w, "%-16s %14s %14s\n", "waste_ratio", kvPct(p.WasteRatio), kvPct(c.WasteRatio))
	fmt.Fprintf(w, "%-16s %14.1f %14.1f\n", "mean_batch", p.MeanBatch, c.MeanBatch)
	fmt.Fprintf(w, "%-16s %14d %14d\n", "max_batch", p.MaxBatch, c.MaxBatch)
	fmt.Fprintf(w, "%-16s %14.0f %14.0f\n", "tokens_per_s", p.TokensPerS, c.TokensPerS)
	fmt.Fprintf(w, "%-16s %14d %14d\n", "preemptions", p.Preemptions, c.Preemptions)
	fmt.Fprintf(w, "%-16s %14s %14s\n", "swapped_bytes", humanBytes(p.SwappedBytes), humanBytes(c.SwappedBytes))
	fmt.Fprintf(w, "%-16s %14s %14s\n", "mean K/V held", humanBytes(uint64(p.MeanHeldBytes)), humanBytes(uint64(c.MeanHeldBytes)))
	fmt.Fprintf(w, "%-16s %14s %14s\n", "simulated time", simTime(p.SimSeconds), simTime(c.SimSeconds))
	if r.ShareableBlocks > 0 {
		fmt.Fprintf(w, "prefix_hit_rate  %s (%d of %d full shareable blocks served from the cache; %s of the %d an earlier request had)\n",
			kvPct(r.PrefixHitRate), r.HitBlocks, r.ShareableBlocks, kvPct(r.ReusableHitRate), r.Paged.ReusableBlocks)
	} else {
		fmt.Fprintln(w, "prefix_hit_rate  - (no request shares a prefix)")
	}
	if c.Note != "" {
		fmt.Fprintf(w, "contiguous: %s\n", c.Note)
	} else if c.MeanBatch > 0 {
		fmt.Fprintf(w, "paged runs %s the sequences per step and %s the tokens per second of contiguous reservation.\n",
			ratio(p.MeanBatch, c.MeanBatch), ratio(p.TokensPerS, c.TokensPerS))
	}
}

func kvPicture(source string, r sched.Result) viz.KVPicture {
	pic := viz.KVPicture{Title: fmt.Sprintf("memwall kv simulate: %s on %s", source, r.Model.Name), BudgetBytes: r.KVBudgetBytes,
		Notes: []string{
			fmt.Sprintf("KV budget %s (%d blocks of %d tokens); %d requests; time model %s", humanBytes(r.KVBudgetBytes), r.Blocks, r.BlockTokens, r.Requests, r.Hardware.Name),
			fmt.Sprintf("paged: waste %s, mean batch %.1f, %.0f tokens/s, %d preemptions, prefix hit rate %s",
				kvPct(r.Paged.WasteRatio), r.Paged.MeanBatch, r.Paged.TokensPerS, r.Paged.Preemptions, kvPct(r.PrefixHitRate)),
			fmt.Sprintf("contiguous: waste %s, mean batch %.1f, %.0f tokens/s", kvPct(r.Contiguous.WasteRatio), r.Contiguous.MeanBatch, r.Contiguous.TokensPerS),
		}}
	for _, p := range []sched.PolicyResult{r.Paged, r.Contiguous} {
		s := viz.KVSeries{Name: p.Policy}
		for _, x := range p.Timeline {
			s.T = append(s.T, x.T)
			s.Held = append(s.Held, x.HeldBytes)
			s.Batch = append(s.Batch, x.Batch)
		}
		pic.Series = append(pic.Series, s)
	}
	return pic
}

const benchKVUsage = `[--device auto|cuda|sim] [--blocks 1000,10000,100000,1000000] [--ops N] [--swap-bytes SIZE] [--reps N] [--no-swap] [--json] [--oom-snapshot FILE]

Times the block manager's alloc, free, fork and touch at each pool size
(flat means O(1)), then swaps a sequence to pinned host memory and back on
the device with the cache's layout (every layer of a block in one copy) and
with a per-layer layout (2·layers copies per block), next to one pinned copy
of the same size, verifying every byte after each round trip.`

func runBenchKV(e *env, args []string) error {
	fs := newFlags(e, "bench kv", benchKVUsage)
	var df deviceFlag
	df.add(fs)
	blocks := fs.String("blocks", "1000,10000,100000,1000000", "pool sizes in blocks, comma-separated")
	ops := intFlagOf(fs, "ops", 200000, 1000, maxKVOps, "timed operations of each kind per size")
	swapBytes := fs.String("swap-bytes", "", "K/V moved per swap (default 1GiB on a GPU, 256MiB on the simulator)")
	reps := intFlagOf(fs, "reps", 3, 1, 1000, "timed swaps per direction and layout (median)")
	noSwap := fs.Bool("no-swap", false, "skip the swap measurement (no device opened)")
	asJSON := fs.Bool("json", false, "print JSON")
	var snap oomSnapshot
	snap.add(fs)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := df.check(); err != nil {
		return err
	}
	if err := snap.check(e); err != nil {
		return err
	}
	if err := checkFiles(e, nil, snap.out); err != nil {
		return err
	}
	var sizes []int
	for _, f := range strings.Split(*blocks, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < bench.MinKVBlocks || v > 1<<26 {
			return usagef("--blocks %q: want sizes of %d..%d blocks, comma-separated", f, bench.MinKVBlocks, 1<<26)
		}
		sizes = append(sizes, v)
	}
	o := bench.KVOptions{Blocks: sizes, Ops: *ops, Reps: *reps, PoolHistory: snap.history()}
	if *swapBytes != "" {
		v, err := flagSize("swap-bytes", *swapBytes, false)
		if err != nil {
			return err
		}
		o.SwapBytes = v
	}
	if !*noSwap {
		d, _, err := df.open(e)
		if err != nil {
			return err
		}
		defer d.Close()
		if d.Info().Backend == "sim" && o.SwapBytes == 0 {
			o.SwapBytes = 256 << 20
		}
		o.Device = d
	}
	pb := newProgress(e, "bench kv")
	pb.unit = "measurements" // one per --blocks size, then the swaps
	o.Progress = func(done, total int, name string) { pb.update(float64(done), float64(total), name) }
	rep, err := bench.KV(e.ctx, o)
	pb.done()
	if err != nil {
		return snap.handle(err)
	}
	if *asJSON {
		return writeJSON(e.stdout, rep)
	}
	printBenchKV(e, rep)
	return nil
}

// maxKVOps bounds bench kv's --ops: each kind's operations are timed in
// rounds and not recorded one by one, so the limit is time: a billion of
// each takes minutes per pool size.
const maxKVOps = 1_000_000_000

func printBenchKV(e *env, rep bench.KVReport) {
	w := e.stdout
	fmt.Fprintf(w, "block manager, ns per operation (the cheapest of ~20 rounds):\n%10s %9s %9s %9s %9s %9s\n", "blocks", "alloc", "free", "fork", "touch", "evict")
	for _, r := range rep.Ops {
		fmt.Fprintf(w, "%10d %9.1f %9.1f %9.1f %9.1f %9.1f\n", r.Blocks, r.AllocNs, r.FreeNs, r.ForkNs, r.TouchNs, r.EvictNs)
	}
	fmt.Fprintf(w, "largest over smallest: alloc %.2f×, free %.2f×, fork %.2f×, touch %.2f×, evict %.2f×\n",
		rep.Flatness["alloc"], rep.Flatness["free"], rep.Flatness["fork"], rep.Flatness["touch"], rep.Flatness["evict"])
	fmt.Fprintln(w, "(alloc: an Append that takes a free block; free: per block; fork: of an 8-block sequence; touch: per block served")
	fmt.Fprintln(w, " from the prefix cache; evict: an Append that takes the least recently used cached block, in a full cache)")
	if len(rep.Swap) > 0 {
		fmt.Fprintf(w, "\nswap on %s (%s), %s per swap:\n%-22s %10s %8s %10s %10s %9s\n", rep.Device, rep.Backend, humanBytes(rep.Swap[0].Bytes),
			"layout", "copy", "copies", "out GB/s", "in GB/s", "verified")
		for _, s := range rep.Swap {
			fmt.Fprintf(w, "%-22s %10s %8d %10.1f %10.1f %9s\n", s.Layout, humanBytes(s.CopyBytes), s.Copies, s.OutGBps, s.InGBps, yesNo(s.Verified))
		}
		fmt.Fprintf(w, "%-22s %10s %8d %10.1f %10.1f\n", "pinned link", humanBytes(rep.Swap[0].Bytes), 1, rep.LinkD2HGBps, rep.LinkH2DGBps)
		fmt.Fprintf(w, "swap over link: %.2f (the smaller direction)\n", rep.SwapOverLink)
		if rep.Backend == "sim" {
			fmt.Fprintln(w, "(simulated device: times come from its model, not from hardware)")
		}
	}
}

// simTime formats simulated seconds to four significant digits in a unit
// that suits them ("2.636ms", "12.5s"): a short run does not read as 0.00.
func simTime(s float64) string {
	d := time.Duration(s * 1e9)
	for r := time.Nanosecond; r < time.Hour; r *= 10 {
		if d < 10000*r {
			return d.Round(r).String()
		}
	}
	return d.Round(time.Second).String()
}
