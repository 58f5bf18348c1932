package kernels

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
)

// groupShapes are the products that decode groups, K = 4096: q/k/v of
// Llama-3-8B (8 kv heads) and Llama-2-7B, gate/up of both.
var groupShapes = [][]uint32{{4096, 1024, 1024}, {4096, 4096, 4096}, {14336, 14336}, {11008, 11008}}

// groupWork is T = 1 products of Ms (K columns each, sharing X), bf16,
// over enough copies of their weights (≥ 768 MiB, at most 64) that each
// call reads them cold, as decode reads a model's layers.
type groupWork struct {
	Ms     []uint32
	K      uint32
	tm     *timer
	x      device.Ptr
	copies [][]MatmulOp
	all    []device.Ptr
	bytes  float64 // weights, X and Y per call
	i      int
}

func newGroupWork(t *testing.T, d device.Device, tm *timer, Ms []uint32, K uint32) *groupWork {
	var total uint64
	for _, M := range Ms {
		total += uint64(M) * uint64(K) * 2
	}
	w := &groupWork{Ms: Ms, K: K, tm: tm, copies: make([][]MatmulOp, min(64, max(1, int((768<<20)/total))))}
	get := func(n uint64, fill bool) device.Ptr {
		p := rawAlloc(t, d, n)
		w.all = append(w.all, p)
		if fill {
			must(t, d.Memset8(p, 0x3c, n, tm.st))
		}
		return p
	}
	for c := range w.copies {
		for _, M := range Ms {
			w.copies[c] = append(w.copies[c], MatmulOp{W: get(uint64(M)*uint64(K)*2, true), Y: get(4*uint64(M), false), M: M})
		}
	}
	w.x = get(uint64(K)*2, true)
	w.bytes = float64(total + uint64(K)*2)
	return w
}

// name is the products' shape, "M1+M2+...,K".
func (w *groupWork) name() string {
	var ms []string
	for _, M := range w.Ms {
		ms = append(ms, fmt.Sprint(M))
	}
	return fmt.Sprintf("%s,%d", strings.Join(ms, "+"), w.K)
}

// grouped queues the next copy's products as one MatmulGroup on s.
func (w *groupWork) grouped(s *Set) error {
	ops := w.copies[w.i%len(w.copies)]
	w.i++
	return s.MatmulGroup(BF16, w.x, w.K, 1, ops, w.tm.st)
}

// separate queues the next copy's products as one Matmul each on s.
func (w *groupWork) separate(s *Set) error {
	ops := w.copies[w.i%len(w.copies)]
	w.i++
	for _, op := range ops {
		if err := s.Matmul(BF16, op.W, w.x, op.Y, op.M, w.K, 1, w.tm.st); err != nil {
			return err
		}
	}
	return nil
}

// free frees the products' buffers.
func (w *groupWork) free() {
	for _, p := range w.all {
		w.tm.d.Free(p)
	}
}

// abOrder is the order an A/B comparison times its two launches in, as
// pairs: A then B, B then A, B then A, A then B (ABBA BAAB). Each launch
// goes first in half the pairs, and a drift over the run (clocks,
// temperature, L2 state) that is linear or quadratic in time cancels from
// the means, while a difference between the orders shows it.
var abOrder = [...]bool{false, true, true, false, true, false, false, true}

// abResult summarizes the samples of an A/B comparison taken in abOrder
// (pct[i] is sample i, launch B where abOrder[i]): each launch's mean, and
// the mean gain of B over A in the pairs where A ran first and in those
// where B did.
type abResult struct {
	A, B                   float64
	GainAFirst, GainBFirst float64
}

func summarizeAB(pct [len(abOrder)]float64) abResult {
	var r abResult
	var nA, nB float64
	for p := 0; p < len(abOrder); p += 2 {
		a, b := pct[p], pct[p+1]
		if abOrder[p] { // B first
			a, b = b, a
			r.GainBFirst += b - a
			nB++
		} else {
			r.GainAFirst += b - a
			nA++
		}
		r.A += a
		r.B += b
	}
	n := float64(len(abOrder) / 2)
	r.A, r.B = r.A/n, r.B/n
	r.GainAFirst, r.GainBFirst = r.GainAFirst/nA, r.GainBFirst/nB
	return r
}

