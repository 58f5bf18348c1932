package synth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/internal/ordered"
	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/format/safetensors"
)

// Options controls how Generate writes.
type Options struct {
	Format string // Safetensors (the default when empty) or GGUF
	// Shards > 1 splits a safetensors model into that many files of about
	// equal size next to an index; out then names the index file and must
	// end in ".json" (conventionally model.safetensors.index.json).
	Shards int
	// Workers generating data in parallel; 0 means GOMAXPROCS.
	Workers int
	// ChunkBytes is the unit of generation and of writes; 0 means 8 MiB.
	ChunkBytes int
	// Progress, if set, is called after each chunk is written with the
	// tensor bytes written so far and the total, from one goroutine at a
	// time, in increasing order; the last call has done == total.
	Progress func(done, total uint64)
	// Metadata, for a GGUF file, is set in its header after Generate's own
	// keys, each replacing any of the same name (gguf.Set): a vocabulary's
	// tokenizer.ggml.* keys, which then replace the no_vocab default. The
	// caller keeps it consistent with the model (token count = Vocab).
	// Ignored for safetensors.
	Metadata []gguf.KV
	// Temps makes Generate's temporary files and renames or removes each
	// (nil: the os package does): a program that removes what it left
	// when it must exit at once, on a second Ctrl-C, registers them
	// through it.
	Temps Temps
}

// Temps makes temporary files and renames or removes them, as
// os.CreateTemp, os.Rename and os.Remove do (see Options.Temps).
type Temps interface {
	CreateTemp(dir, pattern string) (*os.File, error)
	Rename(tmp, path string) error
	Remove(tmp string) error
}

// osTemps is Temps by the os package.
type osTemps struct{}

func (osTemps) CreateTemp(dir, pattern string) (*os.File, error) { return os.CreateTemp(dir, pattern) }
func (osTemps) Rename(tmp, path string) error                    { return os.Rename(tmp, path) }
func (osTemps) Remove(tmp string) error                          { return os.Remove(tmp) }

// Result describes what Generate wrote.
type Result struct {
	Path      string   // what to open: the model file, or the index
	Files     []string // every file written: data files, the index, then config.json (safetensors)
	Tensors   int
	DataBytes uint64 // tensor bytes
	FileBytes uint64 // bytes on disk, headers and index included
}

// WriteTiny writes the Tiny model in the given format (Safetensors or GGUF)
// into dir and returns the file's path: model.safetensors or model.gguf.
func WriteTiny(ctx context.Context, dir, formatName string) (string, error) {
	name := "model.safetensors"
	if formatName == GGUF {
		name = "model.gguf"
	}
	res, err := Generate(ctx, Tiny(), filepath.Join(dir, name), Options{Format: formatName})
	if err != nil {
		return "", err
	}
	return res.Path, nil
}

// shardFile is one file to write and the tensors it holds.
type shardFile struct {
	path    string
	tensors []Tensor
}

