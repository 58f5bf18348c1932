package tokenizer

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// GGUF token types (tokenizer.ggml.token_type), as llama.cpp numbers them.
const (
	ggufNormal      = 1
	ggufUnknown     = 2
	ggufControl     = 3
	ggufUserDefined = 4
	ggufUnused      = 5
	ggufByte        = 6
)

const ggufFile = "gguf metadata"

// FromGGUF builds a Tokenizer from a GGUF file's metadata (format.Model's
// Metadata): tokenizer.ggml.model "llama" (tokens, scores, token_type:
// SentencePiece BPE merging by score, with <0xNN> byte fallback, as llama.cpp
// encodes) or "gpt2" (tokens, merges: byte-level BPE, split as
// tokenizer.ggml.pre names). Control, unknown and user-defined tokens
// written in the text are matched as added tokens (the first two special,
// skipped by Decode(ids, true)); BOS and EOS come from bos_token_id and
// eos_token_id, and add_bos_token / add_eos_token say whether
// Encode(text, true) adds them (default: BOS for "llama" only). Errors are
// *Error naming the key.
func FromGGUF(meta map[string]any) (*Tokenizer, error) {
	errf := func(key, format string, a ...any) error {
		return &Error{File: ggufFile, Field: key, Reason: fmt.Sprintf(format, a...)}
	}
	kind, ok := meta["tokenizer.ggml.model"].(string)
	if !ok {
		return nil, errf("tokenizer.ggml.model", "missing or not a string")
	}
	tokens, ok := meta["tokenizer.ggml.tokens"].([]string)
	if !ok {
		return nil, errf("tokenizer.ggml.tokens", "missing or not an array of strings")
	}
	if len(tokens) == 0 || len(tokens) > MaxVocab {
		return nil, errf("tokenizer.ggml.tokens", "%d tokens, want 1 to %d", len(tokens), MaxVocab)
	}
	types := make([]int, len(tokens))
	for i := range types {
		types[i] = ggufNormal
	}
	if v, ok := meta["tokenizer.ggml.token_type"]; ok {
		tt, ok := intSlice(v)
		if !ok || len(tt) != len(tokens) {
			return nil, errf("tokenizer.ggml.token_type", "want %d integers, one per token", len(tokens))
		}
		types = tt
	}
	t := &Tokenizer{bos: -1, eos: -1, hasDecoder: true}
	t.pieces = slices.Clone(tokens)
	t.has = make([]bool, len(tokens))
	t.special = make([]bool, len(tokens))
	var added []*addedToken
	vocab := make(map[string]int, len(tokens))
	for i, s := range tokens {
		t.has[i] = true
		if _, dup := vocab[s]; !dup {
			vocab[s] = i
		}
		switch types[i] {
		case ggufControl, ggufUserDefined, ggufUnknown: // matched in text, as llama.cpp does
			a := &addedToken{id: i, content: s, pattern: s, special: types[i] != ggufUserDefined}
			t.special[i] = a.special
			t.added = append(t.added, *a)
			added = append(added, a)
		case ggufUnused:
			t.special[i] = true
		}
	}
	t.rawMatch = newMatcher(added)
	t.skip = t.special
	var addBOS bool
	switch kind {
	case "llama":
		m, err := spmFromGGUF(meta, tokens, types, vocab)
		if err != nil {
			return nil, err
		}
		t.model = m
		if b, ok := meta["tokenizer.ggml.add_space_prefix"].(bool); !ok || b {
			t.normalizers = []normalizer{prependNormalizer{"▁"}, replaceNormalizer{" ", "▁"}}
			t.decoders = []decoder{replaceDecoder{"▁", " "}, byteFallbackDecoder{}, fuseDecoder{}, stripDecoder{content: ' ', start: 1}}
		} else {
			t.normalizers = []normalizer{replaceNormalizer{" ", "▁"}}
			t.decoders = []decoder{replaceDecoder{"▁", " "}, byteFallbackDecoder{}, fuseDecoder{}}
		}
		addBOS = true
	case "gpt2":
		m, pre, err := bpeFromGGUF(meta, vocab)
		if err != nil {
			return nil, err
		}
		t.model = m
		t.pre = pre
		t.decoders = []decoder{byteLevelDecoder{}}
	default:
		return nil, errf("tokenizer.ggml.model", "%q is not supported (llama and gpt2 are)", kind)
	}
	for _, k := range []struct {
		key string
		dst *int
	}{{"tokenizer.ggml.bos_token_id", &t.bos}, {"tokenizer.ggml.eos_token_id", &t.eos}} {
		v, ok := meta[k.key]
		if !ok {
			continue
		}
		id, ok := intValue(v)
		if !ok || id < 0 || id >= len(tokens) {
			return nil, errf(k.key, "%v is not a token id (the vocabulary has %d)", v, len(tokens))
		}
		*k.dst = id
	}
	if b, ok := meta["tokenizer.ggml.add_bos_token"].(bool); ok {
		addBOS = b
	}
	if addBOS && t.bos >= 0 {
		t.prefix = []int{t.bos}
	}
	if b, ok := meta["tokenizer.ggml.add_eos_token"].(bool); ok && b && t.eos >= 0 {
		t.suffix = []int{t.eos}
	}
	return t, nil
}

