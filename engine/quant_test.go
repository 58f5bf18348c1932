package engine_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cpu"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/engine/internal/reference"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/internal/longtest"
	"github.com/memwall/memwall/kernels"
)

// quantModel writes the tiny model quantized to file type ft (a GGUF).
// Its intermediate size, 688, is no whole number of 256-element blocks,
// so the k-quant files keep ffn_down in 16 bits (llama.cpp's fallback);
// Q8_0 and Q4_0 have none, and their model takes 704 (22 blocks of 32).
func quantModel(t *testing.T, ft string) string {
	t.Helper()
	cfg := synth.Tiny()
	cfg.DType = ft
	if ft == "q8_0" || ft == "q4_0" {
		cfg.Inter = 704
	}
	path := filepath.Join(t.TempDir(), "model.gguf")
	if _, err := synth.Generate(context.Background(), cfg, path, synth.Options{Format: synth.GGUF, Workers: 2}); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestQuantizedAgainstReference runs quantized files (their matrices in
// mixed block types, the LM head Q6_K in Q4_K_M) resident and streamed on
// the test device and on the CPU device, and checks greedy tokens against
// the float32 reference over the dequantized weights (teacher-forced,
// near-tie margin) and the first logits against the reference's.
func TestQuantizedAgainstReference(t *testing.T) {
	if raceEnabled && testing.Short() {
		t.Skip("numerics only: no concurrency the race detector could find (streaming's is TestRandomBudgets')")
	}
	ctx := context.Background()
	types := []string{"q4_k_m", "q4_0"}
	if longtest.Enabled() {
		types = []string{"q4_k_m", "q5_k_m", "q6_k", "q8_0", "q4_0"}
	}
	for _, ft := range types {
		t.Run(ft, func(t *testing.T) {
			m := open(t, quantModel(t, ft))
			if !m.Tensors.Quantized || m.Tensors.MatrixDType != "F32" {
				t.Fatalf("quantized %v, matrix dtype %s", m.Tensors.Quantized, m.Tensors.MatrixDType)
			}
			ref, err := reference.New(m, "")
			if err != nil {
				t.Fatal(err)
			}
			cd, err := cpu.New(cpu.Options{Kernels: kernels.CPU(), Workers: 3})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cd.Close() })
			for _, dev := range []struct {
				name string
				d    device.Device
			}{{"test-device", testDevice(t)}, {"cpu", cd}} {
				for _, run := range []struct {
					budget string
					quant  bool // Options.QuantPrefill
				}{{"resident", false}, {"streaming", false}, {"resident", true}, {"streaming", true}} {
					budget := run.budget
					r := newRig(t, dev.d)
					b := uint64(256 << 20)
					if budget != "resident" {
						b = smallBudget(t, r, m, false)
					}
					// The float32 products' runs take float32 activations in
					// decode too and a float32 cache, to hold them to float32's
					// bounds; the others run the defaults (8-bit decode
					// products where the kernels have them, an f16 cache).
					kv := ""
					if run.quant {
						kv = kernels.F32
						r.ks.SetQ8Activations(false)
					}
					e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: b, MaxTokens: 96, PrefillChunk: 16, QuantPrefill: run.quant, KVDType: kv})
					if err != nil {
						t.Fatalf("%s %s: %v", dev.name, budget, err)
					}
					if budget != "resident" && len(e.Plan().Streamed()) == 0 {
						t.Fatalf("budget %d streams nothing", b)
					}
					p := prompt(21, m.Config.Vocab, 3)
					res, err := e.Generate(ctx, p, engine.Sampling{MaxNew: 16, IgnoreEOS: true}, nil)
					e.Close()
					if err != nil {
						t.Fatalf("%s %s: %v", dev.name, budget, err)
					}
					// Single-token products over Q4_K and Q6_K weights with
					// 8-bit activations (the GPU's and the simulator's
					// default) are about as close to the float32 reference
					// as bf16 activations are: held to a bf16 model's bounds.
					q8 := r.ks.Q8Activations()
					margin := tieMargin("F32", 8)
					if q8 {
						margin = tieMargin("BF16", 8)
					}
					if skipped := agree(t, ref, p, res.Tokens, margin); skipped > len(res.Tokens)/4 {
						t.Errorf("%s %s: %d of %d positions were near-ties", dev.name, budget, skipped, len(res.Tokens))
					}
					rl, _ := ref.Logits(p)
					// The quantized prefill kernels sum float32 activations:
					// close to the float32 reference. The default prefill (the first
					// 16-token chunk) multiplies bf16 weights and
					// activations: a bf16 model's distance from it.
					tol, minCos := 1e-3*maxAbs(rl[len(p)-1]), 0.99999
					if !run.quant { // (the bound a GPU's bf16 run is held to)
						tol, minCos = 0.03*maxAbs(rl[len(p)-1]), 0.999
					}
					if diff, cos := compare(res.FirstLogits, rl[len(p)-1]); diff > tol || cos < minCos {
						t.Errorf("%s %s quantized prefill %v: first logits differ from the reference's by %g (cos %.7f)", dev.name, budget, run.quant, diff, cos)
					} else {
						t.Logf("%s %s quantized prefill %v: first logits within %.3g of the reference's max (cos %.7f)", dev.name, budget, run.quant, diff/maxAbs(rl[len(p)-1]), cos)
					}
				}
			}
		})
	}
}

