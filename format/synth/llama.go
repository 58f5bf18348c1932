// Package synth writes synthetic model files: real architectures' tensor
// names, shapes and layout filled with deterministic random weights, so tests
// and benchmarks need no downloads. A Llama-7B-shaped bf16 file (32 layers,
// hidden 4096, intermediate 11008, vocabulary 32000) is 13.5 GB.
//
// Files are written in one streaming pass, header first and then tensor data
// chunk by chunk, generated in parallel; memory use is a few chunks per
// worker whatever the model size. Every element can be recomputed on its own
// (see Value and Expected), and the generating Config is stored in the file's
// metadata, so Verify can check a file, or a copy of it, byte for byte.
package synth

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"strconv"
	"strings"

	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/quant"
)

// Formats Generate can write.
const (
	Safetensors = "safetensors"
	GGUF        = "gguf"
)

// MetadataKey is the metadata key under which Generate stores the Config, as
// JSON, in every file it writes.
const MetadataKey = "memwall.synth.config"

// Config is the shape of a synthetic model.
type Config struct {
	Arch    string `json:"arch"` // "llama"
	Layers  int    `json:"layers"`
	Hidden  int    `json:"hidden"`
	Inter   int    `json:"inter"`    // MLP intermediate size
	Heads   int    `json:"heads"`    // attention heads
	KVHeads int    `json:"kv_heads"` // key/value heads (grouped-query attention); 0 means Heads
	Vocab   int    `json:"vocab"`
	Context int    `json:"context"` // context length recorded in GGUF metadata; 0 means 4096
	// DType is "BF16", "F16" or "F32", or for GGUF one of llama.cpp's
	// file types "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0": the BF16
	// model's values quantized as llama-quantize quantizes them, each
	// tensor in the type the file type gives it (see quant.Choose).
	DType string `json:"dtype"`
	Seed  uint64 `json:"seed"`
	// Scale widens the matrices' weights to ±Scale·Amplitude (norm weights
	// stay 1 ± Amplitude); 0 means 1. A larger scale spreads the logits of
	// a small random model, so that greedy decoding is rarely a near-tie.
	Scale float64 `json:"scale,omitempty"`
	// RopeTheta is RoPE's base; 0 means 10000.
	RopeTheta float64 `json:"rope_theta,omitempty"`
	// RopeScaling, when set, is Llama-3-style frequency scaling, recorded
	// in config.json and GGUF metadata.
	RopeScaling *RopeScaling `json:"rope_scaling,omitempty"`
}

// RopeScaling is Llama-3 rope scaling ("rope_type": "llama3").
type RopeScaling struct {
	Factor          float64 `json:"factor"`
	LowFreqFactor   float64 `json:"low_freq_factor"`
	HighFreqFactor  float64 `json:"high_freq_factor"`
	OriginalContext int     `json:"original_max_position_embeddings"`
}

// Token ids recorded in config.json and GGUF metadata.
const (
	BOS = 1
	EOS = 2
)

// Llama7B returns the shape of Llama-2-7B in bf16.
func Llama7B() Config {
	return Config{Arch: "llama", Layers: 32, Hidden: 4096, Inter: 11008, Heads: 32, KVHeads: 32, Vocab: 32000, Context: 4096, DType: "BF16"}
}

// Tiny returns a small Llama-shaped model (4 layers, hidden 256, 8 heads
// over 4 KV heads, 3.4 million parameters, 6.9 MB in bf16) for tests and
// demos. Its matrices are ±0.2 (Scale 4), so that its logits spread like a
// 7B-class model's (standard deviation about 1.8).
func Tiny() Config {
	return Config{Arch: "llama", Layers: 4, Hidden: 256, Inter: 688, Heads: 8, KVHeads: 4, Vocab: 1024, Context: 512, DType: "BF16", Scale: 4}
}

// TinyF16 is a small grouped-query model in f16: 3 layers, hidden 192, 6
// heads of 32 over 2 KV heads (3 query heads per KV head), vocabulary 768,
// matrices ±0.2 (Scale 4) like Tiny.
func TinyF16() Config {
	return Config{Arch: "llama", Layers: 3, Hidden: 192, Inter: 512, Heads: 6, KVHeads: 2, Vocab: 768, Context: 512, DType: "F16", Seed: 7, Scale: 4}
}

