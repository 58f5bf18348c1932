package tokenizer

import (
	"math/rand/v2"
	"testing"
)

// bigSpec is a byte-level BPE the size of Llama-3's (about 128k tokens and
// 128k merges): each merge joins two tokens already there, short ones more
// often.
func bigSpec(n int) spec {
	s := gpt2Spec()
	s.vocab = s.vocab[:256]
	s.added = nil
	have := map[string]bool{}
	for _, v := range s.vocab {
		have[v] = true
	}
	r := rand.New(rand.NewPCG(9, 9))
	pick := func() string { return s.vocab[int(float64(len(s.vocab))*r.Float64()*r.Float64())] }
	for len(s.merges) < n {
		a, b := pick(), pick()
		if len(a)+len(b) > 24 || have[a+b] {
			continue
		}
		have[a+b] = true
		s.vocab = append(s.vocab, a+b)
		s.merges = append(s.merges, [2]string{a, b})
	}
	return s
}

func BenchmarkLoad128k(b *testing.B) {
	js := bigSpec(128000).json()
	b.SetBytes(int64(len(js)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := Parse("big.json", js); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	tok, err := Parse("big.json", bigSpec(20000).json())
	if err != nil {
		b.Fatal(err)
	}
	text := randomText(rand.New(rand.NewPCG(1, 1)), 20000)
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	var n int
	for b.Loop() {
		n = len(tok.Encode(text, false))
	}
	b.ReportMetric(float64(n), "tokens")
}
