package synth_test

import (
	"bytes"
	"context"
	"math"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/format/quantize"
	"github.com/memwall/memwall/format/synth"
)

func generate(t *testing.T, cfg synth.Config, out string, opts synth.Options) {
	t.Helper()
	if _, err := synth.Generate(context.Background(), cfg, out, opts); err != nil {
		t.Fatal(err)
	}
}

func openLlama(t *testing.T, path string) *llama.Model {
	t.Helper()
	m, err := llama.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestQuantizedIsBF16Quantized: a quantized model is its BF16 model
// quantized: every tensor's bytes are what quantize.Write makes of the BF16
// GGUF file (llama-quantize's, byte for byte), for every file type, on a
// shape of whole super-blocks and on tiny-f16's rows of 192, which take
// llama.cpp's fallbacks (Q5_0, Q5_1, Q8_0, F16). Verify accepts the file.
func TestQuantizedIsBF16Quantized(t *testing.T) {
	shapes := map[string]synth.Config{
		"blocks":   {Arch: "llama", Layers: 3, Hidden: 256, Inter: 768, Heads: 4, KVHeads: 2, Vocab: 300, Context: 256, DType: "BF16", Seed: 9},
		"tiny-f16": synth.TinyF16(),
	}
	for name, base := range shapes {
		base.DType = "BF16"
		dir := t.TempDir()
		bf := filepath.Join(dir, "bf16.gguf")
		generate(t, base, bf, synth.Options{Format: synth.GGUF})
		m := openLlama(t, bf)
		src, err := quantize.FromModel(m, "x", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, ft := range quant.FileTypes() {
			t.Run(name+"/"+ft.String(), func(t *testing.T) {
				cfg := base
				cfg.DType = ft.String()
				out := filepath.Join(dir, ft.String()+".gguf")
				generate(t, cfg, out, synth.Options{Format: synth.GGUF, Workers: 3, ChunkBytes: 40000})
				var want bytes.Buffer
				if _, err := quantize.Write(context.Background(), &want, src, ft, quantize.Options{}); err != nil {
					t.Fatal(err)
				}
				ref, err := gguf.Parse("ref", want.Bytes())
				if err != nil {
					t.Fatal(err)
				}
				got, err := gguf.Open(out)
				if err != nil {
					t.Fatal(err)
				}
				defer got.Close()
				if len(got.Tensors) != len(ref.Tensors) {
					t.Fatalf("%d tensors, quantize wrote %d", len(got.Tensors), len(ref.Tensors))
				}
				types := map[string]bool{}
				for _, r := range ref.Tensors {
					g, ok := got.Tensor(r.Name)
					if !ok || g.DType != r.DType || !bytes.Equal(got.Data(g), want.Bytes()[r.Offset:r.Offset+r.Bytes]) {
						t.Fatalf("tensor %s: %s, quantize wrote %s; bytes equal: %v", r.Name, g.DType, r.DType, ok && bytes.Equal(got.Data(g), want.Bytes()[r.Offset:r.Offset+r.Bytes]))
					}
					types[g.DType] = true
				}
				if name == "tiny-f16" && ft == quant.MostlyQ4_K_M && !(types["Q5_0"] && types["Q8_0"]) {
					t.Errorf("tiny-f16 in Q4_K_M has types %v: no fallbacks", types)
				}
				if got.Metadata["general.file_type"] != uint32(ft) || got.Metadata[gguf.KeyTokenizerModel] != gguf.NoVocab {
					t.Errorf("metadata: file type %v, tokenizer %v", got.Metadata["general.file_type"], got.Metadata[gguf.KeyTokenizerModel])
				}
				if err := synth.Verify(got); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func TestQuantizedNeedsGGUF(t *testing.T) {
	cfg := synth.Tiny()
	cfg.DType = "Q4_K_M"
	out := filepath.Join(t.TempDir(), "m.safetensors")
	if _, err := synth.Generate(context.Background(), cfg, out, synth.Options{Format: synth.Safetensors}); err == nil || !strings.Contains(err.Error(), "GGUF") {
		t.Errorf("quantized safetensors: %v", err)
	}
	cfg.DType = "Q8_0" // tiny's rows of 688 are no whole blocks of 32: llama-quantize refuses too
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "ffn_down") {
		t.Errorf("tiny in Q8_0: %v", err)
	}
	cfg.DType = "Q3_K"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Q4_K_M") {
		t.Errorf("unknown dtype: %v", err)
	}
}

// TestRopeFreqsInGGUF: with Llama-3 rope scaling a GGUF file carries the
// scaling as llama.cpp does, a rope_freqs.weight tensor and no
// llama.rope.scaling keys, and memwall reads back the frequencies the
// safetensors model has.
func TestRopeFreqsInGGUF(t *testing.T) {
	cfg := synth.Llama3_8BShape()
	cfg.Layers, cfg.Hidden, cfg.Inter, cfg.Heads, cfg.KVHeads, cfg.Vocab = 1, 512, 256, 4, 2, 256
	dir := t.TempDir()
	gg := filepath.Join(dir, "m.gguf")
	generate(t, cfg, gg, synth.Options{Format: synth.GGUF})
	generate(t, cfg, filepath.Join(dir, "model.safetensors"), synth.Options{Format: synth.Safetensors})
	a, b := openLlama(t, gg), openLlama(t, dir)
	if _, ok := a.Weights.Tensor(gguf.RopeFactorsName); !ok || a.Config.RopeScaling != nil || len(a.Config.RopeFreqFactors) != 64 {
		t.Fatalf("gguf: rope_freqs %v, scaling %v, %d factors", ok, a.Config.RopeScaling, len(a.Config.RopeFreqFactors))
	}
	for k := range a.Weights.Metadata {
		if strings.HasPrefix(k, "llama.rope.scaling.") {
			t.Errorf("gguf has %s", k)
		}
	}
	fa, fb := a.Config.InvFreq(), b.Config.InvFreq()
	for i := range fa {
		if math.Abs(float64(fa[i])-float64(fb[i])) > 1e-6*float64(fb[i]) {
			t.Errorf("inv_freq[%d]: gguf %v, safetensors %v", i, fa[i], fb[i])
		}
	}
	if err := synth.Verify(a.Weights); err != nil {
		t.Fatal(err)
	}
}

// TestLlama2_70B: the preset is Llama-2-70B's shape, 68.98 billion
// parameters, and its Q4_K_M file holds 38.6 GiB of tensors, the size of
// the Q4_K_M files users download.
func TestLlama2_70B(t *testing.T) {
	c := synth.Llama2_70B()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if got := c.Params(); got != 68_976_648_192 {
		t.Errorf("Params = %d, want 68976648192", got)
	}
	c.DType = "Q4_K_M"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	gib := float64(c.DataBytes(synth.GGUF)) / (1 << 30)
	if gib < 38 || gib > 40 {
		t.Errorf("Q4_K_M data %.2f GiB, want about 39", gib)
	}
	types := map[string]int{}
	for _, tt := range c.Tensors(synth.GGUF) {
		types[tt.DType]++
	}
	// attn_v: Q6_K in 40 layers, Q5_K (llama.cpp's 70B rule) in the other 40.
	if types["Q5_K"] != 40 || types["F32"] != 161 {
		t.Errorf("types %v", types)
	}
	t.Logf("Q4_K_M: %.2f GiB, types %v", gib, types)
}

// TestQuantizedMemoryBounded: generating a quantized model takes a few
// chunks per worker, not the model: a 283 MB Q8_0 file (one layer of
// Llama-7B's shape, vocabulary 8000) is written with the heap never more
// than 64 MiB above where it started (the bound: ordered.InFlight(2) = 6
// output buffers and 2 workers' scratch of 2 chunks, 4 MiB each = 40 MiB).
func TestQuantizedMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 283 MB")
	}
	cfg := synth.Llama7B()
	cfg.Layers, cfg.Vocab, cfg.DType = 1, 8000, "Q8_0"
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	out := filepath.Join(t.TempDir(), "m.gguf")
	res, err := synth.Generate(context.Background(), cfg, out, synth.Options{Format: synth.GGUF, Workers: 2, ChunkBytes: 4 << 20})
	close(stop)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	grew := float64(peak.Load()-min(peak.Load(), base.HeapAlloc)) / (1 << 20)
	t.Logf("%.0f MB written, heap peak %.1f MiB above the start", float64(res.FileBytes)/1e6, grew)
	if res.FileBytes < 280e6 || grew > 64 {
		t.Errorf("%d bytes written with the heap %.1f MiB above the start (bound 64)", res.FileBytes, grew)
	}
}
