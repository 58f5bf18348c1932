package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
)

// gemvGrids returns the grids the tests run variant kind on for M rows:
// the variant's own for the row-per-warp kernels; for the streamed ones the
// rule's grid for perSM blocks per SM, one block per unit, and extra.
func gemvGrids(kind int, M, sms uint32, perSM []uint32, extra ...uint32) []uint32 {
	if !gemvStreamed(kind) {
		return []uint32{gemvGrid(kind, M, sms, 1)}
	}
	var out []uint32
	seen := map[uint32]bool{}
	add := func(g uint32) {
		if g > 0 && !seen[g] {
			seen[g] = true
			out = append(out, g)
		}
	}
	for _, b := range perSM {
		add(gemvGrid(kind, M, sms, b))
	}
	add(gemvUnits(kind, M))
	for _, g := range extra {
		add(g)
	}
	return out
}

// Every GEMV variant of both PTX targets, on random shapes (odd M, K not a
// multiple of 8, misaligned W and X, T 1..8) and grids (the rule's, one
// block, one block per unit, more blocks than units, random), against the
// Go twin (HostMatmul) and the float64 reference, with Y NaN-filled so an
// output left unwritten fails.
func TestCUDAGemvVariants(t *testing.T) {
	d := openCUDA(t)
	sms := uint32(max(d.Info().Multiprocessors, 1))
	targets := Targets()
	if v := os.Getenv("MEMWALL_TEST_TARGETS"); v != "" {
		targets = strings.Split(v, ",")
	}
	rng := rand.New(rand.NewPCG(15, 15))
	type gcase struct {
		dt      string
		M, K, T int
		off     int // elements W and X start past a 16-byte boundary
	}
	var cases []gcase
	quick := os.Getenv("MEMWALL_TEST_QUICK") != "" // small shapes only (compute-sanitizer)
	for _, dt := range DTypes() {
		if !quick {
			cases = append(cases, gcase{dt, 3000, 4096, 1, 0})
		}
		cases = append(cases, gcase{dt, 37, 4104, 8, 0}, gcase{dt, 1, 1, 1, 0})
		for range map[bool]int{false: 8, true: 1}[quick] {
			c := gcase{dt: dt, M: 1 + rng.IntN(2500), K: 1 + rng.IntN(5000), T: 1 + rng.IntN(GemvMaxTokens)}
			switch rng.IntN(3) {
			case 0:
				c.K = 8 * (1 + rng.IntN(700))
			case 1:
				c.off = 1 + rng.IntN(3)
			}
			if quick || rng.IntN(3) == 0 {
				c.M = 1 + rng.IntN(40)
			}
			cases = append(cases, c)
		}
	}
	for _, target := range targets {
		s := loadChecked(t, d, target)
		r := newRig(t, d, s)
		per := map[string]*errAgg{}
		for _, c := range cases {
			elt, _ := ElemSize(c.dt)
			W, X := randMatrices(t, c.dt, c.M, c.K, c.T, uint64(c.M*7+c.K))
			pad := make([]byte, c.off*elt)
			pw := r.upload(append(append([]byte{}, pad...), W...)).Add(uint64(len(pad)))
			px := r.upload(append(append([]byte{}, pad...), X...)).Add(uint64(len(pad)))
			twin := make([]float32, c.T*c.M)
			must(t, HostMatmul(c.dt, W, X, twin, c.M, c.K, c.T))
			// float64 references of the four corners and 400 random outputs.
			type sample struct {
				i   int
				ref float64
			}
			var samples []sample
			for j := range 404 {
				tt, m := rng.IntN(c.T), rng.IntN(c.M)
				if j < 4 {
					tt, m = (c.T-1)*(j&1), (c.M-1)*(j>>1)
				}
				samples = append(samples, sample{tt*c.M + m, ReferenceRow(c.dt, W, X, c.M, c.K, c.T, tt, m)})
			}
			// The compute_90 module launches overlapped; each case prefetches a
			// different amount (none, a line, whole blocks, evict_last).
			s.prefetch = pick(rng, uint32(0), 128, 4096, DefaultGemvPrefetch, 1<<20, prefetchEvictLast|DefaultGemvPrefetch, prefetchEarly|4096,
				prefetchPerRow|1000, prefetchPerRow|prefetchEvictLast|1<<20)
			s.gemvmOverlap = rng.IntN(2) == 0 // Matmul launches it plainly; overlapped must be right too
			for kind := range gemvKinds {
				if uint32(c.T) > gemvMaxT(kind) {
					continue
				}
				units := gemvUnits(kind, uint32(c.M))
				for _, g := range gemvGrids(kind, uint32(c.M), sms, []uint32{1, gemvBlocksPerSM}, 1, units+3, 1+rng.Uint32N(3*sms)) {
					py := r.nans(uint64(4 * c.T * c.M))
					must(t, s.launchGemv(gemvPlan{kind, g}, c.dt, pw, px, py, uint32(c.M), uint32(c.K), uint32(c.T), r.st))
					y, err := Decode(F32, r.read(py, uint64(4*c.T*c.M)))
					must(t, err)
					et := relErr32(y, twin)
					var num, den float64
					for _, sm := range samples {
						d := float64(y[sm.i]) - sm.ref
						num, den = num+d*d, den+sm.ref*sm.ref
					}
					er := math.Sqrt(num / max(den, 1e-300))
					if !(er <= Tolerance(c.dt)) {
						t.Errorf("%s %s M=%d K=%d T=%d off=%d grid=%d prefetch %#x: relative error %.3g against float64 (tolerance %.0e)", target, gemvName(kind, c.dt), c.M, c.K, c.T, c.off, g, s.prefetch, er, Tolerance(c.dt))
					}
					if !(et <= Tolerance(c.dt)) {
						t.Errorf("%s %s M=%d K=%d T=%d off=%d grid=%d prefetch %#x: relative error %.3g against the Go twin", target, gemvName(kind, c.dt), c.M, c.K, c.T, c.off, g, s.prefetch, et)
					}
					errAggAdd(per, gemvName(kind, c.dt), et, er)
				}
			}
		}
		s.prefetch, s.gemvmOverlap = DefaultGemvPrefetch, false
		if s.overlap != nil && !s.Overlap() {
			t.Errorf("%s: overlapped launches are off", target)
		}
		gemvGroupCheck(t, r, rng, per)
		s.prefetch, s.groupOverlap = DefaultGemvPrefetch, false
		for kind := range gemvKinds + 1 {
			for _, dt := range DTypes() {
				name := gemvGroupName(dt)
				if kind < gemvKinds {
					name = gemvName(kind, dt)
				}
				if a := per[name]; a != nil {
					fmt.Printf("KCHECK %s %s %.3g %.3g %d\n", name, target, a.twin, a.ref, a.n)
				}
			}
		}
	}
}

