package engine_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/engine/internal/reference"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
)

// counting is a device that counts kernel launches by kernel name.
type counting struct {
	device.Device
	mu     sync.Mutex
	names  map[device.Function]string
	counts map[string]int
}

func newCounting(d device.Device) *counting {
	return &counting{Device: d, names: map[device.Function]string{}, counts: map[string]int{}}
}

func (c *counting) Function(m device.Module, name string) (device.Function, error) {
	f, err := c.Device.Function(m, name)
	if err == nil {
		c.mu.Lock()
		c.names[f] = name
		c.mu.Unlock()
	}
	return f, err
}

func (c *counting) Launch(f device.Function, grid, block device.Dim3, shared uint32, s device.Stream, args ...any) error {
	c.mu.Lock()
	c.counts[c.names[f]]++
	c.mu.Unlock()
	return c.Device.Launch(f, grid, block, shared, s, args...)
}

// EventRecord and StreamWaitEvent count as "(event record)" and "(stream
// wait)": operations between kernels that keep them from overlapping.
func (c *counting) EventRecord(e device.Event, s device.Stream) error {
	c.mu.Lock()
	c.counts[opEventRecord]++
	c.mu.Unlock()
	return c.Device.EventRecord(e, s)
}

func (c *counting) StreamWaitEvent(s device.Stream, e device.Event) error {
	c.mu.Lock()
	c.counts[opStreamWait]++
	c.mu.Unlock()
	return c.Device.StreamWaitEvent(s, e)
}

const (
	opEventRecord = "(event record)"
	opStreamWait  = "(stream wait)"
)

func (c *counting) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.counts)
}

// decodeLaunches returns the kernel launches of one decode step (by
// name): the launches of a run of n+1 tokens less those of a run of n.
func decodeLaunches(t *testing.T, preset, f string, o engine.Options) map[string]int {
	t.Helper()
	return modelLaunches(t, open(t, modelPath(t, preset, f)), o)
}

// modelLaunches is decodeLaunches for an opened model.
func modelLaunches(t *testing.T, m *llama.Model, o engine.Options) map[string]int {
	t.Helper()
	ctx := context.Background()
	run := func(n int) map[string]int {
		d := newCounting(testDevice(t))
		r := newRig(t, d)
		e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		before := d.snapshot()
		if _, err := e.Generate(ctx, prompt(9, m.Config.Vocab, 4), engine.Sampling{MaxNew: n, IgnoreEOS: true}, nil); err != nil {
			t.Fatal(err)
		}
		after := d.snapshot()
		for k, v := range before {
			after[k] -= v
		}
		return after
	}
	a, b := run(3), run(4)
	out := map[string]int{}
	for k, v := range b {
		if v -= a[k]; v != 0 {
			out[k] = v
		}
	}
	return out
}

// total counts the kernel launches in c.
func total(c map[string]int) int {
	n := 0
	for k, v := range c {
		if k != opEventRecord && k != opStreamWait {
			n += v
		}
	}
	return n
}

// stepLaunches is what a decode step of L blocks launches besides the
// products, RoPE, the KV write and attention, with kernels.Set's fused
// residual norm and SiLU·up: each block's O residual fused with its MLP
// norm, each block's down residual but the last's fused with the next
// block's attention norm (the last's a Round, an Add and a Round), the
// first block's attention norm and the final norm on their own, and the
// logits' Round.
type stepLaunches struct{ rmsnorm, plainNorm, residualNorm, round, add, silu int }

func launchesPerStep(L int) stepLaunches {
	return stepLaunches{rmsnorm: 2*L + 1, plainNorm: 2, residualNorm: 2*L - 1, round: 3, add: 1, silu: L}
}

func describe(c map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(c)) {
		parts = append(parts, fmt.Sprintf("%s %d", strings.TrimPrefix(k, "memwall_"), c[k]))
	}
	return strings.Join(parts, ", ")
}

