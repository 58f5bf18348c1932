package main

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/synth"
)

func init() {
	register(verb{
		name:    "gen-model",
		summary: "write a synthetic model file (safetensors or GGUF) with deterministic random weights",
		run:     runGenModel,
	})
}

const genModelUsage = `[--preset tiny|tiny-f16|llama-7b|llama3-8b-shape|llama-2-70b] [--layers N --hidden H --inter I --heads N] [flags] --out FILE

Writes a Llama-shaped model with real tensor names and layout and deterministic
random weights (uniform ±0.05, norms 1±0.05), keyed by --seed and tensor name.
With --preset, explicitly given flags override the preset. The format follows
--out's extension (.gguf: GGUF) unless --format is given. --shards N > 1 writes
N safetensors shards next to --out, which names the index
(model.safetensors.index.json). A Llama-7B-shaped bf16 model is 13.5 GB.

The files written: a GGUF model is the one file --out (it holds its config).
A safetensors model is --out (or the index and its shards
model-0000K-of-0000N.safetensors beside it) and a config.json in --out's
directory, Hugging Face's, which memwall run and fit and transformers read.
gen-model replaces a config.json there only if memwall wrote it (it holds
the key memwall.synth.config) and refuses to start otherwise; one model per
directory, then. Each file is written under a temporary name and renamed
into place at the end.

A GGUF model holds the metadata llama.cpp needs to load it as it is,
a vocabulary included: for --vocab 400 and above, a synthetic Llama-2-style
one of exactly --vocab tokens (<unk> <s> </s>, the 256 byte tokens, pieces
learned from a little English text, then unused tokens), so that text
prompts work in memwall run and in llama.cpp; below 400,
tokenizer.ggml.model = no_vocab (llama.cpp makes placeholder tokens).

--dtype q4_k_m, q5_k_m, q6_k, q8_0 or q4_0 (GGUF only) writes the bf16
model's values quantized as llama-quantize quantizes them, each tensor
generated and quantized in pieces: --preset llama-2-70b --dtype q4_k_m is
a 39 GiB file written without a bf16 one.`