// gemvGroupCheck runs random MatmulGroups (1-3 products, T = 1) and
// checks each product against Matmul's own launch (the same kernel code:
// bit for bit), the Go twin and the float64 reference.
func gemvGroupCheck(t *testing.T, r *rig, rng *rand.Rand, per map[string]*errAgg) {
	for i := range 6 {
		dt := DTypes()[i%3]
		K := pick(rng, 4096, 1+rng.IntN(3000), 8*(1+rng.IntN(400)))
		_, X := randMatrices(t, dt, 1, K, 1, uint64(i))
		px := r.upload(X)
		var ops []MatmulOp
		var Ws [][]byte
		for j := range 1 + rng.IntN(MatmulGroupMax) {
			M := pick(rng, 1+rng.IntN(40), 1+rng.IntN(3000), 1024)
			W, _ := randMatrices(t, dt, M, K, 1, uint64(10*i+j))
			Ws = append(Ws, W)
			ops = append(ops, MatmulOp{W: r.upload(W), Y: r.nans(uint64(4 * M)), M: uint32(M)})
		}
		r.s.prefetch = pick(rng, uint32(0), 128, DefaultGemvPrefetch, 1<<20, prefetchEvictLast|4096, prefetchPerRow|16<<10)
		r.s.groupOverlap = rng.IntN(2) == 0 // launched plainly by default; overlapped must be right too
		must(t, r.s.MatmulGroup(dt, px, uint32(K), 1, ops, r.st))
		for j, op := range ops {
			alone := r.nans(uint64(4 * op.M))
			must(t, r.s.Matmul(dt, op.W, px, alone, op.M, uint32(K), 1, r.st))
			gb, ab := r.read(op.Y, uint64(4*op.M)), r.read(alone, uint64(4*op.M))
			if string(gb) != string(ab) {
				t.Errorf("%s K=%d product %d/%d M=%d: grouped result differs from Matmul's", gemvGroupName(dt), K, j, len(ops), op.M)
			}
			y, _ := Decode(F32, gb)
			twin := make([]float32, op.M)
			must(t, HostMatmul(dt, Ws[j], X, twin, int(op.M), K, 1))
			if err := CheckMatmul(dt, Ws[j], X, y, int(op.M), K, 1, 500, 1); err != nil {
				t.Errorf("%s: %v", gemvGroupName(dt), err)
			}
			errAggAdd(per, gemvGroupName(dt), relErr32(y, twin), matmulSampleErr(dt, Ws[j], X, y, int(op.M), K))
		}
	}
}