// Generate writes the model described by cfg to out. Each file is written to
// a temporary name in its directory and renamed into place once complete, so
// a failed or cancelled run leaves no partial model behind (existing files
// at the destination are replaced only on success). A safetensors model also
// gets config.json in out's directory (HFConfig); a config.json already there
// is replaced only when Generate wrote it (see CheckConfig), else Generate
// fails before writing anything. Files get mode 0644. It returns when the
// data has been handed to the operating system; it does not fsync.
func Generate(ctx context.Context, cfg Config, out string, opts Options) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Format == "" {
		opts.Format = Safetensors
	}
	if opts.Format != Safetensors && opts.Format != GGUF {
		return nil, fmt.Errorf("synth: format %q: want %q or %q", opts.Format, Safetensors, GGUF)
	}
	if opts.Shards < 0 || opts.Shards > 9999 {
		return nil, fmt.Errorf("synth: shards = %d, want 1..9999", opts.Shards)
	}
	if _, q := cfg.FileType(); q && opts.Format != GGUF {
		return nil, fmt.Errorf("synth: dtype %s is a GGUF file type: quantized models are written as GGUF only", cfg.DType)
	}
	if opts.Shards > 1 && opts.Format != Safetensors {
		return nil, fmt.Errorf("synth: shards are implemented for safetensors only")
	}
	if opts.Shards > 1 && !strings.HasSuffix(out, ".json") {
		return nil, fmt.Errorf("synth: with %d shards, out %q must name the index file (model.safetensors.index.json)", opts.Shards, out)
	}
	if opts.Format == Safetensors {
		if err := CheckConfig(filepath.Dir(out)); err != nil {
			return nil, err
		}
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	if opts.ChunkBytes <= 0 {
		opts.ChunkBytes = 8 << 20
	}
	opts.ChunkBytes = max(opts.ChunkBytes&^15, 16) // whole elements of every dtype
	if opts.Temps == nil {
		opts.Temps = osTemps{}
	}

	tensors := cfg.Tensors(opts.Format)
	files := []shardFile{{path: out, tensors: tensors}}
	if opts.Shards > 1 {
		if opts.Shards > len(tensors) {
			return nil, fmt.Errorf("synth: %d shards for %d tensors", opts.Shards, len(tensors))
		}
		files = splitShards(tensors, opts.Shards, filepath.Dir(out))
	}

	res := &Result{Path: out, Tensors: len(tensors), DataBytes: cfg.DataBytes(opts.Format)}
	g := &generator{cfg: cfg, opts: opts, total: res.DataBytes, codecs: map[codecKey]*codec{}}
	var temps []string
	defer func() {
		for _, t := range temps {
			opts.Temps.Remove(t)
		}
	}()
	var finals []string
	for _, f := range files {
		tmp, size, err := g.writeFile(ctx, f)
		if tmp != "" {
			temps = append(temps, tmp)
		}
		if err != nil {
			return nil, err
		}
		finals = append(finals, f.path)
		res.FileBytes += size
	}
	if opts.Shards > 1 {
		tmp, size, err := writeIndex(opts.Temps, cfg, files, out, res.DataBytes)
		if tmp != "" {
			temps = append(temps, tmp)
		}
		if err != nil {
			return nil, err
		}
		finals = append(finals, out)
		res.FileBytes += size
	}
	if opts.Format == Safetensors {
		tmp, size, err := writeConfig(opts.Temps, cfg, filepath.Dir(out))
		if tmp != "" {
			temps = append(temps, tmp)
		}
		if err != nil {
			return nil, err
		}
		finals = append(finals, filepath.Join(filepath.Dir(out), "config.json"))
		res.FileBytes += size
	}
	for i, tmp := range temps {
		if err := opts.Temps.Rename(tmp, finals[i]); err != nil {
			return nil, fmt.Errorf("synth: %w", err)
		}
	}
	temps = nil
	res.Files = finals
	return res, nil
}

// splitShards cuts the tensor list, in order, into n non-empty groups of
// about equal bytes, named like Hugging Face shards.
func splitShards(tensors []Tensor, n int, dir string) []shardFile {
	var left uint64
	for _, t := range tensors {
		left += t.Bytes()
	}
	out := make([]shardFile, n)
	i := 0
	for k := range n {
		target := left / uint64(n-k)
		var got uint64
		for i < len(tensors) && len(tensors)-i > n-k-1 && (got < target || len(out[k].tensors) == 0) {
			if k == n-1 || len(out[k].tensors) == 0 || got+tensors[i].Bytes()/2 <= target {
				out[k].tensors = append(out[k].tensors, tensors[i])
				got += tensors[i].Bytes()
				i++
				continue
			}
			break
		}
		if k == n-1 {
			for ; i < len(tensors); i++ {
				out[k].tensors = append(out[k].tensors, tensors[i])
				got += tensors[i].Bytes()
			}
		}
		left -= got
		out[k].path = filepath.Join(dir, fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, n))
	}
	return out
}

type codecKey struct {
	dtype, via string
	mean, amp  float32
}

