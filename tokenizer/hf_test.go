package tokenizer

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// hfLine is one line of testdata/hf/expected.jsonl.gz: what HF tokenizers
// gave for a text (Text set) or for a list of ids (DecodeIDs set).
type hfLine struct {
	File       string   `json:"file"`
	Text       *string  `json:"text"`
	IDs        []int    `json:"ids"`
	IDsPlain   []int    `json:"ids_plain"`
	Decode     string   `json:"decode"`
	DecodeSkip string   `json:"decode_skip"`
	DecodeIDs  []int    `json:"decode_ids"`
	Pre        []string `json:"pre"`
	// Stream is what HF's DecodeStream(skip_special_tokens=True) gave at
	// each of IDs (null: no text yet), or {"error": ...} where it raised.
	Stream json.RawMessage `json:"stream"`
}

// streamSteps reads l.Stream as one string a step ("" for null); ok is
// false when the line has no steps (older data, or HF raised).
func (l *hfLine) streamSteps() ([]string, bool) {
	var steps []*string
	if len(l.Stream) == 0 || json.Unmarshal(l.Stream, &steps) != nil {
		return nil, false
	}
	out := make([]string, len(steps))
	for i, p := range steps {
		if p != nil {
			out[i] = *p
		}
	}
	return out, true
}

func readHF(t *testing.T) []hfLine { return readHFDir(t, "testdata/hf") }

// readHFDir reads dir/expected.jsonl.gz, skipping the test when it is absent.
func readHFDir(t *testing.T, dir string) []hfLine {
	name := filepath.Join(dir, "expected.jsonl.gz")
	f, err := os.Open(name)
	if os.IsNotExist(err) {
		t.Skipf("no %s (scripts/gpu/tokenizer.sh makes it)", name)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var lines []hfLine
	sc := bufio.NewScanner(z)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var l hfLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

func (t *Tokenizer) tokensOf(ids []int) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i], _ = t.Token(id)
	}
	return out
}

// TestHF holds Encode and Decode to HF tokenizers on the files and strings
// scripts/gpu/tokenizer-check.py made (testdata/README.md): identical ids
// with and without special tokens, identical decodes, and the stream
// decoder's pieces adding up to the decode.
func TestHF(t *testing.T) { checkHF(t, "testdata/hf") }

// TestHFDir runs TestHF's comparison on another directory laid out as
// testdata/hf, named by MEMWALL_HF_DIR: the output of tokenizer-check.py
// (from the GPU machine, or from testdata/hfnode) before it is copied here.
func TestHFDir(t *testing.T) {
	dir := os.Getenv("MEMWALL_HF_DIR")
	if dir == "" {
		t.Skip("MEMWALL_HF_DIR is not set")
	}
	checkHF(t, dir)
}

// checkHF runs TestHF's comparison on the files and lines of dir.
func checkHF(t *testing.T, dir string) {
	lines := readHFDir(t, dir)
	toks := map[string]*Tokenizer{}
	type count struct{ strings, ids, bad, decodes, badDecode, streamed int }
	counts := map[string]*count{}
	for _, l := range lines {
		tok, ok := toks[l.File]
		if !ok {
			var err error
			if tok, err = Load(filepath.Join(dir, l.File)); err != nil {
				t.Fatal(err)
			}
			toks[l.File] = tok
			counts[l.File] = &count{}
		}
		c := counts[l.File]
		if l.Text == nil {
			c.decodes++
			if got := tok.Decode(l.DecodeIDs, false); got != l.Decode {
				c.badDecode++
				if c.badDecode <= 5 {
					t.Errorf("%s: Decode(%v %q) = %q, HF %q", l.File, l.DecodeIDs, tok.tokensOf(l.DecodeIDs), got, l.Decode)
				}
			}
			if got := tok.Decode(l.DecodeIDs, true); got != l.DecodeSkip {
				c.badDecode++
				if c.badDecode <= 5 {
					t.Errorf("%s: Decode(%v, skip) = %q, HF %q", l.File, l.DecodeIDs, got, l.DecodeSkip)
				}
			}
			continue
		}
		s := *l.Text
		c.strings++
		c.ids += len(l.IDs)
		bad := false
		if got := tok.Encode(s, true); !slices.Equal(got, l.IDs) {
			bad = true
			if c.bad < 8 {
				t.Errorf("%s: Encode(%q, true)\n got %v %q\n  HF %v %q\n  HF pieces %q", l.File, s, got, tok.tokensOf(got), l.IDs, tok.tokensOf(l.IDs), l.Pre)
			}
		}
		if got := tok.Encode(s, false); !slices.Equal(got, l.IDsPlain) {
			bad = true
			if c.bad < 8 {
				t.Errorf("%s: Encode(%q, false) = %v, HF %v", l.File, s, got, l.IDsPlain)
			}
		}
		if got := tok.Decode(l.IDsPlain, false); got != l.Decode {
			bad = true
			if c.bad < 8 {
				t.Errorf("%s: Decode(%v) = %q, HF %q", l.File, l.IDsPlain, got, l.Decode)
			}
		}
		if got := tok.Decode(l.IDs, true); got != l.DecodeSkip {
			bad = true
			if c.bad < 8 {
				t.Errorf("%s: Decode(%v, skip) = %q, HF %q", l.File, l.IDs, got, l.DecodeSkip)
			}
		}
		if !strings.Contains(l.DecodeSkip, "\uFFFD") {
			d := tok.NewDecoder()
			var sb strings.Builder
			for _, id := range l.IDs {
				sb.WriteString(d.Add(id))
			}
			sb.WriteString(d.Flush())
			if sb.String() != l.DecodeSkip {
				bad = true
				if c.bad < 8 {
					t.Errorf("%s: stream decode of %v = %q, HF decode %q", l.File, l.IDs, sb.String(), l.DecodeSkip)
				}
			}
		}
		if steps, ok := l.streamSteps(); ok {
			c.streamed++
			d := tok.NewDecoder()
			for i, id := range l.IDs {
				if got := d.Add(id); i < len(steps) && got != steps[i] {
					bad = true
					if c.bad < 8 {
						t.Errorf("%s: stream of %v: step %d (id %d) gave %q, HF's DecodeStream %q", l.File, l.IDs, i, id, got, steps[i])
					}
					break
				}
			}
		}
		if bad {
			c.bad++
		}
	}
	if len(toks) == 0 {
		t.Fatal("no lines")
	}
	for file, c := range counts {
		t.Logf("%-30s %5d strings, %6d ids, %d differ (%d streamed step by step); %d id lists decoded, %d differ", file, c.strings, c.ids, c.bad, c.streamed, c.decodes, c.badDecode)
		if c.strings < 1000 {
			t.Errorf("%s: %d strings, want ≥ 1000", file, c.strings)
		}
	}
}

