package serve

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// pieces decodes id i as piece i.
type pieces []string

type pieceDecoder struct{ p pieces }

func (d pieceDecoder) Add(id int) string { return d.p[id] }
func (d pieceDecoder) Flush() string     { return "" }

// TestOutputStops cuts random texts into random pieces and checks that the
// text handed out, streamed piece by piece, is the text up to the first
// stop string, and that no stop string's start was handed out before it
// was known not to be one.
func TestOutputStops(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []string{"a", "b", "c", "é", "€", " "}
	word := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	for range 3000 {
		var ps pieces
		for range 1 + rng.IntN(12) {
			ps = append(ps, word(rng.IntN(4)))
		}
		var stops []string
		for range rng.IntN(4) {
			stops = append(stops, word(1+rng.IntN(3)))
		}
		full := strings.Join(ps, "")
		want := full
		for _, s := range stops {
			if i := strings.Index(full, s); i >= 0 && i < len(want) {
				want = full[:i]
			}
		}
		o := &output{dec: pieceDecoder{ps}, stops: stops}
		var got strings.Builder
		for id := range ps {
			got.WriteString(o.add(id))
			if o.stop {
				break
			}
			if !strings.HasPrefix(want, got.String()) {
				t.Fatalf("pieces %q stops %q: handed out %q, beyond %q", ps, stops, got.String(), want)
			}
		}
		got.WriteString(o.flush())
		if got.String() != want || o.stop != (want != full) {
			t.Fatalf("pieces %q stops %q: %q (stop %v), want %q", ps, stops, got.String(), o.stop, want)
		}
	}
}
