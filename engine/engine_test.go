package engine_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/memwall/memwall/internal/longtest"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sync"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/engine/internal/reference"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
)

func onGPU() bool { return os.Getenv("MEMWALL_TEST_DEVICE") == "cuda" }

// kernelsEnv is what kernels.Load reads on the GPU: the environment, so
// that MEMWALL_KERNELS_PTX can name PTX newer than the embedded modules
// (the step-state kernels of the decode graph); nil on the simulator.
func kernelsEnv() func(string) string {
	if onGPU() {
		return os.Getenv
	}
	return nil
}

func testDevice(t testing.TB) device.Device {
	t.Helper()
	if onGPU() {
		d, err := cuda.Open(cuda.Options{})
		if err != nil {
			t.Fatalf("MEMWALL_TEST_DEVICE=cuda: %v", err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	o := sim.DefaultOptions()
	o.TotalBytes = 1 << 30
	o.Kernels = kernels.Sim()
	o.Shuffle = true
	d := sim.New(o)
	t.Cleanup(func() { d.Close() })
	return d
}

var (
	modelsOnce sync.Once
	modelsDir  string
	modelsErr  error
)

// modelPath generates (once per test binary) the named preset in a format.
func modelPath(t testing.TB, preset, formatName string) string {
	t.Helper()
	modelsOnce.Do(func() {
		modelsDir, modelsErr = os.MkdirTemp("", "engine-models")
		if modelsErr != nil {
			return
		}
		for _, p := range []string{"tiny", "tiny-f16", "tiny-f32", "tiny-hd64"} {
			cfg, ok := synth.Presets()[p]
			switch {
			case p == "tiny-f32": // rounds nowhere, so the engine must match the reference to float32 precision
				cfg = synth.Tiny()
				cfg.DType = "F32"
			case p == "tiny-hd64": // heads of 64, which the decode attention kernel takes (tiny's are 32)
				cfg = synth.Tiny()
				cfg.Heads, cfg.KVHeads = 4, 2
			case !ok:
				modelsErr = fmt.Errorf("no preset %q", p)
				return
			}
			for _, f := range []string{synth.Safetensors, synth.GGUF} {
				dir := filepath.Join(modelsDir, p)
				if modelsErr = os.MkdirAll(dir, 0o755); modelsErr != nil {
					return
				}
				name := "model.safetensors"
				if f == synth.GGUF {
					name = "model.gguf"
				}
				if _, modelsErr = synth.Generate(context.Background(), cfg, filepath.Join(dir, name), synth.Options{Format: f, Workers: 2}); modelsErr != nil {
					return
				}
			}
		}
	})
	if modelsErr != nil {
		t.Fatal(modelsErr)
	}
	if formatName == synth.GGUF {
		return filepath.Join(modelsDir, preset, "model.gguf")
	}
	return filepath.Join(modelsDir, preset)
}

func TestMain(m *testing.M) {
	// The tests one after another build simulated devices and models of up
	// to hundreds of MiB: a soft limit makes the collector hand the heap
	// back between them, so the package stays within the suite's memory
	// budget (the whole of go test ./... in 2 GB).
	debug.SetMemoryLimit(768 << 20)
	code := m.Run()
	if modelsDir != "" {
		os.RemoveAll(modelsDir)
	}
	os.Exit(code)
}

type rig struct {
	d         device.Device
	ks        *kernels.Set
	dev, host *pool.Pool
}

func newRig(t testing.TB, d device.Device) *rig { return newLimitedRig(t, d, 0) }

// newLimitedRig is newRig with the device pool limited to limit bytes (0:
// no limit), as memwall run limits it to the budget.
func newLimitedRig(t testing.TB, d device.Device, limit uint64) *rig {
	t.Helper()
	ks, err := kernels.Load(d, kernelsEnv())
	if err != nil {
		t.Fatal(err)
	}
	po := pool.DefaultOptions(d)
	po.Limit = limit
	dev, err := pool.New(d, po)
	if err != nil {
		t.Fatal(err)
	}
	host, err := pool.NewHost(d, pool.Options{Name: "host"})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{d: d, ks: ks, dev: dev, host: host}
	t.Cleanup(func() {
		host.Close()
		dev.Close()
		ks.Close()
	})
	return r
}

// zero checks that both pools hold nothing.
func (r *rig) zero(t testing.TB) {
	t.Helper()
	if s := r.dev.Stats(); s.UsedBytes != 0 || s.LiveBlocks != 0 {
		t.Errorf("device pool: %d bytes in %d blocks still used", s.UsedBytes, s.LiveBlocks)
	}
	if s := r.host.Stats(); s.UsedBytes != 0 || s.LiveBlocks != 0 {
		t.Errorf("host pool: %d bytes in %d blocks still used", s.UsedBytes, s.LiveBlocks)
	}
}

func open(t testing.TB, path string) *llama.Model {
	t.Helper()
	m, err := llama.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// prompt returns n token ids drawn from seed, avoiding BOS/EOS.
func prompt(n, vocab int, seed uint64) []int {
	out := make([]int, n)
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range out {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		out[i] = 3 + int(x%uint64(vocab-3))
	}
	return out
}

// agree checks greedy tokens against the reference by teacher forcing:
// the reference's logits over prompt+generated at each generated position
// must have the engine's token as argmax, unless the reference's two best
// logits are within margin. It returns the positions skipped as near-ties.
func agree(t *testing.T, ref *reference.Model, p, got []int, margin float32) int {
	t.Helper()
	seq := append(append([]int(nil), p...), got...)
	logits, err := ref.Logits(seq[:len(seq)-1])
	if err != nil {
		t.Fatal(err)
	}
	skipped := 0
	for i, tok := range got {
		l := logits[len(p)-1+i]
		best, gap := reference.Argmax(l)
		if best == tok {
			continue
		}
		if gap < margin || l[best]-l[tok] < margin {
			skipped++
			continue
		}
		t.Fatalf("token %d: engine %d (logit %.4f), reference %d (logit %.4f, gap to second %.4f)", i, tok, l[tok], best, l[best], gap)
	}
	return skipped
}

func TestAgainstReference(t *testing.T) {
	ctx := context.Background()
	for _, preset := range []string{"tiny", "tiny-f16", "tiny-f32"} {
		for _, f := range []string{synth.Safetensors, synth.GGUF} {
			for _, budget := range []string{"resident", "streaming", "streaming-whole-layers"} {
				t.Run(preset+"/"+f+"/"+budget, func(t *testing.T) {
					m := open(t, modelPath(t, preset, f))
					// An f32 model rounds nowhere on either side.
					ref, err := reference.New(m, map[string]string{"BF16": "BF16", "F16": "F16"}[m.Config.DType])
					if err != nil {
						t.Fatal(err)
					}
					r := newRig(t, testDevice(t))
					b := uint64(256 << 20)
					whole := budget == "streaming-whole-layers"
					if budget != "resident" {
						b = smallBudget(t, r, m, whole)
					}
					e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: b, MaxTokens: 96, PrefillChunk: 16, WholeLayers: whole})
					if err != nil {
						t.Fatal(err)
					}
					if groups := len(e.Plan().Groups); whole != (groups == m.Config.Layers+3) {
						t.Fatalf("%d weight groups for %d layers (whole layers %v)", groups, m.Config.Layers, whole)
					}
					if budget != "resident" && len(e.Plan().Streamed()) == 0 {
						t.Fatalf("budget %d streams nothing", b)
					}
					p := prompt(21, m.Config.Vocab, 3)
					res, err := e.Generate(ctx, p, engine.Sampling{MaxNew: 24, IgnoreEOS: true}, nil)
					if err != nil {
						t.Fatal(err)
					}
					if len(res.Tokens) != 24 {
						t.Fatalf("%d tokens", len(res.Tokens))
					}
					skipped := agree(t, ref, p, res.Tokens, tieMargin(m.Config.DType, 8))
					if skipped > len(res.Tokens)/4 {
						t.Errorf("%d of %d positions were near-ties", skipped, len(res.Tokens))
					}
					// First step's logits against the reference's.
					rl, _ := ref.Logits(p)
					diff, cos := compare(res.FirstLogits, rl[len(p)-1])
					if tol := logitsTol(m.Config.DType, rl[len(p)-1]); diff > tol || cos < 0.999 {
						t.Errorf("first logits: max abs diff %.4g, cosine %.6f", diff, cos)
					}
					t.Logf("tokens %v, %d near-ties, first logits diff %.3g cos %.6f, streamed %d B/token", res.Tokens[:8], skipped, diff, cos, res.StreamedBytesPerToken)
					if err := e.Close(); err != nil {
						t.Fatal(err)
					}
					r.zero(t)
				})
			}
		}
	}
}

// smallBudget returns a budget that streams some blocks: the engine's
// minimum (two slots of a block and the stand-alone groups resident) plus
// one block.
func smallBudget(t testing.TB, r *rig, m *llama.Model, whole bool) uint64 {
	t.Helper()
	_, err := engine.New(context.Background(), r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: 1, MaxTokens: 96, PrefillChunk: 16, WholeLayers: whole})
	var be *engine.BudgetError
	if !errors.As(err, &be) {
		t.Fatalf("budget 1: %v", err)
	}
	b := m.Tensors.Blocks[0]
	return be.Minimum + b.Q.Bytes + b.K.Bytes + b.V.Bytes + b.O.Bytes + b.Gate.Bytes + b.Up.Bytes + b.Down.Bytes + 8<<10
}

// tieMargin is the logit gap below which two tokens count as a near-tie:
// four units in the last place of the model dtype at the logits' magnitude
// (about 8 for these models), at least 0.02. On a GPU the products, the
// attention and the RoPE round in another order than on the simulator (and
// than the reference), so a bf16 model's logits move by an ulp (1/32 at
// 4..8) or two; f16 and f32 logits by far less.
func tieMargin(dtype string, magnitude float64) float32 {
	bits := map[string]int{"BF16": 7, "F16": 10, "F32": 23}[dtype]
	if bits == 0 {
		bits = 7
	}
	ulp := math.Ldexp(1, int(math.Floor(math.Log2(magnitude)))-bits)
	return float32(max(0.02, 4*ulp))
}

// logitsTol is how far (max abs) first-step logits of a model of dtype
// may lie from ref's when the two runs round at different points.
func logitsTol(dtype string, ref []float32) float64 {
	switch {
	case dtype == "F32":
		return 1e-4 * maxAbs(ref)
	case !onGPU():
		// The same roundings in the same order as the reference (RoPE
		// included): bf16 bit for bit, f16 within a unit in the last place
		// or two.
		return 2e-3 * maxAbs(ref)
	}
	// A GPU sums in its own order and rounds to bf16 at slightly different
	// points (RoPE): logits move by a few units in the last place.
	return 0.03 * maxAbs(ref)
}

func maxAbs(a []float32) float64 {
	var m float64
	for _, v := range a {
		m = math.Max(m, math.Abs(float64(v)))
	}
	return m
}

func compare(a, b []float32) (maxDiff float64, cos float64) {
	var ab, aa, bb float64
	for i := range a {
		maxDiff = math.Max(maxDiff, math.Abs(float64(a[i]-b[i])))
		ab += float64(a[i]) * float64(b[i])
		aa += float64(a[i]) * float64(a[i])
		bb += float64(b[i]) * float64(b[i])
	}
	return maxDiff, ab / math.Sqrt(aa*bb)
}

// TestFaultFreesEverything injects a failure into device memory growth,
// pinned host allocation or an event record, at the nth call of each, in
// New or in the middle of generation: the error comes back and, once the
// engine is closed, both pools hold nothing.
func TestFaultFreesEverything(t *testing.T) {
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	failed := 0
	for _, kind := range []string{"physical", "map", "host", "event"} {
		for _, n := range []uint64{1, 2, 3, 5, 9, 17, 40} {
			cfg := &fault.Config{}
			d := fault.Wrap(testDevice(t), cfg)
			r := newRig(t, d)
			budget := smallBudget(t, r, m, n%2 == 0)
			var rules fault.Rules
			switch kind {
			case "physical":
				rules.CreatePhysical = fault.Nth(n)
			case "map":
				rules.Map = fault.Nth(n)
			case "host":
				rules.HostAlloc = fault.Nth(n)
			case "event":
				rules.EventRecord = fault.Nth(n)
			}
			cfg.Set(rules)
			e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: budget, MaxTokens: 64, PrefillChunk: 8})
			if err == nil {
				_, err = e.Generate(ctx, prompt(20, m.Config.Vocab, 1), engine.Sampling{MaxNew: 6}, nil)
				err = errors.Join(err, e.Close())
			}
			if err != nil {
				failed++
			}
			cfg.Set(fault.Rules{})
			r.zero(t)
		}
	}
	t.Logf("%d of 28 runs failed on an injected fault", failed)
	if failed < 8 {
		t.Errorf("only %d runs saw an injected fault", failed)
	}
}

