package tokenizer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/memwall/memwall/format/gguf"
)

// llama3Spec is a byte-level BPE after the Llama-3 split, with ignore_merges
// and a BOS from a TemplateProcessing inside a Sequence, as Llama-3's file.
func llama3Spec(merges ...string) spec {
	s := gpt2Spec(merges...)
	n := len(s.vocab)
	s.vocab = append(s.vocab, "<|begin_of_text|>")
	s.added = append(s.added, map[string]any{"id": n, "content": "<|begin_of_text|>", "special": true, "normalized": false})
	s.model = map[string]any{"ignore_merges": true}
	s.extra["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "Split", "pattern": map[string]any{"Regex": llama3Pattern}, "behavior": "Isolated", "invert": false},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}}}
	s.extra["post_processor"] = map[string]any{"type": "Sequence", "processors": []any{
		map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
		map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"pair":           []any{},
			"special_tokens": map[string]any{"<|begin_of_text|>": map[string]any{"id": "<|begin_of_text|>", "ids": []int{n}, "tokens": []string{"<|begin_of_text|>"}}}}}}
	return s
}

func TestLlama3Style(t *testing.T) {
	tok := mustParse(t, llama3Spec("1 2", "12 3", "Ġ a"))
	bos, ok := tok.BOS()
	if !ok || bos != tok.lookup("<|begin_of_text|>") {
		t.Fatalf("BOS %d %v", bos, ok)
	}
	// 1234 splits as 123 | 4 (three digits at most); " a" is one piece.
	got := tok.Encode("1234 a", true)
	want := append([]int{bos}, tok.idsOf("123", "4", "Ġa")...)
	if !slices.Equal(got, want) {
		t.Errorf("Encode: %v, want %v", got, want)
	}
	if d := tok.Decode(got, true); d != "1234 a" {
		t.Errorf("Decode: %q", d)
	}
}

// fuzzTokenizers are the hand-written files of every kind.
func fuzzTokenizers(t testing.TB) map[string]*Tokenizer {
	ms := llama2Spec([]string{"▁", "a", "e"}, "▁ a", "a a")
	delete(ms.extra, "normalizer")
	ms.extra["pre_tokenizer"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}
	ms.extra["decoder"] = map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}
	toks := map[string]*Tokenizer{
		"gpt2":      mustParse(t, gpt2Spec("h e", "Ġ a", "a a", "Ġ Ġ", "Ċ Ċ", "1 2")),
		"llama3":    mustParse(t, llama3Spec("h e", "Ġ a", "a a", "1 2", "12 3")),
		"llama2":    mustParse(t, llama2Spec([]string{"▁", "a", "e", "Z"}, "▁ a", "a a", "▁ ▁")),
		"metaspace": mustParse(t, ms),
	}
	// The HF-trained files, with real merge tables, when they are here.
	for _, k := range []string{"gpt2", "llama3", "llama2", "llama2-metaspace"} {
		if tok, err := Load("testdata/hf/" + k + "/tokenizer.json"); err == nil {
			toks["hf-"+k] = tok
		}
	}
	return toks
}

// roundTrip is what Decode(Encode(s, false), false) must give for the
// tokenizer named kind, and false where no simple rule holds.
func roundTrip(kind, s string) (string, bool) {
	switch strings.TrimPrefix(kind, "hf-") {
	case "llama2":
		if strings.Contains(s, "<s>") || strings.Contains(s, "</s>") || strings.Contains(s, "<unk>") {
			return "", false // text after an added token gets its own ▁
		}
		return strings.ReplaceAll(s, "▁", " "), true
	case "metaspace", "llama2-metaspace":
		return "", false // its decoder drops every ▁ of the first token
	}
	return s, true
}

// TestRoundTripAll holds every tokenizer here, the HF-trained ones included,
// to its round trip on random text of the test mix.
func TestRoundTripAll(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for name, tok := range fuzzTokenizers(t) {
		for i := 0; i < 1500; i++ {
			s := randomText(r, r.IntN(40))
			want, ok := roundTrip(name, s)
			if !ok {
				continue
			}
			if got := tok.Decode(tok.Encode(s, false), false); got != want {
				t.Fatalf("%s: Decode(Encode(%q)) = %q, want %q", name, s, got, want)
			}
		}
	}
}

// FuzzEncode: no input panics, ids are tokens, and Decode(Encode(s)) gives s
// back: exactly for byte-level BPE; for SentencePiece with its ▁ rules.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", " ", "hello world", "  \n\t x", "a<s>b", "<|endoftext|>", "▁▁a", "\xff\xfe",
		"e\u0301", "👨\u200d👩\u200d👧", "1234567", "'S'll", "\r\n\r\n"} {
		f.Add(s)
	}
	toks := fuzzTokenizers(f)
	f.Fuzz(func(t *testing.T, s string) {
		for name, tok := range toks {
			ids := tok.Encode(s, true)
			for _, id := range ids {
				if _, ok := tok.Token(id); !ok {
					t.Fatalf("%s %q: id %d is no token", name, s, id)
				}
			}
			d := tok.Decode(ids, false)
			if !utf8.ValidString(d) {
				t.Fatalf("%s %q: decode %q is not UTF-8", name, s, d)
			}
			if !utf8.ValidString(s) {
				continue // bad bytes come back as U+FFFD
			}
			want, ok := roundTrip(name, s)
			if !ok {
				continue
			}
			if got := tok.Decode(tok.Encode(s, false), false); got != want {
				t.Fatalf("%s: Decode(Encode(%q)) = %q, want %q", name, s, got, want)
			}
		}
	})
}