type generator struct {
	cfg    Config
	opts   Options
	total  uint64
	done   uint64
	codecs map[codecKey]*codec
}

func (g *generator) codec(t Tensor) *codec {
	k := codecKey{t.valueDType(), t.Via, t.Mean, t.amplitude()}
	c, ok := g.codecs[k]
	if !ok {
		c, _ = newCodecVia(k.dtype, t.Via, t.Mean, t.amplitude()) // dtypes come from a validated Config
		g.codecs[k] = c
	}
	return c
}

// dataWriter is what both format writers offer.
type dataWriter interface {
	Write(p []byte) (int, error)
	Close() error
}

// writeFile writes one file to a temporary path and returns that path, the
// file's size and any error; the caller renames or removes the temporary.
func (g *generator) writeFile(ctx context.Context, f shardFile) (string, uint64, error) {
	tmpf, err := g.opts.Temps.CreateTemp(filepath.Dir(f.path), "."+filepath.Base(f.path)+".tmp*")
	if err != nil {
		return "", 0, fmt.Errorf("synth: %w", err)
	}
	tmp := tmpf.Name()
	fail := func(err error) (string, uint64, error) {
		tmpf.Close()
		return tmp, 0, err
	}
	// CreateTemp makes the file private; a model file is ordinary data.
	if err := tmpf.Chmod(0o644); err != nil {
		return fail(fmt.Errorf("synth %s: %w", f.path, err))
	}
	specs := make([]format.TensorSpec, len(f.tensors))
	for i, t := range f.tensors {
		specs[i] = format.TensorSpec{Name: t.Name, DType: t.DType, Shape: t.Shape}
	}
	var w dataWriter
	if g.opts.Format == GGUF {
		w, err = gguf.NewWriter(tmpf, g.ggufMetadata(), specs)
	} else {
		w, err = safetensors.NewWriter(tmpf, specs, map[string]string{"format": "pt", MetadataKey: g.cfg.marshal()})
	}
	if err != nil {
		return fail(fmt.Errorf("synth %s: %w", f.path, err))
	}
	if err := g.stream(ctx, f.tensors, w); err != nil {
		return fail(fmt.Errorf("synth %s: %w", f.path, err))
	}
	if err := w.Close(); err != nil {
		return fail(fmt.Errorf("synth %s: %w", f.path, err))
	}
	st, err := tmpf.Stat()
	if err != nil {
		return fail(fmt.Errorf("synth %s: %w", f.path, err))
	}
	if err := tmpf.Close(); err != nil {
		return tmp, 0, fmt.Errorf("synth %s: %w", f.path, err)
	}
	return tmp, uint64(st.Size()), nil
}

func (g *generator) ggufMetadata() []gguf.KV {
	c := g.cfg
	fileType := uint32(1) // MOSTLY_F16
	switch c.DType {
	case "F32":
		fileType = 0
	case "BF16":
		fileType = 32
	}
	ft, quantized := c.FileType()
	if quantized {
		fileType = uint32(ft)
	}
	kv := []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "general.name", Value: "memwall synthetic llama"},
		{Key: "general.file_type", Value: fileType},
		{Key: "general.alignment", Value: uint32(gguf.DefaultAlignment)},
		{Key: "llama.vocab_size", Value: uint32(c.Vocab)},
		{Key: "llama.context_length", Value: uint32(c.context())},
		{Key: "llama.embedding_length", Value: uint32(c.Hidden)},
		{Key: "llama.block_count", Value: uint32(c.Layers)},
		{Key: "llama.feed_forward_length", Value: uint32(c.Inter)},
		{Key: "llama.rope.dimension_count", Value: uint32(c.Hidden / c.Heads)},
		{Key: "llama.rope.freq_base", Value: float32(c.ropeTheta())},
		{Key: "llama.attention.head_count", Value: uint32(c.Heads)},
		{Key: "llama.attention.head_count_kv", Value: uint32(c.kvHeads())},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
		// No vocabulary: llama.cpp, which refuses a file without a
		// tokenizer model, then makes llama.vocab_size placeholder tokens.
		{Key: gguf.KeyTokenizerModel, Value: gguf.NoVocab},
		{Key: "tokenizer.ggml.bos_token_id", Value: uint32(BOS)},
		{Key: "tokenizer.ggml.eos_token_id", Value: uint32(EOS)},
		{Key: MetadataKey, Value: c.marshal()},
	}
	if quantized {
		kv = append(kv, gguf.KV{Key: "general.quantization_version", Value: uint32(quant.QuantizationVersion)})
	}
	for _, x := range g.opts.Metadata {
		kv = gguf.Set(kv, x.Key, x.Value)
	}
	// Llama-3 rope scaling is in the rope_freqs.weight tensor, as llama.cpp
	// stores it (Config.Tensors).
	return kv
}