func TestBudgetTooSmall(t *testing.T) {
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	r := newRig(t, testDevice(t))
	_, err := engine.New(context.Background(), r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: 1 << 20, MaxTokens: 64})
	var be *engine.BudgetError
	if !errors.As(err, &be) || !errors.Is(err, engine.ErrBudget) || be.Minimum <= 1<<20 {
		t.Fatalf("error %v, want a BudgetError with the minimum", err)
	}
	// The minimum it states runs.
	e, err := engine.New(context.Background(), r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: be.Minimum, MaxTokens: 64})
	if err != nil {
		t.Fatalf("at the stated minimum %d: %v", be.Minimum, err)
	}
	e.Close()
	r.zero(t)
}

// TestSampledSteps samples (temperature, top-k, top-p) so the sequence
// wanders, then checks every step's logits against the reference's over
// the same sequence, and that the seed fixes the tokens.
func TestSampledSteps(t *testing.T) {
	if raceEnabled && testing.Short() {
		t.Skip("numerics only: no concurrency the race detector could find")
	}
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.GGUF))
	ref, err := reference.New(m, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, testDevice(t))
	e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: 64 << 20, MaxTokens: 128, PrefillChunk: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := prompt(30, m.Config.Vocab, 9)
	s := engine.Sampling{MaxNew: 40, Temperature: 1.2, TopK: 40, TopP: 0.95, Seed: 5, IgnoreEOS: true, KeepLogits: true}
	var streamed []int
	res, err := e.Generate(ctx, p, s, func(id int) error { streamed = append(streamed, id); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(streamed, res.Tokens) || len(res.Logits) != len(res.Tokens) {
		t.Fatalf("callback saw %v, result %v, %d logits", streamed, res.Tokens, len(res.Logits))
	}
	seq := append(slices.Clone(p), res.Tokens...)
	want, err := ref.Logits(seq[:len(seq)-1])
	if err != nil {
		t.Fatal(err)
	}
	distinct := map[int]bool{}
	for i, got := range res.Logits {
		w := want[len(p)-1+i]
		diff, cos := compare(got, w)
		// The products sum in another order than the reference (on the GPU,
		// and in the simulator's GEMV twins for chunks of up to 8 tokens):
		// a few units in the last place of bf16 that grow over the sequence.
		if diff > 0.06*maxAbs(w) || cos < 0.998 {
			t.Errorf("step %d (position %d): max abs diff %.4g, cosine %.6f", i, len(p)+i, diff, cos)
		}
		distinct[res.Tokens[i]] = true
	}
	if len(distinct) < 10 {
		t.Errorf("sampling gave only %d distinct tokens: %v", len(distinct), res.Tokens)
	}
	again, err := e.Generate(ctx, p, s, nil)
	if err != nil || !slices.Equal(again.Tokens, res.Tokens) {
		t.Errorf("same seed: %v then %v (%v)", res.Tokens, again.Tokens, err)
	}
	s.Seed = 6
	other, _ := e.Generate(ctx, p, s, nil)
	if slices.Equal(other.Tokens, res.Tokens) {
		t.Errorf("seeds 5 and 6 gave the same tokens")
	}
	// Top-k 1 is greedy whatever the temperature.
	g1, _ := e.Generate(ctx, p, engine.Sampling{MaxNew: 8, IgnoreEOS: true}, nil)
	g2, _ := e.Generate(ctx, p, engine.Sampling{MaxNew: 8, Temperature: 3, TopK: 1, Seed: 1, IgnoreEOS: true}, nil)
	if !slices.Equal(g1.Tokens, g2.Tokens) {
		t.Errorf("greedy %v, top-k 1 %v", g1.Tokens, g2.Tokens)
	}
}

// TestLimits: prompts that cannot run, the context limit and EOS.
func TestLimits(t *testing.T) {
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	r := newRig(t, testDevice(t))
	e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: 64 << 20, MaxTokens: 40})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, p := range [][]int{nil, prompt(40, 1024, 1), {1, 2, 1024}, {-1}} {
		if _, err := e.Generate(ctx, p, engine.Sampling{}, nil); err == nil {
			t.Errorf("prompt %v accepted", p)
		}
	}
	res, err := e.Generate(ctx, prompt(30, 1024, 2), engine.Sampling{MaxNew: 100, IgnoreEOS: true}, nil)
	if err != nil || res.Stop != "context" || len(res.Tokens) != 11 {
		t.Errorf("at the context limit: %d tokens, stop %q, %v", len(res.Tokens), res.Stop, err)
	}
	// Sampling at a high temperature reaches EOS (id 2) sooner or later;
	// generation stops right after it.
	for seed := range uint64(200) {
		res, err := e.Generate(ctx, prompt(5, 1024, seed), engine.Sampling{MaxNew: 30, Temperature: 50, Seed: seed}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Stop == "eos" {
			if res.Tokens[len(res.Tokens)-1] != 2 || slices.Contains(res.Tokens[:len(res.Tokens)-1], 2) {
				t.Errorf("stop eos with tokens %v", res.Tokens)
			}
			return
		}
	}
	t.Error("no run reached EOS")
}

