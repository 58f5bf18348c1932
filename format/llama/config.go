// Package llama reads the configuration of a Llama-family model — from a
// Hugging Face config.json or from GGUF metadata — maps its tensors' names
// (Hugging Face or llama.cpp) to roles once, and checks the tensors against
// the configuration, so that nothing downstream keys on tensor names.
//
// Quick start:
//
//	m, err := llama.Open("path/to/model-dir") // or a .safetensors or .gguf file
//	if err != nil { ... }
//	defer m.Close()
//	fmt.Println(m.Config.Layers, m.Config.KVHeads, m.Roles[0].Q.Name)
//
// GGUF files carry the Q and K projections' rows permuted as llama.cpp's
// converter writes them (within each head, rows (i, i+d/2) become rows (2i,
// 2i+1)); Config.PermutedQK says so, and RoPE must then pair adjacent
// elements of each head instead of HF's halves.
package llama

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// ErrConfig marks a configuration that is malformed, contradicts itself or
// the tensors, or names an architecture this package does not run.
var ErrConfig = errors.New("llama config")

// Error is a problem with one field of one file. It reads
//
//	llama config.json: num_key_value_heads: 3 does not divide num_attention_heads 8
//
// and matches ErrConfig.
type Error struct {
	File   string // the file as given
	Tensor string // the tensor concerned, "" if none
	Field  string // the config field or metadata key, "" if none
	Reason string
}

func (e *Error) Error() string {
	s := "llama " + e.File + ": "
	if e.Tensor != "" {
		s += "tensor " + strconv.Quote(e.Tensor) + ": "
	}
	if e.Field != "" {
		s += e.Field + ": "
	}
	return s + e.Reason
}

// Is makes errors.Is(err, ErrConfig) true.
func (e *Error) Is(target error) bool { return target == ErrConfig }

// RopeScaling is Llama-3-style frequency scaling ("rope_type": "llama3").
type RopeScaling struct {
	Factor          float64 `json:"factor"`
	LowFreqFactor   float64 `json:"low_freq_factor"`
	HighFreqFactor  float64 `json:"high_freq_factor"`
	OriginalContext int     `json:"original_max_position_embeddings"`
}

// Config is the shape and numerics of a Llama-family decoder.
type Config struct {
	Layers       int     `json:"layers"`
	Hidden       int     `json:"hidden"`
	Intermediate int     `json:"intermediate"`
	Heads        int     `json:"heads"`
	KVHeads      int     `json:"kv_heads"`
	HeadDim      int     `json:"head_dim"`
	Vocab        int     `json:"vocab"`
	Context      int     `json:"context"` // max_position_embeddings
	RMSNormEps   float64 `json:"rms_norm_eps"`
	RopeTheta    float64 `json:"rope_theta"`
	// RopeScaling is nil for plain RoPE.
	RopeScaling *RopeScaling `json:"rope_scaling,omitempty"`
	// RopeFreqFactors, when set, divide the inverse frequencies one by one:
	// llama.cpp's converter writes Llama-3 scaling into a GGUF file as the
	// rope_freqs.weight tensor of HeadDim/2 factors instead of metadata.
	RopeFreqFactors []float32 `json:"rope_freq_factors,omitempty"`
	// TiedEmbeddings: the LM head is the embedding matrix (no lm_head tensor).
	TiedEmbeddings bool  `json:"tied_embeddings"`
	BOS            int   `json:"bos"` // -1 when none
	EOS            []int `json:"eos"`
	// DType is the declared weight dtype ("BF16", "F16", "F32"), "" when the
	// file does not say; the tensors' own dtypes are what the engine uses.
	DType string `json:"dtype,omitempty"`
	// PermutedQK: Q and K rows are in llama.cpp's order (GGUF); RoPE pairs
	// adjacent elements.
	PermutedQK bool `json:"permuted_qk"`
	// Source names the file the config came from, for error messages.
	Source string `json:"source"`

	gguf bool // name GGUF metadata keys in errors
}