// FuzzParse: any bytes either fail with an *Error or give a tokenizer that
// encodes and decodes without panicking.
func FuzzParse(f *testing.F) {
	for _, s := range []spec{gpt2Spec("h e"), llama3Spec("a a"), llama2Spec([]string{"▁", "a"}, "▁ a")} {
		f.Add(s.json())
	}
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},"added_tokens":[{"id":3,"content":"<x>","special":true,"lstrip":true,"rstrip":true,"single_word":true}]}`))
	f.Add([]byte(`{"model":{"vocab":{"a":0},"merges":[]},"decoder":{"type":"Strip","content":"a","start":3,"stop":3}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := Parse("fuzz.json", b)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %T %v is not *Error", err, err)
			}
			return
		}
		for _, s := range []string{"", "ab <x> a\n", string(b[:min(len(b), 40)])} {
			ids := tok.Encode(s, true)
			_ = tok.Decode(ids, false)
			_ = tok.Decode(ids, true)
		}
		ids := make([]int, 0, 16)
		for i := 0; i < 16 && i < len(b); i++ {
			ids = append(ids, int(b[i])-8)
		}
		d := tok.NewDecoder()
		for _, id := range ids {
			d.Add(id)
		}
		d.Flush()
	})
}

// FuzzGGUF: any GGUF header either fails to parse, fails FromGGUF with an
// *Error, or gives a tokenizer that encodes and decodes.
func FuzzGGUF(f *testing.F) {
	toks := fuzzTokenizers(f)
	for _, kind := range []struct{ name, model string }{{"gpt2", "gpt2"}, {"llama2", "llama"}} {
		meta := ggufOf(toks[kind.name], kind.model)
		var kvs []gguf.KV
		for k, v := range meta {
			kvs = append(kvs, gguf.KV{Key: k, Value: v})
		}
		slices.SortFunc(kvs, func(a, b gguf.KV) int { return strings.Compare(a.Key, b.Key) })
		hdr, _, err := gguf.Layout(kvs, nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(hdr)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := gguf.Parse("fuzz.gguf", b)
		if err != nil {
			return
		}
		meta := map[string]any{}
		for _, kv := range g.Metadata {
			meta[kv.Key] = kv.Value
		}
		tok, err := FromGGUF(meta)
		if err != nil {
			if _, ok := err.(*Error); !ok {
				t.Fatalf("error %T %v is not *Error", err, err)
			}
			return
		}
		ids := tok.Encode("a b\n aa ▁<s>é", true)
		_ = tok.Decode(ids, false)
		_ = tok.Decode(append(ids, -1, 0, tok.VocabSize()), true)
	})
}

// FuzzStream: the stream decoder's pieces add up to Decode for any ids.
func FuzzStream(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3})
	f.Add([]byte{230, 143, 131, 200, 7})
	toks := fuzzTokenizers(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for name, tok := range toks {
			ids := make([]int, len(b))
			for i, c := range b {
				ids[i] = int(c) * tok.VocabSize() / 255
			}
			d := tok.NewDecoder()
			var sb strings.Builder
			for _, id := range ids {
				sb.WriteString(d.Add(id))
			}
			sb.WriteString(d.Flush())
			want := tok.Decode(ids, true)
			if strings.Contains(want, "\uFFFD") {
				continue
			}
			if sb.String() != want {
				t.Fatalf("%s ids %v: stream %q, Decode %q", name, ids, sb.String(), want)
			}
		}
	})
}

