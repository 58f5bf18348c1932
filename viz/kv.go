package viz

import (
	"bufio"
	"fmt"
	"io"
	"math"
)

// KVPicture is what KVHTML draws: for each KV policy (paged, contiguous),
// the K/V memory it holds and its batch size over simulated time, against
// the KV budget.
type KVPicture struct {
	Title string
	// Notes are lines of text shown under the title.
	Notes []string
	// BudgetBytes, when set, is drawn as a line on the memory chart.
	BudgetBytes uint64
	Series      []KVSeries
}

// KVSeries is one policy's timeline. T (seconds, non-decreasing), Held and
// Batch have the same length.
type KVSeries struct {
	Name  string
	T     []float64
	Held  []uint64
	Batch []float64
}

const (
	maxKVSeries = 16
	maxKVPoints = 100000
)

var kvColours = []string{"#337ab7", "#d9534f", "#5cb85c", "#f0ad4e", "#8e44ad", "#555"}

// KVHTML writes one self-contained HTML page (inline SVG, no scripts, no
// external assets): K/V memory held over time and batch size over time,
// every policy on the same two charts. It returns ErrInvalid (wrapped) for
// mismatched lengths, non-finite or decreasing times, too many series or
// points, and the first write error otherwise.
func KVHTML(w io.Writer, p KVPicture) error {
	if len(p.Series) > maxKVSeries {
		return fmt.Errorf("%w: %d series (at most %d)", ErrInvalid, len(p.Series), maxKVSeries)
	}
	var tmax, bmax float64
	ymax := p.BudgetBytes
	for _, s := range p.Series {
		if len(s.T) != len(s.Held) || len(s.T) != len(s.Batch) {
			return fmt.Errorf("%w: series %q: %d times, %d held, %d batch", ErrInvalid, s.Name, len(s.T), len(s.Held), len(s.Batch))
		}
		if len(s.T) > maxKVPoints {
			return fmt.Errorf("%w: series %q: %d points (at most %d)", ErrInvalid, s.Name, len(s.T), maxKVPoints)
		}
		for i, t := range s.T {
			if math.IsNaN(t) || math.IsInf(t, 0) || t < 0 || (i > 0 && t < s.T[i-1]) || math.IsNaN(s.Batch[i]) || math.IsInf(s.Batch[i], 0) || s.Batch[i] < 0 {
				return fmt.Errorf("%w: series %q: point %d (t %v, batch %v) not finite, negative or out of order", ErrInvalid, s.Name, i, t, s.Batch[i])
			}
			tmax = max(tmax, t)
			bmax = max(bmax, s.Batch[i])
			ymax = max(ymax, s.Held[i])
		}
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
	e.printf("<p>")
	for i, s := range p.Series {
		e.printf("<span class=\"k\" style=\"background:%s\"></span>%s", kvColours[i%len(kvColours)], esc(s.Name))
	}
	if p.BudgetBytes > 0 {
		e.printf("<span class=\"k\" style=\"background:#999\"></span>KV budget")
	}
	e.printf("</p>\n<h2>K/V memory held</h2>\n")
	kvChart(e, p.Series, tmax, float64(ymax), true, float64(p.BudgetBytes))
	e.printf("<h2>sequences per step (batch)</h2>\n")
	kvChart(e, p.Series, tmax, bmax, false, 0)
	e.printf("</body></html>\n")
	if e.err != nil {
		return e.err
	}
	return bw.Flush()
}

// kvChart draws every series as a line over [0, tmax] × [0, ymax]; bytes
// picks the byte axis (Held) over the plain one (Batch).
func kvChart(e *errWriter, series []KVSeries, tmax, ymax float64, bytes bool, budget float64) {
	const W, H, L, B = 900.0, 200.0, 70.0, 20.0
	e.printf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%s\" height=\"%s\" viewBox=\"0 0 %s %s\">\n", num(W+L+10), num(H+B+10), num(W+L+10), num(H+B+10))
	if ymax <= 0 || len(series) == 0 {
		e.printf("<text x=\"%s\" y=\"20\">no data</text></svg>\n", num(L))
		return
	}
	if tmax <= 0 {
		tmax = 1
	}
	fx := func(t float64) float64 { return L + t/tmax*W }
	fy := func(v float64) float64 { return 5 + H - v/ymax*H }
	unit, uname := 1.0, ""
	if bytes {
		unit, uname = byteUnit(ymax)
		uname = " " + uname
	}
	for _, t := range niceTicks(0, ymax/unit, 4) {
		y := fy(t * unit)
		e.printf("<line x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"#ddd\"/><text x=\"%s\" y=\"%s\" font-size=\"11\" text-anchor=\"end\">%s%s</text>\n",
			num(L), num(L+W), num(y), num(y), num(L-4), num(y+4), num(t), uname)
	}
	for _, t := range niceTicks(0, tmax, 6) {
		x := fx(t)
		e.printf("<line x1=\"%s\" x2=\"%s\" y1=\"5\" y2=\"%s\" stroke=\"#eee\"/><text x=\"%s\" y=\"%s\" font-size=\"11\" text-anchor=\"middle\">%s s</text>\n",
			num(x), num(x), num(5+H), num(x), num(H+B+2), num(t))
	}
	if budget > 0 {
		e.printf("<line x1=\"%s\" x2=\"%s\" y1=\"%s\" y2=\"%s\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>\n", num(L), num(L+W), num(fy(budget)), num(fy(budget)))
	}
	for i, s := range series {
		if len(s.T) == 0 {
			continue
		}
		e.printf("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", kvColours[i%len(kvColours)])
		for j, t := range s.T {
			v := s.Batch[j]
			if bytes {
				v = float64(s.Held[j])
			}
			e.printf("%s,%s ", num(fx(t)), num(fy(v)))
		}
		e.printf("\"/>\n")
	}
	e.printf("</svg>\n")
}