// Llama3_8BShape is a 7B-class model shaped like Llama-3-8B (32 layers,
// hidden 4096, intermediate 14336, 32 heads over 8 KV heads, rope_theta
// 500000 with Llama-3 scaling: factor 8, low 1, high 4, original context
// 8192) but with a 32000-token vocabulary, so that it stays at 7.0 billion
// parameters (14.0 GB in bf16).
func Llama3_8BShape() Config {
	return Config{Arch: "llama", Layers: 32, Hidden: 4096, Inter: 14336, Heads: 32, KVHeads: 8, Vocab: 32000, Context: 8192, DType: "BF16",
		RopeTheta: 500000, RopeScaling: &RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalContext: 8192}}
}

// Llama2_70B returns the shape of Llama-2-70B in bf16: 80 layers, hidden
// 8192, intermediate 28672, 64 heads over 8 KV heads, vocabulary 32000
// (69.0 billion parameters, 138 GB; 39 GiB in Q4_K_M).
func Llama2_70B() Config {
	return Config{Arch: "llama", Layers: 80, Hidden: 8192, Inter: 28672, Heads: 64, KVHeads: 8, Vocab: 32000, Context: 4096, DType: "BF16"}
}

// Presets maps the names gen-model accepts to their shapes.
func Presets() map[string]Config {
	return map[string]Config{"tiny": Tiny(), "tiny-f16": TinyF16(), "llama-7b": Llama7B(), "llama3-8b-shape": Llama3_8BShape(), "llama-2-70b": Llama2_70B()}
}

func (c Config) ropeTheta() float64 {
	if c.RopeTheta == 0 {
		return 10000
	}
	return c.RopeTheta
}

func (c Config) kvHeads() int {
	if c.KVHeads == 0 {
		return c.Heads
	}
	return c.KVHeads
}

func (c Config) context() int {
	if c.Context == 0 {
		return 4096
	}
	return c.Context
}

// Validate reports the first field that is out of range or inconsistent.
func (c Config) Validate() error {
	check := func(name string, v, lo, hi int) error {
		if v < lo || v > hi {
			return fmt.Errorf("synth: %s = %d, want %d..%d", name, v, lo, hi)
		}
		return nil
	}
	if c.Arch != "llama" {
		return fmt.Errorf("synth: arch %q: only \"llama\" is implemented", c.Arch)
	}
	for _, f := range []struct {
		name      string
		v, lo, hi int
	}{
		{"layers", c.Layers, 1, 1024},
		{"hidden", c.Hidden, 1, 1 << 16},
		{"inter", c.Inter, 1, 1 << 20},
		{"heads", c.Heads, 1, 1024},
		{"kv-heads", c.KVHeads, 0, 1024},
		{"vocab", c.Vocab, 1, 1 << 22},
		{"context", c.Context, 0, 1 << 24},
	} {
		if err := check(f.name, f.v, f.lo, f.hi); err != nil {
			return err
		}
	}
	if c.Hidden%c.Heads != 0 {
		return fmt.Errorf("synth: hidden %d is not a multiple of heads %d", c.Hidden, c.Heads)
	}
	if c.Heads%c.kvHeads() != 0 {
		return fmt.Errorf("synth: heads %d is not a multiple of kv-heads %d", c.Heads, c.kvHeads())
	}
	if ft, ok := c.FileType(); ok {
		if _, err := c.quantTypes(ft); err != nil {
			return fmt.Errorf("synth: dtype %s: %v", c.DType, strings.TrimPrefix(err.Error(), "quant: "))
		}
	} else if _, err := newCodec(c.DType, 0, Amplitude); err != nil {
		return fmt.Errorf("%w, or for GGUF a file type (%s)", err, fileTypeNames())
	}
	if c.Hidden/c.Heads%2 != 0 {
		return fmt.Errorf("synth: head dim %d (hidden/heads) is odd: RoPE needs pairs", c.Hidden/c.Heads)
	}
	if c.Scale != 0 && !(c.Scale >= 0.01 && c.Scale <= 100) {
		return fmt.Errorf("synth: scale %v, want 0.01..100", c.Scale)
	}
	if c.RopeTheta != 0 && !(c.RopeTheta > 1 && c.RopeTheta < 1e12) {
		return fmt.Errorf("synth: rope_theta %v, want 1..1e12", c.RopeTheta)
	}
	if s := c.RopeScaling; s != nil && !(s.Factor >= 1 && s.LowFreqFactor > 0 && s.HighFreqFactor > s.LowFreqFactor && s.OriginalContext > 0) {
		return fmt.Errorf("synth: rope_scaling %+v: want factor >= 1, 0 < low < high, original > 0", *s)
	}
	return nil
}