// matmulSampleErr is the relative error of y against float64 over 200
// sampled outputs of a T = 1 product.
func matmulSampleErr(dt string, W, X []byte, y []float32, M, K int) float64 {
	var num, den float64
	for i := range 200 {
		m := (i * 7919) % M
		ref := ReferenceRow(dt, W, X, M, K, 1, 0, m)
		d := float64(y[m]) - ref
		num, den = num+d*d, den+ref*ref
	}
	return math.Sqrt(num / max(den, 1e-300))
}

// The decode shapes of 7B/8B Llama models (q/o, 8-KV k/v, Llama-2 and -3
// MLP, both LM heads) and a few T > 1.
var sweepShapes = []struct{ M, K, T uint32 }{
	{4096, 4096, 1}, {1024, 4096, 1}, {11008, 4096, 1}, {4096, 11008, 1},
	{14336, 4096, 1}, {4096, 14336, 1}, {32000, 4096, 1}, {128256, 4096, 1},
	{4096, 4096, 2}, {4096, 4096, 4}, {4096, 4096, 8},
	{14336, 4096, 2}, {14336, 4096, 4}, {14336, 4096, 8},
	{4096, 14336, 4}, {4096, 14336, 8}, {1024, 4096, 8},
}

// Every GEMV variant × grid × shape on both targets, bf16, timed with the
// weights cold (the launches rotate over copies of W that together exceed
// the L2 cache several times, as a model's layers do) and hot (one copy,
// L2-resident where it fits), against a device-to-device copy measured in
// the same run (2·bytes/time: the 100% line). A spin kernel ahead of each
// timed batch lets the host queue every launch first, so small products
// measure the GPU, not the launch rate. Prints
//
//	KCOPY <GB/s>
//	KSWEEP <target> <M,K,T> <kernel> <grid> <cold GB/s> <hot GB/s> <cold % of copy>
//	KSEL   <target> <M,K,T> <kernel> <grid> <cold GB/s> <hot GB/s> <cold % of copy>
//
// KSEL is the launch Matmul makes (Set.Shape): the selection rule's pick.
func TestCUDAGemvSweep(t *testing.T) {
	d, tm := openTimed(t)
	sms := uint32(max(d.Info().Multiprocessors, 1))
	copyGBs := copySpeed(t, d, tm)
	fmt.Printf("KCOPY %.0f GB/s (device-to-device, 2 x 512 MiB per copy)\n", copyGBs)
	var sets []*Set
	for _, target := range Targets() {
		sets = append(sets, loadTarget(t, d, target))
	}
	for _, sh := range sweepShapes {
		sweepShape(t, d, sets, tm, sh.M, sh.K, sh.T, sms, copyGBs)
	}
	for _, g := range groupShapes {
		sweepGroup(t, d, sets, tm, g, 4096, copyGBs)
	}
	for _, m := range chainModels {
		sweepChain(t, d, sets, tm, m, copyGBs)
	}
}

// sweepLabel names a Set in the sweep's lines: its target, "-nopdl" on the
// compute_90 module with overlapped launches off.
func sweepLabel(s *Set) string {
	target := strings.TrimSuffix(strings.TrimPrefix(s.Source(), "embedded kernels_"), ".ptx")
	if s.overlap != nil && !s.Overlap() {
		target += "-nopdl"
	}
	return target
}