// TestHFGGUF writes each HF-trained vocabulary as GGUF metadata
// (GGUFMetadata) and encodes the same strings through FromGGUF. Byte-level vocabularies ("gpt2" with
// merges) must give HF's ids exactly. A "llama" vocabulary merges by score
// as llama.cpp does; scores made from merge ranks agree with HF's BPE except
// where a token can also be made from a pair that is no merge of the file,
// so that count is reported, not held.
func TestHFGGUF(t *testing.T) {
	lines := readHF(t)
	type pair struct {
		json, gguf *Tokenizer
	}
	kinds := map[string]pair{}
	for _, c := range []struct{ file, model, pre string }{
		{"gpt2/tokenizer.json", "gpt2", "gpt2"},
		{"llama3/tokenizer.json", "gpt2", "llama-bpe"},
		{"llama2/tokenizer.json", "llama", ""},
	} {
		tok, err := Load(filepath.Join("testdata/hf", c.file))
		if err != nil {
			t.Fatal(err)
		}
		meta, err := tok.GGUFMetadata()
		if err != nil {
			t.Fatal(err)
		}
		if meta["tokenizer.ggml.model"] != c.model || c.pre != "" && meta["tokenizer.ggml.pre"] != c.pre {
			t.Errorf("%s: GGUF model %v pre %v, want %s %s", c.file, meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"], c.model, c.pre)
		}
		g, err := FromGGUF(viaFile(t, meta))
		if err != nil {
			t.Fatal(err)
		}
		kinds[c.file] = pair{tok, g}
	}
	n, same := map[string]int{}, map[string]int{}
	for _, l := range lines {
		p, ok := kinds[l.File]
		if !ok || l.Text == nil {
			continue
		}
		n[l.File]++
		got := p.gguf.Encode(*l.Text, true)
		if slices.Equal(got, l.IDs) {
			same[l.File]++
		} else if !strings.HasPrefix(l.File, "llama2/") && n[l.File]-same[l.File] <= 5 {
			t.Errorf("%s as GGUF: Encode(%q) = %v, HF %v", l.File, *l.Text, got, l.IDs)
		}
	}
	for file := range kinds {
		t.Logf("%-24s as GGUF: %d of %d strings give HF's ids", file, same[file], n[file])
	}
}

// TestTransformersGGUF compares FromGGUF on the llama2 vocabulary written as
// GGUF metadata with what transformers' GGUF tokenizer converter makes of the
// same metadata (testdata/hf/transformers-gguf.jsonl.gz, when the check
// script could import it). The converter builds BPE merges from the scores;
// FromGGUF merges by score as llama.cpp does. The agreement is reported; a
// low one fails.
func TestTransformersGGUF(t *testing.T) {
	f, err := os.Open("testdata/hf/transformers-gguf.jsonl.gz")
	if os.IsNotExist(err) {
		t.Skip("no testdata/hf/transformers-gguf.jsonl.gz (scripts/gpu/tokenizer.sh makes it where transformers imports)")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := Load("testdata/hf/llama2/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	g, err := FromGGUF(viaFile(t, ggufOf(tok, "llama")))
	if err != nil {
		t.Fatal(err)
	}
	n, same := 0, 0
	sc := bufio.NewScanner(z)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var l hfLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		n++
		if got := g.Encode(*l.Text, false); slices.Equal(got, l.IDsPlain) {
			same++
		} else if n-same <= 5 {
			t.Logf("%q: FromGGUF %q, transformers %q", *l.Text, g.tokensOf(got), g.tokensOf(l.IDsPlain))
		}
	}
	t.Logf("llama2 vocabulary as GGUF: %d of %d strings give transformers' ids", same, n)
	if n == 0 || same < n*9/10 {
		t.Errorf("%d of %d agree", same, n)
	}
}
