package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
)

// GPU tests (MEMWALL_TEST_DEVICE=cuda). They print result lines that
// scripts/gpu/kernels.sh turns into its table:
//
//	KCHECK <kernel> <target> <max rel error vs twin> <max rel error vs float64> <cases>
//	KPERF <kernel> <target> <shape> <value> <unit>

// loadChecked is loadTarget for the checks against the twins and
// references: its launches are counted (countLaunches) and printed at t's
// cleanup, so the GPU script can show that every kernel ran.
func loadChecked(t testing.TB, d device.Device, target string) *Set {
	t.Helper()
	return loadTarget(t, countLaunches(t, d, target), target)
}

// envTarget is the target name under which the GPU tests load the module
// MEMWALL_KERNELS_PTX names instead of the embedded ones (gpuTargets).
const envTarget = "env"

// gpuTargets are the modules the GPU checks load: the one
// MEMWALL_KERNELS_PTX names when it is set (PTX just built from this
// kernels.cu, before it is embedded), else MEMWALL_TEST_TARGETS's
// embedded targets (e.g. "sm80": one JIT under compute-sanitizer), else
// all of them.
func gpuTargets() []string {
	if os.Getenv(EnvPTX) != "" {
		return []string{envTarget}
	}
	if v := os.Getenv("MEMWALL_TEST_TARGETS"); v != "" {
		return strings.Split(v, ",")
	}
	return Targets()
}

