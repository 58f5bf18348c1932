package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/format/quantize"
	"github.com/memwall/memwall/tokenizer"
)

func init() {
	register(verb{
		name:    "quantize",
		summary: "write a Llama model as a quantized GGUF file (Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0), as llama-quantize does",
		run:     runQuantize,
	})
}

const quantizeUsage = `IN OUT --type Q4_K_M|Q5_K_M|Q6_K|Q8_0|Q4_0 [--workers N] [--json]
       memwall quantize --compare IN FILE... [--workers N] [--json]

Reads a Llama model in bf16, f16 or f32 — a GGUF file, or a Hugging Face
directory (config.json, safetensors, tokenizer.json optional), a .safetensors
file or a sharded index with config.json beside it — and writes OUT, a GGUF
file of the given type: each tensor in the type llama.cpp's rules give it
for that type (norms stay F32, the output matrix and some attn_v and
ffn_down get more bits), every block as ggml's reference quantizers write
it, which is what llama-quantize writes without an importance matrix.
From a GGUF file the metadata is carried over; from a checkpoint it is
derived from config.json as llama.cpp's converter does, with the
vocabulary of tokenizer.json when it is a Llama-2, GPT-2 or Llama-3 style
BPE. A model with no vocabulary gets tokenizer.ggml.model = no_vocab, so
that llama.cpp loads it. The work is parallel over tensors and rows
(--workers, default: every core); OUT is written beside its path and
renamed into place when complete. Each tensor's error is measured as it is
written: the RMS of quantized minus source over its elements, relative to
the source's RMS; the report lists the largest.

With --compare, nothing is written: each FILE, a quantized GGUF file of
the model IN (from memwall quantize, llama-quantize or another tool), is
read with memwall's dequantizer and each of its tensors compared with
IN's, with the same measure, so that two tools' files of one source can
be set side by side.`

func runQuantize(e *env, args []string) error {
	fs := newFlags(e, "quantize", quantizeUsage)
	typeName := fs.String("type", "", "file type: Q4_K_M, Q5_K_M, Q6_K, Q8_0 or Q4_0 (required)")
	workers := intFlagOf(fs, "workers", 0, 0, 1024, "quantizing goroutines (default: GOMAXPROCS)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	compare := fs.Bool("compare", false, "measure the error of quantized files FILE... of IN instead of writing one")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *compare {
		if *typeName != "" {
			return usagef("--type writes a file, --compare writes none: give one")
		}
		return runQuantizeCompare(e, pos, *workers, *asJSON)
	}
	if len(pos) != 2 {
		return usagef("want IN and OUT, got %d arguments", len(pos))
	}
	in, out := pos[0], pos[1]
	if *typeName == "" {
		return usagef("--type is required (Q4_K_M, Q5_K_M, Q6_K, Q8_0 or Q4_0)")
	}
	ft, ok := quant.ParseFileType(*typeName)
	if !ok {
		return usagef("--type %q: want Q4_K_M, Q5_K_M, Q6_K, Q8_0 or Q4_0", *typeName)
	}
	if same, err := sameFile(in, out); err != nil {
		return err
	} else if same {
		return usagef("OUT %s is IN: write the quantized model to another file", out)
	}

	m, err := llama.Open(in)
	if err != nil {
		return err
	}
	defer m.Close()
	for _, f := range m.Weights.Files() {
		if same, _ := sameFile(f, out); same {
			return usagef("OUT %s is the model's file %s: write the quantized model to another file", out, f)
		}
	}
	extra, vocab, err := tokenizerKeys(m)
	if err != nil {
		return err
	}
	src, err := quantize.FromModel(m, modelName(in), extra)
	if err != nil {
		return err
	}
	plan, _, err := quantize.Plan(src, ft)
	if err != nil {
		return fmt.Errorf("%s: %w", in, errors.New(strings.TrimPrefix(err.Error(), "quant: ")))
	}
	o, err := checkOutput(e.temps, "OUT", out)
	if err != nil {
		return err
	}

	bar := newProgress(e, "quantize")
	bar.unit = "bytes" // of the source read
	var last time.Time
	opts := quantize.Options{Workers: *workers, Progress: func(done, total uint64) {
		if now := time.Now(); done == total || now.Sub(last) >= 100*time.Millisecond {
			last = now
			bar.update(float64(done), float64(total), humanBytes(done)+" of "+humanBytes(total))
		}
	}}
	start := time.Now()
	res, err := writeStreamed(o, func(w io.Writer) (*quantize.Result, error) {
		return quantize.Write(e.ctx, w, src, ft, opts)
	})
	bar.done()
	if err != nil {
		return err
	}
	secs := time.Since(start).Seconds()
	return reportQuantize(e, *asJSON, in, out, ft, vocab, plan, res, secs)
}

