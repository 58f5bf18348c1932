package viz

import (
	"bufio"
	"fmt"
	"io"
)

// ReplayPicture is what ReplayHTML draws: for each pool configuration, its
// live and reserved bytes over a trace's replay, and the address space of
// one configuration at the peak.
type ReplayPicture struct {
	Title string
	// Notes are lines of text shown under the title (figures, PyTorch's
	// numbers).
	Notes  []string
	Series []ReplaySeries
	Map    *ReplayMap
}

// ReplaySeries is one configuration's timeline. X, Live and Reserved have
// the same length; X is increasing (an op index).
type ReplaySeries struct {
	Name     string
	X        []float64
	Live     []uint64
	Reserved []uint64
}

// ReplayMap is an address space at one moment: Reserved ranges (memory
// held) and live Blocks, as offsets from the lowest reserved address.
// Reserved bytes no block covers are holes.
type ReplayMap struct {
	Name string
	// Heading replaces the heading "address space at the peak: Name"
	// (an out-of-memory snapshot's map is at its failure).
	Heading  string
	Reserved []ReplaySpan
	Blocks   []ReplaySpan
}

// ReplaySpan is a range of bytes.
type ReplaySpan struct {
	Off, Size uint64
}

// Limits on what ReplayHTML accepts, so a page stays readable and bounded.
const (
	maxReplaySeries = 64
	maxReplayPoints = 100000
	maxReplaySpans  = 1 << 20
)

// ReplayHTML writes one self-contained HTML page (inline SVG, no scripts,
// no external assets) with a live-vs-reserved chart per series and the
// address map. It returns ErrInvalid (wrapped) for mismatched series
// lengths or more series, points or spans than it draws, and the first
// write error otherwise.
func ReplayHTML(w io.Writer, p ReplayPicture) error {
	if len(p.Series) > maxReplaySeries {
		return fmt.Errorf("%w: %d series (at most %d)", ErrInvalid, len(p.Series), maxReplaySeries)
	}
	for _, s := range p.Series {
		if len(s.X) != len(s.Live) || len(s.X) != len(s.Reserved) {
			return fmt.Errorf("%w: series %q: %d x values, %d live, %d reserved", ErrInvalid, s.Name, len(s.X), len(s.Live), len(s.Reserved))
		}
		if len(s.X) > maxReplayPoints {
			return fmt.Errorf("%w: series %q: %d points (at most %d)", ErrInvalid, s.Name, len(s.X), maxReplayPoints)
		}
	}
	if m := p.Map; m != nil && len(m.Reserved)+len(m.Blocks) > maxReplaySpans {
		return fmt.Errorf("%w: address map: %d spans (at most %d)", ErrInvalid, len(m.Reserved)+len(m.Blocks), maxReplaySpans)
	}
	bw := bufio.NewWriter(w)
	e := &errWriter{w: bw}
	e.printf("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>%s</title>\n", esc(p.Title))
	e.printf("<style>body{font:14px system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px}h2{font-size:16px;margin:24px 0 4px}" +
		"p{margin:2px 0}.k{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}</style></head><body>\n")
	e.printf("<h1>%s</h1>\n", esc(p.Title))
	for _, n := range p.Notes {
		e.printf("<p>%s</p>\n", esc(n))
	}
	// One scale for all charts, so configurations compare at a glance.
	var ymax uint64
	for _, s := range p.Series {
		for i := range s.X {
			ymax = max(ymax, s.Live[i], s.Reserved[i])
		}
	}
	e.printf("<p><span class=\"k\" style=\"background:#d9534f\"></span>reserved<span class=\"k\" style=\"background:#337ab7\"></span>live</p>\n")
	for _, s := range p.Series {
		e.printf("<h2>%s</h2>\n", esc(s.Name))
		timeline(e, s, ymax)
	}
	if p.Map != nil {
		if p.Map.Heading != "" {
			e.printf("<h2>%s</h2>\n", esc(p.Map.Heading))
		} else {
			e.printf("<h2>address space at the peak: %s</h2>\n", esc(p.Map.Name))
		}
		e.printf("<p><span class=\"k\" style=\"background:#337ab7\"></span>live block<span class=\"k\" style=\"background:#f0ad4e\"></span>reserved, free (hole)<span class=\"k\" style=\"background:#eee;border:1px solid #ccc\"></span>not reserved</p>\n")
		addressMap(e, p.Map)
	}
	e.printf("</body></html>\n")
	if e.err != nil {
		return e.err
	}
	return bw.Flush()
}