// verdict names the faster launch when both orders agree on it by at
// least margin points: "A" or "B", else "unclear".
func (r abResult) verdict(margin float64) string {
	switch {
	case r.GainAFirst >= margin && r.GainBFirst >= margin:
		return "B"
	case r.GainAFirst <= -margin && r.GainBFirst <= -margin:
		return "A"
	}
	return "unclear"
}

func TestSummarizeAB(t *testing.T) {
	// B 2 points faster, with a drift of +0.5 per sample: both orders see
	// B ahead, by 1.5 and 2.5, and the means keep the 2 points.
	var pct [len(abOrder)]float64
	for i, b := range abOrder {
		pct[i] = 80 + 0.5*float64(i)
		if b {
			pct[i] += 2
		}
	}
	r := summarizeAB(pct)
	if math.Abs(r.B-r.A-2) > 1e-9 || math.Abs(r.GainAFirst-2.5) > 1e-9 || math.Abs(r.GainBFirst-1.5) > 1e-9 || r.verdict(1) != "B" {
		t.Errorf("drift and a 2-point gain: %+v, verdict %s", r, r.verdict(1))
	}
	// No difference but a strong drift: the orders disagree.
	for i := range pct {
		pct[i] = 80 + 3*float64(i)
	}
	if r := summarizeAB(pct); r.A != r.B || r.GainAFirst != -r.GainBFirst || r.verdict(1) != "unclear" {
		t.Errorf("drift alone: %+v, verdict %s", r, r.verdict(1))
	}
	for i, b := range abOrder {
		pct[i] = 90
		if b {
			pct[i] = 85
		}
	}
	if r := summarizeAB(pct); r.verdict(1) != "A" || r.verdict(6) != "unclear" {
		t.Errorf("A 5 points faster: %+v, verdict %s", r, r.verdict(1))
	}
}

// TestCUDAGroupOverlap decides whether MatmulGroup should launch
// overlapped (PDL, with the Set's L2 prefetch) or plainly, the default: on
// the compute_90 module with PDL on, cold, the grouped products alone and
// a whole decoder layer of each chain model, each timed with the group
// launched plainly (A) and overlapped (B) back to back in abOrder. Prints
// every sample and a summary per row:
//
//	KGOVS <row> <pair> <plain|overlapped> <% of copy>
//	KGOV <row> <plain %> <overlapped %> <gain, plain first> <gain, overlapped first> <plain|overlapped|unclear>
//
// where the gains are overlapped minus plain in points of the copy and the
// verdict needs both orders to agree by a point.
func TestCUDAGroupOverlap(t *testing.T) {
	d, tm := openTimed(t)
	if info := d.Info(); info.ComputeMajor < 9 {
		t.Skipf("compute capability %d.%d: the compute_90 module, the only one that overlaps launches, needs 9.0", info.ComputeMajor, info.ComputeMinor)
	}
	s := loadTarget(t, d, TargetSM90)
	if s.overlap == nil {
		t.Skip("the device does not overlap launches: MatmulGroup has nothing to choose")
	}
	copyGBs := copySpeed(t, d, tm)
	fmt.Printf("KCOPY %.0f GB/s (device-to-device, 2 x 512 MiB per copy)\n", copyGBs)
	ab := func(row string, bytes float64, spin time.Duration, f func() error) {
		var pct [len(abOrder)]float64
		for i, ovl := range abOrder {
			s.groupOverlap = ovl
			pct[i] = 100 * bytes / queuedSpin(t, s, tm, f, spin).Seconds() / 1e9 / copyGBs
			fmt.Printf("KGOVS %s %d %s %.1f\n", row, i/2, map[bool]string{false: "plain", true: "overlapped"}[ovl], pct[i])
		}
		s.groupOverlap = false
		r := summarizeAB(pct)
		v := map[string]string{"A": "plain", "B": "overlapped", "unclear": "unclear"}[r.verdict(1)]
		fmt.Printf("KGOV %s %.1f %.1f %+.1f %+.1f %s\n", row, r.A, r.B, r.GainAFirst, r.GainBFirst, v)
	}
	s.SetOverlap(true)
	s.SetGemvPrefetch(DefaultGemvPrefetch)
	for _, Ms := range groupShapes {
		w := newGroupWork(t, d, tm, Ms, 4096)
		ab(w.name(), w.bytes, time.Millisecond, func() error { return w.grouped(s) })
		w.free()
	}
	for _, m := range chainModels {
		c := newChainWork(t, d, tm, m)
		ab(m.name+"/layer", c.bytes, chainSpin, func() error { return c.layer(s, false) })
		c.free()
	}
}