// TestFormatsAgree: the GGUF and safetensors files of the same weights
// give the same tokens and bit-identical logits at every step (Q and K are
// put back in HF row order exactly; norms hold the same values), resident
// and streaming.
func TestFormatsAgree(t *testing.T) {
	ctx := context.Background()
	for _, preset := range []string{"tiny", "tiny-f16"} {
		for _, streaming := range []bool{false, true} {
			var runs []*engine.Result
			for _, f := range []string{synth.Safetensors, synth.GGUF} {
				m := open(t, modelPath(t, preset, f))
				r := newRig(t, testDevice(t))
				b := uint64(64 << 20)
				if streaming {
					b = smallBudget(t, r, m, false)
				}
				e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: b, MaxTokens: 96, PrefillChunk: 16})
				if err != nil {
					t.Fatal(err)
				}
				res, err := e.Generate(ctx, prompt(40, m.Config.Vocab, 8), engine.Sampling{MaxNew: 40, IgnoreEOS: true, KeepLogits: true}, nil)
				if err != nil {
					t.Fatal(err)
				}
				runs = append(runs, res)
				e.Close()
			}
			a, g := runs[0], runs[1]
			if !slices.Equal(a.Tokens, g.Tokens) {
				t.Errorf("%s streaming=%v: safetensors %v, gguf %v", preset, streaming, a.Tokens, g.Tokens)
			}
			for i := range min(len(a.Logits), len(g.Logits)) {
				if !slices.Equal(a.Logits[i], g.Logits[i]) {
					d, c := compare(a.Logits[i], g.Logits[i])
					t.Errorf("%s streaming=%v: step %d logits differ (max %.3g, cosine %.6f)", preset, streaming, i, d, c)
					break
				}
			}
		}
	}
}

