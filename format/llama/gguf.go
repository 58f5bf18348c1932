package llama

import (
	"fmt"
	"math"
)

// ParseGGUF builds a Config from GGUF metadata (format.Model.Metadata of a
// GGUF file); file names it in errors. general.architecture must be
// "llama". The vocabulary is llama.vocab_size or, when absent, the length
// of tokenizer.ggml.tokens. PermutedQK is set: GGUF stores Q and K rows as
// llama.cpp's converter permutes them.
func ParseGGUF(file string, meta map[string]any) (*Config, error) {
	bad := func(field, f string, a ...any) error {
		return &Error{File: file, Field: field, Reason: fmt.Sprintf(f, a...)}
	}
	arch, _ := meta["general.architecture"].(string)
	if arch != "llama" {
		if _, ok := meta["general.architecture"]; !ok {
			return nil, bad("general.architecture", "missing")
		}
		return nil, bad("general.architecture", "%q unsupported (want \"llama\")", fmt.Sprint(meta["general.architecture"]))
	}
	c := &Config{Source: file, BOS: -1, RopeTheta: 10000, PermutedQK: true, Context: 2048, gguf: true}
	ints := []struct {
		key      string
		dst      *int
		required bool
	}{
		{"llama.block_count", &c.Layers, true},
		{"llama.embedding_length", &c.Hidden, true},
		{"llama.feed_forward_length", &c.Intermediate, true},
		{"llama.attention.head_count", &c.Heads, true},
		{"llama.attention.head_count_kv", &c.KVHeads, false},
		{"llama.context_length", &c.Context, false},
		{"llama.vocab_size", &c.Vocab, false},
		{"llama.attention.key_length", &c.HeadDim, false},
	}
	for _, f := range ints {
		v, ok, err := metaInt(meta, f.key)
		if err != nil {
			return nil, bad(f.key, "%v", err)
		}
		if !ok {
			if f.required {
				return nil, bad(f.key, "missing")
			}
			continue
		}
		*f.dst = v
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.Vocab == 0 {
		toks, ok := meta["tokenizer.ggml.tokens"].([]string)
		if !ok {
			return nil, bad("llama.vocab_size", "missing, and no tokenizer.ggml.tokens to count")
		}
		c.Vocab = len(toks)
	}
	eps, ok, err := metaFloat(meta, "llama.attention.layer_norm_rms_epsilon")
	if err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("missing")
		}
		return nil, bad("llama.attention.layer_norm_rms_epsilon", "%v", err)
	}
	c.RMSNormEps = eps
	if v, ok, err := metaFloat(meta, "llama.rope.freq_base"); err != nil {
		return nil, bad("llama.rope.freq_base", "%v", err)
	} else if ok {
		c.RopeTheta = v
	}
	if err := ggufScaling(c, meta); err != nil {
		return nil, err
	}
	if v, ok, err := metaInt(meta, "tokenizer.ggml.bos_token_id"); err != nil {
		return nil, bad("tokenizer.ggml.bos_token_id", "%v", err)
	} else if ok {
		c.BOS = v
	}
	if v, ok, err := metaInt(meta, "tokenizer.ggml.eos_token_id"); err != nil {
		return nil, bad("tokenizer.ggml.eos_token_id", "%v", err)
	} else if ok {
		c.EOS = []int{v}
	}
	if ft, ok, _ := metaInt(meta, "general.file_type"); ok {
		switch ft {
		case 0:
			c.DType = "F32"
		case 1:
			c.DType = "F16"
		case 32:
			c.DType = "BF16"
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// ggufScaling reads llama.rope.scaling.* (llama.cpp writes Llama-3's
// scaling into a rope_freqs tensor instead; the keys below are what
// memwall's writer and some converters emit).
func ggufScaling(c *Config, meta map[string]any) error {
	typ, _ := meta["llama.rope.scaling.type"].(string)
	switch typ {
	case "", "none":
		return nil
	case "llama3":
	default:
		return &Error{File: c.Source, Field: "llama.rope.scaling.type", Reason: fmt.Sprintf("%q unsupported (want llama3 or none)", typ)}
	}
	s := &RopeScaling{}
	for _, f := range []struct {
		key string
		dst *float64
	}{
		{"llama.rope.scaling.factor", &s.Factor},
		{"llama.rope.scaling.low_freq_factor", &s.LowFreqFactor},
		{"llama.rope.scaling.high_freq_factor", &s.HighFreqFactor},
	} {
		v, ok, err := metaFloat(meta, f.key)
		if err != nil || !ok {
			if err == nil {
				err = fmt.Errorf("missing (llama3 scaling)")
			}
			return &Error{File: c.Source, Field: f.key, Reason: err.Error()}
		}
		*f.dst = v
	}
	v, ok, err := metaInt(meta, "llama.rope.scaling.original_context_length")
	if err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("missing (llama3 scaling)")
		}
		return &Error{File: c.Source, Field: "llama.rope.scaling.original_context_length", Reason: err.Error()}
	}
	s.OriginalContext = v
	c.RopeScaling = s
	return nil
}

// metaInt reads an integer of any GGUF integer type that fits an int32
// range sensibly (up to 2^31).
func metaInt(meta map[string]any, key string) (int, bool, error) {
	v, ok := meta[key]
	if !ok {
		return 0, false, nil
	}
	var n int64
	switch x := v.(type) {
	case uint8:
		n = int64(x)
	case int8:
		n = int64(x)
	case uint16:
		n = int64(x)
	case int16:
		n = int64(x)
	case uint32:
		n = int64(x)
	case int32:
		n = int64(x)
	case uint64:
		if x > math.MaxInt32 {
			return 0, true, fmt.Errorf("%d is too large", x)
		}
		n = int64(x)
	case int64:
		n = x
	default:
		return 0, true, fmt.Errorf("%T, want an integer", v)
	}
	if n < 0 || n > math.MaxInt32 {
		return 0, true, fmt.Errorf("%d out of range", n)
	}
	return int(n), true, nil
}

func metaFloat(meta map[string]any, key string) (float64, bool, error) {
	v, ok := meta[key]
	if !ok {
		return 0, false, nil
	}
	switch x := v.(type) {
	case float32:
		return float64(x), true, nil
	case float64:
		return x, true, nil
	}
	if n, ok, err := metaInt(meta, key); ok && err == nil {
		return float64(n), true, nil
	}
	return 0, true, fmt.Errorf("%T, want a number", v)
}