// ggufKeys are the GGUF metadata keys of config fields, for errors.
var ggufKeys = map[string]string{
	"num_hidden_layers":             "llama.block_count",
	"hidden_size":                   "llama.embedding_length",
	"intermediate_size":             "llama.feed_forward_length",
	"num_attention_heads":           "llama.attention.head_count",
	"num_key_value_heads":           "llama.attention.head_count_kv",
	"vocab_size":                    "llama.vocab_size",
	"max_position_embeddings":       "llama.context_length",
	"head_dim":                      "llama.attention.key_length",
	"rms_norm_eps":                  "llama.attention.layer_norm_rms_epsilon",
	"rope_theta":                    "llama.rope.freq_base",
	"bos_token_id":                  "tokenizer.ggml.bos_token_id",
	"eos_token_id":                  "tokenizer.ggml.eos_token_id",
	"torch_dtype":                   "general.file_type",
	"rope_scaling.factor":           "llama.rope.scaling.factor",
	"rope_scaling.high_freq_factor": "llama.rope.scaling.high_freq_factor",
	"rope_scaling.original_max_position_embeddings": "llama.rope.scaling.original_context_length",
}

// Limits on fields, far above any real model, so arithmetic on them never
// overflows.
const (
	maxDim     = 1 << 20
	maxLayers  = 1 << 12
	maxHeads   = 1 << 12
	maxVocab   = 1 << 24
	maxContext = 1 << 24
)

// Validate checks ranges and consistency and fills HeadDim when zero.
func (c *Config) Validate() error {
	bad := func(field, f string, a ...any) error {
		if k, ok := ggufKeys[field]; ok && c.gguf {
			field = k
		}
		return &Error{File: c.Source, Field: field, Reason: fmt.Sprintf(f, a...)}
	}
	for _, f := range []struct {
		name   string
		v, max int
	}{
		{"num_hidden_layers", c.Layers, maxLayers},
		{"hidden_size", c.Hidden, maxDim},
		{"intermediate_size", c.Intermediate, maxDim},
		{"num_attention_heads", c.Heads, maxHeads},
		{"num_key_value_heads", c.KVHeads, maxHeads},
		{"vocab_size", c.Vocab, maxVocab},
		{"max_position_embeddings", c.Context, maxContext},
	} {
		if f.v < 1 || f.v > f.max {
			return bad(f.name, "%d, want 1..%d", f.v, f.max)
		}
	}
	if c.Heads%c.KVHeads != 0 {
		return bad("num_key_value_heads", "%d does not divide num_attention_heads %d", c.KVHeads, c.Heads)
	}
	if c.HeadDim == 0 {
		if c.Hidden%c.Heads != 0 {
			return bad("num_attention_heads", "%d does not divide hidden_size %d (and no head_dim)", c.Heads, c.Hidden)
		}
		c.HeadDim = c.Hidden / c.Heads
	}
	if c.HeadDim < 2 || c.HeadDim > 1<<12 || c.HeadDim%2 != 0 {
		return bad("head_dim", "%d, want an even number 2..4096", c.HeadDim)
	}
	if !(c.RMSNormEps > 0 && c.RMSNormEps < 1) {
		return bad("rms_norm_eps", "%v, want a number in (0, 1)", c.RMSNormEps)
	}
	if !(c.RopeTheta > 1 && c.RopeTheta < 1e12) {
		return bad("rope_theta", "%v, want a number in (1, 1e12)", c.RopeTheta)
	}
	if s := c.RopeScaling; s != nil {
		if !(s.Factor >= 1 && s.Factor < 1e6) {
			return bad("rope_scaling.factor", "%v, want 1..1e6", s.Factor)
		}
		if !(s.LowFreqFactor > 0 && s.HighFreqFactor > s.LowFreqFactor && s.HighFreqFactor < 1e6) {
			return bad("rope_scaling.high_freq_factor", "low %v and high %v, want 0 < low < high", s.LowFreqFactor, s.HighFreqFactor)
		}
		if s.OriginalContext < 1 || s.OriginalContext > maxContext {
			return bad("rope_scaling.original_max_position_embeddings", "%d, want 1..%d", s.OriginalContext, maxContext)
		}
	}
	if c.BOS < -1 || c.BOS >= c.Vocab {
		return bad("bos_token_id", "%d outside the vocabulary of %d", c.BOS, c.Vocab)
	}
	for _, e := range c.EOS {
		if e < 0 || e >= c.Vocab {
			return bad("eos_token_id", "%d outside the vocabulary of %d", e, c.Vocab)
		}
	}
	switch c.DType {
	case "", "BF16", "F16", "F32":
	default:
		return bad("torch_dtype", "%q, want bfloat16, float16 or float32", c.DType)
	}
	return nil
}