// TestWarmProductsAndGivenStream: the warm-up gives back its scratch, and
// an engine on a stream it was given runs on it and leaves it alive.
func TestWarmProductsAndGivenStream(t *testing.T) {
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	r := newRig(t, testDevice(t))
	st, err := r.d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	free0, _, _ := r.d.MemInfo()
	if err := engine.WarmProducts(r.d, r.ks, m, st, []int{1, 16, 5}); err != nil {
		t.Fatal(err)
	}
	if free1, _, _ := r.d.MemInfo(); free1 != free0 {
		t.Errorf("free memory %d before the warm-up, %d after", free0, free1)
	}
	e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: 64 << 20, MaxTokens: 64, Stream: st})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Generate(ctx, prompt(20, m.Config.Vocab, 4), engine.Sampling{MaxNew: 4}, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.d.StreamSynchronize(st); err != nil {
		t.Errorf("the given stream after Close: %v", err)
	}
	if err := r.d.DestroyStream(st); err != nil {
		t.Errorf("destroying the given stream: %v", err)
	}
	r.zero(t)
}

// TestTiming: with Options.Timing a streaming prefill reports its device
// time and its copies' (the simulator's time model).
func TestTiming(t *testing.T) {
	if onGPU() {
		t.Skip("the simulator's time model")
	}
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	r := newRig(t, testDevice(t))
	e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: smallBudget(t, r, m, false), MaxTokens: 96, PrefillChunk: 16, Timing: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	res, err := e.Generate(ctx, prompt(40, m.Config.Vocab, 2), engine.Sampling{MaxNew: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.PrefillDeviceSeconds <= 0 || res.PrefillCopySeconds <= 0 {
		t.Errorf("prefill device %v s, copies %v s", res.PrefillDeviceSeconds, res.PrefillCopySeconds)
	}
}

// short is long with -long (CI's long job), else n: the randomized runs at
// full count take half a minute each on two cores.
func short(n, long int) int {
	if testing.Short() || !longtest.Enabled() {
		return n
	}
	return long
}

// pagedSim is a simulated device of 1 GiB with 64 KiB pages, so that the
// pools' page rounding leaves a small budget little slack.
func pagedSim() *sim.Device {
	o := sim.DefaultOptions()
	o.TotalBytes, o.Kernels, o.Granularity = 1<<30, kernels.Sim(), 64<<10
	return sim.New(o)
}

// TestRandomBudgets: any budget from below the minimum to above the model,
// with random slots, chunk and context, is refused with the minimum or
// runs in a pool limited to it: the plan's slack covers the pool's page
// rounding and holes (64 KiB pages here, so that the slack is small).
func TestRandomBudgets(t *testing.T) {
	if onGPU() {
		t.Skip("a simulated device with 64 KiB pages")
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 7))
	for _, preset := range []string{"tiny", "tiny-f16"} {
		m := open(t, modelPath(t, preset, []string{synth.Safetensors, synth.GGUF}[rng.IntN(2)]))
		for range short(12, 40) {
			d := pagedSim()
			opts := engine.Options{MaxTokens: 24 + rng.IntN(100), PrefillChunk: 1 + rng.IntN(64), Slots: 2 + rng.IntN(3), WholeLayers: rng.IntN(4) == 0}
			opts.Budget = 1
			_, err := engine.Estimate(ctx, m, opts, d.Info())
			var be *engine.BudgetError
			if !errors.As(err, &be) {
				t.Fatalf("%+v: %v", opts, err)
			}
			opts.Budget = be.Minimum + rng.Uint64N(m.Weights.DataBytes+1)
			// The pool is limited to the budget, as memwall run limits it.
			r := newLimitedRig(t, d, opts.Budget)
			e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, opts)
			if err != nil {
				t.Fatalf("%s, minimum %d, %+v: %v", preset, be.Minimum, opts, err)
			}
			if _, err := e.Generate(ctx, prompt(min(20, opts.MaxTokens-2), m.Config.Vocab, 1), engine.Sampling{MaxNew: 2}, nil); err != nil {
				t.Fatalf("%+v: %v", opts, err)
			}
			if peak := r.dev.Stats().PeakReservedBytes + e.ScratchBytes(); peak > opts.Budget {
				t.Errorf("%+v: peak %d above the budget", opts, peak)
			}
			e.Close()
			r.zero(t)
		}
	}
}