// timeline draws one series: reserved and live as step areas.
func timeline(e *errWriter, s ReplaySeries, ymax uint64) {
	const W, H, L, B = 900.0, 180.0, 70.0, 20.0
	e.printf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%s\" height=\"%s\" viewBox=\"0 0 %s %s\">\n", num(W+L+10), num(H+B+10), num(W+L+10), num(H+B+10))
	if len(s.X) == 0 || ymax == 0 {
		e.printf("<text x=\"%s\" y=\"20\">no data</text></svg>\n", num(L))
		return
	}
	x0, x1 := s.X[0], s.X[len(s.X)-1]
	if x1 <= x0 {
		x1 = x0 + 1
	}
	unit, uname := byteUnit(float64(ymax))
	fx := func(x float64) float64 { return L + (x-x0)/(x1-x0)*W }
	fy := func(v uint64) float64 { return 5 + H - float64(v)/float64(ymax)*H }
	for _, t := range niceTicks(0, float64(ymax)/unit, 4) {
		y := 5 + H - t*unit/float64(ymax)*H
		e.printf("<line x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"#ddd\"/><text x=\"%s\" y=\"%s\" font-size=\"11\" text-anchor=\"end\">%s %s</text>\n",
			num(L), num(L+W), num(y), num(y), num(L-4), num(y+4), num(t), uname)
	}
	area := func(vals []uint64, colour string) {
		e.printf("<path fill=\"%s\" fill-opacity=\"0.55\" d=\"M%s,%s", colour, num(fx(s.X[0])), num(fy(0)))
		for i := range s.X {
			e.printf("L%s,%s", num(fx(s.X[i])), num(fy(vals[i])))
		}
		e.printf("L%s,%sZ\"/>\n", num(fx(s.X[len(s.X)-1])), num(fy(0)))
	}
	area(s.Reserved, "#d9534f")
	area(s.Live, "#337ab7")
	e.printf("<text x=\"%s\" y=\"%s\" font-size=\"11\">op %s</text><text x=\"%s\" y=\"%s\" font-size=\"11\" text-anchor=\"end\">op %s</text>\n",
		num(L), num(H+B+2), num(x0), num(L+W), num(H+B+2), num(x1))
	e.printf("</svg>\n")
}

// addressMap draws the address space as rows of equal byte width: first
// not reserved (grey), reserved ranges (orange holes), live blocks (blue).
func addressMap(e *errWriter, m *ReplayMap) {
	var end uint64
	for _, r := range m.Reserved {
		end = max(end, r.Off+r.Size)
	}
	for _, b := range m.Blocks {
		end = max(end, b.Off+b.Size)
	}
	const W, rows, rowH = 900.0, 16, 18.0
	if end == 0 {
		e.printf("<p>nothing reserved</p>\n")
		return
	}
	per := (end + rows - 1) / rows // bytes per row
	H := rows*rowH + 4
	e.printf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%s\" height=\"%s\" viewBox=\"0 0 %s %s\">\n", num(W+130), num(H), num(W+130), num(H))
	for r := 0; r < rows; r++ {
		y := float64(r) * rowH
		e.printf("<rect x=\"120\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"#eee\"/><text x=\"114\" y=\"%s\" font-size=\"11\" text-anchor=\"end\">+%s</text>\n",
			num(y), num(W), num(rowH-3), num(y+12), esc(humanBytes(uint64(r)*per)))
	}
	span := func(sp ReplaySpan, fill, tip string) {
		for off, stop := sp.Off, sp.Off+sp.Size; off < stop; {
			r := off / per
			rowEnd := min(stop, (r+1)*per)
			x := 120 + float64(off-r*per)/float64(per)*W
			w := max(float64(rowEnd-off)/float64(per)*W, 0.5)
			e.printf("<rect x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"%s\"><title>%s</title></rect>\n",
				num(x), num(float64(r)*rowH), num(w), num(rowH-3), fill, esc(tip))
			off = rowEnd
		}
	}
	for _, sp := range m.Reserved {
		span(sp, "#f0ad4e", fmt.Sprintf("reserved +%s, %s", humanBytes(sp.Off), humanBytes(sp.Size)))
	}
	for _, sp := range m.Blocks {
		span(sp, "#337ab7", fmt.Sprintf("block +%s, %s", humanBytes(sp.Off), humanBytes(sp.Size)))
	}
	e.printf("</svg>\n")
}