// TestKVDType: a quantized model caches K and V in f16 unless told, a
// float model in its own dtype; an unknown dtype is refused.
func TestKVDType(t *testing.T) {
	ctx := context.Background()
	q := open(t, quantModel(t, "q4_k_m"))
	f := open(t, modelPath(t, "tiny", synth.GGUF))
	for _, c := range []struct {
		m   *llama.Model
		kv  string
		elt int
	}{{q, "", 2}, {q, kernels.F32, 4}, {f, "", 2}, {f, kernels.F32, 4}} {
		r := newRig(t, testDevice(t))
		e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, c.m, engine.Options{Budget: 256 << 20, MaxTokens: 64, KVDType: c.kv})
		if err != nil {
			t.Fatal(err)
		}
		cfg := c.m.Config
		want := uint64(c.elt) * 2 * uint64(cfg.KVHeads*cfg.HeadDim*cfg.Layers) * 64 // K and V for MaxTokens rounded to blocks
		t.Logf("KV dtype %q: %d bytes, %d for the 64 tokens", c.kv, e.KVBytes(), want)
		if got := e.KVBytes(); got < want || got > want+want/2 {
			t.Errorf("KV dtype %q (quantized %v): %d KV bytes, want about %d", c.kv, c.m.Tensors.Quantized, got, want)
		}
		e.Close()
	}
	r := newRig(t, testDevice(t))
	if _, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, q, engine.Options{Budget: 256 << 20, MaxTokens: 64, KVDType: "f8"}); err == nil || !strings.Contains(err.Error(), `"f8"`) {
		t.Errorf("KV dtype f8: %v", err)
	}
}

// TestQuantDecodeLaunches: a Q4_K_M decode step multiplies its Q4_K and
// Q6_K weights on the 8-bit kernel, q, k, v and gate, up one launch each,
// and none on the float32 quantized kernels.
func TestQuantDecodeLaunches(t *testing.T) {
	if raceEnabled && testing.Short() {
		t.Skip("launch counts only: no concurrency the race detector could find")
	}
	m := open(t, quantModel(t, "q4_k_m"))
	L := m.Config.Layers
	o := engine.Options{Budget: 256 << 20, MaxTokens: 64, PrefillChunk: 16}
	got := modelLaunches(t, m, o)
	// (ffn_down stays 16-bit in this model: its 688 columns are no whole
	// number of 256-element blocks)
	if got[kernels.NameQ8MV] != 3*L+1 || got[kernels.QMatmulName(kernels.Q4_K)] != 0 || got[kernels.QMatmulName(kernels.Q6_K)] != 0 {
		t.Errorf("q8: %d launches of %s, want %d (q, k, v; o; gate, up; the LM head); all: %s", got[kernels.NameQ8MV], kernels.NameQ8MV, 3*L+1, describe(got))
	}
	t.Logf("q8: %s", describe(got))
}
