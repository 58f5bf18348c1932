package viz

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// small is MiniMalloc's README example planned at its lower bound, plus a
// long-named buffer and a tiny one.
func small() PlanPicture {
	return PlanPicture{
		Title: "example: 6 buffers, arena 16 B, lower bound 12 B",
		Rects: []PlanRect{
			{Label: "b1 has a name too long for its width", Start: 0, End: 3, Offset: 8, Size: 4},
			{Label: "b2", Start: 3, End: 9, Offset: 8, Size: 4},
			{Label: "b3", Start: 0, End: 9, Offset: 4, Size: 4},
			{Label: "b4", Start: 9, End: 21, Offset: 4, Size: 4},
			{Label: "b5 a rather long tensor name that cannot fit", Start: 0, End: 21, Offset: 0, Size: 4},
			{Label: "tiny<&>", Start: 12, End: 13, Offset: 12, Size: 4},
		},
		LowerBoundBytes: 12,
		ArenaBytes:      16,
		CapacityBytes:   20,
	}
}

func TestPlanSVGGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := PlanSVG(&buf, small()); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "plan_small.golden")
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
		t.Errorf("SVG differs from %s (run go test ./viz -update after checking the change)", golden)
	}
}

// wellFormed parses the SVG as XML and counts elements by name.
func wellFormed(t *testing.T, svg []byte) map[string]int {
	t.Helper()
	count := map[string]int{}
	d := xml.NewDecoder(bytes.NewReader(svg))
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return count
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			count[se.Name.Local]++
		}
	}
}

func TestPlanSVGContent(t *testing.T) {
	var buf bytes.Buffer
	if err := PlanSVG(&buf, small()); err != nil {
		t.Fatal(err)
	}
	svg := buf.String()
	n := wellFormed(t, buf.Bytes())
	// 2 background/plot frames + one per buffer.
	if n["rect"] != 2+6 || n["title"] != 6 {
		t.Errorf("%d rects and %d titles, want 8 and 6", n["rect"], n["title"])
	}
	for _, want := range []string{
		"lower bound 12 B", "arena 16 B", "capacity 20 B", // the three lines, labelled
		"tiny&lt;&amp;&gt;", // escaped
		"b3\n4 B (4 bytes)\nlive [0, 9)\noffset 4 (4 B)", // a tooltip
		"op index", "offset (down)",
		"…", // the long name is cut where it is written inside its rectangle
	} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	if strings.Contains(svg, "<script") {
		t.Error("SVG has a script")
	}
}

// TestPlanSVGLarge draws 2000 buffers: every one gets a rectangle and a
// tooltip, but only the few large ones get a label, and the file stays
// small enough to open.
func TestPlanSVGLarge(t *testing.T) {
	p := PlanPicture{Title: "large", LowerBoundBytes: 1 << 30, ArenaBytes: 1<<30 + 1<<28}
	for i := range 2000 {
		size := uint64(1 << 16)
		if i%500 == 0 {
			size = 1 << 28
		}
		p.Rects = append(p.Rects, PlanRect{Label: fmt.Sprint("t", i), Start: i, End: i + 300, Offset: uint64(i%64) << 24, Size: size})
	}
	var buf bytes.Buffer
	if err := PlanSVG(&buf, p); err != nil {
		t.Fatal(err)
	}
	n := wellFormed(t, buf.Bytes())
	if n["title"] != 2000 {
		t.Errorf("%d tooltips, want 2000", n["title"])
	}
	labels := strings.Count(buf.String(), `pointer-events="none"`)
	if labels == 0 || labels > 10 {
		t.Errorf("%d labels inside rectangles, want the few large ones", labels)
	}
	if buf.Len() > 600<<10 {
		t.Errorf("%d bytes for 2000 buffers", buf.Len())
	}
	if !strings.Contains(buf.String(), "GiB</text>") {
		t.Error("y axis not in GiB")
	}
}

func TestPlanSVGErrors(t *testing.T) {
	tests := []struct {
		name string
		p    PlanPicture
		want string
	}{
		{"empty lifetime", PlanPicture{Rects: []PlanRect{{Label: "x", Start: 4, End: 4, Size: 1}}}, `rectangle 0 ("x"): lifetime [4, 4) is empty`},
		{"overflow", PlanPicture{Rects: []PlanRect{{Label: "y", Start: 0, End: 1, Offset: 1 << 63, Size: 1 << 63}}}, "overflows"},
		{"too many", PlanPicture{Rects: make([]PlanRect, MaxPlanRects+1)}, "more than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := PlanSVG(&buf, tc.p)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tc.want)
			}
			if buf.Len() != 0 {
				t.Error("wrote output for an invalid picture")
			}
		})
	}
}

// TestPlanSVGLabelsApart checks that the labels of lines at the same
// offset (an arena at the lower bound) do not overprint.
func TestPlanSVGLabelsApart(t *testing.T) {
	p := PlanPicture{LowerBoundBytes: 1 << 20, ArenaBytes: 1 << 20,
		Rects: []PlanRect{{Label: "a", Start: 0, End: 2, Size: 1 << 20}}}
	var buf bytes.Buffer
	if err := PlanSVG(&buf, p); err != nil {
		t.Fatal(err)
	}
	var ys []float64
	for _, line := range strings.Split(buf.String(), "\n") {
		if strings.Contains(line, "1.0 MiB</text>") && strings.Contains(line, "fill=") {
			var y float64
			if _, err := fmt.Sscanf(line[strings.Index(line, ` y="`)+4:], "%g", &y); err != nil {
				t.Fatal(err)
			}
			ys = append(ys, y)
		}
	}
	if len(ys) != 2 || ys[1]-ys[0] < labelFontPx {
		t.Errorf("label positions %v, want two at least %d px apart", ys, labelFontPx)
	}
}

func TestPlanSVGEmpty(t *testing.T) {
	var buf bytes.Buffer
	if err := PlanSVG(&buf, PlanPicture{}); err != nil {
		t.Fatal(err)
	}
	wellFormed(t, buf.Bytes())
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	if f.n -= len(p); f.n < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

func TestPlanSVGWriteError(t *testing.T) {
	p := small()
	for i := range 300 {
		p.Rects = append(p.Rects, PlanRect{Label: "r", Start: i, End: i + 1, Size: 1})
	}
	err := PlanSVG(&failWriter{n: 1000}, p)
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("err = %v, want the write error", err)
	}
}

func TestNiceTicks(t *testing.T) {
	tests := []struct {
		lo, hi float64
		n      int
		want   string
	}{
		{0, 209, 10, "[0 20 40 60 80 100 120 140 160 180 200]"},
		{0, 1.04, 8, "[0 0.1 0.2 0.3 0.4 0.5 0.6 0.7 0.8 0.9 1]"},
		{0, 20.8, 8, "[0 2 4 6 8 10 12 14 16 18 20]"},
		{0, 3.3e9, 8, "[0 5e+08 1e+09 1.5e+09 2e+09 2.5e+09 3e+09]"},
		{5, 5, 10, "[5]"},
	}
	for _, tc := range tests {
		if got := fmt.Sprint(niceTicks(tc.lo, tc.hi, tc.n)); got != tc.want {
			t.Errorf("niceTicks(%v, %v, %d) = %s, want %s", tc.lo, tc.hi, tc.n, got, tc.want)
		}
	}
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1 << 20: "1.0 MiB", 3 << 29: "1.5 GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