// HFConfig returns the config.json Generate writes beside a safetensors
// model: what transformers' LlamaForCausalLM.from_pretrained needs to load
// the directory as it is.
func (c Config) HFConfig() map[string]any {
	dt := map[string]string{"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[c.DType]
	m := map[string]any{
		"architectures":           []string{"LlamaForCausalLM"},
		"model_type":              "llama",
		"hidden_size":             c.Hidden,
		"intermediate_size":       c.Inter,
		"num_hidden_layers":       c.Layers,
		"num_attention_heads":     c.Heads,
		"num_key_value_heads":     c.kvHeads(),
		"head_dim":                c.Hidden / c.Heads,
		"vocab_size":              c.Vocab,
		"max_position_embeddings": c.context(),
		"rms_norm_eps":            1e-5,
		"rope_theta":              c.ropeTheta(),
		"tie_word_embeddings":     false,
		"bos_token_id":            BOS,
		"eos_token_id":            EOS,
		"hidden_act":              "silu",
		"attention_bias":          false,
		"mlp_bias":                false,
		"initializer_range":       0.02,
		"use_cache":               true,
		"torch_dtype":             dt,
		MetadataKey:               c.marshal(),
	}
	if s := c.RopeScaling; s != nil {
		m["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": s.Factor, "low_freq_factor": s.LowFreqFactor,
			"high_freq_factor": s.HighFreqFactor, "original_max_position_embeddings": s.OriginalContext}
	}
	return m
}

// ConfigError is Generate's refusal to replace a config.json it did not
// write.
type ConfigError struct {
	Path   string // the config.json
	Reason string // why it is not replaced
}

func (e *ConfigError) Error() string { return "synth: " + e.Path + ": " + e.Reason + "; not replaced" }

// configMaxBytes is the largest config.json CheckConfig reads: Generate's
// are about a kilobyte.
const configMaxBytes = 1 << 20

// CheckConfig reports whether Generate may write config.json into dir: it
// may when there is none, or when the one there is a regular file holding a
// JSON object with the key MetadataKey, which Generate writes and nothing
// else does. Any other config.json is someone else's: the error is a
// *ConfigError saying what it is. Note that a config.json Generate wrote
// for another model in dir is replaced too: keep one model per directory.
func CheckConfig(dir string) error {
	path := filepath.Join(dir, "config.json")
	st, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("synth: %w", err)
	case !st.Mode().IsRegular():
		return &ConfigError{path, "exists and is not a regular file (" + st.Mode().Type().String() + ")"}
	case st.Size() > configMaxBytes:
		return &ConfigError{path, "exists and memwall did not write it (it is larger than memwall's)"}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return &ConfigError{path, "exists and memwall did not write it (it is not a JSON object)"}
	}
	if _, ok := m[MetadataKey]; !ok {
		return &ConfigError{path, fmt.Sprintf("exists and memwall did not write it (it has no %q key)", MetadataKey)}
	}
	return nil
}

