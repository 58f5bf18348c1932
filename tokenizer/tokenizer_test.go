package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// spec is a tokenizer.json written by hand, as the HF format documents it.
type spec struct {
	vocab   []string    // ids in order
	merges  [][2]string // rank order
	added   []map[string]any
	extra   map[string]any // top-level fields (normalizer, pre_tokenizer, ...)
	model   map[string]any // extra model fields
	strings bool           // merges as "a b" strings (older files)
}

func (s spec) json() []byte {
	vocab := map[string]int{}
	for i, v := range s.vocab {
		vocab[v] = i
	}
	var merges any
	if s.strings {
		var l []string
		for _, m := range s.merges {
			l = append(l, m[0]+" "+m[1])
		}
		merges = l
	} else {
		merges = s.merges
	}
	model := map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
		"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": merges}
	for k, v := range s.model {
		model[k] = v
	}
	f := map[string]any{"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": s.added,
		"normalizer": nil, "pre_tokenizer": nil, "post_processor": nil, "decoder": nil, "model": model}
	for k, v := range s.extra {
		f[k] = v
	}
	b, err := json.Marshal(f)
	if err != nil {
		panic(err)
	}
	return b
}

// with is the spec's JSON with one top-level field replaced by raw JSON.
func (s spec) with(field, raw string) string {
	var f map[string]json.RawMessage
	if err := json.Unmarshal(s.json(), &f); err != nil {
		panic(err)
	}
	f[field] = json.RawMessage(raw)
	b, err := json.Marshal(f)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func mustParse(t testing.TB, s spec) *Tokenizer {
	t.Helper()
	tok, err := Parse("test.json", s.json())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func byteLevelJSON(prefix bool) map[string]any {
	return map[string]any{"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true, "use_regex": true}
}

// gpt2Spec is a byte-level BPE: the 256 byte runes, then merges.
func gpt2Spec(merges ...string) spec {
	var s spec
	for b := 0; b < 256; b++ {
		s.vocab = append(s.vocab, alphabet.toStr[b])
	}
	for _, m := range merges {
		a, b, _ := strings.Cut(m, " ")
		s.merges = append(s.merges, [2]string{a, b})
		if !slices.Contains(s.vocab, a+b) {
			s.vocab = append(s.vocab, a+b)
		}
	}
	s.vocab = append(s.vocab, "<|endoftext|>")
	s.added = []map[string]any{{"id": len(s.vocab) - 1, "content": "<|endoftext|>", "single_word": false,
		"lstrip": false, "rstrip": false, "normalized": false, "special": true}}
	s.extra = map[string]any{"pre_tokenizer": byteLevelJSON(false), "decoder": byteLevelJSON(true),
		"post_processor": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true}}
	return s
}

func (t *Tokenizer) idsOf(tokens ...string) []int {
	var out []int
	for _, s := range tokens {
		id := t.lookup(s)
		if id < 0 {
			panic("no token " + s)
		}
		out = append(out, id)
	}
	return out
}

func TestByteLevelBPE(t *testing.T) {
	for _, strs := range []bool{false, true} {
		s := gpt2Spec("h e", "l l", "Ġ w", "o r", "he ll", "hell o", "a a", "Ġ a")
		s.strings = strs
		tok := mustParse(t, s)
		for _, c := range []struct {
			text string
			want []string
		}{
			{"hello world", []string{"hello", "Ġw", "or", "l", "d"}},
			{"aaa", []string{"aa", "a"}},
			{"aaaa", []string{"aa", "aa"}},
			{" aaa", []string{"Ġ", "aa", "a"}}, // "a a" ranks before "Ġ a"
			{"hello<|endoftext|>hello", []string{"hello", "<|endoftext|>", "hello"}},
			{"\n", []string{"Ċ"}},
			{"é", []string{"Ã", "©"}},
			{"", nil},
		} {
			got := tok.Encode(c.text, true)
			if want := tok.idsOf(c.want...); !slices.Equal(got, want) {
				t.Errorf("merges as strings %v: Encode(%q) = %v, want %v %q", strs, c.text, got, want, c.want)
			}
			if d := tok.Decode(got, false); d != c.text {
				t.Errorf("Decode(Encode(%q)) = %q", c.text, d)
			}
		}
		if _, ok := tok.BOS(); ok {
			t.Errorf("GPT-2 style has a BOS")
		}
		if id, ok := tok.EOS(); !ok || id != tok.VocabSize()-1 {
			t.Errorf("EOS = %d %v, want <|endoftext|>", id, ok)
		}
		if got := tok.Decode(tok.Encode("hi<|endoftext|>", false), true); got != "hi" {
			t.Errorf("skipping special: %q", got)
		}
	}
}

func TestIgnoreMerges(t *testing.T) {
	s := gpt2Spec("h e", "l l")
	s.vocab = append(s.vocab, "Ġhello") // a token no merge makes
	with := s
	with.model = map[string]any{"ignore_merges": true}
	a, b := mustParse(t, s), mustParse(t, with)
	if got, want := a.Encode(" hello", false), a.idsOf("Ġ", "he", "ll", "o"); !slices.Equal(got, want) {
		t.Errorf("without ignore_merges: %v, want %v", got, want)
	}
	if got, want := b.Encode(" hello", false), b.idsOf("Ġhello"); !slices.Equal(got, want) {
		t.Errorf("ignore_merges: %v, want %v", got, want)
	}
}

// llama2Spec is SentencePiece-style BPE with byte fallback and Llama-2's
// pipeline.
func llama2Spec(pieces []string, merges ...string) spec {
	s := spec{vocab: []string{"<unk>", "<s>", "</s>"}}
	for b := 0; b < 256; b++ {
		s.vocab = append(s.vocab, fmt.Sprintf("<0x%02X>", b))
	}
	s.vocab = append(s.vocab, pieces...)
	for _, m := range merges {
		a, b, _ := strings.Cut(m, " ")
		s.merges = append(s.merges, [2]string{a, b})
		if !slices.Contains(s.vocab, a+b) {
			s.vocab = append(s.vocab, a+b)
		}
	}
	for i, c := range []string{"<unk>", "<s>", "</s>"} {
		s.added = append(s.added, map[string]any{"id": i, "content": c, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true})
	}
	s.model = map[string]any{"unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true}
	s.extra = map[string]any{
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"}}},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0}}},
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":           []any{},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}}}},
	}
	return s
}

func TestSentencePieceBPE(t *testing.T) {
	tok := mustParse(t, llama2Spec([]string{"▁", "h", "e", "l", "o", "w", "r", "d", "a", "b"},
		"▁ h", "e l", "▁h el", "l o", "▁hel lo", "▁ w", "o r", "▁w or"))
	for _, c := range []struct {
		text  string
		want  []string
		plain string // Decode(Encode(text, false)), when not text
	}{
		{"hello world", []string{"<s>", "▁hello", "▁wor", "l", "d"}, ""},
		{"é", []string{"<s>", "▁", "<0xC3>", "<0xA9>"}, ""},
		{"a<s>b", []string{"<s>", "▁", "a", "<s>", "▁", "b"}, "a<s> b"},
		{" a", []string{"<s>", "▁", "▁", "a"}, ""},
		{"", []string{"<s>"}, ""},
		{"<0x41>", []string{"<s>", "▁", "<0x3C>", "<0x30>", "<0x78>", "<0x34>", "<0x31>", "<0x3E>"}, ""},
	} {
		got := tok.Encode(c.text, true)
		if want := tok.idsOf(c.want...); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v %q", c.text, got, want, c.want)
		}
		want := c.plain
		if want == "" {
			want = c.text
		}
		if d := tok.Decode(got[1:], false); d != want {
			t.Errorf("Decode(Encode(%q)) = %q, want %q", c.text, d, want)
		}
	}
	if id, ok := tok.BOS(); !ok || id != 1 {
		t.Errorf("BOS = %d %v", id, ok)
	}
	if id, ok := tok.EOS(); !ok || id != 2 {
		t.Errorf("EOS = %d %v", id, ok)
	}
	// Byte pieces that are not UTF-8 decode as one U+FFFD each.
	if got := tok.Decode(tok.idsOf("<0xE2>", "<0x82>", "a"), false); got != "\uFFFD\uFFFDa" {
		t.Errorf("bad bytes: %q", got)
	}
}

func TestLossyUTF8(t *testing.T) {
	// As Rust's String::from_utf8_lossy (the maximal-subpart rule).
	for _, c := range []struct{ in, want string }{
		{"abc", "abc"},
		{"\xe2\x82A", "\uFFFDA"},
		{"\xe2\x82\xac", "€"},
		{"\xff\xfe", "\uFFFD\uFFFD"},
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // a surrogate: ED then A0 is out of range
		{"\xf0\x9f\x98", "\uFFFD"},
		{"\xf0\x9f\x98\x80\xf0", "😀\uFFFD"},
		{"\xc0\xaf", "\uFFFD\uFFFD"},
		{"\xe0\x80\x80", "\uFFFD\uFFFD\uFFFD"},
		{"\xf4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
	} {
		if got := lossyUTF8([]byte(c.in)); got != c.want {
			t.Errorf("lossyUTF8(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestMetaspace(t *testing.T) {
	s := llama2Spec([]string{"▁", "h", "i"}, "▁ h", "▁h i")
	delete(s.extra, "normalizer")
	s.extra["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false}
	s.extra["decoder"] = map[string]any{"type": "Sequence", "decoders": []any{
		map[string]any{"type": "ByteFallback"},
		map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false}}}
	tok := mustParse(t, s)
	for _, c := range []struct {
		text string
		want []string
	}{
		{"hi", []string{"▁hi"}},
		{" hi", []string{"▁hi"}},                      // already starts with ▁: no second one
		{"hi<s>hi", []string{"▁hi", "<s>", "h", "i"}}, // "first": only at the start of the input
		{"hi hi", []string{"▁hi", "▁hi"}},
	} {
		if got, want := tok.Encode(c.text, false), tok.idsOf(c.want...); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v %q", c.text, got, want, c.want)
		}
	}
	if got := tok.Decode(tok.Encode("hi hi", false), false); got != "hi hi" {
		t.Errorf("decode: %q", got)
	}
}

func TestAddedTokenOptions(t *testing.T) {
	s := gpt2Spec()
	n := len(s.vocab)
	s.vocab = append(s.vocab, "<L>", "<R>", "<W>", "<long>", "<lo")
	s.added = append(s.added,
		map[string]any{"id": n, "content": "<L>", "lstrip": true, "special": true, "normalized": false},
		map[string]any{"id": n + 1, "content": "<R>", "rstrip": true, "special": true, "normalized": false},
		map[string]any{"id": n + 2, "content": "<W>", "single_word": true, "special": true, "normalized": false},
		map[string]any{"id": n + 3, "content": "<long>", "special": false, "normalized": true},
		map[string]any{"id": n + 4, "content": "<lo", "special": false, "normalized": true})
	tok := mustParse(t, s)
	for _, c := range []struct {
		text string
		want []string
	}{
		{"a  <L>b", []string{"a", "<L>", "b"}},
		{"a<R>  b", []string{"a", "<R>", "b"}},
		{"a <W> b", []string{"a", "Ġ", "<W>", "Ġ", "b"}},
		{"a<W>b", []string{"a", "<", "W", ">", "b"}},
		{"<long><lo", []string{"<long>", "<lo"}}, // longest match first
	} {
		if got, want := tok.Encode(c.text, false), tok.idsOf(c.want...); !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, want %v %q", c.text, got, want, c.want)
		}
	}
	if tok.IsSpecial(n+3) || !tok.IsSpecial(n) {
		t.Errorf("special flags wrong")
	}
}

func TestLoadErrors(t *testing.T) {
	good := gpt2Spec("h e")
	for _, c := range []struct {
		name  string
		json  string
		field string
	}{
		{"not json", `{"model": `, ""},
		{"no model", `{"added_tokens": []}`, "model"},
		{"unigram", `{"model": {"type": "Unigram", "vocab": []}}`, "model.type"},
		{"bad merge", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}`, "model.merges[0]"},
		{"bad merge form", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [1]}}`, "model.merges"},
		{"negative id", `{"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}}`, "model.vocab"},
		{"huge id", `{"model": {"type": "BPE", "vocab": {"a": 99999999}, "merges": []}}`, "model.vocab"},
		{"vocab type", `{"model": {"type": "BPE", "vocab": ["a"], "merges": []}}`, "model.vocab"},
		{"pattern", good.with("pre_tokenizer", `{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\w+"},"behavior":"Isolated"}]}`), "pre_tokenizer.pretokenizers[0]"},
		{"behavior", good.with("pre_tokenizer", `{"type":"Split","pattern":{"String":"x"},"behavior":"Sideways"}`), "pre_tokenizer"},
		{"normalizer", good.with("normalizer", `{"type":"NFKC"}`), "normalizer"},
		{"template", good.with("post_processor", `{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<x>"}},{"Sequence":{"id":"A"}}],"special_tokens":{}}`), "post_processor"},
		{"template id", good.with("post_processor", `{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<x>"}},{"Sequence":{"id":"A"}}],"special_tokens":{"<x>":{"ids":[999999]}}}`), "post_processor"},
		{"decoder", good.with("decoder", `{"type":"WordPiece"}`), "decoder"},
		{"strip", good.with("decoder", `{"type":"Strip","content":"ab","start":1,"stop":0}`), "decoder"},
		{"added id", good.with("added_tokens", `[{"content":"x"}]`), "added_tokens[0].id"},
		{"dropout", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "dropout": 0.1}}`, "model.dropout"},
	} {
		_, err := Parse("x.json", []byte(c.json))
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: error %v, want *Error", c.name, err)
			continue
		}
		if e.File != "x.json" || e.Field != c.field {
			t.Errorf("%s: %v: file %q field %q, want field %q", c.name, err, e.File, e.Field, c.field)
		}
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Errorf("Load of a missing file: no error")
	}
}

func TestTokenizerConfig(t *testing.T) {
	dir := t.TempDir()
	s := gpt2Spec("h e")
	n := len(s.vocab)
	s.vocab = append(s.vocab, "<|eot_id|>")
	s.added = append(s.added, map[string]any{"id": n, "content": "<|eot_id|>", "special": true})
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), s.json(), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := `{"bos_token": "<|endoftext|>", "eos_token": {"content": "<|eot_id|>"}}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := tok.EOS(); id != n {
		t.Errorf("EOS %d, want %d", id, n)
	}
	if id, _ := tok.BOS(); id != n-1 {
		t.Errorf("BOS %d, want %d", id, n-1)
	}
	os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token": "<nope>"}`), 0o644)
	if _, err := Load(filepath.Join(dir, "tokenizer.json")); err == nil || !strings.Contains(err.Error(), "eos_token") {
		t.Errorf("unknown eos_token: %v", err)
	}
}

// randomText draws text from the mix the HF comparison uses: ASCII, other
// scripts, emoji with ZWJ, whitespace runs, digits, bad bytes.
func randomText(r *rand.Rand, n int) string {
	alpha := []string{"a", "Z", "e", " ", "  ", "\t", "\n", "\r\n", "'", "'s", "'LL", "0", "42", "1234", ".", "!",
		"é", "e\u0301", "字", "日本", "한", "Ж", "λ", "ش", "ह", "्", "ก", "😀", "👨\u200d👩\u200d👧", "🇯🇵",
		"\u00a0", "\u3000", "\u2028", "▁", "<s>", "<|endoftext|>", "Ġ", "²", "٣", "ſ"}
	var sb strings.Builder
	for i := 0; i < n; i++ {
		sb.WriteString(alpha[r.IntN(len(alpha))])
	}
	return sb.String()
}

// TestRoundTrip checks Decode(Encode(s)) == s over random text: exactly for
// byte-level BPE, and for SentencePiece once the normalizer's ▁ rules are
// accounted for (spaces come back as spaces, the one leading space it adds
// is stripped).
func TestRoundTrip(t *testing.T) {
	bl := mustParse(t, gpt2Spec("h e", "Ġ a", "a a", "Ġ Ġ", "Ċ Ċ"))
	sp := mustParse(t, llama2Spec([]string{"▁", "a", "e", "Z"}, "▁ a", "a a", "▁ ▁"))
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 3000; i++ {
		s := randomText(r, r.IntN(20))
		if got := bl.Decode(bl.Encode(s, true), false); got != s {
			t.Fatalf("byte-level: Decode(Encode(%q)) = %q", s, got)
		}
		if strings.Contains(s, "<s>") {
			continue // text after a special token gets its own ▁
		}
		want := strings.ReplaceAll(s, "▁", " ")
		if got := sp.Decode(sp.Encode(s, true), true); got != want {
			t.Fatalf("sentencepiece: Decode(Encode(%q)) = %q, want %q", s, got, want)
		}
	}
	if !utf8.ValidString(bl.Decode([]int{0xE2 - 0x21}, false)) {
		t.Errorf("decode of a lone byte is not valid UTF-8")
	}
}

func TestStreamDecoder(t *testing.T) {
	bl := mustParse(t, gpt2Spec("h e", "Ġ a", "a a"))
	sp := mustParse(t, llama2Spec([]string{"▁", "a", "e"}, "▁ a", "a a"))
	r := rand.New(rand.NewPCG(3, 4))
	for _, tok := range []*Tokenizer{bl, sp} {
		for i := 0; i < 2000; i++ {
			var ids []int
			if i%2 == 0 {
				ids = tok.Encode(randomText(r, r.IntN(12)), i%4 == 0)
			} else {
				for k := r.IntN(12); k > 0; k-- {
					ids = append(ids, r.IntN(tok.VocabSize()+2)-1)
				}
			}
			d := tok.NewDecoder()
			var sb strings.Builder
			for _, id := range ids {
				piece := d.Add(id)
				if strings.HasSuffix(piece, "\uFFFD") && !strings.HasSuffix(tok.Decode(ids, true), "\uFFFD") {
					// held-back bytes must not come out early as U+FFFD
					t.Fatalf("ids %v: piece %q ends with U+FFFD", ids, piece)
				}
				sb.WriteString(piece)
			}
			sb.WriteString(d.Flush())
			want := tok.Decode(ids, true)
			if strings.Contains(want, "\uFFFD") {
				// ByteFallback turns a whole run of bytes into U+FFFDs when any
				// of it is bad, so text already handed out can differ.
				if !utf8.ValidString(sb.String()) {
					t.Fatalf("ids %v: stream gave invalid UTF-8 %q", ids, sb.String())
				}
				continue
			}
			if sb.String() != want {
				t.Fatalf("ids %v: stream gave %q, Decode %q", ids, sb.String(), want)
			}
		}
	}
	// A three-byte character over three byte tokens comes out once, whole.
	d := sp.NewDecoder()
	var got []string
	for _, id := range sp.idsOf("▁a", "<0xE2>", "<0x82>", "<0xAC>", "a") {
		got = append(got, d.Add(id))
	}
	if want := []string{"a", "", "", "€", "a"}; !slices.Equal(got, want) {
		t.Errorf("stream pieces %q, want %q", got, want)
	}
}

// A normalized added token is looked for as the normalizer writes it: with
// Llama-2's, "<x>" only where a space (▁) comes before it.
func TestNormalizedAddedToken(t *testing.T) {
	s := llama2Spec([]string{"▁", "a", "b", "<", "x", ">"})
	n := len(s.vocab)
	s.added = append(s.added, map[string]any{"id": n, "content": "<x>", "special": false, "normalized": true})
	tok := mustParse(t, s)
	if got, want := tok.Encode("a <x>b", false), append(tok.idsOf("▁", "a"), n, tok.lookup("b")); !slices.Equal(got, want) {
		t.Errorf("a <x>b: %v, want %v", got, want)
	}
	if got, want := tok.Encode("a<x>b", false), tok.idsOf("▁", "a", "<", "x", ">", "b"); !slices.Equal(got, want) {
		t.Errorf("a<x>b: %v, want %v", got, want)
	}
}

// TestConcurrent: one Tokenizer used from many goroutines gives the same ids
// as from one (run with -race).
func TestConcurrent(t *testing.T) {
	toks := fuzzTokenizers(t)
	r := rand.New(rand.NewPCG(7, 7))
	texts := make([]string, 64)
	for i := range texts {
		texts[i] = randomText(r, 30)
	}
	for name, tok := range toks {
		want := make([][]int, len(texts))
		for i, s := range texts {
			want[i] = tok.Encode(s, true)
		}
		done := make(chan string, 8)
		for g := 0; g < 8; g++ {
			go func() {
				for i, s := range texts {
					if got := tok.Encode(s, true); !slices.Equal(got, want[i]) {
						done <- fmt.Sprintf("%s %q: %v, want %v", name, s, got, want[i])
						return
					}
					tok.Decode(want[i], g%2 == 0)
				}
				done <- ""
			}()
		}
		for g := 0; g < 8; g++ {
			if msg := <-done; msg != "" {
				t.Error(msg)
			}
		}
	}
}

// Subword affixes: continuing_subword_prefix marks every rune but the first,
// end_of_word_suffix the last, and merges are spelled with them.
func TestSubwordAffixes(t *testing.T) {
	pre := spec{vocab: []string{"a", "##b", "##c", "ab", "abc"}, merges: [][2]string{{"a", "##b"}, {"ab", "##c"}},
		model: map[string]any{"continuing_subword_prefix": "##"}}
	if got, want := mustParse(t, pre).Encode("abc", false), []int{4}; !slices.Equal(got, want) {
		t.Errorf("prefix: %v, want %v", got, want)
	}
	suf := spec{vocab: []string{"a", "b", "c</w>", "ab", "abc</w>"}, merges: [][2]string{{"a", "b"}, {"ab", "c</w>"}},
		model: map[string]any{"end_of_word_suffix": "</w>"},
		extra: map[string]any{"decoder": map[string]any{"type": "BPEDecoder", "suffix": "</w>"}}}
	tok := mustParse(t, suf)
	if got, want := tok.Encode("abc", false), []int{4}; !slices.Equal(got, want) {
		t.Errorf("suffix: %v, want %v", got, want)
	}
	if got := tok.Decode([]int{4, 4}, false); got != "abc abc" {
		t.Errorf("BPEDecoder: %q", got)
	}
}

// TestDigitsNumeric: HF's Digits pre-tokenizer splits on Rust's
// char::is_numeric, which is Nd, Nl and No, not decimal digits alone.
func TestDigitsNumeric(t *testing.T) {
	for _, c := range []struct {
		individual bool
		want       []string
	}{
		{false, []string{"a", "12Ⅳ²", "b", "٣"}},
		{true, []string{"a", "1", "2", "Ⅳ", "²", "b", "٣"}},
	} {
		if got := (digits{individual: c.individual}).split("a12Ⅳ²b٣", false, nil); !slices.Equal(got, c.want) {
			t.Errorf("individual %v: %q, want %q", c.individual, got, c.want)
		}
	}
}

// TestSplitMerged holds the Merged behaviours to HF's fold over the spans:
// its documented example, and the inverted case where non-matches (each
// "a" here) stand next to each other and stay apart.
func TestSplitMerged(t *testing.T) {
	for _, c := range []struct {
		text, lit string
		behavior  splitBehavior
		invert    bool
		want      []string
	}{
		{"the-final--countdown", "-", splitMergedWithPrevious, false, []string{"the-", "final-", "-", "countdown"}},
		{"the-final--countdown", "-", splitMergedWithNext, false, []string{"the", "-final", "-", "-countdown"}},
		{"xaab", "a", splitMergedWithNext, true, []string{"xa", "a", "b"}},
		{"xaab", "a", splitMergedWithPrevious, true, []string{"x", "a", "ab"}},
		{"xaab", "a", splitContiguous, true, []string{"x", "aa", "b"}},
	} {
		got := (splitPre{literal: c.lit, behavior: c.behavior, invert: c.invert}).split(c.text, false, nil)
		if !slices.Equal(got, c.want) {
			t.Errorf("%q on %q (behavior %d, invert %v) = %q, want %q", c.text, c.lit, c.behavior, c.invert, got, c.want)
		}
	}
}