// sweepGroup times the T = 1 products of Ms (K columns, sharing X) cold as
// one MatmulGroup launch and as one Matmul each, back to back, on each Set
// (compute_90: PDL on and off; MatmulGroup's own launch as Load leaves it).
// Prints
//
//	KFUSE <target> <M1+M2+...,K> <grouped GB/s> <separate GB/s> <grouped % of copy> <separate % of copy>
func sweepGroup(t *testing.T, d device.Device, sets []*Set, tm *timer, Ms []uint32, K uint32, copyGBs float64) {
	w := newGroupWork(t, d, tm, Ms, K)
	defer w.free()
	for _, s := range sets {
		for _, pdl := range pdlModes(s) {
			s.SetOverlap(pdl)
			var gbs [2]float64
			for mode, f := range []func(*Set) error{w.grouped, w.separate} {
				gbs[mode] = w.bytes / queued(t, s, tm, func() error { return f(s) }).Seconds() / 1e9
			}
			fmt.Printf("KFUSE %s %s %.0f %.0f %.1f %.1f\n", sweepLabel(s), w.name(), gbs[0], gbs[1], 100*gbs[0]/copyGBs, 100*gbs[1]/copyGBs)
		}
		s.SetOverlap(true)
	}
}

// pdlModes is the overlap settings a sweep runs s with: on and off for the
// compute_90 module on a GPU that overlaps, else its only one.
func pdlModes(s *Set) []bool {
	if s.overlap != nil {
		return []bool{true, false}
	}
	return []bool{false}
}

// queued returns the GPU time per call of f over 20 calls queued behind a
// 1 ms spin kernel (so the host has queued them all before the first runs),
// after one call to warm up.
func queued(t *testing.T, s *Set, tm *timer, f func() error) time.Duration {
	return queuedSpin(t, s, tm, f, time.Millisecond)
}

// queuedSpin is queued behind a spin of the given length.
func queuedSpin(t *testing.T, s *Set, tm *timer, f func() error, spin time.Duration) time.Duration {
	const n = 20
	must(t, f())
	must(t, s.Spin(spin, tm.st))
	must(t, tm.d.EventRecord(tm.e0, tm.st))
	for range n {
		must(t, f())
	}
	must(t, tm.d.EventRecord(tm.e1, tm.st))
	must(t, tm.d.EventSynchronize(tm.e1))
	el, err := tm.d.EventElapsed(tm.e0, tm.e1)
	must(t, err)
	return el / n
}

func copySpeed(t *testing.T, d device.Device, tm *timer) float64 {
	const n = 512 << 20
	a, b := rawAlloc(t, d, n), rawAlloc(t, d, n)
	defer d.Free(a)
	defer d.Free(b)
	must(t, d.Memset8(a, 1, n, tm.st))
	per := tm.per(5, func() error { return d.CopyDtoD(b, a, n, tm.st) })
	return 2 * n / per.Seconds() / 1e9
}