// FileType returns the llama.cpp file type DType names, if it names one.
func (c Config) FileType() (quant.FileType, bool) { return quant.ParseFileType(c.DType) }

func fileTypeNames() string {
	var s []string
	for _, f := range quant.FileTypes() {
		s = append(s, f.String())
	}
	return strings.Join(s, ", ")
}

// quantTypes is the type of each of the BF16 GGUF model's tensors in file
// type ft, in Tensors' order.
func (c Config) quantTypes(ft quant.FileType) ([]quant.Type, error) {
	bf := c
	bf.DType = "BF16"
	ts := bf.Tensors(GGUF)
	qs := make([]quant.Tensor, len(ts))
	for i, t := range ts {
		typ, _ := quant.TypeByName(t.DType)
		qs[i] = quant.Tensor{Name: t.Name, Type: typ, Shape: t.Shape}
	}
	return quant.Choose(ft, quant.Model{Arch: "llama", Layers: c.Layers, Heads: c.Heads, KVHeads: c.kvHeads()}, qs)
}

// Tensor is one tensor of a synthetic model.
type Tensor struct {
	Name  string   // name in the file (Hugging Face or llama.cpp naming)
	Key   string   // Hugging Face name, which keys the values in both formats
	DType string   // stored dtype
	Shape []uint64 // outermost first
	Mean  float32  // 1 for norm weights, 0 otherwise
	Scale float32  // amplitude multiplier (Config.Scale for matrices); 0 means 1
	// Via, when set, is a narrower dtype the value is rounded to before it
	// is stored as DType: GGUF's F32 norms of a BF16 or F16 model hold
	// the model dtype's values, as llama.cpp converts such a checkpoint.
	Via string
	// HeadDim, when non-zero, says the rows are permuted within each head
	// of HeadDim rows as llama.cpp's converter permutes Q and K for GGUF:
	// file row h·d + 2i + s holds Hugging Face row h·d + s·d/2 + i.
	HeadDim int
	// Fixed, when set, is the tensor's content instead of random values:
	// GGUF's rope_freqs.weight, Llama-3 rope scaling as llama.cpp stores it.
	Fixed []float32
}

// quantType is the ggml type of t.DType.
func (t Tensor) quantType() quant.Type {
	typ, _ := quant.TypeByName(t.DType)
	return typ
}

// rowLen is the tensor's row length (its last dimension).
func (t Tensor) rowLen() uint64 { return t.Shape[len(t.Shape)-1] }

// Elements returns the product of the shape.
func (t Tensor) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Bytes returns the tensor's data size.
func (t Tensor) Bytes() uint64 {
	n, _ := quant.RowBytes(t.quantType(), int(t.rowLen())) // whole blocks: Validate checked
	return uint64(n) * (t.Elements() / t.rowLen())
}

