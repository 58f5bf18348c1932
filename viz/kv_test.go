package viz

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKVHTML(t *testing.T) {
	pic := KVPicture{
		Title:       "kv <simulate>",
		Notes:       []string{"paged waste 1.8%"},
		BudgetBytes: 10 << 30,
		Series: []KVSeries{
			{Name: "paged", T: []float64{0, 1, 2.5}, Held: []uint64{1 << 30, 9 << 30, 2 << 30}, Batch: []float64{4, 120, 30}},
			{Name: "contiguous", T: []float64{0, 3}, Held: []uint64{8 << 30, 8 << 30}, Batch: []float64{4, 4}},
		},
	}
	var b bytes.Buffer
	if err := KVHTML(&b, pic); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	for _, want := range []string{"<!DOCTYPE html>", "kv &lt;simulate&gt;", "paged waste 1.8%", "K/V memory held", "sequences per step", ">paged<", "contiguous", "GiB", "KV budget"} {
		if !strings.Contains(s, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if n := strings.Count(s, "<polyline"); n != 4 {
		t.Errorf("%d lines, want 4 (2 series × 2 charts)", n)
	}
	if strings.Contains(s, "<script") || strings.Contains(s, "href=") || strings.Contains(s, "src=") {
		t.Error("page refers to something outside itself")
	}
	// Every SVG is well-formed XML.
	for rest := s; ; {
		i := strings.Index(rest, "<svg")
		if i < 0 {
			break
		}
		j := strings.Index(rest[i:], "</svg>")
		dec := xml.NewDecoder(strings.NewReader(rest[i : i+j+6]))
		for {
			if _, err := dec.Token(); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("SVG not well-formed: %v", err)
			}
		}
		rest = rest[i+j:]
	}
}

func TestKVHTMLInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		pic  KVPicture
	}{
		{"lengths differ", KVPicture{Series: []KVSeries{{T: []float64{0, 1}, Held: []uint64{1}, Batch: []float64{1, 2}}}}},
		{"time goes back", KVPicture{Series: []KVSeries{{T: []float64{1, 0}, Held: []uint64{1, 1}, Batch: []float64{1, 1}}}}},
		{"NaN batch", KVPicture{Series: []KVSeries{{T: []float64{0}, Held: []uint64{1}, Batch: []float64{math.NaN()}}}}},
		{"too many series", KVPicture{Series: make([]KVSeries, maxKVSeries+1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := KVHTML(&bytes.Buffer{}, tc.pic); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
	if err := KVHTML(&bytes.Buffer{}, KVPicture{Series: []KVSeries{{Name: "empty"}}}); err != nil {
		t.Fatal(err)
	}
}

func TestKVHTMLGolden(t *testing.T) {
	pic := KVPicture{
		Title:       "kv simulate: golden",
		Notes:       []string{"two policies"},
		BudgetBytes: 4 << 30,
		Series: []KVSeries{
			{Name: "paged", T: []float64{0, 0.5, 1, 2}, Held: []uint64{0, 3 << 30, 4 << 30, 1 << 30}, Batch: []float64{1, 60, 120, 8}},
			{Name: "contiguous", T: []float64{0, 1, 3}, Held: []uint64{2 << 30, 4 << 30, 4 << 30}, Batch: []float64{2, 4, 4}},
		},
	}
	var buf bytes.Buffer
	if err := KVHTML(&buf, pic); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "kv_small.golden")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./viz -update to create it)", err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("page differs from %s (run go test ./viz -update after checking the change)", golden)
	}
}