// TestAutoChunk: with PrefillChunk 0 the chunk is the largest, up to the
// prompt and AutoChunkLimit, whose plan fits the budget (every longer one
// is refused with the minimum), New runs exactly that plan, and the run's
// peak stays within the budget; a budget that holds no chunk is refused
// with the minimum at one token, which then runs.
func TestAutoChunk(t *testing.T) {
	if raceEnabled && testing.Short() {
		t.Skip("numerics only: no concurrency the race detector could find")
	}
	if onGPU() {
		t.Skip("a simulated device with 64 KiB pages")
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 3))
	for _, preset := range []string{"tiny", "tiny-f16"} {
		m := open(t, modelPath(t, preset, []string{synth.Safetensors, synth.GGUF}[rng.IntN(2)]))
		for i := range short(4, 10) {
			d := pagedSim()
			opts := engine.Options{MaxTokens: 24 + rng.IntN(100), Slots: []int{0, 2, 3}[rng.IntN(3)], WholeLayers: rng.IntN(4) == 0}
			opts.PromptTokens = 1 + rng.IntN(opts.MaxTokens-1)
			opts.Budget = 1
			_, err := engine.Estimate(ctx, m, opts, d.Info())
			var be *engine.BudgetError
			if !errors.As(err, &be) {
				t.Fatalf("%+v: %v", opts, err)
			}
			one := opts
			one.PrefillChunk = 1
			if _, err := engine.Estimate(ctx, m, one, d.Info()); !errors.Is(err, engine.ErrBudget) {
				t.Fatalf("chunk 1 at budget 1: %v", err)
			}
			// Budgets from the minimum to a few arenas above it.
			opts.Budget = be.Minimum + rng.Uint64N([]uint64{64 << 10, 1 << 20, 4 << 20, m.Weights.DataBytes}[i%4])
			f, err := engine.Estimate(ctx, m, opts, d.Info())
			if err != nil {
				t.Fatalf("%s at budget %d (minimum %d), %+v: %v", preset, opts.Budget, be.Minimum, opts, err)
			}
			hi := min(opts.PromptTokens, engine.AutoChunkLimit)
			if f.PrefillChunk < 1 || f.PrefillChunk > hi {
				t.Fatalf("%+v: chunk %d outside 1..%d", opts, f.PrefillChunk, hi)
			}
			wantSlots := opts.Slots
			if wantSlots == 0 {
				wantSlots = 2 // chunks this short never take a third slot
			}
			if f.Slots != wantSlots && (f.Slots != 2 || len(f.Plan.Streamed()) == 0) {
				t.Errorf("%+v: %d slots, want %d", opts, f.Slots, wantSlots)
			}
			for T := f.PrefillChunk + 1; T <= hi; T++ {
				o := opts
				o.PrefillChunk, o.Slots = T, f.Slots
				if _, err := engine.Estimate(ctx, m, o, d.Info()); !errors.Is(err, engine.ErrBudget) {
					t.Fatalf("%+v: chose chunk %d but %d fits too (%v)", opts, f.PrefillChunk, T, err)
				}
			}
			r := newLimitedRig(t, d, opts.Budget)
			e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, opts)
			if err != nil {
				t.Fatalf("%+v: %v", opts, err)
			}
			if g := e.Footprint(); g.PrefillChunk != f.PrefillChunk || g.Slots != f.Slots || g.DeviceBytes != f.DeviceBytes {
				t.Errorf("New planned chunk %d, %d slots, %d bytes; Estimate %d, %d, %d", g.PrefillChunk, g.Slots, g.DeviceBytes, f.PrefillChunk, f.Slots, f.DeviceBytes)
			}
			if _, err := e.Generate(ctx, prompt(opts.PromptTokens, m.Config.Vocab, 1), engine.Sampling{MaxNew: 2}, nil); err != nil {
				t.Fatalf("%+v: %v", opts, err)
			}
			if peak := r.dev.Stats().PeakReservedBytes + e.ScratchBytes(); peak > opts.Budget {
				t.Errorf("%+v: peak %d above the budget %d", opts, peak, opts.Budget)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			r.zero(t)
		}
	}
}