// TestDecodeLaunches counts the kernels of one decode step of a resident
// bf16 model: per layer, one grouped product for q, k, v and one for gate,
// up, one RoPE over Q and K, no Round for Q, K or V, one Round over gate
// and up where they touch; and the ungrouped step launches two products more per layer
// (q, k, v as three, gate and up as two).
func TestDecodeLaunches(t *testing.T) {
	if raceEnabled && testing.Short() {
		t.Skip("numerics only: no concurrency the race detector could find")
	}
	totals := map[string]int{}
	for _, f := range []string{synth.Safetensors, synth.GGUF} {
		m := open(t, modelPath(t, "tiny", f))
		L := m.Config.Layers
		o := engine.Options{Budget: 256 << 20, MaxTokens: 96, PrefillChunk: 16}
		got := decodeLaunches(t, "tiny", f, o)
		totals[f] = total(got)
		p := launchesPerStep(L)
		// GGUF's Q and K rows go back to HF's order inside RoPE.
		rope, notRope := "memwall_rope", "memwall_rope_gguf"
		if f == synth.GGUF {
			rope, notRope = notRope, rope
		}
		want := map[string]int{
			"memwall_gemvg1_bf16": 2 * L,
			rope:                  L,
			notRope:               0,
			"memwall_kvwrite":     L,
			"memwall_rmsnorm":     p.rmsnorm, // the fused residual and norm is an RMSNorm launch
			"memwall_silumul":     p.silu,
			"memwall_add":         p.add,
			"memwall_embed":       1,
			"memwall_round":       p.round,
		}
		// Resident groups are released without an event, and nothing
		// waits: the step is one chain of kernels.
		want[opEventRecord], want[opStreamWait] = 0, 0
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %d launches of %s in a decode step, want %d (all: %s)", f, got[k], k, v, describe(got))
			}
		}
		o.Ungrouped = true
		un := decodeLaunches(t, "tiny", f, o)
		if un["memwall_gemvg1_bf16"] != 0 {
			t.Errorf("%s: ungrouped step launched %d grouped products", f, un["memwall_gemvg1_bf16"])
		}
		if d := total(un) - total(got); d != 3*L {
			t.Errorf("%s: ungrouped step has %d launches, grouped %d: want %d more", f, total(un), total(got), 3*L)
		}
		t.Logf("%s, %d layers: %d launches per decode step (%s); ungrouped %d", f, L, total(got), describe(got), total(un))
	}
	if totals[synth.GGUF] != totals[synth.Safetensors] {
		t.Errorf("a GGUF decode step launches %d kernels, safetensors %d: want the same", totals[synth.GGUF], totals[synth.Safetensors])
	}
	// Streaming, each streamed group's release records the event its slot's
	// next copy waits for (on the copy stream) and its copy records the
	// event its acquire waits for (on the compute stream): two records and
	// two waits per streamed group.
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	r := newRig(t, testDevice(t))
	o := engine.Options{Budget: smallBudget(t, r, m, false), MaxTokens: 96, PrefillChunk: 16}
	e, err := engine.New(context.Background(), r.d, r.ks, r.dev, r.host, m, o)
	if err != nil {
		t.Fatal(err)
	}
	streamed := len(e.Plan().Streamed())
	e.Close()
	got := decodeLaunches(t, "tiny", synth.Safetensors, o)
	if got[opEventRecord] != 2*streamed || got[opStreamWait] != 2*streamed {
		t.Errorf("streaming %d groups: %d event records and %d waits per decode step, want %d each", streamed, got[opEventRecord], got[opStreamWait], 2*streamed)
	}
}

// runMode is one engine configuration that bitIdenticalPairs runs.
type runMode struct {
	name      string
	streaming bool           // a budget that streams some blocks (smallBudget), else 256 MiB resident
	o         engine.Options // WholeLayers, Exact...; the loop sets Budget, MaxTokens and PrefillChunk
}

// pairSpec is what bitIdenticalPairs compares: a generation (prompt of
// promptLen ids from seed, maxNew tokens) in two variants, named by labels
// (variant false, then true).
type pairSpec struct {
	modes     []runMode
	labels    [2]string
	promptLen int
	seed      uint64
	maxNew    int
	// options (nil: the variant is no option) sets a run's variant in its
	// options before engine.New.
	options func(o *engine.Options, variant bool)
	// kernels (nil: nothing) sets a run's variant in its rig's kernels
	// before engine.New.
	kernels func(ks *kernels.Set, variant bool)
	// prepare (nil: nothing) sets a run's variant in its engine before
	// Generate.
	prepare func(e *engine.Engine, r *rig, variant bool)
	// after (nil: nothing more) checks a pair once both runs are done.
	after func(t *testing.T, m *llama.Model)
}

