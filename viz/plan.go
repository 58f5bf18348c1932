// Package viz draws memwall's plans and memory maps as self-contained SVG:
// no scripts, no external fonts or styles, readable in a browser or an image
// viewer. It knows nothing about the packages whose data it draws; callers
// fill its picture types.
package viz

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// ErrInvalid marks a picture PlanSVG refuses to draw; its errors wrap it and
// name the rectangle at fault.
var ErrInvalid = errors.New("invalid picture")

// MaxPlanRects is the most rectangles PlanSVG draws (each costs ~200 bytes
// of output).
const MaxPlanRects = 1 << 18

// PlanPicture is an offset plan drawn as in the seed's Figure 1: time (the
// step, i.e. the op index) across, offset down, one rectangle per buffer.
type PlanPicture struct {
	Title  string // first line at the top; may be empty
	XLabel string // the time axis' title; "" means "op index"
	Rects  []PlanRect
	// LowerBoundBytes and ArenaBytes are drawn as horizontal lines when
	// non-zero; CapacityBytes too (a dotted line), when set.
	LowerBoundBytes uint64
	ArenaBytes      uint64
	CapacityBytes   uint64
}

// PlanRect is one buffer: Size bytes at Offset, live on steps [Start, End).
type PlanRect struct {
	Label  string // names shown in the tooltip (and inside, when it fits)
	Start  int
	End    int
	Offset uint64
	Size   uint64
}

// Layout of the picture, in pixels.
const (
	planWidth   = 1400
	planHeight  = 820
	plotLeft    = 92
	plotRight   = 150 // room for the line labels
	plotTop     = 48
	plotBottom  = 56
	labelFontPx = 11
)

