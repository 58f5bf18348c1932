package quantize_test

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/format/quantize"
	"github.com/memwall/memwall/format/synth"
)

// genTiny writes a small synthetic Llama model in the given format and
// opens it.
func genTiny(t *testing.T, cfg synth.Config, formatName string) *llama.Model {
	t.Helper()
	dir := t.TempDir()
	name := map[string]string{synth.GGUF: "m.gguf", synth.Safetensors: "model.safetensors"}[formatName]
	if _, err := synth.Generate(context.Background(), cfg, filepath.Join(dir, name), synth.Options{Format: formatName, Workers: 2}); err != nil {
		t.Fatal(err)
	}
	m, err := llama.Open(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func writeModel(t *testing.T, m *llama.Model, f quant.FileType, opts quantize.Options) (string, *quantize.Result) {
	t.Helper()
	src, err := quantize.FromModel(m, "tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "q.gguf")
	fh, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	res, err := quantize.Write(context.Background(), fh, src, f, opts)
	if err != nil {
		t.Fatal(err)
	}
	return out, res
}

// smallShape is a Llama shape whose rows are whole super-blocks, 2 layers.
func smallShape() synth.Config {
	return synth.Config{Arch: "llama", Layers: 2, Hidden: 256, Inter: 512, Heads: 4, KVHeads: 2, Vocab: 300, Context: 256, DType: "BF16", Seed: 3}
}

// TestWriteSameFromBothFormats: a Hugging Face checkpoint and the GGUF file
// of the same weights quantize to the same tensors, byte for byte: the
// checkpoint's conversion (names, Q/K rows, F32 norms) is llama.cpp's.
func TestWriteSameFromBothFormats(t *testing.T) {
	cfg := smallShape()
	fromST, resST := writeModel(t, genTiny(t, cfg, synth.Safetensors), quant.MostlyQ4_K_M, quantize.Options{Workers: 3, ChunkElems: 1000})
	fromGG, resGG := writeModel(t, genTiny(t, cfg, synth.GGUF), quant.MostlyQ4_K_M, quantize.Options{Workers: 1})
	a, err := gguf.Open(fromST)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := gguf.Open(fromGG)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if len(a.Tensors) != len(b.Tensors) || len(a.Tensors) != 3+9*cfg.Layers {
		t.Fatalf("%d and %d tensors", len(a.Tensors), len(b.Tensors))
	}
	for i, ta := range a.Tensors {
		tb := b.Tensors[i]
		if ta.Name != tb.Name || ta.DType != tb.DType || !bytes.Equal(a.Data(ta), b.Data(tb)) {
			t.Errorf("tensor %d: %s %s and %s %s differ", i, ta.Name, ta.DType, tb.Name, tb.DType)
		}
	}
	if resST.DataBytes != resGG.DataBytes {
		t.Errorf("data bytes %d and %d", resST.DataBytes, resGG.DataBytes)
	}
	for _, m := range []map[string]any{a.Metadata, b.Metadata} {
		if m["general.file_type"] != uint32(quant.MostlyQ4_K_M) || m["general.quantization_version"] != uint32(2) || m[gguf.KeyTokenizerModel] != gguf.NoVocab {
			t.Errorf("metadata %v %v %v", m["general.file_type"], m["general.quantization_version"], m[gguf.KeyTokenizerModel])
		}
	}
	// The file reads back as a Llama config, with the types Choose gives.
	cfgBack, err := llama.ParseGGUF(fromST, a.Metadata)
	if err != nil || cfgBack.Layers != cfg.Layers || cfgBack.Hidden != cfg.Hidden || cfgBack.KVHeads != cfg.KVHeads || cfgBack.Vocab != cfg.Vocab {
		t.Fatalf("config %+v, %v", cfgBack, err)
	}
	want := map[string]string{"output.weight": "Q6_K", "token_embd.weight": "Q4_K", "blk.0.attn_v.weight": "Q4_K", "blk.1.attn_v.weight": "Q6_K", "blk.1.ffn_down.weight": "Q6_K",
		"blk.0.attn_q.weight": "Q4_K", "blk.0.attn_norm.weight": "F32"}
	for n, d := range want {
		if tt, ok := a.Tensor(n); !ok || tt.DType != d {
			t.Errorf("%s: %+v, want %s", n, tt, d)
		}
	}
	// llama-quantize's order: global tensors first, by name, then by block.
	if a.Tensors[0].Name != "output.weight" || a.Tensors[3].Name != "blk.0.attn_k.weight" {
		t.Errorf("order: %s, %s", a.Tensors[0].Name, a.Tensors[3].Name)
	}
}

// tolerance is the most an element may move, as a share of its tensor's
// range (the package's own tests hold tighter bounds per block).
var tolerance = map[quant.Type]float64{quant.F32: 0, quant.F16: 1e-3, quant.Q8_0: 0.01, quant.Q6_K: 0.15, quant.Q5_K: 0.12, quant.Q4_K: 0.15, quant.Q5_1: 0.04, quant.Q5_0: 0.07, quant.Q4_0: 0.13}

// TestWriteValues: every tensor of the output decodes to its source's
// values within the type's bound.
func TestWriteValues(t *testing.T) {
	m := genTiny(t, smallShape(), synth.GGUF)
	for _, f := range quant.FileTypes() {
		out, res := writeModel(t, m, f, quantize.Options{Workers: 2, ChunkElems: 4096})
		q, err := gguf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range res.Tensors {
			got, _ := q.Tensor(tt.Name)
			srcT, _ := m.Weights.Tensor(tt.Name)
			if got.DType != tt.To.String() || uint64(len(q.Data(got))) != tt.Bytes {
				t.Fatalf("%v %s: %s of %d bytes, result says %v of %d", f, tt.Name, got.DType, len(q.Data(got)), tt.To, tt.Bytes)
			}
			n := int(got.Elements())
			x, y := make([]float32, n), make([]float32, n)
			from, _ := quant.TypeByName(srcT.DType)
			if err := quant.Dequantize(from, x, m.Weights.Data(srcT)); err != nil {
				t.Fatal(err)
			}
			if err := quant.Dequantize(tt.To, y, q.Data(got)); err != nil {
				t.Fatal(err)
			}
			var lo, hi float64
			for _, v := range x {
				lo, hi = min(lo, float64(v)), max(hi, float64(v))
			}
			for i := range x {
				if e := math.Abs(float64(x[i]) - float64(y[i])); e > tolerance[tt.To]*(hi-lo)+1e-3*math.Abs(float64(x[i])) {
					t.Fatalf("%v %s element %d: %g became %g", f, tt.Name, i, x[i], y[i])
				}
			}
		}
		q.Close()
	}
}

func TestWriteCancelled(t *testing.T) {
	m := genTiny(t, smallShape(), synth.GGUF)
	src, err := quantize.FromModel(m, "tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var buf bytes.Buffer
	if _, err := quantize.Write(ctx, &buf, src, quant.MostlyQ4_K_M, quantize.Options{}); err == nil || !strings.Contains(err.Error(), "cancel") {
		t.Errorf("cancelled: %v", err)
	}
}

// TestMatchesLlamaQuantize: quantizing gen-model's files gives the files
// llama-quantize wrote from them (testdata/README.md), byte for byte:
// header, metadata, tensor order, types, blocks and padding.
func TestMatchesLlamaQuantize(t *testing.T) {
	cases := []struct {
		file string
		cfg  synth.Config
		ft   quant.FileType
	}{
		{"llama-quantize-a.Q4_K_M.gguf", synth.Config{Arch: "llama", Layers: 1, Hidden: 256, Inter: 256, Heads: 4, KVHeads: 1, Vocab: 256, Context: 256, DType: "BF16", Seed: 11}, quant.MostlyQ4_K_M},
		{"llama-quantize-b.Q5_K_M.gguf", synth.Config{Arch: "llama", Layers: 1, Hidden: 192, Inter: 192, Heads: 6, KVHeads: 2, Vocab: 256, Context: 256, DType: "BF16", Seed: 12}, quant.MostlyQ5_K_M},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join("testdata", c.file))
			if err != nil {
				t.Fatal(err)
			}
			src, err := quantize.FromModel(genTiny(t, c.cfg, synth.GGUF), "x", nil)
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if _, err := quantize.Write(context.Background(), &got, src, c.ft, quantize.Options{Workers: 2, ChunkElems: 3000}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				i := 0
				for i < min(got.Len(), len(want)) && got.Bytes()[i] == want[i] {
					i++
				}
				t.Fatalf("%d bytes, llama-quantize's %d; first difference at byte %d", got.Len(), len(want), i)
			}
		})
	}
}