// writeConfig writes config.json into dir under a temporary name.
func writeConfig(temps Temps, cfg Config, dir string) (string, uint64, error) {
	b, err := json.MarshalIndent(cfg.HFConfig(), "", "  ")
	if err != nil {
		return "", 0, fmt.Errorf("synth: config.json: %w", err)
	}
	return writeTemp(temps, filepath.Join(dir, "config.json"), append(b, '\n'))
}

// chunk is elements [first, first+n) of a tensor.
type chunk struct {
	c        *codec
	t        Tensor
	st       uint64
	first, n uint64
	buf      []byte
}

// stream generates the tensors' data in parallel and writes it in order.
// Memory: ordered.InFlight(Workers) buffers of ChunkBytes, and for
// quantized tensors a scratch of 2·ChunkBytes per worker (a chunk holds at
// least one row, so a row longer than ChunkBytes/4 takes more).
func (g *generator) stream(ctx context.Context, tensors []Tensor, w dataWriter) error {
	var chunks []chunk
	for _, t := range tensors {
		c := g.codec(t)
		st := stream(g.cfg.Seed, t.Key)
		per := uint64(g.opts.ChunkBytes / c.size)
		if t.blockwise() {
			per = max(1, per/t.rowLen()) * t.rowLen() // whole rows
		}
		for first, n := uint64(0), t.Elements(); first < n; first += per {
			chunks = append(chunks, chunk{c: c, t: t, st: st, first: first, n: min(per, n-first)})
		}
	}
	free := make(chan []byte, ordered.InFlight(g.opts.Workers))
	for range cap(free) {
		free <- make([]byte, g.opts.ChunkBytes)
	}
	scratch := make(chan *rowScratch, max(g.opts.Workers, 1))
	for range cap(scratch) {
		scratch <- &rowScratch{}
	}
	work := func(i int) error {
		k := &chunks[i]
		b := <-free // never waits: a buffer per chunk in flight
		n := k.t.chunkBytes(k.n)
		if uint64(cap(b)) < n {
			b = make([]byte, n)
		}
		k.buf = b[:n]
		sc := <-scratch
		k.t.fill(k.buf, k.c, k.st, k.first, k.n, sc)
		scratch <- sc
		return nil
	}
	write := func(i int) error {
		k := &chunks[i]
		if _, err := w.Write(k.buf); err != nil {
			return err
		}
		g.done += uint64(len(k.buf))
		if g.opts.Progress != nil {
			g.opts.Progress(g.done, g.total)
		}
		free <- k.buf[:cap(k.buf)]
		k.buf = nil
		return nil
	}
	err := ordered.Run(ctx, len(chunks), g.opts.Workers, work, write)
	if err != nil && errors.Is(err, context.Canceled) {
		return fmt.Errorf("generation cancelled: %w", err)
	}
	return err
}

// writeIndex writes the sharded checkpoint's index to a temporary file.
func writeIndex(temps Temps, cfg Config, files []shardFile, out string, total uint64) (string, uint64, error) {
	wm := map[string]string{}
	for _, f := range files {
		for _, t := range f.tensors {
			wm[t.Name] = filepath.Base(f.path)
		}
	}
	b, err := json.MarshalIndent(map[string]any{
		"metadata":   map[string]any{"total_size": total, MetadataKey: cfg.marshal(), "format": "pt"},
		"weight_map": wm,
	}, "", "  ")
	if err != nil {
		return "", 0, fmt.Errorf("synth %s: %w", out, err)
	}
	return writeTemp(temps, out, append(b, '\n'))
}

// writeTemp writes b to a temporary file beside out (mode 0644) and
// returns its name; the caller renames or removes it.
func writeTemp(temps Temps, out string, b []byte) (string, uint64, error) {
	f, err := temps.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp*")
	if err != nil {
		return "", 0, fmt.Errorf("synth: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return f.Name(), 0, fmt.Errorf("synth %s: %w", out, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return f.Name(), 0, fmt.Errorf("synth %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return f.Name(), 0, fmt.Errorf("synth %s: %w", out, err)
	}
	return f.Name(), uint64(len(b)), nil
}