// TestAutoSlots: a long prompt's chunk takes a third staging slot when
// weights stream and the budget holds it, never beyond AutoChunkLimit,
// and never a third slot for a chunk below AutoSlotsChunk.
func TestAutoSlots(t *testing.T) {
	ctx := context.Background()
	cfg := synth.Tiny()
	cfg.Context = 4096
	dir := t.TempDir()
	if _, err := synth.Generate(ctx, cfg, filepath.Join(dir, "model.safetensors"), synth.Options{Workers: 2}); err != nil {
		t.Fatal(err)
	}
	m := open(t, dir)
	so := sim.DefaultOptions()
	so.Granularity = 64 << 10
	info := sim.New(so).Info()
	base := engine.Options{Budget: 1, MaxTokens: 4096, PromptTokens: 3000}
	_, err := engine.Estimate(ctx, m, base, info)
	var be *engine.BudgetError
	if !errors.As(err, &be) {
		t.Fatal(err)
	}
	// The least budget of a 2,048-token chunk: budgets from the minimum to
	// a little above the whole model next to that chunk.
	long := base
	long.PrefillChunk = engine.AutoChunkLimit
	_, err = engine.Estimate(ctx, m, long, info)
	var be2 *engine.BudgetError
	if !errors.As(err, &be2) {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	seen := map[[2]int]int{}
	for i := range 24 {
		o := base
		o.Budget = be.Minimum + rng.Uint64N(be2.Minimum-be.Minimum)
		if i%2 == 0 {
			o.Budget = be2.Minimum + rng.Uint64N(m.Weights.DataBytes+4<<20)
		}
		f, err := engine.Estimate(ctx, m, o, info)
		if err != nil {
			t.Fatal(err)
		}
		streams := len(f.Plan.Streamed()) > 0
		seen[[2]int{f.PrefillChunk, f.Slots}]++
		switch {
		case f.PrefillChunk > engine.AutoChunkLimit:
			t.Errorf("budget %d: chunk %d", o.Budget, f.PrefillChunk)
		case f.Slots == 3 && (f.PrefillChunk < engine.AutoSlotsChunk || !streams):
			t.Errorf("budget %d: 3 slots for chunk %d (streams %v)", o.Budget, f.PrefillChunk, streams)
		case f.Slots == 2 && f.PrefillChunk >= engine.AutoSlotsChunk && streams:
			o3 := o
			o3.PrefillChunk, o3.Slots = f.PrefillChunk, 3
			if f3, err := engine.Estimate(ctx, m, o3, info); err == nil && f3.Slots == 3 {
				t.Errorf("budget %d: 2 slots for chunk %d though 3 fit", o.Budget, f.PrefillChunk)
			}
		}
	}
	t.Logf("(chunk, slots): budgets %v", seen)
	if seen[[2]int{engine.AutoChunkLimit, 3}] == 0 || seen[[2]int{engine.AutoChunkLimit, 2}] == 0 || len(seen) < 4 {
		t.Errorf("the budgets did not reach the cases: %v", seen)
	}
}