// PlanSVG writes p as one SVG document to w. Each rectangle carries a
// <title> tooltip (label, size, lifetime, offset); labels are written inside
// rectangles only where they fit, so 1000+ buffers stay readable. Colours
// come from a hash of the label, so a tensor keeps its colour across
// pictures. It returns an error wrapping ErrInvalid for a rectangle with an
// empty lifetime or too many rectangles (nothing is written then), or the
// first write error.
func PlanSVG(w io.Writer, p PlanPicture) error {
	if len(p.Rects) > MaxPlanRects {
		return fmt.Errorf("viz plan: %d rectangles, more than %d: %w", len(p.Rects), MaxPlanRects, ErrInvalid)
	}
	t0, t1 := 0, 1
	var top uint64
	for i, r := range p.Rects {
		if r.End <= r.Start {
			return fmt.Errorf("viz plan: rectangle %d (%q): lifetime [%d, %d) is empty: %w", i, r.Label, r.Start, r.End, ErrInvalid)
		}
		if r.Offset > math.MaxUint64-r.Size {
			return fmt.Errorf("viz plan: rectangle %d (%q): offset %d + size %d overflows: %w", i, r.Label, r.Offset, r.Size, ErrInvalid)
		}
		if i == 0 {
			t0, t1 = r.Start, r.End
		}
		t0, t1 = min(t0, r.Start), max(t1, r.End)
		top = max(top, r.Offset+r.Size)
	}
	top = max(top, p.LowerBoundBytes, p.ArenaBytes, p.CapacityBytes, 1)
	ymax := float64(top) * 1.04

	pw := float64(planWidth - plotLeft - plotRight)
	ph := float64(planHeight - plotTop - plotBottom)
	sx := func(t int) float64 { return plotLeft + pw*float64(t-t0)/float64(t1-t0) }
	sy := func(b uint64) float64 { return plotTop + ph*float64(b)/ymax }

	bw := &errWriter{w: bufio.NewWriter(w)}
	bw.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="%d">`+"\n",
		planWidth, planHeight, planWidth, planHeight, labelFontPx)
	bw.printf(`<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", planWidth, planHeight)
	if p.Title != "" {
		bw.printf(`<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", plotLeft, esc(p.Title))
	}
	bw.printf(`<rect x="%d" y="%d" width="%s" height="%s" fill="#f7f7f7" stroke="#999999" stroke-width="0.5"/>`+"\n",
		plotLeft, plotTop, num(pw), num(ph))

	// Grid and axes.
	xlabel := p.XLabel
	if xlabel == "" {
		xlabel = "op index"
	}
	for _, t := range niceTicks(float64(t0), float64(t1), 10) {
		x := sx(int(t))
		bw.printf(`<line x1="%s" y1="%d" x2="%s" y2="%s" stroke="#e0e0e0" stroke-width="0.5"/>`+"\n", num(x), plotTop, num(x), num(plotTop+ph))
		bw.printf(`<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", num(x), num(plotTop+ph+16), strconv.Itoa(int(t)))
	}
	bw.printf(`<text x="%s" y="%d" text-anchor="middle">%s</text>`+"\n", num(plotLeft+pw/2), planHeight-14, esc(xlabel))
	unit, uname := byteUnit(ymax)
	for _, v := range niceTicks(0, ymax/unit, 8) {
		y := sy(uint64(v * unit))
		bw.printf(`<line x1="%d" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0" stroke-width="0.5"/>`+"\n", plotLeft, num(y), num(plotLeft+pw), num(y))
		bw.printf(`<text x="%d" y="%s" text-anchor="end" dominant-baseline="middle">%s %s</text>`+"\n", plotLeft-6, num(y), num(v), uname)
	}
	bw.printf(`<text transform="translate(18 %s) rotate(-90)" text-anchor="middle">offset (down)</text>`+"\n", num(plotTop+ph/2))

	// Buffers: thin outlines, at least half a pixel each way so tiny ones
	// still show.
	bw.printf(`<g stroke="#333333" stroke-width="0.25">` + "\n")
	for _, r := range p.Rects {
		x, y := sx(r.Start), sy(r.Offset)
		rw, rh := max(sx(r.End)-x, 0.5), max(sy(r.Offset+r.Size)-y, 0.5)
		// Outlines would blacken slivers: only rectangles of some size
		// get one.
		stroke := ""
		if rw < 2 || rh < 2 {
			stroke = ` stroke="none"`
		}
		bw.printf(`<rect x="%s" y="%s" width="%s" height="%s" fill="%s"%s><title>%s</title></rect>`+"\n",
			num(x), num(y), num(rw), num(rh), colour(r.Label), stroke, esc(tooltip(r)))
	}
	bw.printf("</g>\n")
	// Labels where they fit, above every rectangle.
	for _, r := range p.Rects {
		x, y := sx(r.Start), sy(r.Offset)
		rw, rh := sx(r.End)-x, sy(r.Offset+r.Size)-y
		if rh < labelFontPx+3 || rw < 60 {
			continue
		}
		text := []rune(r.Label)
		if fit := int((rw - 6) / (0.6 * labelFontPx)); len(text) > fit {
			if fit < 4 {
				continue
			}
			text = append(text[:fit-1], '…')
		}
		bw.printf(`<text x="%s" y="%s" dominant-baseline="middle" pointer-events="none">%s</text>`+"\n",
			num(x+3), num(y+rh/2), esc(string(text)))
	}

	// The lines the plan is judged by, labelled at the right; labels of
	// lines closer than a text line are pushed apart, in order of offset.
	type mark struct {
		bytes             uint64
		colour, dash, txt string
		y, labelY         float64
	}
	var marks []mark
	for _, m := range []mark{
		{bytes: p.LowerBoundBytes, colour: "#c62828", dash: ` stroke-dasharray="6 4"`, txt: "lower bound"},
		{bytes: p.ArenaBytes, colour: "#1565c0", txt: "arena"},
		{bytes: p.CapacityBytes, colour: "#666666", dash: ` stroke-dasharray="2 3"`, txt: "capacity"},
	} {
		if m.bytes > 0 {
			m.y = sy(m.bytes)
			marks = append(marks, m)
		}
	}
	slices.SortStableFunc(marks, func(a, b mark) int { return cmp.Compare(a.y, b.y) })
	for i := range marks {
		marks[i].labelY = marks[i].y
		if i > 0 {
			marks[i].labelY = max(marks[i].y, marks[i-1].labelY+labelFontPx+2)
		}
	}
	for _, m := range marks {
		bw.printf(`<line x1="%d" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="1.5"%s/>`+"\n",
			plotLeft, num(m.y), num(plotLeft+pw), num(m.y), m.colour, m.dash)
		bw.printf(`<text x="%s" y="%s" fill="%s" dominant-baseline="middle">%s %s</text>`+"\n",
			num(plotLeft+pw+6), num(m.labelY), m.colour, m.txt, esc(humanBytes(m.bytes)))
	}
	bw.printf("</svg>\n")
	if bw.err == nil {
		bw.err = bw.w.Flush()
	}
	if bw.err != nil {
		return fmt.Errorf("viz plan: %w", bw.err)
	}
	return nil
}

// tooltip is a rectangle's <title>: label, size, lifetime, offset.
func tooltip(r PlanRect) string {
	label := r.Label
	if label == "" {
		label = "(unnamed)"
	}
	return fmt.Sprintf("%s\n%s (%d bytes)\nlive [%d, %d)\noffset %d (%s)", label, humanBytes(r.Size), r.Size, r.Start, r.End, r.Offset, humanBytes(r.Offset))
}

// colour picks a fill from a hash of the label: a hue at fixed saturation
// (55%) and lightness (70%), so neighbours differ and text on top stays
// readable. It is written as #rrggbb, which every SVG renderer reads.
func colour(label string) string {
	h := fnv.New32a()
	h.Write([]byte(label))
	hue := float64(h.Sum32()%360) / 60
	const s, l = 0.55, 0.70
	c := (1 - math.Abs(2*l-1)) * s
	x := c * (1 - math.Abs(math.Mod(hue, 2)-1))
	var r, g, b float64
	switch int(hue) {
	case 0:
		r, g = c, x
	case 1:
		r, g = x, c
	case 2:
		g, b = c, x
	case 3:
		g, b = x, c
	case 4:
		r, b = x, c
	default:
		r, b = c, x
	}
	m := l - c/2
	to := func(v float64) int { return int(math.Round((v + m) * 255)) }
	return fmt.Sprintf("#%02x%02x%02x", to(r), to(g), to(b))
}

// byteUnit picks a binary unit for an axis running to max bytes.
func byteUnit(max float64) (float64, string) {
	switch {
	case max >= 1<<30:
		return 1 << 30, "GiB"
	case max >= 1<<20:
		return 1 << 20, "MiB"
	case max >= 1<<10:
		return 1 << 10, "KiB"
	}
	return 1, "B"
}

// niceTicks returns round values (1, 2 or 5 times a power of ten apart,
// the step nearest span/n) covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	span := hi - lo
	if span <= 0 || n <= 0 {
		return []float64{lo}
	}
	raw := span / float64(n)
	exp := math.Floor(math.Log10(raw))
	pow := math.Pow(10, exp)
	best := 1.0
	for _, m := range []float64{2, 5, 10} {
		if math.Abs(m*pow-raw) < math.Abs(best*pow-raw) {
			best = m
		}
	}
	step := best * pow
	// Values are k*best*10^exp; dividing by 10^-exp when exp < 0 keeps
	// decimals such as 0.6 exact to the last bit.
	value := func(k float64) float64 {
		if exp < 0 {
			return k * best / math.Pow(10, -exp)
		}
		return k * step
	}
	var out []float64
	for k := math.Ceil(lo / step); value(k) <= hi+step*1e-9; k++ {
		out = append(out, value(k))
	}
	return out
}

// humanBytes formats a byte count with binary units ("1.5 MiB").
func humanBytes(n uint64) string {
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	v, units := float64(n), "KMGTPE"
	i := -1
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " " + units[i:i+1] + "iB"
}

// num formats a coordinate with at most two decimals and no trailing zeros.
func num(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		return "0"
	}
	return s
}

var xmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;")

// esc escapes text for SVG content and attributes, dropping characters XML
// does not allow (control characters; invalid UTF-8 reads as U+FFFD).
func esc(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r == '\t' || r == '\n' || r == '\r',
			r >= 0x20 && r <= 0xD7FF,
			r >= 0xE000 && r <= 0xFFFD,
			r >= 0x10000 && r <= 0x10FFFF:
			return r
		}
		return -1
	}, s)
	return xmlEscaper.Replace(s)
}

// errWriter keeps the first write error so drawing code can ignore them.
type errWriter struct {
	w   *bufio.Writer
	err error
}

func (e *errWriter) printf(format string, a ...any) {
	if e.err != nil {
		return
	}
	_, e.err = fmt.Fprintf(e.w, format, a...)
}