// sameFile reports whether a and b name one file (b may not exist).
func sameFile(a, b string) (bool, error) {
	sb, err := os.Stat(b)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, nil // checkOutput says what is wrong with OUT
	}
	sa, err := os.Stat(a)
	if err != nil {
		return false, fmt.Errorf("IN %s: %v", a, pathErr(err))
	}
	return os.SameFile(sa, sb), nil
}

// modelName is general.name for a checkpoint: its directory's name, or the
// file's without its extension.
func modelName(in string) string {
	if st, err := os.Stat(in); err == nil && st.IsDir() {
		return filepath.Base(filepath.Clean(in))
	}
	base := filepath.Base(in)
	if strings.HasSuffix(base, ".safetensors") || strings.HasSuffix(base, ".json") {
		return filepath.Base(filepath.Dir(in))
	}
	return strings.TrimSuffix(base, filepath.Ext(base))
}

// tokenizerKeys returns the tokenizer.ggml.* keys of a checkpoint's
// tokenizer.json and a line saying what the output's vocabulary is: the
// GGUF file's own, tokenizer.json's, or no_vocab (with why).
func tokenizerKeys(m *llama.Model) ([]gguf.KV, string, error) {
	if m.Weights.Format == gguf.FormatName {
		if model, ok := m.Weights.Metadata[gguf.KeyTokenizerModel].(string); ok {
			return nil, "carried over (" + model + ")", nil
		}
		return nil, "none in the source: " + gguf.NoVocab, nil
	}
	if m.TokenizerPath == "" {
		return nil, "no tokenizer.json: " + gguf.NoVocab, nil
	}
	t, err := tokenizer.Load(m.TokenizerPath)
	if err != nil {
		return nil, "", err
	}
	meta, err := t.GGUFMetadata()
	if err != nil {
		return nil, fmt.Sprintf("not carried (%s): %s", strings.TrimPrefix(err.Error(), "tokenizer: GGUF metadata: "), gguf.NoVocab), nil
	}
	return sortedKVs(meta), fmt.Sprintf("tokenizer.json (%s, %d tokens)", meta[gguf.KeyTokenizerModel], t.VocabSize()), nil
}

// sortedKVs is meta as GGUF metadata, by key.
func sortedKVs(meta map[string]any) []gguf.KV {
	keys := make([]string, 0, len(meta))
	for k := range meta {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	kvs := make([]gguf.KV, len(keys))
	for i, k := range keys {
		kvs[i] = gguf.KV{Key: k, Value: meta[k]}
	}
	return kvs
}

// minSyntheticVocab is the smallest vocabulary tokenizer.Synthetic makes.
const minSyntheticVocab = 400

// syntheticVocab returns the tokenizer.ggml.* keys of tokenizer.Synthetic's
// Llama-2-style vocabulary of n tokens, for a GGUF file of made-up
// weights, and a line saying what it is; no keys (the file keeps no_vocab)
// when n is below minSyntheticVocab or above tokenizer.MaxVocab.
func syntheticVocab(n int) ([]gguf.KV, string, error) {
	if n < minSyntheticVocab || n > tokenizer.MaxVocab {
		return nil, fmt.Sprintf("%s (a synthetic vocabulary needs %d to %d tokens)", gguf.NoVocab, minSyntheticVocab, tokenizer.MaxVocab), nil
	}
	js, err := tokenizer.Synthetic(n)
	if err != nil {
		return nil, "", err
	}
	t, err := tokenizer.Parse("synthetic tokenizer.json", js)
	if err != nil {
		return nil, "", err
	}
	meta, err := t.GGUFMetadata()
	if err != nil {
		return nil, "", err
	}
	return sortedKVs(meta), fmt.Sprintf("synthetic (%s, %d tokens)", meta[gguf.KeyTokenizerModel], n), nil
}

// writeStreamed writes a file too large to hold in memory by outputFile's
// rules: through, for a device or a pipe; otherwise to a temporary file in
// the target's directory, synced and renamed over it when write succeeds,
// removed when it fails.
func writeStreamed[R any](o *outputFile, write func(io.Writer) (R, error)) (R, error) {
	var zero R
	if o.through {
		f, err := os.OpenFile(o.target, os.O_WRONLY, 0)
		if err != nil {
			return zero, fmt.Errorf("%s %s: %v", o.flag, o.path, pathErr(err))
		}
		r, err := write(f)
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("%s %s: %v", o.flag, o.path, pathErr(cerr))
		}
		return r, err
	}
	f, err := o.temps.CreateTemp(filepath.Dir(o.target), "."+filepath.Base(o.target)+".*.tmp")
	if err != nil {
		return zero, fmt.Errorf("%s %s: %v", o.flag, o.path, pathErr(err))
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			o.temps.Remove(f.Name())
		}
	}()
	r, err := write(f)
	if err != nil {
		return zero, err
	}
	for _, step := range []func() error{func() error { return f.Chmod(o.mode) }, f.Sync, f.Close, func() error { return o.temps.Rename(f.Name(), o.target) }} {
		if err := step(); err != nil {
			return zero, fmt.Errorf("%s %s: %v", o.flag, o.path, pathErr(err))
		}
	}
	ok = true
	return r, nil
}