func sweepShape(t *testing.T, d device.Device, sets []*Set, tm *timer, M, K, T, sms uint32, copyGBs float64) {
	wBytes := uint64(M) * uint64(K) * 2
	copies := max(1, int((768<<20)/wBytes)) // cold: ≥ 768 MiB of weights in rotation
	if copies > 64 {
		copies = 64
	}
	ws := make([]device.Ptr, copies)
	for i := range ws {
		ws[i] = rawAlloc(t, d, wBytes)
		must(t, d.Memset8(ws[i], 0x3c, wBytes, tm.st))
	}
	x := rawAlloc(t, d, uint64(T)*uint64(K)*2)
	y := rawAlloc(t, d, 4*uint64(T)*uint64(M))
	defer func() {
		for _, w := range ws {
			d.Free(w)
		}
		d.Free(x)
		d.Free(y)
	}()
	must(t, d.Memset8(x, 0x3c, uint64(T)*uint64(K)*2, tm.st))
	bytes := float64(wBytes + uint64(T)*uint64(K)*2 + 4*uint64(T)*uint64(M))
	shape := fmt.Sprintf("%d,%d,%d", M, K, T)
	var measureLaunch func(s *Set, launch func(w device.Ptr) error) (cold, hot float64)
	measure := func(s *Set, p gemvPlan) (cold, hot float64) {
		return measureLaunch(s, func(w device.Ptr) error { return s.launchGemv(p, BF16, w, x, y, M, K, T, tm.st) })
	}
	// measureLaunch times launch(W) cold (rotating over the copies) and hot.
	measureLaunch = func(s *Set, launch func(w device.Ptr) error) (cold, hot float64) {
		i := 0
		run := func(rotate bool) func() error {
			return func() error {
				w := ws[0]
				if rotate {
					w = ws[i%len(ws)]
					i++
				}
				return launch(w)
			}
		}
		for _, rotate := range []bool{true, false} {
			gbs := bytes / queued(t, s, tm, run(rotate)).Seconds() / 1e9
			if rotate {
				cold = gbs
			} else {
				hot = gbs
			}
		}
		return cold, hot
	}
	for _, s := range sets {
		target := strings.TrimSuffix(strings.TrimPrefix(s.Source(), "embedded kernels_"), ".ptx")
		for kind := range gemvKinds {
			if T > gemvMaxT(kind) {
				continue
			}
			for _, g := range gemvGrids(kind, M, sms, []uint32{1, 2, 3, 4, 5, 6, 8}) {
				cold, hot := measure(s, gemvPlan{kind, g})
				fmt.Printf("KSWEEP %s %s %s %d %.0f %.0f %.1f\n", target, shape, gemvName(kind, BF16), g, cold, hot, 100*cold/copyGBs)
			}
		}
		if T == 1 {
			// The grouped kernel with one product: memwall_gemv1_'s work split
			// on the register-pipelined code (compute_70's gemv1) on every target.
			cold, hot := measureLaunch(s, func(w device.Ptr) error {
				return s.MatmulGroup(BF16, x, K, 1, []MatmulOp{{W: w, Y: y, M: M}}, tm.st)
			})
			fmt.Printf("KSWEEP %s %s %s %d %.0f %.0f %.1f\n", target, shape, gemvGroupName(BF16), ceilDiv(M, 8), cold, hot, 100*cold/copyGBs)
		}
		p := planGemv(BF16, M, K, T, s.sms, s.tensor, &s.gemvOff)
		cold, hot := measure(s, p)
		fmt.Printf("KSEL %s %s %s %d %.0f %.0f %.1f\n", target, shape, gemvName(p.kind, BF16), p.grid, cold, hot, 100*cold/copyGBs)
		if s.overlap == nil {
			continue
		}
		// The rule's launch with overlapped launches off and on, at each
		// prefetch size (memwall_gemvm_* too, which Matmul launches plainly).
		was := s.prefetch
		s.gemvmOverlap = true
		for _, c := range pdlSweep {
			s.SetOverlap(c.pdl)
			s.prefetch = c.pf
			cold, hot := measure(s, p)
			fmt.Printf("KPDL %s %s %d %s %.0f %.0f %.1f\n", shape, gemvName(p.kind, BF16), map[bool]int{false: 0, true: 1}[c.pdl],
				pfLabel(c.pf), cold, hot, 100*cold/copyGBs)
		}
		if p.kind == gemvMMA {
			// The tensor-core kernel at finer grids (8 blocks per SM, a block
			// per 16-row group), overlapped or not: whether more, smaller
			// shares keep it even when its blocks land beside the previous
			// kernel's.
			seen := map[uint32]bool{p.grid: true}
			for _, g := range []uint32{gemvGrid(gemvMMA, M, sms, 8), gemvUnits(gemvMMA, M)} {
				if seen[g] {
					continue
				}
				seen[g] = true
				q := gemvPlan{gemvMMA, g}
				for _, c := range pdlSweep[:4] {
					s.SetOverlap(c.pdl)
					s.prefetch = c.pf
					cold, hot := measure(s, q)
					fmt.Printf("KPDL %s %s@%d %d %s %.0f %.0f %.1f\n", shape, gemvName(q.kind, BF16), g, map[bool]int{false: 0, true: 1}[c.pdl],
						pfLabel(c.pf), cold, hot, 100*cold/copyGBs)
				}
			}
		}
		s.SetOverlap(true)
		s.prefetch = was
		s.gemvmOverlap = false
	}
}

