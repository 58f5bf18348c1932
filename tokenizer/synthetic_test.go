package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestSynthetic(t *testing.T) {
	for _, n := range []int{400, 768, 1024, 32000} {
		js, err := Synthetic(n)
		if err != nil {
			t.Fatal(err)
		}
		tok, err := Parse("synthetic.json", js)
		if err != nil {
			t.Fatal(err)
		}
		if tok.VocabSize() != n {
			t.Errorf("vocab %d, want %d", tok.VocabSize(), n)
		}
		if bos, _ := tok.BOS(); bos != 1 {
			t.Errorf("BOS %d", bos)
		}
		if eos, _ := tok.EOS(); eos != 2 {
			t.Errorf("EOS %d", eos)
		}
		if got := tok.Encode("The model runs on the device", true); n >= 1024 && len(got) > 10 {
			t.Errorf("vocab %d: %d tokens for corpus text: %q", n, len(got), tok.tokensOf(got))
		}
		meta, err := tok.GGUFMetadata()
		if err != nil {
			t.Fatal(err)
		}
		g, err := FromGGUF(viaFile(t, meta))
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(uint64(n), 1))
		for i := 0; i < 300; i++ {
			s := randomText(r, r.IntN(20))
			if strings.Contains(s, "<s>") {
				continue
			}
			ids := tok.Encode(s, true)
			if got := tok.Decode(ids, true); got != strings.ReplaceAll(s, "▁", " ") {
				t.Fatalf("vocab %d: round trip of %q gave %q", n, s, got)
			}
			if got := g.Encode(s, true); !slices.Equal(got, ids) {
				t.Fatalf("vocab %d %q: GGUF %v, json %v", n, s, got, ids)
			}
		}
	}
	if _, err := Synthetic(300); err == nil {
		t.Errorf("Synthetic(300): no error")
	}
	a, _ := Synthetic(1024)
	b, _ := Synthetic(1024)
	if string(a) != string(b) {
		t.Errorf("Synthetic is not deterministic")
	}
}

func TestGGUFMetadataUnsupported(t *testing.T) {
	s := llama2Spec([]string{"▁", "a"})
	delete(s.extra, "normalizer")
	s.extra["pre_tokenizer"] = map[string]any{"type": "Digits"}
	if _, err := mustParse(t, s).GGUFMetadata(); err == nil {
		t.Errorf("a Digits pipeline has a GGUF form")
	}
}