// bitIdenticalPairs runs spec for each preset (tiny, tiny-f16), format
// (safetensors, GGUF) and mode, as subtests preset/format/mode: the
// generation with variant false and then true, each on a fresh rig whose
// pools hold nothing afterwards (a streaming mode's engine must stream
// something). A pair fails unless its two runs give the same tokens and the
// same logits at every step, bit for bit.
func bitIdenticalPairs(t *testing.T, spec pairSpec) {
	t.Helper()
	ctx := context.Background()
	for _, preset := range []string{"tiny", "tiny-f16"} {
		for _, f := range []string{synth.Safetensors, synth.GGUF} {
			for _, mode := range spec.modes {
				t.Run(preset+"/"+f+"/"+mode.name, func(t *testing.T) {
					m := open(t, modelPath(t, preset, f))
					var runs [2]*engine.Result
					for i, variant := range []bool{false, true} {
						r := newRig(t, testDevice(t))
						o := mode.o
						o.Budget, o.MaxTokens, o.PrefillChunk = 256<<20, 96, 16
						if mode.streaming {
							o.Budget = smallBudget(t, r, m, o.WholeLayers)
						}
						if spec.options != nil {
							spec.options(&o, variant)
						}
						if spec.kernels != nil {
							spec.kernels(r.ks, variant)
						}
						e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, o)
						if err != nil {
							t.Fatal(err)
						}
						if mode.streaming && len(e.Plan().Streamed()) == 0 {
							t.Fatalf("%s: budget %d streams nothing", spec.labels[i], o.Budget)
						}
						if spec.prepare != nil {
							spec.prepare(e, r, variant)
						}
						p := prompt(spec.promptLen, m.Config.Vocab, spec.seed)
						if runs[i], err = e.Generate(ctx, p, engine.Sampling{MaxNew: spec.maxNew, IgnoreEOS: true, KeepLogits: true}, nil); err != nil {
							t.Fatal(err)
						}
						if err := e.Close(); err != nil {
							t.Fatal(err)
						}
						r.zero(t)
					}
					if spec.after != nil {
						spec.after(t, m)
					}
					a, b := runs[0], runs[1]
					if !slices.Equal(a.Tokens, b.Tokens) {
						t.Errorf("%s %v, %s %v", spec.labels[0], a.Tokens, spec.labels[1], b.Tokens)
					}
					if len(a.Logits) != len(b.Logits) || len(a.Logits) != spec.maxNew {
						t.Errorf("%d and %d steps of logits, want %d", len(a.Logits), len(b.Logits), spec.maxNew)
					}
					for s := range min(len(a.Logits), len(b.Logits)) {
						if !slices.Equal(a.Logits[s], b.Logits[s]) {
							t.Errorf("step %d logits differ (%s, %s)", s, spec.labels[0], spec.labels[1])
							break
						}
					}
				})
			}
		}
	}
}

// TestGroupedBitIdentical: grouping the products (MatmulGroup) changes no
// bit: the same tokens and logits at every step as one launch per product,
// for both formats, resident and streaming, per-matrix and whole-layer
// groups, prefill chunks and decode.
func TestGroupedBitIdentical(t *testing.T) {
	if raceEnabled && testing.Short() {
		t.Skip("numerics only: no concurrency the race detector could find")
	}
	bitIdenticalPairs(t, pairSpec{
		modes: []runMode{{name: "resident"}, {name: "streaming", streaming: true},
			{name: "whole", streaming: true, o: engine.Options{WholeLayers: true}}},
		labels:    [2]string{"grouped", "ungrouped"},
		promptLen: 37, seed: 9, maxNew: 20,
		options: func(o *engine.Options, ungrouped bool) { o.Ungrouped = ungrouped },
	})
}