func reportQuantize(e *env, asJSON bool, in, out string, ft quant.FileType, vocab string, plan []quantize.TensorResult, res *quantize.Result, secs float64) error {
	var elems uint64
	counts := map[string]int{}
	typeBytes := map[string]uint64{}
	for _, t := range plan {
		n := uint64(1)
		for _, d := range t.Shape {
			n *= d
		}
		elems += n
		counts[t.To.String()]++
		typeBytes[t.To.String()] += t.Bytes
	}
	bpw := float64(res.DataBytes) * 8 / float64(max(elems, 1))
	mbps := float64(res.SourceBytes) / 1e6 / max(secs, 1e-9)
	if asJSON {
		tensors := make([]map[string]any, len(res.Tensors))
		for i, t := range res.Tensors {
			tensors[i] = map[string]any{"name": t.Name, "from": t.From.String(), "to": t.To.String(), "shape": t.Shape, "bytes": t.Bytes, "source_bytes": t.Source,
				"rms_error": t.Error.RMS(), "relative_error": finite(t.Error.Relative())}
		}
		return writeJSON(e.stdout, map[string]any{
			"in": in, "out": out, "type": ft.String(), "tokenizer": vocab, "types": counts, "type_bytes": typeBytes,
			"tensors": tensors, "source_bytes": res.SourceBytes, "data_bytes": res.DataBytes, "file_bytes": res.FileBytes,
			"bits_per_weight": bpw, "seconds": secs, "source_mb_per_s": mbps, "relative_error": finite(totalError(res.Tensors).Relative()),
		})
	}
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	slices.Sort(names)
	var mix []string
	for _, n := range names {
		mix = append(mix, fmt.Sprintf("%d %s", counts[n], n))
	}
	fmt.Fprintf(e.stdout, "wrote %s: %s, %d tensors (%s)\n", out, ft, len(res.Tensors), strings.Join(mix, ", "))
	fmt.Fprintf(e.stdout, "  %s of tensors from %s, %.2f bits per weight, %s on disk, %.2f s, %.0f MB/s of source\n",
		humanBytes(res.DataBytes), humanBytes(res.SourceBytes), bpw, humanBytes(res.FileBytes), secs, mbps)
	fmt.Fprintf(e.stdout, "  vocabulary: %s\n", vocab)
	printWorst(e.stdout, res.Tensors, worstShown)
	return nil
}

// worstShown is how many tensors the human reports list by error.
const worstShown = 5

// finite is v for JSON, which has no infinities: nil when v is not finite.
func finite(v float64) any {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return nil
	}
	return v
}

// totalError is the error of the tensors together.
func totalError(ts []quantize.TensorResult) quantize.Error {
	var sum quantize.Error
	for _, t := range ts {
		sum.Add(t.Error)
	}
	return sum
}

// printWorst prints the model's relative RMS error and the n tensors with
// the largest.
func printWorst(w io.Writer, ts []quantize.TensorResult, n int) {
	byErr := slices.Clone(ts)
	slices.SortStableFunc(byErr, func(a, b quantize.TensorResult) int { return cmp.Compare(b.Error.Relative(), a.Error.Relative()) })
	byErr = byErr[:min(n, len(byErr))]
	fmt.Fprintf(w, "  RMS error relative to the source's: %.4f over the model; the largest:\n", totalError(ts).Relative())
	for _, t := range byErr {
		fmt.Fprintf(w, "    %.4f  %-5s %s\n", t.Error.Relative(), t.To, t.Name)
	}
}
