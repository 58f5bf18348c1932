package tokenizer

import (
	"encoding/json"
	"os"
	"slices"
	"testing"
)

// TestAddedTokensAsHF loads testdata/hf/llama2's vocabulary with added
// tokens that HF tokenizers loads in its own way, and holds Encode and
// Decode to what HF tokenizers 0.23.2 gave for the same file: ids assigned
// by content and from the vocabulary's size on, not as the file says (<gap>
// is written as 3050, "the" is in the vocabulary as 679, <dup> twice, an
// empty content); a special normalized token decoded as "▁<n>" and so not
// skipped; whitespace-only lstrip+rstrip tokens; rstrip followed by a
// token inside the spaces it took; single_word next to marks, Other_Alphabetic,
// connector punctuation, ZWJ and letter numbers.
func TestAddedTokensAsHF(t *testing.T) {
	b, err := os.ReadFile("testdata/hf/llama2/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	add := func(id int, content string, flags ...string) map[string]any {
		a := map[string]any{"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
			"normalized": false, "special": false}
		for _, fl := range flags {
			a[fl] = true
		}
		return a
	}
	added := f["added_tokens"].([]any)
	for _, a := range []map[string]any{
		add(3050, "<gap>", "special"), add(3010, "the"), add(3020, "<dup>", "special"), add(3021, "<dup>"),
		add(3030, "", "special"), add(3040, "<n>", "special", "normalized"), add(3041, "   ", "lstrip", "rstrip"),
		add(3042, "<r>", "rstrip"), add(3043, " x"), add(3044, "<w>", "single_word"),
	} {
		added = append(added, a)
	}
	f["added_tokens"] = added
	if b, err = json.Marshal(f); err != nil {
		t.Fatal(err)
	}
	tok, err := Parse("added.json", b)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.VocabSize(); got != 3007 {
		t.Errorf("VocabSize = %d, HF 3007", got)
	}
	for id, want := range map[int]string{3000: "<gap>", 3001: "<dup>", 3002: "<n>", 3003: "   ", 3004: "<r>", 3005: " x", 3006: "<w>", 679: "the"} {
		if got, ok := tok.Token(id); !ok || got != want {
			t.Errorf("Token(%d) = %q %v, want %q", id, got, ok, want)
		}
	}
	if !tok.IsSpecial(3001) || tok.IsSpecial(3005) {
		t.Errorf("IsSpecial(<dup>) %v, IsSpecial(\" x\") %v; HF: <dup> stays special after a non-special repeat", tok.IsSpecial(3001), tok.IsSpecial(3005))
	}
	for _, id := range []int{3010, 3050} {
		if _, ok := tok.Token(id); ok {
			t.Errorf("Token(%d) exists; HF gives no token the file's id", id)
		}
	}
	for _, c := range []struct {
		text             string
		ids              []int
		decode, skipping string
	}{
		{"<gap> the <dup> x", []int{3000, 659, 679, 659, 3001, 3005}, "<gap>  the  <dup> x", " the   x"},
		{"a <n> b<n>", []int{713, 3002, 697, 291, 339, 293}, "a <n> b<n>", "a <n> b<n>"},
		{"          ", []int{3003}, "  ", "  "},
		{"a      b", []int{713, 3003, 697}, "a    b", "a    b"},
		{"<r>   x y", []int{3004, 594, 349, 594, 350}, "<r> x y", "<r> x y"},
		{"<r>    x", []int{3004, 3005}, "<r> x", "<r> x"},
		{"a<w>b", []int{713, 291, 348, 293, 327}, "a<w>b", "a<w>b"},
		{"a <w> b", []int{713, 594, 3006, 659, 327}, "a <w>  b", "a <w>  b"},
		{"\u0903<w>", []int{594, 227, 167, 134, 291, 348, 293}, "\u0903<w>", "\u0903<w>"},
		{"ⓐ<w>‿", []int{594, 229, 150, 147, 291, 348, 293, 229, 131, 194}, "ⓐ<w>‿", "ⓐ<w>‿"},
		{"\u200d<w>", []int{594, 588, 291, 348, 293}, "\u200d<w>", "\u200d<w>"},
		{"Ⅳ<w>.", []int{594, 229, 136, 166, 291, 348, 293, 277}, "Ⅳ<w>.", "Ⅳ<w>."},
	} {
		got := tok.Encode(c.text, false)
		if !slices.Equal(got, c.ids) {
			t.Errorf("Encode(%q) = %v %q\n HF %v %q", c.text, got, tok.tokensOf(got), c.ids, tok.tokensOf(c.ids))
		}
		if got := tok.Decode(c.ids, false); got != c.decode {
			t.Errorf("Decode(%v) = %q, HF %q", c.ids, got, c.decode)
		}
		if got := tok.Decode(append([]int{1}, c.ids...), true); got != c.skipping {
			t.Errorf("Decode([1 %v], skip) = %q, HF %q", c.ids, got, c.skipping)
		}
	}
	for _, c := range []struct {
		ids              []int
		decode, skipping string
	}{
		{[]int{3000, 3001, 3002, 3003, 3004, 3005, 3010, 3020, 3021, 3030, 3040, 3050}, "<gap><dup> <n>   <r> x", "<n>   <r> x"},
		{[]int{659, 3002, 659, 3001, 1}, "  <n>  <dup><s>", "  <n>  "},
	} {
		if got := tok.Decode(c.ids, false); got != c.decode {
			t.Errorf("Decode(%v) = %q, HF %q", c.ids, got, c.decode)
		}
		if got := tok.Decode(c.ids, true); got != c.skipping {
			t.Errorf("Decode(%v, skip) = %q, HF %q", c.ids, got, c.skipping)
		}
	}
}
