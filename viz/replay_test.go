package viz

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestReplayHTML(t *testing.T) {
	pic := ReplayPicture{
		Title: "replay <of> a trace",
		Notes: []string{"peak live 10 MiB"},
		Series: []ReplaySeries{
			{Name: "default", X: []float64{0, 1, 2}, Live: []uint64{1 << 20, 10 << 20, 2 << 20}, Reserved: []uint64{2 << 20, 12 << 20, 12 << 20}},
			{Name: "chunks", X: []float64{0, 1, 2}, Live: []uint64{1 << 20, 10 << 20, 2 << 20}, Reserved: []uint64{32 << 20, 32 << 20, 32 << 20}},
		},
		Map: &ReplayMap{Name: "default", Reserved: []ReplaySpan{{0, 12 << 20}}, Blocks: []ReplaySpan{{0, 3 << 20}, {4 << 20, 7 << 20}}},
	}
	var b bytes.Buffer
	if err := ReplayHTML(&b, pic); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	for _, want := range []string{"<!DOCTYPE html>", "replay &lt;of&gt; a trace", "peak live 10 MiB", "<h2>default</h2>", "<h2>chunks</h2>", "address space at the peak", "block +4.0 MiB, 7.0 MiB"} {
		if !strings.Contains(s, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if n := strings.Count(s, "<svg"); n != 3 {
		t.Errorf("%d SVGs, want 3", n)
	}
	if strings.Contains(s, "<script") || strings.Contains(s, "href=") || strings.Contains(s, "src=") {
		t.Error("page refers to something outside itself")
	}
}

func TestReplayHTMLInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		pic  ReplayPicture
	}{
		{"lengths differ", ReplayPicture{Series: []ReplaySeries{{Name: "x", X: []float64{0, 1}, Live: []uint64{1}, Reserved: []uint64{1, 2}}}}},
		{"too many series", ReplayPicture{Series: make([]ReplaySeries, maxReplaySeries+1)}},
		{"too many points", ReplayPicture{Series: []ReplaySeries{{X: make([]float64, maxReplayPoints+1), Live: make([]uint64, maxReplayPoints+1), Reserved: make([]uint64, maxReplayPoints+1)}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := ReplayHTML(&bytes.Buffer{}, tc.pic); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
	// Empty series and maps draw placeholders, not errors.
	if err := ReplayHTML(&bytes.Buffer{}, ReplayPicture{Series: []ReplaySeries{{Name: "empty"}}, Map: &ReplayMap{}}); err != nil {
		t.Fatal(err)
	}
}