// pdlSweep is the overlap and prefetch settings the sweep times the rule's
// launch at on the compute_90 module.
var pdlSweep = []struct {
	pdl bool
	pf  uint32
}{{false, 0}, {true, 0}, {true, 4 << 10}, {true, 8 << 10}, {true, 16 << 10}, {true, 32 << 10},
	{true, prefetchEvictLast | 8<<10}, {true, prefetchPerRow | 8<<10}, {true, prefetchPerRow | 16<<10}, {true, prefetchPerRow | 32<<10}}

// pfLabel prints a prefetch argument: bytes, "+last" for evict_last,
// "+early" for the early launch_dependents.
func pfLabel(pf uint32) string {
	l := fmt.Sprint(pf & prefetchBytesMask)
	if pf&prefetchEvictLast != 0 {
		l += "+last"
	}
	if pf&prefetchEarly != 0 {
		l += "+early"
	}
	if pf&prefetchPerRow != 0 {
		l += "+rows"
	}
	return l
}

// TestCUDAMappedGemv times a decode product (T = 1) over a weight read in
// place from mapped pinned host memory, against the same product over the
// weight in device memory and the copy of the weight to the device, at a
// 7B model's shapes; the outputs are bit for bit the same. It measures
// whether streamed matrices could be read in place instead of copied
// through staging slots (the embedding gather's question for whole
// matrices): KPERF rows.
func TestCUDAMappedGemv(t *testing.T) {
	d, tm, s, r := timedRig(t)
	rng := rand.New(rand.NewPCG(7, 31))
	for _, sh := range []struct {
		dt   string
		M, K int
	}{{BF16, 4096, 4096}, {BF16, 11008, 4096}, {BF16, 4096, 11008}, {Q4_K, 11008, 4096}, {Q6_K, 4096, 11008}} {
		var w []byte
		if typ, ok := QuantType(sh.dt); ok {
			w = q8SpeedWeights(rng, typ, sh.M, sh.K)
		} else {
			var err error
			w, err = Encode(sh.dt, randNormal(rng, sh.M*sh.K, 0.05))
			must(t, err)
		}
		hb, err := d.HostAlloc(uint64(len(w)))
		must(t, err)
		if hb.DevicePtr == 0 {
			d.HostFree(hb)
			t.Skip("pinned host memory is not mapped on this device")
		}
		copy(hb.Bytes, w)
		W, X := r.upload(w), r.f32(randNormal(rng, sh.K, 1))
		Yd, Yh := r.nans(uint64(4*sh.M)), r.nans(uint64(4*sh.M))
		M, K := uint32(sh.M), uint32(sh.K)
		onDev := queued(t, s, tm, func() error { return s.Matmul(sh.dt, W, X, Yd, M, K, 1, tm.st) })
		inPlace := queued(t, s, tm, func() error { return s.Matmul(sh.dt, hb.DevicePtr, X, Yh, M, K, 1, tm.st) })
		cp := tm.per(5, func() error { return d.CopyHtoD(W, hb.Bytes, tm.st) })
		if a, b := r.read(Yd, uint64(4*sh.M)), r.read(Yh, uint64(4*sh.M)); string(a) != string(b) {
			t.Errorf("%s M=%d K=%d: the product over host memory differs from the one over device memory", sh.dt, sh.M, sh.K)
		}
		gbps := func(el time.Duration) float64 { return float64(len(w)) / el.Seconds() / 1e9 }
		t.Logf("KPERF mapped-gemv %s M=%d,K=%d %.1f MB: device %.1f us (%.0f GB/s), in place %.1f us (%.1f GB/s), copy %.1f us (%.1f GB/s)",
			sh.dt, sh.M, sh.K, float64(len(w))/1e6, float64(onDev)/1e3, gbps(onDev), float64(inPlace)/1e3, gbps(inPlace), float64(cp)/1e3, gbps(cp))
		must(t, d.HostFree(hb))
	}
}