func runGenModel(e *env, args []string) error {
	fs := newFlags(e, "gen-model", genModelUsage)
	preset := fs.String("preset", "", "start from a preset shape: tiny, tiny-f16, llama-7b, llama3-8b-shape or llama-2-70b")
	arch := fs.String("arch", "llama", "architecture (llama)")
	// The ranges are synth.Config.Validate's.
	layers := intFlagOf(fs, "layers", 0, 1, 1024, "transformer blocks")
	hidden := intFlagOf(fs, "hidden", 0, 1, 1<<16, "hidden size")
	inter := intFlagOf(fs, "inter", 0, 1, 1<<20, "MLP intermediate size")
	heads := intFlagOf(fs, "heads", 0, 1, 1024, "attention heads")
	kvHeads := intFlagOf(fs, "kv-heads", 0, 0, 1024, "key/value heads for grouped-query attention (default: --heads)")
	vocab := intFlagOf(fs, "vocab", 32000, 1, 1<<22, "vocabulary size")
	ctxLen := intFlagOf(fs, "context", 4096, 0, 1<<24, "context length recorded in GGUF metadata")
	dtype := fs.String("dtype", "bf16", "weight dtype: bf16, f16 or f32, or a GGUF file type: q4_k_m, q5_k_m, q6_k, q8_0, q4_0")
	formatName := fs.String("format", "", "safetensors or gguf (default: from --out's extension)")
	shards := intFlagOf(fs, "shards", 1, 1, 9999, "safetensors shards; > 1 writes an index at --out")
	seed := fs.Uint64("seed", 0, "random seed")
	workers := intFlagOf(fs, "workers", 0, 0, 1024, "generator goroutines (default: GOMAXPROCS)")
	out := fs.String("out", "", "output file (the index file with --shards)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return usagef("--out is required")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	var cfg synth.Config
	switch *preset {
	case "":
		for _, name := range []string{"layers", "hidden", "inter", "heads"} {
			if !set[name] {
				return usagef("--%s is required without --preset", name)
			}
		}
		cfg = synth.Config{Vocab: *vocab, Context: *ctxLen}
	case "tiny":
		cfg = synth.Tiny()
	case "llama-7b":
		cfg = synth.Llama7B()
	case "tiny-f16":
		cfg = synth.TinyF16()
	case "llama3-8b-shape":
		cfg = synth.Llama3_8BShape()
	case "llama-2-70b":
		cfg = synth.Llama2_70B()
	default:
		return usagef("unknown --preset %q (want tiny, tiny-f16, llama-7b, llama3-8b-shape or llama-2-70b)", *preset)
	}
	cfg.Arch = *arch
	override := func(name string, dst *int, v int) {
		if set[name] || *preset == "" {
			*dst = v
		}
	}
	override("layers", &cfg.Layers, *layers)
	override("hidden", &cfg.Hidden, *hidden)
	override("inter", &cfg.Inter, *inter)
	override("heads", &cfg.Heads, *heads)
	override("kv-heads", &cfg.KVHeads, *kvHeads)
	override("vocab", &cfg.Vocab, *vocab)
	override("context", &cfg.Context, *ctxLen)
	if set["dtype"] || *preset == "" {
		cfg.DType = strings.ToUpper(*dtype)
	}
	_, quantized := cfg.FileType()
	if cfg.DType != "BF16" && cfg.DType != "F16" && cfg.DType != "F32" && !quantized {
		return usagef("--dtype %q: want bf16, f16 or f32, or for GGUF q4_k_m, q5_k_m, q6_k, q8_0 or q4_0", *dtype)
	}
	cfg.Seed = *seed
	if err := cfg.Validate(); err != nil {
		return usagef("%v", strings.TrimPrefix(err.Error(), "synth: "))
	}
	f := strings.ToLower(*formatName)
	if f == "" {
		f = synth.Safetensors
		if strings.EqualFold(filepath.Ext(*out), ".gguf") {
			f = synth.GGUF
		}
	}
	if f != synth.Safetensors && f != synth.GGUF {
		return usagef("--format %q: want safetensors or gguf", *formatName)
	}
	if quantized && f != synth.GGUF {
		return usagef("--dtype %s is a GGUF file type: give --format gguf or an --out ending in .gguf", *dtype)
	}
	if *shards > 1 && f != synth.Safetensors {
		return usagef("--shards needs --format safetensors")
	}
	if *shards > 1 && !strings.HasSuffix(*out, ".json") {
		return usagef("with --shards, --out names the index file (for example model.safetensors.index.json)")
	}

	o, err := checkOutput(e.temps, "--out", *out)
	if err != nil {
		return err
	}
	if err := checkFiles(e, nil, o); err != nil {
		return err
	}
	if o.through {
		return fmt.Errorf("--out %s: not a regular file; gen-model writes a model beside its path and renames it into place, so give a file's path", *out)
	}
	if f == synth.Safetensors {
		var ce *synth.ConfigError
		if err := synth.CheckConfig(filepath.Dir(o.target)); errors.As(err, &ce) {
			return fmt.Errorf("--out %s: a safetensors model gets a config.json beside it, and %s %s: not replaced; give --out a path in another directory", *out, ce.Path, ce.Reason)
		} else if err != nil {
			return fmt.Errorf("--out %s: %w", *out, synthCause(err))
		}
	}

	var vocabKVs []gguf.KV
	vocabLine := ""
	if f == synth.GGUF {
		if vocabKVs, vocabLine, err = syntheticVocab(cfg.Vocab); err != nil {
			return err
		}
	}

	bar := newProgress(e, "gen-model")
	bar.unit = "bytes"
	var last time.Time
	opts := synth.Options{Format: f, Shards: *shards, Workers: *workers, Metadata: vocabKVs, Temps: e.temps, Progress: func(done, total uint64) {
		if now := time.Now(); done == total || now.Sub(last) >= 100*time.Millisecond {
			last = now
			bar.update(float64(done), float64(total), humanBytes(done)+" of "+humanBytes(total))
		}
	}}
	start := time.Now()
	res, err := synth.Generate(e.ctx, cfg, o.target, opts)
	bar.done()
	if err != nil {
		return fmt.Errorf("%s: %w", *out, synthCause(err))
	}
	res.Path = *out
	secs := time.Since(start).Seconds()
	gbps := float64(res.FileBytes) / 1e9 / max(secs, 1e-9)
	if *asJSON {
		return writeJSON(e.stdout, map[string]any{
			"path": res.Path, "files": res.Files, "format": f, "config": cfg,
			"params": cfg.Params(), "tensors": res.Tensors, "data_bytes": res.DataBytes,
			"file_bytes": res.FileBytes, "seconds": secs, "gb_per_s": gbps, "vocabulary": vocabLine,
		})
	}
	files := "1 file"
	if len(res.Files) > 1 {
		files = fmt.Sprintf("%d files", len(res.Files))
	}
	fmt.Fprintf(e.stdout, "wrote %s: %s, %d layers, hidden %d, %s params, %s\n",
		res.Path, cfg.Arch, cfg.Layers, cfg.Hidden, paramCount(cfg.Params()), strings.ToLower(cfg.DType))
	fmt.Fprintf(e.stdout, "  %d tensors, %s of data in %s (%s on disk), %.2f s, %.2f GB/s\n",
		res.Tensors, humanBytes(res.DataBytes), files, humanBytes(res.FileBytes), secs, gbps)
	if vocabLine != "" {
		fmt.Fprintf(e.stdout, "  vocabulary: %s\n", vocabLine)
	}
	return nil
}

// synthCause is what went wrong in a synth error, without the package's
// prefix or the temporary file's path (the caller names the file given).
func synthCause(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return pathErr(u)
	}
	return errors.New(strings.TrimPrefix(err.Error(), "synth: "))
}

// paramCount renders a parameter count the way model cards do: 6.74 B, 3.43 M.
func paramCount(n uint64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2f B", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2f M", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f K", float64(n)/1e3)
	}
	return fmt.Sprintf("%d", n)
}