// loadTarget loads an embedded PTX target on d (envTarget: the file
// MEMWALL_KERNELS_PTX names).
func loadTarget(t testing.TB, d device.Device, target string) *Set {
	t.Helper()
	t0 := time.Now()
	ptx, name := EmbeddedFor(target), embeddedName(target)
	if target == envTarget {
		name = os.Getenv(EnvPTX)
		var err error
		if ptx, err = os.ReadFile(name); err != nil {
			t.Fatal(err)
		}
	}
	s, err := LoadPTX(d, ptx, name)
	if err != nil {
		t.Fatalf("load %s: %v", target, err)
	}
	t.Logf("loaded %s in %v (flash attention %v)", s.Source(), time.Since(t0).Round(time.Millisecond), s.FlashAttention())
	for _, why := range s.Disabled() {
		t.Errorf("%s: %s", target, why)
		fmt.Printf("KCHECK disabled %s %s\n", target, strings.ReplaceAll(why, " ", "_"))
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Every Llama kernel of both PTX targets against its Go twin (run on the
// simulator with the same inputs) and the float64 reference.
func TestCUDALlamaKernels(t *testing.T) {
	d := openCUDA(t)
	sd := newSim(t)
	ss, err := Load(sd, nil)
	must(t, err)
	defer ss.Close()
	simRig := newRig(t, sd, ss)
	rounds := 4
	if os.Getenv("MEMWALL_TEST_QUICK") != "" {
		rounds = 2
	}
	cases := llamaCases(11, rounds)
	rng := rand.New(rand.NewPCG(12, 12))
	cases = append(cases,
		attnCase(rng, 4000, 1, 8, 4, 128, BF16), // decode, split
		attnCase(rng, 0, 300, 8, 4, 128, BF16),  // prefill
		attnCase(rng, 500, 64, 2, 4, 128, F16),  // prefill after a prefix
		attnCase(rng, 1000, 1, 1, 32, 64, F32),  // four head groups
		attnCase(rng, 300, 2, 2, 3, 32, BF16),   // memwall_attn_e1 (head dim ≤ 32)
		attnCase(rng, 600, 1, 1, 4, 256, F16),   // memwall_attn_e8 (head dim > 128), split
		rmsnormCaseH(rng, 4096), rmsnormCaseH(rng, 4097), rmsnormCaseH(rng, 5000+rng.IntN(4000)),
	)
	twins := make([][]float32, len(cases))
	for i, c := range cases {
		twins[i] = c.run(simRig)
	}
	for _, target := range gpuTargets() {
		s := loadChecked(t, d, target)
		r := newRig(t, d, s)
		switch {
		case s.HasRoPEGGUF():
			checkRoPEGGUFExact(t, r, 21, 30)
			fmt.Printf("KCHECK rope_gguf_exact %s 0 0 30\n", target)
		case target != TargetSM70:
			t.Errorf("%s: no %s", target, NameRoPEGGUF)
		}
		per := map[string]*errAgg{}
		for i, c := range cases {
			got := c.run(r)
			et, er := relErr32(got, twins[i]), relErr(got, c.ref)
			errAggAdd(per, c.kernel, et, er)
			if !(er <= c.tol) || !(et <= max(c.tol, 1e-6)) {
				t.Errorf("%s %s %s: relative error %.3g vs float64 (tolerance %.0e), %.3g vs the Go twin", target, c.kernel, c.name, er, c.tol, et)
			}
		}
		names := make([]string, 0, len(per))
		for k := range per {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			fmt.Printf("KCHECK %s %s %.3g %.3g %d\n", k, target, per[k].twin, per[k].ref, per[k].n)
		}
	}
}

// errAgg is a kernel's worst relative errors (against the Go twin and the
// float64 reference) over n cases.
type errAgg struct {
	twin, ref float64
	n         int
}

func errAggAdd(per map[string]*errAgg, kernel string, twin, ref float64) {
	a := per[kernel]
	if a == nil {
		a = &errAgg{}
		per[kernel] = a
	}
	a.twin, a.ref, a.n = max(a.twin, twin), max(a.ref, ref), a.n+1
}

// The matrix kernels of the compute_70 target (TestCUDAKernels covers the
// target Load picks).
func TestCUDAMatmulSM70(t *testing.T) {
	d := openCUDA(t)
	s := loadChecked(t, d, TargetSM70)
	st, err := d.NewStream()
	must(t, err)
	defer d.DestroyStream(st)
	worst := map[string]float64{}
	for _, dt := range DTypes() {
		for _, sh := range []struct{ M, K, T int }{{37, 13, 1}, {203, 99, 3}, {1003, 1024, 8}, {77, 200, 9}, {1003, 1024, 300}, {3, 4104, 129}} {
			W, X := randMatrices(t, dt, sh.M, sh.K, sh.T, uint64(sh.M+sh.K))
			pw, px := alloc(t, d, uint64(len(W))), alloc(t, d, uint64(len(X)))
			py := alloc(t, d, uint64(4*sh.M*sh.T))
			must(t, d.CopyHtoD(pw, W, st))
			must(t, d.CopyHtoD(px, X, st))
			must(t, s.Matmul(dt, pw, px, py, uint32(sh.M), uint32(sh.K), uint32(sh.T), st))
			y, err := Decode(F32, readBack(t, d, py, uint64(4*sh.M*sh.T), st))
			must(t, err)
			err = CheckMatmul(dt, W, X, y, sh.M, sh.K, sh.T, 2000, 1)
			var me *MatmulError
			switch {
			case errors.As(err, &me):
				t.Errorf("sm70 %v", err)
				worst[dt] = math.Inf(1)
			case err != nil:
				t.Fatal(err)
			}
		}
	}
	for _, dt := range DTypes() {
		fmt.Printf("KCHECK matmul_%s %s - %.3g 6\n", dt, TargetSM70, worst[dt])
	}
}

func readBack(t testing.TB, d device.Device, p device.Ptr, n uint64, st device.Stream) []byte {
	b := make([]byte, n)
	must(t, d.CopyDtoH(b, p, st))
	must(t, d.StreamSynchronize(st))
	return b
}

// timer measures device time per call with events.
// openTimed opens the CUDA device (skipping the test without one) with a
// stream and a timer on it, all released at t's cleanup.
func openTimed(t *testing.T) (device.Device, *timer) {
	d := openCUDA(t)
	st, err := d.NewStream()
	must(t, err)
	t.Cleanup(func() { d.DestroyStream(st) })
	return d, newTimer(t, d, st)
}

// timedRig is openTimed's device and timer with the kernels loaded
// (closed at the test's end) and a rig on the timer's stream.
func timedRig(t *testing.T) (device.Device, *timer, *Set, *rig) {
	d, tm := openTimed(t)
	s, err := Load(d, os.Getenv)
	must(t, err)
	t.Cleanup(func() { s.Close() })
	r := newRig(t, d, s)
	r.st = tm.st
	return d, tm, s, r
}

type timer struct {
	t      testing.TB
	d      device.Device
	st     device.Stream
	e0, e1 device.Event
}

func newTimer(t testing.TB, d device.Device, st device.Stream) *timer {
	e0, err := d.NewEvent(true)
	must(t, err)
	e1, err := d.NewEvent(true)
	must(t, err)
	t.Cleanup(func() { d.DestroyEvent(e0); d.DestroyEvent(e1) })
	return &timer{t: t, d: d, st: st, e0: e0, e1: e1}
}

// per runs f once to warm up, then n times between events.
func (tm *timer) per(n int, f func() error) time.Duration {
	must(tm.t, f())
	must(tm.t, tm.d.StreamSynchronize(tm.st))
	must(tm.t, tm.d.EventRecord(tm.e0, tm.st))
	for range n {
		must(tm.t, f())
	}
	must(tm.t, tm.d.EventRecord(tm.e1, tm.st))
	must(tm.t, tm.d.EventSynchronize(tm.e1))
	el, err := tm.d.EventElapsed(tm.e0, tm.e1)
	must(tm.t, err)
	return el / time.Duration(n)
}

// Speed of attention, GEMV and GEMM on the target Load picks (and GEMV on
// compute_70 too).
func TestCUDALlamaSpeed(t *testing.T) {
	d, tm := openTimed(t)
	for _, target := range gpuTargets() {
		s := loadTarget(t, d, target)
		attnSpeed(t, d, s, tm, target)
		normSpeed(t, d, s, tm)
		gemvSpeed(t, d, s, tm, target)
		gemmSpeed(t, d, s, tm, target)
	}
}

// normSpeed times a decode step's RMSNorm (T = 1, H = 4096, bf16 out) and
// SiluMul (11008), queued, with PDL off and on where the module has it:
//
//	KPERF rmsnorm <target> T=1,H=4096 <µs> us
func normSpeed(t *testing.T, d device.Device, s *Set, tm *timer) {
	const H, I = 4096, 11008
	x, w, out := rawAlloc(t, d, 4*H), rawAlloc(t, d, 2*H), rawAlloc(t, d, 2*H)
	g, u, act := rawAlloc(t, d, 4*I), rawAlloc(t, d, 4*I), rawAlloc(t, d, 2*I)
	defer func() {
		for _, p := range []device.Ptr{x, w, out, g, u, act} {
			d.Free(p)
		}
	}()
	for _, p := range []struct {
		p device.Ptr
		n uint64
	}{{x, 4 * H}, {w, 2 * H}, {g, 4 * I}, {u, 4 * I}} {
		must(t, d.Memset8(p.p, 0x3c, p.n, tm.st))
	}
	for _, pdl := range pdlModes(s) {
		s.SetOverlap(pdl)
		per := queued(t, s, tm, func() error { return s.RMSNorm(x, w, BF16, out, BF16, 1, H, 1e-5, tm.st) })
		fmt.Printf("KPERF rmsnorm %s T=1,H=%d %.2f us\n", sweepLabel(s), H, per.Seconds()*1e6)
		per = queued(t, s, tm, func() error { return s.SiluMul(g, u, act, BF16, I, tm.st) })
		fmt.Printf("KPERF silumul %s n=%d %.2f us\n", sweepLabel(s), I, per.Seconds()*1e6)
	}
	s.SetOverlap(true)
}

func attnSpeed(t *testing.T, d device.Device, s *Set, tm *timer, target string) {
	const nH, kvH, hd = 32, 8, 128
	L := KVLayout{BlockTokens: 16, KVHeads: kvH, HeadDim: hd, Layers: 1, DType: BF16}
	L.BlockBytes = 2 * 16 * kvH * hd * 2
	const maxCtx = 32768
	nblk := maxCtx / 16
	cache := alloc(t, d, uint64(nblk)*L.BlockBytes)
	must(t, d.Memset8(cache, 0x3c, uint64(nblk)*L.BlockBytes, tm.st))
	ids := make([]int32, nblk)
	for i, p := range rand.New(rand.NewPCG(1, 1)).Perm(nblk) {
		ids[i] = int32(p)
	}
	r := newRig(t, d, s)
	table := r.i32(ids)
	q := r.f32(randF32(rand.New(rand.NewPCG(2, 2)), 2048*nH*hd, 1))
	out := alloc(t, d, 2048*nH*hd*4)
	scale := float32(1 / math.Sqrt(hd))
	// Prefill: 2048 tokens from position 0, on the flash kernel (where the
	// target has it) and on the split kernel.
	flash := s.FlashAttention()
	defer s.SetFlashAttention(flash)
	for _, on := range []bool{true, false} {
		if on && !flash {
			continue
		}
		s.SetFlashAttention(on)
		name := "attention_prefill_split"
		if on {
			name = "attention_prefill_flash"
		}
		T := uint32(2048)
		per := tm.per(3, func() error { return s.Attention(q, cache, table, 0, T, nH, L, 0, scale, out, BF16, tm.st) })
		pairs := float64(T) * float64(T+1) / 2
		fmt.Printf("KPERF %s %s T=2048,heads=32/8,dim=128 %.2f TFLOP/s (%.3f ms)\n", name, target,
			4*pairs*hd*nH/per.Seconds()/1e12, per.Seconds()*1e3)
	}
	// Decode: grouped (32/8, Llama-3) and multi-head (32/32, Llama-2) caches.
	mha := L
	mha.KVHeads, mha.BlockBytes = nH, 2*16*nH*hd*2
	mhaCache := alloc(t, d, uint64(nblk)*mha.BlockBytes)
	must(t, d.Memset8(mhaCache, 0x3c, uint64(nblk)*mha.BlockBytes, tm.st))
	for _, pdl := range pdlModes(s) {
		s.SetOverlap(pdl)
		label := sweepLabel(s)
		for _, lc := range []struct {
			L     KVLayout
			cache device.Ptr
		}{{L, cache}, {mha, mhaCache}} {
			for _, ctx := range []uint32{512, 2048, 4096, 32768} {
				// Queued behind a spin (GPU time, launches included), as decode runs it.
				per := queued(t, s, tm, func() error {
					return s.Attention(q, lc.cache, table, ctx-1, 1, nH, lc.L, 0, scale, out, BF16, tm.st)
				})
				kv := float64(ctx) * 2 * float64(lc.L.KVHeads) * hd * 2
				fmt.Printf("KPERF attention_decode %s ctx=%d,heads=32/%d %.0f GB/s (%.1f us)\n", label, ctx, lc.L.KVHeads,
					kv/per.Seconds()/1e9, per.Seconds()*1e6)
			}
		}
	}
	s.SetOverlap(true)
}

func gemvSpeed(t *testing.T, d device.Device, s *Set, tm *timer, target string) {
	for _, sh := range []struct{ M, K, T uint32 }{{4096, 4096, 1}, {14336, 4096, 1}, {4096, 14336, 1}, {128256, 4096, 1}, {14336, 4096, 4}, {14336, 4096, 8}} {
		M, K, T := uint64(sh.M), uint64(sh.K), uint64(sh.T)
		w := rawAlloc(t, d, M*K*2)
		x := rawAlloc(t, d, T*K*2)
		y := rawAlloc(t, d, 4*T*M)
		must(t, d.Memset8(w, 0x3c, M*K*2, tm.st))
		must(t, d.Memset8(x, 0x3c, T*K*2, tm.st))
		per := tm.per(20, func() error { return s.Matmul(BF16, w, x, y, sh.M, sh.K, sh.T, tm.st) })
		bytes := float64(M*K*2 + T*K*2 + 4*T*M)
		if sh.M == 4096 && sh.K == 4096 { // the host's cost per launch, queued without waiting
			must(t, d.StreamSynchronize(tm.st))
			h0 := time.Now()
			for range 200 {
				must(t, s.Matmul(BF16, w, x, y, sh.M, sh.K, sh.T, tm.st))
			}
			host := time.Since(h0) / 200
			must(t, d.StreamSynchronize(tm.st))
			fmt.Printf("KPERF launch_host %s Matmul,M=4096,K=4096,T=1 %.1f us/launch (GPU %.1f us)\n", target, host.Seconds()*1e6, per.Seconds()*1e6)
		}
		fmt.Printf("KPERF gemv_bf16 %s M=%d,K=%d,T=%d %.0f GB/s\n", target, sh.M, sh.K, sh.T, bytes/per.Seconds()/1e9)
		if sh.T == 1 { // the same product on the two-rows-per-warp kernel, for comparison
			g := device.Dim3{X: ceilDiv(sh.M, gemvRowsPerBlock(2)), Y: 1, Z: 1}
			per := tm.per(20, func() error {
				return s.launchGemv(gemvPlan{gemvTwo, g.X}, BF16, w, x, y, sh.M, sh.K, sh.T, tm.st)
			})
			fmt.Printf("KPERF gemv_bf16_2rows %s M=%d,K=%d,T=%d %.0f GB/s\n", target, sh.M, sh.K, sh.T, bytes/per.Seconds()/1e9)
		}
		must(t, d.Free(w))
		must(t, d.Free(x))
		must(t, d.Free(y))
	}
}

func gemmSpeed(t *testing.T, d device.Device, s *Set, tm *timer, target string) {
	lib := s.gemmLib
	defer func() { s.gemmLib = lib }()
	if lib != nil {
		// What the library holds once a 7B prefill's shapes have run: the
		// stream's workspace plus lazily loaded kernels.
		free0, _, err := d.MemInfo()
		must(t, err)
		t0 := time.Now()
		must(t, s.WarmUpMatmul(BF16, [][3]uint32{{4096, 4096, 2048}, {11008, 4096, 2048}, {4096, 11008, 2048}}, tm.st))
		free1, _, err := d.MemInfo()
		must(t, err)
		fmt.Printf("KPERF cublaslt_warmup %s 7B-shapes,T=2048 %.1f MiB held (workspace %d MiB; %v)\n", target,
			(float64(free0)-float64(free1))/(1<<20), s.GemmWorkspaceBytes()>>20, time.Since(t0).Round(time.Millisecond))
	}
	for _, sh := range []struct{ M, K uint32 }{{4096, 4096}, {11008, 4096}, {4096, 11008}} {
		const T = 2048
		M, K := uint64(sh.M), uint64(sh.K)
		w := rawAlloc(t, d, M*K*2)
		x := rawAlloc(t, d, T*K*2)
		y := rawAlloc(t, d, 4*T*M)
		must(t, d.Memset8(w, 0x3c, M*K*2, tm.st))
		must(t, d.Memset8(x, 0x3c, T*K*2, tm.st))
		libs := []device.MatmulLibrary{nil}
		if lib != nil && target == TargetSM80 {
			libs = append(libs, lib)
		}
		for _, l := range libs {
			s.gemmLib = l
			name := s.GemmLibrary()
			per := tm.per(5, func() error { return s.Matmul(BF16, w, x, y, sh.M, sh.K, T, tm.st) })
			fmt.Printf("KPERF gemm_bf16_%s %s T=2048,M=%d,K=%d %.1f TFLOP/s\n", name, target, sh.M, sh.K, 2*float64(M*K*T)/per.Seconds()/1e12)
		}
		must(t, d.Free(w))
		must(t, d.Free(x))
		must(t, d.Free(y))
	}
}

// rawAlloc allocates without a cleanup: the caller frees.
func rawAlloc(t testing.TB, d device.Device, n uint64) device.Ptr {
	t.Helper()
	p, err := d.Alloc(n)
	must(t, err)
	return p
}
