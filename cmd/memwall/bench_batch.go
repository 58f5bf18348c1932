package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/kvcache"
)

func init() { benchVerbs["batch"] = runBenchBatch }

const benchBatchUsage = `MODEL [--npl 1,8,32] [--npp 128] [--ntg 128] [--vram SIZE] [--prefill-chunk N] [--device auto|cuda|sim] [--profile] [--json]

Batched generation as llama.cpp's llama-batched-bench measures it, through
the engine serve runs on (no HTTP): for each N of --npl, N sequences of
--npp random prompt tokens are prefilled together (steps of up to the
prefill chunk), then each generates --ntg tokens greedily, N per step.
Reports per N the prompt tokens a second (S_PP), the generated tokens a
second (S_TG) and both over the whole (S), as llama-batched-bench prints
them; --profile adds one more decode step timed per op on the device.`

type benchBatchFlags struct {
	df                 deviceFlag
	vram, npl          string
	npp, ntg, chunk    int
	profile, asJSON    bool
	seqs               []int // --npl parsed
	maxSeqs, seqTokens int
}

// batchRow is one N of bench batch, in llama-batched-bench's columns.
type batchRow struct {
	PP    int     `json:"pp"`
	TG    int     `json:"tg"`
	B     int     `json:"b"`
	NKV   int     `json:"n_kv"`
	TPP   float64 `json:"t_pp_s"`
	SPP   float64 `json:"s_pp_tokens_per_s"`
	TTG   float64 `json:"t_tg_s"`
	STG   float64 `json:"s_tg_tokens_per_s"`
	T     float64 `json:"t_s"`
	S     float64 `json:"s_tokens_per_s"`
	Steps int     `json:"decode_steps"`
	// Profile is one more decode step of the B sequences timed per op
	// (--profile).
	Profile *engine.BatchProfile `json:"profile,omitempty"`
}

type benchBatchJSON struct {
	Model        string     `json:"model"`
	Device       string     `json:"device"`
	BudgetBytes  uint64     `json:"budget_bytes"`
	PrefillChunk int        `json:"prefill_chunk"`
	Rows         []batchRow `json:"rows"`
}

func runBenchBatch(e *env, args []string) error {
	fs := newFlags(e, "bench batch", benchBatchUsage)
	var f benchBatchFlags
	f.df.add(fs)
	fs.StringVar(&f.vram, "vram", "", "the process's device memory budget, context included (default: free memory less a margin)")
	fs.StringVar(&f.npl, "npl", "1,8,32", "sequence counts to measure, comma-separated")
	intVar(fs, &f.npp, "npp", 128, 1, 1<<20, "prompt tokens per sequence")
	intVar(fs, &f.ntg, "ntg", 128, 1, 1<<20, "generated tokens per sequence")
	intVar(fs, &f.chunk, "prefill-chunk", 0, 0, 1<<16, "most tokens per step (0: the largest up to 2048 that the budget holds)")
	fs.BoolVar(&f.profile, "profile", false, "time one more decode step per op on the device")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	pos, vram, err := parseModelFlags(fs, args, &f.df, &f.vram)
	if err != nil {
		return err
	}
	for _, s := range strings.Split(f.npl, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 4096 {
			return usagef("--npl %q: want sequence counts 1..4096, comma-separated", f.npl)
		}
		f.seqs = append(f.seqs, n)
	}
	f.maxSeqs = slices.Max(f.seqs)
	// The prompt, the generated tokens and the profiled step's.
	f.seqTokens = f.npp + f.ntg + 1
	if err := checkFiles(e, modelInputs("MODEL", pos[0])); err != nil {
		return err
	}
	remove, err := spoolModel(e, pos[0], true)
	if err != nil {
		return err
	}
	defer remove()
	return benchBatch(e, &f, pos[0], vram)
}

