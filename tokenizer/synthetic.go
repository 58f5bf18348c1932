package tokenizer

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// synthCorpus is the text Synthetic trains on: plain English about what the
// project does, digits and punctuation.
const synthCorpus = `The model runs on the device when its weights fit, and streams them from the host when they do not.
Every byte of device memory comes from a pool, and every tensor has its place in a plan made before the first step.
A decoder reads the prompt, then generates one token at a time: the keys and values of earlier tokens wait in the cache.
Memory is the wall: a seven billion parameter model holds fourteen gigabytes of weights in sixteen bits.
We measure the link, the allocator and the kernels, and we say what each one costs, in bytes and in seconds.
Is it fast? It is as fast as the copies allow, and no faster: 9 tokens per second at 8 GiB, 512 tokens of context.
Hello, world! What time is it? It's 10:05, and the run takes 3.2 seconds (about 4,096 tokens).
the of and to in is was he for it with as his on be at by had are but from or have an they which one you were
all we her she there would their will when who him been has more if no out do so can what up said about other
0 1 2 3 4 5 6 7 8 9 10 100 1000 2026 3.14 42 64 128 256 512 1024 2048 4096 8192 - + * / = < > ( ) [ ] { } . , ; : ! ? ' "`

// Synthetic returns a Llama-2-style tokenizer.json with exactly vocab
// tokens: <unk> <s> </s> (ids 0, 1, 2), the 256 byte tokens <0x00>..<0xFF>,
// "▁", the printable ASCII characters, then BPE merges learned from a small
// built-in English text until the vocabulary is full (the rest, when the
// text runs out of merges, are <unused_N> tokens no text encodes to). It
// has the normalizer, decoder and BOS post-processor of Llama-2's file, so
// any text round-trips. For models made up for tests: the ids mean nothing
// to a trained model. vocab must be at least 400.
func Synthetic(vocab int) ([]byte, error) {
	if vocab < 400 || vocab > MaxVocab {
		return nil, fmt.Errorf("tokenizer: synthetic vocabulary of %d tokens: want 400 to %d", vocab, MaxVocab)
	}
	tokens := []string{"<unk>", "<s>", "</s>"}
	for b := 0; b < 256; b++ {
		tokens = append(tokens, fmt.Sprintf("<0x%02X>", b))
	}
	tokens = append(tokens, "▁")
	for c := byte('!'); c <= '~'; c++ {
		tokens = append(tokens, string(c))
	}
	have := map[string]bool{}
	for _, t := range tokens {
		have[t] = true
	}
	merges := trainMerges(synthCorpus, vocab-len(tokens), have)
	for _, m := range merges {
		tokens = append(tokens, m[0]+m[1])
	}
	for i := 0; len(tokens) < vocab; i++ {
		tokens = append(tokens, fmt.Sprintf("<unused_%d>", i))
	}
	v := make(map[string]int, len(tokens))
	for i, t := range tokens {
		v[t] = i
	}
	added := make([]map[string]any, 3)
	for i := range added {
		added[i] = map[string]any{"id": i, "content": tokens[i], "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true}
	}
	f := map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": added,
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"}}},
		"pre_tokenizer": nil,
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
				map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 1}},
				map[string]any{"Sequence": map[string]any{"id": "B", "type_id": 1}}},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}}}},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0}}},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": "<unk>", "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
			"vocab": v, "merges": merges},
	}
	return json.MarshalIndent(f, "", " ")
}