// Tensors lists the model's tensors in storage order (embedding, then layer
// by layer, then final norm and head) with the names the given format uses.
// In GGUF, as llama.cpp converts them, norm weights are F32 whatever the
// model dtype (holding the model dtype's values) and Q and K rows are
// permuted (see Tensor.HeadDim); the values are otherwise the same in both
// formats. A quantized model (a file type as DType, GGUF only) has the BF16
// model's tensors in the types the file type gives them, holding the BF16
// values quantized; with Llama-3 rope scaling, GGUF files start with
// rope_freqs.weight (see Tensor.Fixed). Call Validate first.
func (c Config) Tensors(formatName string) []Tensor {
	if ft, ok := c.FileType(); ok {
		bf := c
		bf.DType = "BF16"
		ts := bf.Tensors(GGUF)
		types, _ := c.quantTypes(ft) // Validate checked; one type per tensor of ts
		for i := range types {
			t := &ts[i]
			if name := types[i].String(); name != t.DType {
				t.DType, t.Via = name, "BF16"
			}
		}
		return ts
	}
	if formatName == GGUF && c.RopeScaling != nil {
		bf := c
		bf.RopeScaling = nil
		s := c.RopeScaling
		f := gguf.Llama3RopeFactors(c.ropeTheta(), c.Hidden/c.Heads, s.Factor, s.LowFreqFactor, s.HighFreqFactor, s.OriginalContext)
		rope := Tensor{Name: gguf.RopeFactorsName, Key: gguf.RopeFactorsName, DType: "F32", Shape: []uint64{uint64(len(f))}, Fixed: f}
		return append([]Tensor{rope}, bf.Tensors(GGUF)...)
	}
	h, in, v := uint64(c.Hidden), uint64(c.Inter), uint64(c.Vocab)
	kv := uint64(c.kvHeads()) * (h / uint64(c.Heads))
	gg := formatName == GGUF
	var out []Tensor
	hd := c.Hidden / c.Heads
	add := func(hf, gguf string, shape []uint64, norm bool) {
		t := Tensor{Name: hf, Key: hf, DType: c.DType, Shape: shape}
		if !norm {
			t.Scale = float32(c.Scale)
		}
		if gg && (strings.HasSuffix(hf, "q_proj.weight") || strings.HasSuffix(hf, "k_proj.weight")) {
			t.HeadDim = hd
		}
		if norm {
			t.Mean = 1
		}
		if gg {
			t.Name = gguf
			if norm && c.DType != "F32" {
				t.DType, t.Via = "F32", c.DType
			}
		}
		out = append(out, t)
	}
	add("model.embed_tokens.weight", "token_embd.weight", []uint64{v, h}, false)
	for l := range c.Layers {
		p, g := "model.layers."+strconv.Itoa(l)+".", "blk."+strconv.Itoa(l)+"."
		add(p+"self_attn.q_proj.weight", g+"attn_q.weight", []uint64{h, h}, false)
		add(p+"self_attn.k_proj.weight", g+"attn_k.weight", []uint64{kv, h}, false)
		add(p+"self_attn.v_proj.weight", g+"attn_v.weight", []uint64{kv, h}, false)
		add(p+"self_attn.o_proj.weight", g+"attn_output.weight", []uint64{h, h}, false)
		add(p+"mlp.gate_proj.weight", g+"ffn_gate.weight", []uint64{in, h}, false)
		add(p+"mlp.up_proj.weight", g+"ffn_up.weight", []uint64{in, h}, false)
		add(p+"mlp.down_proj.weight", g+"ffn_down.weight", []uint64{h, in}, false)
		add(p+"input_layernorm.weight", g+"attn_norm.weight", []uint64{h}, true)
		add(p+"post_attention_layernorm.weight", g+"ffn_norm.weight", []uint64{h}, true)
	}
	add("model.norm.weight", "output_norm.weight", []uint64{h}, true)
	add("lm_head.weight", "output.weight", []uint64{v, h}, false)
	return out
}

// Params returns the number of parameters.
func (c Config) Params() uint64 {
	var n uint64
	for _, t := range c.Tensors(Safetensors) {
		n += t.Elements()
	}
	return n
}

// DataBytes returns the total tensor bytes of the model in the given format.
func (c Config) DataBytes(formatName string) uint64 {
	var n uint64
	for _, t := range c.Tensors(formatName) {
		sum, carry := bits.Add64(n, t.Bytes(), 0)
		if carry != 0 {
			return ^uint64(0)
		}
		n = sum
	}
	return n
}

func (c Config) marshal() string {
	b, _ := json.Marshal(c) // plain fields: cannot fail
	return string(b)
}

// ConfigFromMetadata recovers the Config Generate stored in a model's
// metadata (format.Model.Metadata).
func ConfigFromMetadata(meta map[string]any) (Config, error) {
	s, ok := meta[MetadataKey].(string)
	if !ok {
		return Config{}, fmt.Errorf("synth: metadata has no %q string: not a synthetic model", MetadataKey)
	}
	var c Config
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		return Config{}, fmt.Errorf("synth: metadata %q: %w", MetadataKey, err)
	}
	return c, c.Validate()
}