func benchBatch(e *env, f *benchBatchFlags, path string, vram uint64) error {
	m, _, err := openRunModel(e, path)
	if err != nil {
		return err
	}
	defer m.Close()
	if f.seqTokens > m.Config.Context {
		return usagef("--npp %d + --ntg %d: above the model's context of %d (max_position_embeddings in %s)", f.npp, f.ntg, m.Config.Context, m.Config.Source)
	}
	so := runSimOptions()
	d, ch, err := e.open(f.df.backend, auto.Options{Getenv: e.getenv, Sim: &so})
	if err != nil {
		return err
	}
	defer d.Close()
	o := engine.Options{MaxTokens: f.seqTokens, PromptTokens: f.npp, PrefillChunk: f.chunk, BlockTokens: 16}
	o.KVBlocks = f.maxSeqs * ((f.seqTokens + o.BlockTokens - 1) / o.BlockTokens)
	g := generation{model: m, path: path, vram: vram, opts: o, quiet: true}
	l, b, err := g.loadBatch(e, d, ch.Backend, f.maxSeqs, "bench batch", "--npl")
	if err != nil {
		return err
	}
	defer l.close()
	defer b.Close()
	out := benchBatchJSON{Model: path, Device: ch.Backend + ": " + d.Info().Name, BudgetBytes: l.rp.budget.VRAMBytes, PrefillChunk: b.MaxTokens()}
	pb := newProgress(e, "bench batch")
	pb.unit = "sequence counts"
	rng := rand.New(rand.NewPCG(1, 2))
	for i, n := range f.seqs {
		pb.update(float64(i), float64(len(f.seqs)), fmt.Sprintf("%d sequences", n))
		row, err := batchRun(e, b, f, n, rng)
		if err != nil {
			pb.done()
			return fmt.Errorf("%d sequences: %w", n, err)
		}
		out.Rows = append(out.Rows, row)
	}
	pb.done()
	if f.asJSON {
		return writeJSON(e.stdout, out)
	}
	printBenchBatch(e, out)
	return nil
}

// batchRun prefills n sequences of f.npp random tokens together, then
// decodes f.ntg tokens each, n per step, and frees them.
func batchRun(e *env, b *engine.Batch, f *benchBatchFlags, n int, rng *rand.Rand) (batchRow, error) {
	row := batchRow{PP: f.npp, TG: f.ntg, B: n, NKV: n * (f.npp + f.ntg)}
	seqs := make([]kvcache.SeqID, 0, n)
	defer func() {
		for _, s := range seqs {
			b.Free(s)
		}
	}()
	prompts := make([][]int32, n)
	for i := range prompts {
		p := make([]int32, f.npp)
		for j := range p {
			p[j] = int32(3 + rng.IntN(b.Vocab()-3))
		}
		prompts[i] = p
		id, _, err := b.Add(p)
		if err != nil {
			return row, err
		}
		seqs = append(seqs, id)
	}
	greedy := engine.NewSampler(engine.Sampling{})
	next := make([]int32, n)
	t0 := time.Now()
	if err := batchPrefill(e, b, seqs, prompts, greedy, next); err != nil {
		return row, err
	}
	row.TPP = time.Since(t0).Seconds()
	ws := make([]engine.Work, n)
	step := func(k int, profile bool) (*engine.BatchProfile, error) {
		for i, s := range seqs {
			if err := b.Append(s, next[i]); err != nil {
				return nil, err
			}
			ws[i] = engine.Work{Seq: s, Start: f.npp + k, Tokens: []int32{next[i]}, Logits: true}
		}
		var logits [][]float32
		var p *engine.BatchProfile
		var err error
		if profile {
			logits, p, err = b.StepProfiled(e.ctx, ws)
		} else {
			logits, err = b.Step(e.ctx, ws)
		}
		if err != nil {
			return nil, err
		}
		for i := range next {
			next[i] = int32(greedy.Next(logits[i]))
		}
		return p, nil
	}
	t1 := time.Now()
	for k := range f.ntg {
		if _, err := step(k, false); err != nil {
			return row, err
		}
	}
	row.TTG = time.Since(t1).Seconds()
	row.Steps = f.ntg
	if f.profile {
		p, err := step(f.ntg, true)
		if err != nil {
			return row, err
		}
		row.Profile = p
	}
	row.T = row.TPP + row.TTG
	row.SPP = float64(n*f.npp) / max(row.TPP, 1e-9)
	row.STG = float64(n*f.ntg) / max(row.TTG, 1e-9)
	row.S = float64(n*(f.npp+f.ntg)) / max(row.T, 1e-9)
	return row, nil
}