func spmFromGGUF(meta map[string]any, tokens []string, types []int, vocab map[string]int) (*spm, error) {
	scores, ok := meta["tokenizer.ggml.scores"].([]float32)
	if !ok || len(scores) != len(tokens) {
		return nil, &Error{File: ggufFile, Field: "tokenizer.ggml.scores", Reason: fmt.Sprintf("want %d float32 scores, one per token", len(tokens))}
	}
	m := &spm{vocab: vocab, scores: slices.Clone(scores), unk: -1}
	for i, s := range scores {
		if math.IsNaN(float64(s)) {
			return nil, &Error{File: ggufFile, Field: "tokenizer.ggml.scores", Reason: fmt.Sprintf("score %d is NaN", i)}
		}
	}
	for b := range m.byteIDs {
		m.byteIDs[b] = -1
		if id, ok := vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteIDs[b] = id
		} else if id, ok := vocab[string([]byte{byte(b)})]; ok {
			m.byteIDs[b] = id
		}
	}
	if v, ok := meta["tokenizer.ggml.unknown_token_id"]; ok {
		if id, ok := intValue(v); ok && id >= 0 && id < len(tokens) {
			m.unk = id
		}
	} else {
		for i, ty := range types {
			if ty == ggufUnknown {
				m.unk = i
				break
			}
		}
	}
	return m, nil
}

func bpeFromGGUF(meta map[string]any, vocab map[string]int) (*bpe, []preTokenizer, error) {
	merges, ok := meta["tokenizer.ggml.merges"].([]string)
	if !ok {
		return nil, nil, &Error{File: ggufFile, Field: "tokenizer.ggml.merges", Reason: "missing or not an array of strings"}
	}
	m := &bpe{vocab: vocab, unk: -1, merges: make(map[uint64]merge, len(merges))}
	for b := range m.byteIDs {
		m.byteIDs[b] = -1
	}
	for rank, s := range merges {
		a, b, ok := strings.Cut(s, " ")
		ia, ok1 := vocab[a]
		ib, ok2 := vocab[b]
		id, ok3 := vocab[a+b]
		if !ok || !ok1 || !ok2 || !ok3 {
			return nil, nil, &Error{File: ggufFile, Field: fmt.Sprintf("tokenizer.ggml.merges[%d]", rank),
				Reason: fmt.Sprintf("%q is not two tokens whose concatenation is a token", s)}
		}
		m.merges[pairKey(ia, ib)] = merge{rank: int32(rank), id: int32(id)}
	}
	pre, _ := meta["tokenizer.ggml.pre"].(string)
	switch pre {
	case "", "default", "gpt2", "gpt-2":
		return m, []preTokenizer{byteLevel{useRegex: true}}, nil
	case "llama3", "llama-v3", "llama-bpe":
		m.ignoreMerges = true
		p, _ := knownPattern(llama3Pattern)
		return m, []preTokenizer{splitPre{pattern: p, behavior: splitIsolated}, byteLevel{}}, nil
	case "qwen2":
		p, _ := knownPattern(qwen2Pattern)
		return m, []preTokenizer{splitPre{pattern: p, behavior: splitIsolated}, byteLevel{}}, nil
	}
	return nil, nil, &Error{File: ggufFile, Field: "tokenizer.ggml.pre", Reason: fmt.Sprintf("%q is not supported (default, gpt2, llama-bpe, qwen2 are)", pre)}
}

// intValue reads any GGUF integer type.
func intValue(v any) (int, bool) {
	switch x := v.(type) {
	case uint8:
		return int(x), true
	case int8:
		return int(x), true
	case uint16:
		return int(x), true
	case int16:
		return int(x), true
	case uint32:
		return int(x), true
	case int32:
		return int(x), true
	case uint64:
		if x > math.MaxInt32 {
			return 0, false
		}
		return int(x), true
	case int64:
		if x > math.MaxInt32 || x < math.MinInt32 {
			return 0, false
		}
		return int(x), true
	case int:
		return x, true
	}
	return 0, false
}

// intSlice reads any GGUF integer array.
func intSlice(v any) ([]int, bool) {
	conv := func(n int, at func(i int) int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = at(i)
		}
		return out
	}
	switch x := v.(type) {
	case []int32:
		return conv(len(x), func(i int) int { return int(x[i]) }), true
	case []uint32:
		return conv(len(x), func(i int) int { return int(x[i]) }), true
	case []int8:
		return conv(len(x), func(i int) int { return int(x[i]) }), true
	case []uint8:
		return conv(len(x), func(i int) int { return int(x[i]) }), true
	case []int16:
		return conv(len(x), func(i int) int { return int(x[i]) }), true
	case []uint16:
		return conv(len(x), func(i int) int { return int(x[i]) }), true
	case []int64:
		return conv(len(x), func(i int) int { return int(x[i]) }), true
	case []uint64:
		return conv(len(x), func(i int) int { return int(x[i]) }), true
	case []int:
		return x, true
	}
	return nil, false
}