// TestRoPEGGUFBitIdentical: RoPE reading GGUF's Q/K row order gives the
// bits of the permutation product and RoPE it replaces, at every step and
// in every mode (safetensors runs RoPE alone either way).
func TestRoPEGGUFBitIdentical(t *testing.T) {
	if raceEnabled && testing.Short() {
		t.Skip("numerics only: no concurrency the race detector could find")
	}
	bitIdenticalPairs(t, pairSpec{
		modes:     []runMode{{name: "resident"}, {name: "streaming", streaming: true}},
		labels:    [2]string{"rope from GGUF order", "permutation, then rope"},
		promptLen: 29, seed: 12, maxNew: 16,
		kernels: func(ks *kernels.Set, permute bool) {
			if !ks.HasRoPEGGUF() && !permute {
				t.Fatal("the kernels lack memwall_rope_gguf")
			}
			ks.SetRoPEGGUF(!permute)
			t.Cleanup(func() { ks.SetRoPEGGUF(true) })
		},
	})
}

// TestProfile: a profiled run gives the same tokens as an unprofiled one,
// times a whole decode step and each op class of another on the device,
// and the classes add up to the profiled step.
func TestProfile(t *testing.T) {
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	var runs []*engine.Result
	for _, profile := range []bool{false, true} {
		r := newRig(t, testDevice(t))
		e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: 256 << 20, MaxTokens: 96, PrefillChunk: 16, Profile: profile})
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.Generate(ctx, prompt(19, m.Config.Vocab, 5), engine.Sampling{MaxNew: 10, IgnoreEOS: true}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		r.zero(t)
		runs = append(runs, res)
	}
	plain, prof := runs[0], runs[1]
	if !slices.Equal(plain.Tokens, prof.Tokens) {
		t.Fatalf("profiled tokens %v, unprofiled %v", prof.Tokens, plain.Tokens)
	}
	if plain.DecodeProfile != nil || plain.DecodeStepDeviceSeconds != 0 {
		t.Errorf("unprofiled run has a profile: %v, %g s", plain.DecodeProfile, plain.DecodeStepDeviceSeconds)
	}
	sum := 0.0
	for _, c := range []string{engine.ClassProducts, engine.ClassAttention, engine.ClassNorms, engine.ClassOther} {
		if !(prof.DecodeProfile[c] > 0) {
			t.Errorf("class %s: %g s", c, prof.DecodeProfile[c])
		}
		sum += prof.DecodeProfile[c]
	}
	if len(prof.DecodeProfile) != 4 {
		t.Errorf("classes %v", prof.DecodeProfile)
	}
	// The simulator's clock adds up exactly; a GPU's event timestamps have
	// about half a microsecond of resolution per segment.
	tol := 1e-9
	if onGPU() {
		tol = 0.1 * prof.DecodeProfileSeconds
	}
	if d := sum - prof.DecodeProfileSeconds; d > tol || d < -tol || !(prof.DecodeStepDeviceSeconds > 0) {
		t.Errorf("classes sum to %g s, profiled step %g s, whole step %g s", sum, prof.DecodeProfileSeconds, prof.DecodeStepDeviceSeconds)
	}
	if !(prof.DecodeProfileQueueSeconds > 0) {
		t.Errorf("queue time %g s", prof.DecodeProfileQueueSeconds)
	}
	// Every op its own segment: the op counts are the launches'.
	L := m.Config.Layers
	pl := launchesPerStep(L)
	opSum := 0.0
	for op, want := range map[string]int{"rmsnorm": pl.plainNorm, "add + rmsnorm": pl.residualNorm,
		"q, k, v": L, "o": L, "gate, up": L, "down": L, "lm head": 1, "attention": L, "kv write": L, "rope": L,
		"round": pl.round, "add": pl.add, "silu·up": pl.silu, "embed": 1, "upload": 1, "download": 1} {
		if want == 0 {
			continue
		}
		if got := prof.DecodeProfileOps[op]; got.Count != want || !(got.Seconds > 0) || got.Class == "" {
			t.Errorf("op %q: %d segments, %g s; want %d", op, got.Count, got.Seconds, want)
		}
	}
	n := 0
	var wb uint64
	for _, o := range prof.DecodeProfileOps {
		opSum += o.Seconds
		n += o.Count
		wb += o.WeightBytes
	}
	if wb != prof.ProductWeightBytes {
		t.Errorf("profiled products read %d weight bytes, the step's products %d", wb, prof.ProductWeightBytes)
	}
	if d := opSum - sum; d > tol || d < -tol || n != prof.DecodeProfileSegments {
		t.Errorf("ops sum to %g s over %d segments; classes %g s, %d segments", opSum, n, sum, prof.DecodeProfileSegments)
	}
	if prof.ProductWeightBytes == 0 || prof.ProductWeightBytes != plain.ProductWeightBytes {
		t.Errorf("product weight bytes %d, %d", prof.ProductWeightBytes, plain.ProductWeightBytes)
	}
	t.Logf("decode step %.1f µs on the device; classes %v; ops %v", prof.DecodeStepDeviceSeconds*1e6, prof.DecodeProfile, prof.DecodeProfileOps)
}