// FuzzPipeline builds tokenizer.json files from the fuzzer's bytes: which
// normalizers, pre-tokenizers, decoders and post-processor, the added
// tokens' flags, and merges over a small vocabulary; then encodes and
// decodes. Nothing may panic and every id must be a token.
func FuzzPipeline(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7}, "hello <x> world")
	f.Add([]byte{9, 9, 9, 9, 9, 9, 9, 9, 9, 9}, "  ▁a\n\tb<s>")
	f.Add([]byte{255, 128, 7, 3, 200, 1}, "'S 12345 é")
	norms := []string{`{"type":"Prepend","prepend":"▁"}`, `{"type":"Replace","pattern":{"String":" "},"content":"▁"}`,
		`{"type":"Strip","strip_left":true,"strip_right":false}`, `{"type":"Replace","pattern":{"String":"a"},"content":""}`}
	pres := []string{`{"type":"ByteLevel","add_prefix_space":true}`, `{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}`,
		`{"type":"Split","pattern":{"Regex":` + jsonString(llama3Pattern) + `},"behavior":"Isolated"}`,
		`{"type":"Split","pattern":{"String":" "},"behavior":"Removed"}`, `{"type":"Split","pattern":{"String":"a"},"behavior":"MergedWithNext","invert":true}`,
		`{"type":"Split","pattern":{"String":"b"},"behavior":"Contiguous"}`, `{"type":"Split","pattern":{"String":"▁"},"behavior":"MergedWithPrevious"}`,
		`{"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":true}`, `{"type":"Digits","individual_digits":true}`}
	decs := []string{`{"type":"ByteLevel"}`, `{"type":"Replace","pattern":{"String":"▁"},"content":" "}`, `{"type":"ByteFallback"}`,
		`{"type":"Fuse"}`, `{"type":"Strip","content":" ","start":2,"stop":1}`, `{"type":"Metaspace","replacement":"▁","prepend_scheme":"always"}`,
		`{"type":"BPEDecoder","suffix":"b"}`}
	f.Fuzz(func(t *testing.T, b []byte, text string) {
		next := func() int {
			if len(b) == 0 {
				return 0
			}
			c := int(b[0])
			b = b[1:]
			return c
		}
		pick := func(list []string) string {
			var parts []string
			for n := next() % 4; n > 0; n-- {
				parts = append(parts, list[next()%len(list)])
			}
			return strings.Join(parts, ",")
		}
		vocab := []string{"<unk>", "<s>", "a", "b", " ", "▁", "ab", "▁a", "Ġ", "Ġa", "<0x61>", "<0xC3>", "<0xA9>", "1", "2", "12"}
		for c := 0; c < 256 && next()%2 == 1; c++ {
			vocab = append(vocab, alphabet.toStr[c])
		}
		var sb strings.Builder
		sb.WriteString(`{"model":{"type":"BPE","vocab":{`)
		for i, v := range vocab {
			if i > 0 {
				sb.WriteString(",")
			}
			fmt.Fprintf(&sb, "%s:%d", jsonString(v), i)
		}
		fmt.Fprintf(&sb, `},"merges":[["a","b"],["▁","a"],["Ġ","a"],["1","2"]],"byte_fallback":%v,"ignore_merges":%v,"unk_token":"<unk>","fuse_unk":%v},`,
			next()%2 == 0, next()%2 == 0, next()%2 == 0)
		fmt.Fprintf(&sb, `"added_tokens":[{"id":1,"content":"<s>","special":true,"normalized":%v,"lstrip":%v,"rstrip":%v,"single_word":%v},{"id":%d,"content":"<x>","special":false}],`,
			next()%2 == 0, next()%2 == 0, next()%2 == 0, next()%2 == 0, len(vocab)+next()%3)
		fmt.Fprintf(&sb, `"normalizer":{"type":"Sequence","normalizers":[%s]},`, pick(norms))
		fmt.Fprintf(&sb, `"pre_tokenizer":{"type":"Sequence","pretokenizers":[%s]},`, pick(pres))
		fmt.Fprintf(&sb, `"decoder":{"type":"Sequence","decoders":[%s]},`, pick(decs))
		sb.WriteString(`"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>"}},{"Sequence":{"id":"A"}},{"SpecialToken":{"id":"<s>"}}],"special_tokens":{"<s>":{"ids":[1]}}}}`)
		// More added tokens, with contents and flags from the rest of the
		// bytes (contents may repeat, be empty, be vocabulary or whitespace).
		contents := []string{"", " ", "  ", "a b", "<x>", "▁a", "ab", " <y>", "<y> ", "\n", "a", "é"}
		var more []string
		for n := next() % 5; n > 0; n-- {
			fl := next()
			more = append(more, fmt.Sprintf(`{"id":%d,"content":%s,"special":%v,"normalized":%v,"lstrip":%v,"rstrip":%v,"single_word":%v}`,
				next()%40, jsonString(contents[next()%len(contents)]), fl&1 != 0, fl&2 != 0, fl&4 != 0, fl&8 != 0, fl&16 != 0))
		}
		js := sb.String()
		if len(more) > 0 {
			js = strings.Replace(js, `"added_tokens":[`, `"added_tokens":[`+strings.Join(more, ",")+",", 1)
		}
		tok, err := Parse("pipeline.json", []byte(js))
		if err != nil {
			t.Fatalf("%v\n%s", err, js)
		}
		for _, add := range []bool{false, true} {
			ids := tok.Encode(text, add)
			for _, id := range ids {
				if _, ok := tok.Token(id); !ok {
					t.Fatalf("id %d is no token", id)
				}
			}
			if !utf8.ValidString(tok.Decode(ids, !add)) {
				t.Fatalf("decode is not UTF-8")
			}
			if add && len(ids) > 0 && tok.IsSpecial(ids[0]) != tok.skip[ids[0]] && tok.decodeText(ids[0]) == tok.pieces[ids[0]] {
				t.Fatalf("id %d: special %v but skipped %v though its text is its content", ids[0], tok.IsSpecial(ids[0]), tok.skip[ids[0]])
			}
			d := tok.NewDecoder()
			for _, id := range ids {
				d.Add(id)
			}
			d.Flush()
		}
	})
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
