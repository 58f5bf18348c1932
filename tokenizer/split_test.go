package tokenizer

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"slices"
	"testing"
)

func splitAll(name, s string) []string {
	var p splitPattern
	switch name {
	case "gpt2":
		p, _ = knownPattern(gpt2Pattern)
	case "llama3":
		p, _ = knownPattern(llama3Pattern)
	case "qwen2":
		p, _ = knownPattern(qwen2Pattern)
	}
	var out []string
	for _, m := range p.findAll(s) {
		out = append(out, s[m[0]:m[1]])
	}
	return out
}

func TestSplitExamples(t *testing.T) {
	for _, c := range []struct {
		pattern, text string
		want          []string
	}{
		{"gpt2", "Hello world", []string{"Hello", " world"}},
		{"gpt2", "Hello  world", []string{"Hello", " ", " world"}},
		{"gpt2", "I'm here", []string{"I", "'m", " here"}},
		{"gpt2", "I'M", []string{"I", "'", "M"}},
		{"gpt2", "  hi", []string{" ", " hi"}},
		{"gpt2", "a\n\nb", []string{"a", "\n", "\n", "b"}},
		{"gpt2", "x  ", []string{"x", "  "}},
		{"gpt2", "123 4567", []string{"123", " 4567"}},
		{"gpt2", " !?", []string{" !?"}},
		{"llama3", "123 4567", []string{"123", " ", "456", "7"}},
		{"llama3", "DON'T", []string{"DON", "'T"}},
		{"llama3", "x'ſ", []string{"x", "'ſ"}},
		{"llama3", "\n\nHello", []string{"\n\n", "Hello"}},
		{"llama3", "  \n  x", []string{"  \n", " ", " x"}},
		{"llama3", "!!!\n\nabc", []string{"!!!\n\n", "abc"}},
		{"llama3", "\tfoo", []string{"\tfoo"}},
		{"llama3", "'sup", []string{"'s", "up"}},
		{"llama3", "a ", []string{"a", " "}},
		{"qwen2", "1234", []string{"1", "2", "3", "4"}},
	} {
		if got := splitAll(c.pattern, c.text); !slices.Equal(got, c.want) {
			t.Errorf("%s %q: got %q, want %q", c.pattern, c.text, got, c.want)
		}
	}
}

// TestSplitOracle holds the matchers to a backtracking regex engine (Python's
// re, with the Unicode classes spelled out) on 5,600 strings of the test mix:
// testdata/split-oracle.py made testdata/splits.json.gz.
func TestSplitOracle(t *testing.T) {
	var cases []struct {
		Pattern string   `json:"pattern"`
		Text    string   `json:"text"`
		Pieces  []string `json:"pieces"`
	}
	readGzipJSON(t, "testdata/splits.json.gz", &cases)
	bad := 0
	for _, c := range cases {
		if got := splitAll(c.Pattern, c.Text); !slices.Equal(got, c.Pieces) {
			if bad++; bad <= 10 {
				t.Errorf("%s %q: got %q, want %q", c.Pattern, c.Text, got, c.Pieces)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d splits differ", bad, len(cases))
	}
}

func readGzipJSON(t testing.TB, path string, v any) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.NewDecoder(z).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// TestSplitCovers checks on random bytes that the matches tile the input:
// nothing lost, nothing twice, every match non-empty.
func FuzzSplit(f *testing.F) {
	for _, s := range []string{"", "Hello world", "  \n\t x", "'s'S'ſ", "١٢٣ abc", "\xff\xfe a", "e\u0301\u0301"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, name := range []string{"gpt2", "llama3", "qwen2"} {
			got := splitAll(name, s)
			joined := ""
			for _, p := range got {
				if p == "" {
					t.Fatalf("%s %q: empty piece", name, s)
				}
				joined += p
			}
			if joined != s {
				t.Fatalf("%s %q: pieces %q do not tile the input", name, s, got)
			}
		}
	})
}