// TestRandomShapes: models of shapes drawn at random (odd head counts and
// sizes, so that the regions' parts touch in some steps and not in others,
// grouped-query or not, bf16 and f16, both formats) give the same tokens
// and logits bit for bit grouped and ungrouped, resident and streaming,
// GGUF and safetensors, and first logits within TestAgainstReference's
// simulator tolerance of the float32 reference.
func TestRandomShapes(t *testing.T) {
	if onGPU() {
		t.Skip("simulator shapes (the GPU runs the presets)")
	}
	if raceEnabled && testing.Short() {
		t.Skip("numerics only: no concurrency the race detector could find")
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(21, 4))
	for i := range short(3, 8) {
		heads := []int{1, 2, 3, 5, 6}[rng.IntN(5)]
		kv := heads
		for kv > 1 && rng.IntN(2) == 0 { // a divisor of heads
			if d := kv - 1; heads%d == 0 {
				kv = d
			} else {
				break
			}
		}
		hd := 2 * (2 + rng.IntN(12))
		if i == 0 { // Q of one token ends where K begins (4·heads·hd a multiple of 256)
			heads, kv, hd = 4, 2, 16
		}
		cfg := synth.Config{Arch: "llama", Layers: 2 + rng.IntN(2), Hidden: heads * hd, Inter: 8 + rng.IntN(150), Heads: heads, KVHeads: kv,
			Vocab: 64 + rng.IntN(400), Context: 256, DType: []string{"BF16", "F16"}[rng.IntN(2)], Seed: uint64(i), Scale: 4}
		dir := t.TempDir()
		for _, f := range []string{synth.Safetensors, synth.GGUF} {
			name := map[string]string{synth.Safetensors: "model.safetensors", synth.GGUF: "model.gguf"}[f]
			if _, err := synth.Generate(ctx, cfg, filepath.Join(dir, name), synth.Options{Format: f, Workers: 1}); err != nil {
				t.Fatal(err)
			}
		}
		p := prompt(5+rng.IntN(30), cfg.Vocab, uint64(i))
		chunk := 1 + rng.IntN(20)
		var base *engine.Result
		for _, run := range []struct {
			path             string
			streaming, ungrp bool
		}{{dir, false, false}, {dir, false, true}, {dir, true, false}, {filepath.Join(dir, "model.gguf"), false, false}, {filepath.Join(dir, "model.gguf"), true, true}} {
			m := open(t, run.path)
			r := newRig(t, testDevice(t))
			b := uint64(64 << 20)
			if run.streaming {
				b = smallBudget(t, r, m, false)
			}
			e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: b, MaxTokens: 96, PrefillChunk: chunk, Ungrouped: run.ungrp})
			if err != nil {
				t.Fatalf("%+v: %v", cfg, err)
			}
			if run.streaming && len(e.Plan().Streamed()) == 0 {
				t.Fatalf("%+v: budget %d streams nothing", cfg, b)
			}
			res, err := e.Generate(ctx, p, engine.Sampling{MaxNew: 12, IgnoreEOS: true, KeepLogits: true}, nil)
			if err != nil {
				t.Fatalf("%+v: %v", cfg, err)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			r.zero(t)
			if base == nil {
				base = res
				ref, err := reference.New(m, cfg.DType)
				if err != nil {
					t.Fatal(err)
				}
				rl, err := ref.Logits(p)
				if err != nil {
					t.Fatal(err)
				}
				if diff, cos := compare(res.FirstLogits, rl[len(p)-1]); diff > logitsTol(cfg.DType, rl[len(p)-1]) || cos < 0.999 {
					t.Errorf("%+v: first logits against the reference: max diff %.4g, cosine %.6f", cfg, diff, cos)
				}
				continue
			}
			if !slices.Equal(res.Tokens, base.Tokens) {
				t.Errorf("%+v, %s streaming=%v ungrouped=%v: tokens %v, want %v", cfg, run.path, run.streaming, run.ungrp, res.Tokens, base.Tokens)
				continue
			}
			for s := range res.Logits {
				if !slices.Equal(res.Logits[s], base.Logits[s]) {
					t.Errorf("%+v, %s streaming=%v ungrouped=%v: step %d logits differ", cfg, run.path, run.streaming, run.ungrp, s)
					break
				}
			}
		}
	}
}

