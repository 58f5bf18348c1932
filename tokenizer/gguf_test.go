package tokenizer

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/memwall/memwall/format/gguf"
)

// ggufOf writes a tokenizer.json-built tokenizer's vocabulary as GGUF
// metadata: tokens in id order, token types, and merges ("gpt2") or scores
// ("llama": a merged token scores minus its merge rank, so merging by score
// is merging by rank).
func ggufOf(t *Tokenizer, kind string) map[string]any {
	b := t.model.(*bpe)
	tokens := slices.Clone(t.pieces)
	types := make([]int32, len(tokens))
	scores := make([]float32, len(tokens))
	for i := range tokens {
		types[i] = ggufNormal
		if _, ok := byteToken(tokens[i]); ok {
			types[i] = ggufByte
		}
		scores[i] = -1e6
	}
	for _, a := range t.added {
		types[a.id] = ggufControl
	}
	merges := make([]string, len(b.merges))
	for k, m := range b.merges {
		merges[m.rank] = t.pieces[int(k>>32)] + " " + t.pieces[int(uint32(k))]
		scores[m.id] = -float32(m.rank)
	}
	meta := map[string]any{
		"tokenizer.ggml.model":      kind,
		"tokenizer.ggml.tokens":     tokens,
		"tokenizer.ggml.token_type": types,
	}
	if bos, ok := t.BOS(); ok {
		meta["tokenizer.ggml.bos_token_id"] = uint32(bos)
	}
	if eos, ok := t.EOS(); ok {
		meta["tokenizer.ggml.eos_token_id"] = uint32(eos)
	}
	if kind == "gpt2" {
		meta["tokenizer.ggml.merges"] = merges
		meta["tokenizer.ggml.add_bos_token"] = false
	} else {
		meta["tokenizer.ggml.scores"] = scores
		meta["tokenizer.ggml.add_bos_token"] = true
	}
	return meta
}

// viaFile round-trips metadata through a GGUF header, as FromGGUF sees a
// real file's.
func viaFile(t testing.TB, meta map[string]any) map[string]any {
	t.Helper()
	var kvs []gguf.KV
	for k, v := range meta {
		kvs = append(kvs, gguf.KV{Key: k, Value: v})
	}
	slices.SortFunc(kvs, func(a, b gguf.KV) int { return strings.Compare(a.Key, b.Key) })
	hdr, _, err := gguf.Layout(kvs, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse("t.gguf", hdr)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	for _, kv := range f.Metadata {
		out[kv.Key] = kv.Value
	}
	return out
}

func TestGGUFMatchesJSON(t *testing.T) {
	bl := mustParse(t, gpt2Spec("h e", "l l", "Ġ w", "o r", "he ll", "hell o", "a a", "Ġ a", "Ġ Ġ"))
	sp := mustParse(t, llama2Spec([]string{"▁", "h", "e", "l", "o", "w", "r", "d", "a", "b"},
		"▁ h", "e l", "▁h el", "l o", "▁hel lo", "▁ w", "o r", "▁w or", "a a", "▁ a"))
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		json *Tokenizer
		kind string
	}{{bl, "gpt2"}, {sp, "llama"}} {
		g, err := FromGGUF(viaFile(t, ggufOf(c.json, c.kind)))
		if err != nil {
			t.Fatal(err)
		}
		if g.VocabSize() != c.json.VocabSize() {
			t.Errorf("%s: vocab %d, json %d", c.kind, g.VocabSize(), c.json.VocabSize())
		}
		for i := 0; i < 2000; i++ {
			s := randomText(r, r.IntN(16))
			if c.kind == "llama" {
				s = strings.Map(func(r rune) rune { // the letters the vocabulary merges
					return rune("helowrdab "[int(r)%10])
				}, s)
			}
			want, got := c.json.Encode(s, true), g.Encode(s, true)
			if !slices.Equal(got, want) {
				t.Fatalf("%s %q: gguf %v, json %v", c.kind, s, got, want)
			}
			if d, w := g.Decode(got, true), c.json.Decode(want, true); d != w {
				t.Fatalf("%s %q: gguf decodes %q, json %q", c.kind, s, d, w)
			}
		}
	}
}

func TestSPMByScore(t *testing.T) {
	// "ab" outscores "bc": abc → ab c; with "bc" higher, a bc.
	for _, c := range []struct {
		abScore, bcScore float32
		want             []string
	}{
		{-1, -2, []string{"▁", "ab", "c"}},
		{-2, -1, []string{"▁", "a", "bc"}},
		{-1, -1, []string{"▁", "ab", "c"}}, // a tie goes to the left pair
	} {
		tokens := []string{"<unk>", "<s>", "</s>", "▁", "a", "b", "c", "ab", "bc", "<0x41>"}
		scores := []float32{0, 0, 0, -9, -9, -9, -9, c.abScore, c.bcScore, 0}
		types := []int32{2, 3, 3, 1, 1, 1, 1, 1, 1, 6}
		tok, err := FromGGUF(map[string]any{"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
			"tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
			"tokenizer.ggml.bos_token_id": uint32(1), "tokenizer.ggml.eos_token_id": uint32(2)})
		if err != nil {
			t.Fatal(err)
		}
		var want []int
		for _, w := range c.want {
			want = append(want, slices.Index(tokens, w))
		}
		if got := tok.Encode("abc", false); !slices.Equal(got, want) {
			t.Errorf("scores ab %v bc %v: %v, want %v", c.abScore, c.bcScore, got, want)
		}
		// A is in the vocabulary only as a byte; d not at all: unknown.
		if got := tok.Encode("Ad", true); !slices.Equal(got, []int{1, 3, 9, 0}) {
			t.Errorf("byte fallback and unknown: %v", got)
		}
		if got := tok.Decode([]int{1, 3, 9, 7}, true); got != "Aab" {
			t.Errorf("decode: %q", got)
		}
	}
}

func TestGGUFErrors(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": []string{"a", "b"},
			"tokenizer.ggml.scores": []float32{0, 0}, "tokenizer.ggml.token_type": []int32{1, 1}}
	}
	for _, c := range []struct {
		key string
		val any // nil: delete
	}{
		{"tokenizer.ggml.model", nil},
		{"tokenizer.ggml.model", "bert"},
		{"tokenizer.ggml.tokens", []uint32{1}},
		{"tokenizer.ggml.tokens", []string{}},
		{"tokenizer.ggml.scores", []float32{0}},
		{"tokenizer.ggml.token_type", []float32{1, 1}},
		{"tokenizer.ggml.bos_token_id", uint32(7)},
		{"tokenizer.ggml.eos_token_id", "x"},
	} {
		m := base()
		if c.val == nil {
			delete(m, c.key)
		} else {
			m[c.key] = c.val
		}
		_, err := FromGGUF(m)
		var e *Error
		if !errors.As(err, &e) || e.Field != c.key {
			t.Errorf("%s = %v: error %v, want one naming the key", c.key, c.val, err)
		}
	}
	m := base()
	m["tokenizer.ggml.model"] = "gpt2"
	m["tokenizer.ggml.merges"] = []string{"a c"}
	if _, err := FromGGUF(m); err == nil || !strings.Contains(err.Error(), "tokenizer.ggml.merges[0]") {
		t.Errorf("bad merge: %v", err)
	}
	m["tokenizer.ggml.merges"] = []string{}
	m["tokenizer.ggml.pre"] = "falcon"
	if _, err := FromGGUF(m); err == nil || !strings.Contains(err.Error(), "tokenizer.ggml.pre") {
		t.Errorf("unknown pre: %v", err)
	}
}