// batchPrefill runs the prompts through steps of up to the batch's
// tokens, packing several sequences a step, and leaves each sequence's
// first generated token in next.
func batchPrefill(e *env, b *engine.Batch, seqs []kvcache.SeqID, prompts [][]int32, greedy *engine.Sampler, next []int32) error {
	done := make([]int, len(seqs))
	for i := 0; i < len(seqs); {
		var ws []engine.Work
		var who []int
		budget := b.MaxTokens()
		for j := i; j < len(seqs) && budget > 0 && len(ws) < b.MaxSeqs(); j++ {
			k := min(len(prompts[j])-done[j], budget)
			if k == 0 {
				continue
			}
			ws = append(ws, engine.Work{Seq: seqs[j], Start: done[j], Tokens: prompts[j][done[j] : done[j]+k], Logits: done[j]+k == len(prompts[j])})
			who = append(who, j)
			budget -= k
		}
		logits, err := b.Step(e.ctx, ws)
		if err != nil {
			return err
		}
		for k, j := range who {
			done[j] += len(ws[k].Tokens)
			if err := b.Computed(seqs[j], done[j]); err != nil {
				return err
			}
			if logits[k] != nil {
				next[j] = int32(greedy.Next(logits[k]))
			}
		}
		for i < len(seqs) && done[i] == len(prompts[i]) {
			i++
		}
	}
	return nil
}

func printBenchBatch(e *env, o benchBatchJSON) {
	fmt.Fprintf(e.stdout, "memwall bench batch: %s on %s, budget %s, prefill chunk %d\n\n", o.Model, o.Device, humanBytes(o.BudgetBytes), o.PrefillChunk)
	fmt.Fprintf(e.stdout, "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |\n")
	fmt.Fprintf(e.stdout, "|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|\n")
	for _, r := range o.Rows {
		fmt.Fprintf(e.stdout, "| %5d | %6d | %4d | %6d | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |\n",
			r.PP, r.TG, r.B, r.NKV, r.TPP, r.SPP, r.TTG, r.STG, r.T, r.S)
	}
	for _, r := range o.Rows {
		if r.Profile == nil {
			continue
		}
		p := r.Profile
		fmt.Fprintf(e.stdout, "\nprofiled decode step of %d sequences: %.3f ms on the device (%d timed segments)\n", r.B, 1e3*p.Seconds, p.Segments)
		classes := make([]string, 0, len(p.Classes))
		for c := range p.Classes {
			classes = append(classes, c)
		}
		slices.Sort(classes)
		for _, c := range classes {
			fmt.Fprintf(e.stdout, "  %-10s %8.3f ms\n", c, 1e3*p.Classes[c])
		}
		ops := make([]string, 0, len(p.Ops))
		for op := range p.Ops {
			ops = append(ops, op)
		}
		slices.SortFunc(ops, func(a, b string) int {
			if d := p.Ops[b].Seconds - p.Ops[a].Seconds; d != 0 {
				if d > 0 {
					return 1
				}
				return -1
			}
			return strings.Compare(a, b)
		})
		for _, op := range ops {
			x := p.Ops[op]
			fmt.Fprintf(e.stdout, "    %-24s %8.3f ms  ×%d\n", op, 1e3*x.Seconds, x.Count)
		}
	}
}