// TestResidualNormFused: the fused residual add and RMSNorm and the SiLU·up
// that rounds its inputs (kernels.Set's ResidualRMSNorm and SiluMulIn, which
// the engine calls) give the same tokens and logits bit for bit as the
// kernels they stand for (Round, Add, Round, RMSNorm; Round, Round,
// SiluMul), put in their place once per block, for both formats, resident
// and streaming, rounded and exact.
func TestResidualNormFused(t *testing.T) {
	if raceEnabled && testing.Short() {
		t.Skip("numerics only: no concurrency the race detector could find")
	}
	const maxNew = 9
	calls, siluCalls := 0, 0
	bitIdenticalPairs(t, pairSpec{
		// Plain launches: the stand-ins are Go functions counted per call,
		// which a replayed decode graph does not call (TestDecodeGraph
		// holds the graph to the plain launches).
		modes: []runMode{{name: "resident", o: engine.Options{NoGraph: true}}, {name: "streaming", streaming: true},
			{name: "exact", o: engine.Options{Exact: true, NoGraph: true}}},
		labels:    [2]string{"fused", "unfused"},
		promptLen: 21, seed: 6, maxNew: maxNew,
		prepare: func(e *engine.Engine, r *rig, unfused bool) {
			if !unfused {
				return
			}
			ks := r.ks
			engine.SetResidualNorm(e, func(x, y device.Ptr, rdt string, w device.Ptr, wdt string, out device.Ptr, odt string, T, H uint32, eps float32, st device.Stream) error {
				calls++
				n := uint64(T) * uint64(H)
				if err := ks.Round(y, rdt, n, st); err != nil {
					return err
				}
				if err := ks.Add(x, y, n, st); err != nil {
					return err
				}
				if err := ks.Round(x, rdt, n, st); err != nil {
					return err
				}
				return ks.RMSNorm(x, w, wdt, out, odt, T, H, eps, st)
			})
			engine.SetSiluMulIn(e, func(g, u device.Ptr, rdt string, out device.Ptr, odt string, n uint64, st device.Stream) error {
				siluCalls++
				if err := ks.Round(g, rdt, n, st); err != nil {
					return err
				}
				if err := ks.Round(u, rdt, n, st); err != nil {
					return err
				}
				return ks.SiluMul(g, u, out, odt, n, st)
			})
		},
		after: func(t *testing.T, m *llama.Model) {
			// Prefill (21 ids, chunks of 16: two steps) and maxNew−1 decode
			// steps; per block the O residual and MLP norm, and but for the
			// last block the MLP residual and the next attention norm.
			if steps, L := 2+maxNew-1, m.Config.Layers; calls != steps*(2*L-1) || siluCalls != steps*L {
				t.Errorf("%d unfused norm and %d SiLU calls in %d steps of %d blocks, want %d and %d", calls, siluCalls, steps, L, steps*(2*L-1), steps*L)
			}
			calls, siluCalls = 0, 0
		},
	})
}