// IsEOS reports whether id is one of the end-of-sequence tokens.
func (c *Config) IsEOS(id int) bool {
	for _, e := range c.EOS {
		if e == id {
			return true
		}
	}
	return false
}

// InvFreq returns RoPE's HeadDim/2 inverse frequencies,
// 1/theta^(2i/HeadDim), with Llama-3 scaling applied when configured (as
// transformers' _compute_llama3_parameters: wavelengths above
// original/low_freq_factor divided by factor, below original/high_freq_factor
// kept, smoothly interpolated between), or divided by RopeFreqFactors.
// Computed in float64, rounded once.
func (c *Config) InvFreq() []float32 {
	half := c.HeadDim / 2
	out := make([]float32, half)
	for i := range half {
		f := 1 / math.Pow(c.RopeTheta, float64(2*i)/float64(c.HeadDim))
		if s := c.RopeScaling; s != nil {
			orig := float64(s.OriginalContext)
			lowWave := orig / s.LowFreqFactor
			highWave := orig / s.HighFreqFactor
			wave := 2 * math.Pi / f
			switch {
			case wave > lowWave:
				f /= s.Factor
			case wave >= highWave:
				smooth := (orig/wave - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				f = (1-smooth)*f/s.Factor + smooth*f
			}
		}
		if i < len(c.RopeFreqFactors) && c.RopeFreqFactors[i] > 0 {
			f /= float64(c.RopeFreqFactors[i])
		}
		out[i] = float32(f)
	}
	return out
}

// hfConfig is config.json's fields that matter here.
type hfConfig struct {
	Architectures []string        `json:"architectures"`
	ModelType     string          `json:"model_type"`
	Hidden        *int            `json:"hidden_size"`
	Inter         *int            `json:"intermediate_size"`
	Layers        *int            `json:"num_hidden_layers"`
	Heads         *int            `json:"num_attention_heads"`
	KVHeads       *int            `json:"num_key_value_heads"`
	HeadDim       *int            `json:"head_dim"`
	Vocab         *int            `json:"vocab_size"`
	Context       *int            `json:"max_position_embeddings"`
	Eps           *float64        `json:"rms_norm_eps"`
	Theta         *float64        `json:"rope_theta"`
	Scaling       json.RawMessage `json:"rope_scaling"`
	Tied          *bool           `json:"tie_word_embeddings"`
	BOS           json.RawMessage `json:"bos_token_id"`
	EOS           json.RawMessage `json:"eos_token_id"`
	TorchDType    string          `json:"torch_dtype"`
	DType         string          `json:"dtype"`
	AttnBias      *bool           `json:"attention_bias"`
	MLPBias       *bool           `json:"mlp_bias"`
	HiddenAct     string          `json:"hidden_act"`
}

// ParseHF parses an HF config.json's bytes; file names it in errors. Only
// LlamaForCausalLM (model_type "llama") is accepted: Mistral-like and other
// model types are refused naming model_type.
func ParseHF(file string, b []byte) (*Config, error) {
	var h hfConfig
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, &Error{File: file, Reason: "not a JSON config: " + err.Error()}
	}
	bad := func(field, f string, a ...any) error {
		return &Error{File: file, Field: field, Reason: fmt.Sprintf(f, a...)}
	}
	if h.ModelType != "llama" {
		return nil, bad("model_type", "%q unsupported (want \"llama\")", h.ModelType)
	}
	for _, a := range h.Architectures {
		if a != "LlamaForCausalLM" {
			return nil, bad("architectures", "%q unsupported (want LlamaForCausalLM)", a)
		}
	}
	if h.AttnBias != nil && *h.AttnBias {
		return nil, bad("attention_bias", "true unsupported")
	}
	if h.MLPBias != nil && *h.MLPBias {
		return nil, bad("mlp_bias", "true unsupported")
	}
	if h.HiddenAct != "" && h.HiddenAct != "silu" {
		return nil, bad("hidden_act", "%q unsupported (want silu)", h.HiddenAct)
	}
	c := &Config{Source: file, BOS: -1, RMSNormEps: 1e-6, RopeTheta: 10000}
	need := func(field string, p *int, dst *int) error {
		if p == nil {
			return bad(field, "missing")
		}
		*dst = *p
		return nil
	}
	for _, f := range []struct {
		name string
		p    *int
		dst  *int
	}{
		{"hidden_size", h.Hidden, &c.Hidden},
		{"intermediate_size", h.Inter, &c.Intermediate},
		{"num_hidden_layers", h.Layers, &c.Layers},
		{"num_attention_heads", h.Heads, &c.Heads},
		{"vocab_size", h.Vocab, &c.Vocab},
	} {
		if err := need(f.name, f.p, f.dst); err != nil {
			return nil, err
		}
	}
	c.KVHeads = c.Heads
	if h.KVHeads != nil {
		c.KVHeads = *h.KVHeads
	}
	if h.HeadDim != nil {
		c.HeadDim = *h.HeadDim
		if c.HeadDim < 1 {
			return nil, bad("head_dim", "%d, want a positive even number", c.HeadDim)
		}
	}
	c.Context = 2048
	if h.Context != nil {
		c.Context = *h.Context
	}
	if h.Eps != nil {
		c.RMSNormEps = *h.Eps
	}
	if h.Theta != nil {
		c.RopeTheta = *h.Theta
	}
	if h.Tied != nil {
		c.TiedEmbeddings = *h.Tied
	}
	if err := parseScaling(c, h.Scaling); err != nil {
		return nil, err
	}
	var err error
	if c.BOS, err = tokenIDs(file, "bos_token_id", h.BOS, true); err != nil {
		return nil, err
	}
	if len(h.EOS) > 0 && string(h.EOS) != "null" {
		if c.EOS, err = tokenList(file, h.EOS); err != nil {
			return nil, err
		}
	}
	dt := h.TorchDType
	if dt == "" {
		dt = h.DType
	}
	switch dt {
	case "":
	case "bfloat16":
		c.DType = "BF16"
	case "float16":
		c.DType = "F16"
	case "float32":
		c.DType = "F32"
	default:
		return nil, bad("torch_dtype", "%q unsupported (want bfloat16, float16 or float32)", dt)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func parseScaling(c *Config, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s struct {
		RopeType string   `json:"rope_type"`
		Type     string   `json:"type"`
		Factor   *float64 `json:"factor"`
		Low      *float64 `json:"low_freq_factor"`
		High     *float64 `json:"high_freq_factor"`
		Orig     *int     `json:"original_max_position_embeddings"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return &Error{File: c.Source, Field: "rope_scaling", Reason: err.Error()}
	}
	t := s.RopeType
	if t == "" {
		t = s.Type
	}
	switch t {
	case "default", "":
		return nil
	case "llama3":
	default:
		return &Error{File: c.Source, Field: "rope_scaling.rope_type", Reason: strconv.Quote(t) + " unsupported (want llama3 or default)"}
	}
	if s.Factor == nil || s.Low == nil || s.High == nil || s.Orig == nil {
		return &Error{File: c.Source, Field: "rope_scaling", Reason: "llama3 needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings"}
	}
	c.RopeScaling = &RopeScaling{Factor: *s.Factor, LowFreqFactor: *s.Low, HighFreqFactor: *s.High, OriginalContext: *s.Orig}
	return nil
}

// tokenIDs parses a token id that may be null (→ -1).
func tokenIDs(file, field string, raw json.RawMessage, allowNull bool) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return -1, nil
	}
	var v int
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, &Error{File: file, Field: field, Reason: "want an integer: " + err.Error()}
	}
	return v, nil
}

// tokenList parses eos_token_id: an integer or a list of integers.
func tokenList(file string, raw json.RawMessage) ([]int, error) {
	var one int
	if err := json.Unmarshal(raw, &one); err == nil {
		return []int{one}, nil
	}
	var many []int
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, &Error{File: file, Field: "eos_token_id", Reason: "want an integer or a list of integers"}
	}
	return many, nil
}