// trainMerges learns up to n BPE merges on text split into words (each
// beginning with ▁, as the normalizer writes them): the most frequent pair
// of neighbours first, the smaller pair on a tie, never making a token
// already in have.
func trainMerges(text string, n int, have map[string]bool) [][2]string {
	counts := map[string]int{}
	for _, w := range strings.Fields(text) {
		counts["▁"+w]++
	}
	type word struct {
		syms  []string
		count int
	}
	var words []word
	for _, w := range slices.Sorted(maps.Keys(counts)) {
		var syms []string
		for _, r := range w {
			syms = append(syms, string(r))
		}
		words = append(words, word{syms, counts[w]})
	}
	var merges [][2]string
	for len(merges) < n {
		pairs := map[[2]string]int{}
		for _, w := range words {
			for i := 0; i+1 < len(w.syms); i++ {
				pairs[[2]string{w.syms[i], w.syms[i+1]}] += w.count
			}
		}
		var best [2]string
		bestN := 0
		for p, c := range pairs {
			if have[p[0]+p[1]] {
				continue
			}
			if c > bestN || c == bestN && (p[0] < best[0] || p[0] == best[0] && p[1] < best[1]) {
				best, bestN = p, c
			}
		}
		if bestN == 0 {
			break
		}
		merges = append(merges, best)
		have[best[0]+best[1]] = true
		for wi := range words {
			s := words[wi].syms
			out := s[:0]
			for i := 0; i < len(s); i++ {
				if i+1 < len(s) && s[i] == best[0] && s[i+1] == best[1] {
					out = append(out, best[0]+best[1])
					i++
					continue
				}
				out = append(out, s[i])
			}
			words[wi].syms = out
		}
	}
	return merges
}

// GGUFMetadata returns the tokenizer.ggml.* keys a GGUF file needs to hold
// this vocabulary, so that FromGGUF of them encodes as t does: for
// SentencePiece-style BPE (byte fallback, Llama-2's normalizer) model
// "llama" with scores from the merge ranks, for byte-level BPE on the GPT-2
// or Llama-3 split model "gpt2" with its merges. Other pipelines are an
// error.
func (t *Tokenizer) GGUFMetadata() (map[string]any, error) {
	b, ok := t.model.(*bpe)
	if !ok {
		return nil, fmt.Errorf("tokenizer: GGUF metadata: not a BPE model")
	}
	kind, pre := "", ""
	switch {
	case b.byteFallback && len(t.pre) == 0 && isLlama2Normalizer(t.normalizers):
		kind = "llama"
	case len(t.pre) == 1 && isByteLevel(t.pre[0], true):
		kind, pre = "gpt2", "gpt2"
	case len(t.pre) == 2 && isSplit(t.pre[0], "llama3") && isByteLevel(t.pre[1], false):
		kind, pre = "gpt2", "llama-bpe"
	default:
		return nil, fmt.Errorf("tokenizer: GGUF metadata: only Llama-2, GPT-2 and Llama-3 style pipelines have a GGUF form")
	}
	tokens := slices.Clone(t.pieces)
	types := make([]int32, len(tokens))
	scores := make([]float32, len(tokens))
	for i := range tokens {
		types[i] = ggufNormal
		if !t.has[i] {
			types[i] = ggufUnused
		} else if _, isByte := byteToken(tokens[i]); isByte && kind == "llama" {
			types[i] = ggufByte
		}
		scores[i] = -1e6
	}
	for _, a := range t.added {
		types[a.id] = ggufUserDefined
		if a.special {
			types[a.id] = ggufControl
		}
	}
	if b.unk >= 0 && kind == "llama" {
		types[b.unk] = ggufUnknown
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
	if kind == "llama" {
		meta["tokenizer.ggml.scores"] = scores
	} else {
		meta["tokenizer.ggml.merges"] = merges
		meta["tokenizer.ggml.pre"] = pre
	}
	if bos, ok := t.BOS(); ok {
		meta["tokenizer.ggml.bos_token_id"] = uint32(bos)
	}
	if eos, ok := t.EOS(); ok {
		meta["tokenizer.ggml.eos_token_id"] = uint32(eos)
	}
	meta["tokenizer.ggml.add_bos_token"] = len(t.prefix) > 0
	return meta, nil
}

func isByteLevel(p preTokenizer, regex bool) bool {
	b, ok := p.(byteLevel)
	return ok && b.useRegex == regex && !b.addPrefixSpace
}

func isSplit(p preTokenizer, pattern string) bool {
	s, ok := p.(splitPre)
	return ok && s.pattern.name == pattern && s.behavior == splitIsolated && !s.invert
}

func isLlama2Normalizer(ns []normalizer) bool {
	if len(ns) != 2 {
		return false
	}
	p, ok1 := ns[0].(prependNormalizer)
	r, ok2 := ns[1].(replaceNormalizer)
	return ok1 && ok2 && p.prefix == "▁" && r.old == " " && r.new == "▁"
}
