package engine_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cpu"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/engine/internal/reference"
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
					e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: b, MaxTokens: 96, PrefillChunk: 16, QuantPrefill: run.quant})
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
					if skipped := agree(t, ref, p, res.Tokens, tieMargin("F32", 8)); skipped > len(res.Tokens)/4 {
						t.Errorf("%s %s: %d of %d positions were near-ties", dev.name, budget, skipped, len(res.Tokens))
					}
					rl, _ := ref.Logits(p)
					// The quantized kernels sum float32 activations: close to
					// the float32 reference. The default prefill (the first
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
