package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
)

// overlapFake is a fakeDevice that also offers overlapped launches and
// records which launches took that path.
type overlapFake struct {
	*fakeDevice
	can        bool
	overlapped []string
}

func (f *overlapFake) CanOverlap() bool { return f.can }

func (f *overlapFake) LaunchOverlapped(fn device.Function, grid, block device.Dim3, shared uint32, s device.Stream, args ...any) error {
	if !f.can {
		return device.ErrUnsupported
	}
	f.overlapped = append(f.overlapped, f.funcs[fn])
	return f.fakeDevice.Launch(fn, grid, block, shared, s, args...)
}

// A Set launches overlapped exactly when the module is compute_90, the
// device can, and neither SetOverlap(false) nor MEMWALL_KERNELS_PDL=0 said
// otherwise; every launch helper goes the same way; the prefetch bytes
// reach the GEMV kernels' last argument.
func TestSetOverlap(t *testing.T) {
	sm90 := writePTX(t, Names())
	sm80 := strings.Replace(string(mustRead(t, sm90)), ".target sm_90", ".target sm_80", 1)
	sm80Path := writeFile(t, sm80)
	for _, tc := range []struct {
		name    string
		path    string
		can     bool
		env     map[string]string
		want    bool
		wantPf  uint32
		wantErr bool
	}{
		{"sm90 module, capable device", sm90, true, nil, true, DefaultGemvPrefetch, false},
		{"sm90 module, incapable device", sm90, false, nil, false, DefaultGemvPrefetch, false},
		{"sm80 module", sm80Path, true, nil, false, DefaultGemvPrefetch, false},
		{"PDL=0", sm90, true, map[string]string{EnvPDL: "0"}, false, DefaultGemvPrefetch, false},
		{"PDL=1", sm90, true, map[string]string{EnvPDL: "1"}, true, DefaultGemvPrefetch, false},
		{"prefetch 0", sm90, true, map[string]string{EnvPrefetch: "0"}, true, 0, false},
		{"prefetch 65536", sm90, true, map[string]string{EnvPrefetch: "65536"}, true, 65536, false},
		{"prefetch bad", sm90, true, map[string]string{EnvPrefetch: "lots"}, false, 0, true},
		{"prefetch too big", sm90, true, map[string]string{EnvPrefetch: "536870912"}, false, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &overlapFake{fakeDevice: newFake("cuda"), can: tc.can}
			getenv := func(k string) string {
				if k == EnvPTX {
					return tc.path
				}
				return tc.env[k]
			}
			s, err := Load(d, getenv)
			if tc.wantErr {
				if err == nil || !errors.Is(err, device.ErrInvalid) || !strings.Contains(err.Error(), EnvPrefetch) {
					t.Fatalf("Load: err %v, want one naming %s", err, EnvPrefetch)
				}
				if d.unloaded != 1 {
					t.Errorf("module unloaded %d times after the failure", d.unloaded)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.Overlap() != tc.want || s.GemvPrefetch() != tc.wantPf {
				t.Fatalf("Overlap %v, prefetch %d; want %v, %d", s.Overlap(), s.GemvPrefetch(), tc.want, tc.wantPf)
			}
			st := device.Stream(3)
			p := device.Ptr(1 << 20)
			steps := []func() error{
				func() error { return s.Fill(p, 100, 1, st) },
				func() error { return s.Spin(time.Microsecond, st) },
				func() error { return s.Matmul(BF16, p, p, p, 100, 64, 1, st) },
				func() error { return s.Matmul(BF16, p, p, p, 100, 64, 4, st) },
				func() error { return s.Matmul(F32, p, p, p, 100, 64, 100, st) },
				func() error {
					return s.MatmulGroup(BF16, p, 64, 1, []MatmulOp{{p, p, 10}, {p, p, 20}}, st)
				},
				func() error { return s.RMSNorm(p, p, BF16, p, BF16, 1, 64, 1e-5, st) },
				func() error { return s.SiluMul(p, p, p, BF16, 64, st) },
			}
			for i, f := range steps {
				if err := f(); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			n := len(d.launches) // MatmulGroup's kernel too, with prefetch
			if want := map[bool]int{true: n, false: 0}[tc.want]; len(d.overlapped) != want {
				t.Errorf("%d of %d launches overlapped, want %d", len(d.overlapped), n, want)
			}
			for _, l := range d.launches {
				if !strings.HasPrefix(l.name, "memwall_gemv") {
					continue
				}
				want := tc.wantPf
				if pf, ok := l.args[len(l.args)-1].(uint32); !ok || pf != want {
					t.Errorf("%s: last argument %v, want the prefetch bytes %d", l.name, l.args[len(l.args)-1], want)
				}
			}
			if s.Overlap() {
				// The T = 2..8 tensor-core GEMV goes plainly, without prefetch.
				s.tensor = true
				n, m := len(d.launches), len(d.overlapped)
				if err := s.Matmul(BF16, p, p, p, 100, 64, 4, st); err != nil {
					t.Fatal(err)
				}
				l := d.launches[n]
				if l.name != gemvName(gemvMMA, BF16) || len(d.overlapped) != m || l.args[len(l.args)-1] != uint32(0) {
					t.Errorf("T = 4 with tensor cores: %s, %d overlapped, prefetch %v; want %s plainly with 0", l.name, len(d.overlapped)-m, l.args[len(l.args)-1], gemvName(gemvMMA, BF16))
				}
				s.tensor = false
			}
			if s.SetOverlap(true) != (tc.can && tc.path == sm90) {
				t.Errorf("SetOverlap(true) = %v on a device that can %v", s.Overlap(), tc.can)
			}
			if s.SetOverlap(false) || s.Overlap() {
				t.Error("SetOverlap(false) left overlap on")
			}
			s.SetGemvPrefetch(prefetchEvictLast | prefetchEarly | prefetchPerRow | 7)
			if s.GemvPrefetch() != 7 {
				t.Errorf("GemvPrefetch %d after setting 7 with bits 29-31", s.GemvPrefetch())
			}
		})
	}
}

// A driver that refuses overlapped launches leaves the Set on plain ones,
// with the reason in Disabled.
func TestProbeOverlap(t *testing.T) {
	d := &overlapFake{fakeDevice: newFake("cuda"), can: true}
	s, err := Load(d, env(writePTX(t, Names())))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.probeOverlap(3)
	if !s.Overlap() || len(s.Disabled()) != 0 || len(d.overlapped) != 2 {
		t.Fatalf("a working driver: overlap %v, disabled %v, %d overlapped launches", s.Overlap(), s.Disabled(), len(d.overlapped))
	}
	d.launchFail = device.ErrInvalid
	s.probeOverlap(3)
	if s.Overlap() || s.SetOverlap(true) || len(s.Disabled()) != 1 || !strings.Contains(s.Disabled()[0], "overlapped launches") {
		t.Fatalf("a refusing driver: overlap %v, disabled %v", s.Overlap(), s.Disabled())
	}
	d.launchFail = nil
	if err := s.Spin(0, 3); err != nil || len(d.overlapped) != 3 { // the probe's refused one, then none
		t.Errorf("after the probe: %v, %d overlapped launches (want the plain path)", err, len(d.overlapped))
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := readPTX(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A chain of dependent kernels queued without a pause on the compute_90
// module, launched overlapped, gives the same bytes as the same chain
// launched plainly: each kernel reads what the one before it wrote (and a
// device-to-device copy and a memset sit between kernels, whose order is
// plain stream order, and one kernel follows a wait on an event that a
// second stream records after a late copy of that kernel's input). Every output starts NaN, so a kernel that read its
// input before its producer finished would differ. Random shapes, prefetch
// sizes (0, lines, whole blocks, evict_last) and dtypes.
func TestCUDAOverlapChain(t *testing.T) {
	d := openCUDA(t)
	if d.Info().ComputeMajor < 9 {
		t.Skip("programmatic dependent launch needs compute capability 9.0")
	}
	s := loadChecked(t, d, TargetSM90)
	if !s.Overlap() {
		t.Fatalf("the compute_90 module on a %d.%d GPU does not launch overlapped", d.Info().ComputeMajor, d.Info().ComputeMinor)
	}
	r := newRig(t, d, s)
	rng := rand.New(rand.NewPCG(90, 90))
	cases, big := 6, true
	if os.Getenv("MEMWALL_TEST_QUICK") != "" { // compute-sanitizer: small shapes
		cases, big = 3, false
	}
	for c := range cases {
		dt := []string{BF16, F16, F32}[c%3]
		H := uint32(pick(rng, 4096, 8*(1+rng.IntN(400)), 1+rng.IntN(2000)))
		I := uint32(pick(rng, 5504, 8*(1+rng.IntN(700)), 1+rng.IntN(3000)))
		if !big {
			H, I = uint32(1+rng.IntN(300)), uint32(1+rng.IntN(600))
		}
		pf := pick(rng, uint32(0), 128, 4096, DefaultGemvPrefetch, 1<<20, prefetchEvictLast|DefaultGemvPrefetch, prefetchEarly|DefaultGemvPrefetch,
			prefetchPerRow|16<<10, prefetchPerRow|1<<20)
		chain := newTestChain(t, r, rng, dt, H, I)
		var outs [2][]byte
		for i, on := range []bool{false, true} {
			s.SetOverlap(on)
			s.prefetch = pf // bit 31 too: the evict_last policy
			outs[i] = chain.run(t, r)
		}
		s.SetOverlap(true)
		s.SetGemvPrefetch(DefaultGemvPrefetch)
		q, _ := Decode(F32, outs[0][:4*H])
		for i, v := range q {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%s H=%d I=%d: the plain chain's q[%d] = %v: an output was not written", dt, H, I, i, v)
			}
		}
		if !slices.Equal(outs[0], outs[1]) {
			t.Errorf("%s H=%d I=%d prefetch %#x: the overlapped chain's output differs from the plain one", dt, H, I, pf)
		}
		fmt.Printf("KCHECK overlap_chain_%s %s %s - 1\n", dt, TargetSM90, map[bool]string{true: "identical", false: "DIFFERS"}[slices.Equal(outs[0], outs[1])])
	}
}

// testChain is one layer-like chain of dependent launches on shared
// buffers (see TestCUDAOverlapChain).
type testChain struct {
	dt                       string
	H, I                     uint32
	x, wn, xn, wq, wk, q, k  device.Ptr
	wg, wu, g, u, act, wd, y device.Ptr
	xc, ysum                 device.Ptr
	wn2                      device.Ptr // wn, copied in on a second stream each run
	st2                      device.Stream
	cleared, copied          device.Event
}

func newTestChain(t *testing.T, r *rig, rng *rand.Rand, dt string, H, I uint32) *testChain {
	elt, _ := ElemSize(dt)
	mat := func(M, K uint32) device.Ptr {
		W, _ := randMatrices(t, dt, int(M), int(K), 1, rng.Uint64())
		return r.upload(W)
	}
	xv := make([]float32, H)
	for i := range xv {
		xv[i] = float32(rng.NormFloat64())
	}
	nv := make([]float32, H)
	for i := range nv {
		nv[i] = 1 + 0.1*float32(rng.NormFloat64())
	}
	nb, _ := Encode(dt, nv)
	c := &testChain{dt: dt, H: H, I: I, x: r.f32(xv), wn: r.upload(nb), wn2: r.nans(uint64(len(nb)))}
	var err error
	c.st2, err = r.d.NewStream()
	must(t, err)
	t.Cleanup(func() { r.d.DestroyStream(c.st2) })
	for _, e := range []*device.Event{&c.cleared, &c.copied} {
		*e, err = r.d.NewEvent(false)
		must(t, err)
		ev := *e
		t.Cleanup(func() { r.d.DestroyEvent(ev) })
	}
	c.xn = r.nans(uint64(H) * uint64(elt))
	c.xc = r.nans(uint64(H) * uint64(elt))
	c.wq, c.wk = mat(H, H), mat(H/2+1, H)
	c.wg, c.wu, c.wd = mat(I, H), mat(I, H), mat(H, I)
	for _, p := range []*device.Ptr{&c.q, &c.y, &c.ysum} {
		*p = r.nans(4 * uint64(H))
	}
	c.k = r.nans(4 * uint64(H/2+1))
	c.g, c.u = r.nans(4*uint64(I)), r.nans(4*uint64(I))
	c.act = r.nans(uint64(I) * uint64(elt))
	return c
}

// run queues the chain three times over, each pass's input the previous
// pass's last output (so every pass reads buffers that earlier kernels
// read with other values: a line left stale in an SM's cache would show),
// reads every output back and returns them.
func (c *testChain) run(t *testing.T, r *rig) []byte {
	s, st := r.s, r.st
	elt, _ := ElemSize(c.dt)
	H, I := c.H, c.I
	// Outputs start NaN (queued, so they are part of the stream's order).
	for _, o := range []struct {
		p device.Ptr
		n uint64
	}{{c.xn, uint64(H) * uint64(elt)}, {c.xc, uint64(H) * uint64(elt)}, {c.q, 4 * uint64(H)}, {c.k, 4 * uint64(H/2+1)},
		{c.g, 4 * uint64(I)}, {c.u, 4 * uint64(I)}, {c.act, uint64(I) * uint64(elt)}, {c.y, 4 * uint64(H)}, {c.ysum, 4 * uint64(H)}} {
		must(t, r.d.Memset8(o.p, 0xFF, o.n, st))
	}
	// The engine's case: a second stream fills wn2 (late, behind a spin) and
	// the first stream waits on its event right after a kernel, then runs a
	// kernel that reads wn2.
	must(t, r.d.Memset8(c.wn2, 0xFF, uint64(H)*uint64(elt), st))
	must(t, r.d.EventRecord(c.cleared, st))
	must(t, r.d.StreamWaitEvent(c.st2, c.cleared))
	must(t, s.Spin(500*time.Microsecond, c.st2))
	must(t, r.d.CopyDtoD(c.wn2, c.wn, uint64(H)*uint64(elt), c.st2))
	must(t, r.d.EventRecord(c.copied, c.st2))
	must(t, s.Spin(300*time.Microsecond, st)) // the host queues the rest meanwhile
	for pass := range 3 {
		in := c.x
		if pass > 0 {
			in = c.ysum
		}
		must(t, s.RMSNorm(in, c.wn, c.dt, c.xn, c.dt, 1, H, 1e-5, st))
		must(t, r.d.CopyDtoD(c.xc, c.xn, uint64(H)*uint64(elt), st)) // a copy between two kernels
		must(t, s.MatmulGroup(c.dt, c.xc, H, 1, []MatmulOp{{c.wq, c.q, H}, {c.wk, c.k, H/2 + 1}}, st))
		if pass == 0 {
			must(t, r.d.StreamWaitEvent(st, c.copied))
		}
		must(t, s.RMSNorm(c.q, c.wn2, c.dt, c.xn, c.dt, 1, H, 1e-5, st))
		must(t, s.Matmul(c.dt, c.wg, c.xn, c.g, I, H, 1, st))
		must(t, s.Matmul(c.dt, c.wu, c.xn, c.u, I, H, 1, st))
		must(t, s.SiluMul(c.g, c.u, c.act, c.dt, uint64(I), st))
		must(t, s.Matmul(c.dt, c.wd, c.act, c.y, H, I, 1, st))
		must(t, s.Cast(c.y, c.xc, c.dt, uint64(H), st)) // a kernel overwriting a buffer an earlier one read
		must(t, r.d.CopyDtoD(c.ysum, c.q, 4*uint64(H), st))
		must(t, s.Add(c.ysum, c.y, uint64(H), st))
	}
	var out []byte
	for _, o := range []struct {
		p device.Ptr
		n uint64
	}{{c.q, 4 * uint64(H)}, {c.k, 4 * uint64(H/2+1)}, {c.act, uint64(I) * uint64(elt)}, {c.y, 4 * uint64(H)},
		{c.xc, uint64(H) * uint64(elt)}, {c.ysum, 4 * uint64(H)}} {
		out = append(out, r.read(o.p, o.n)...)
	}
	return out
}

// chainModel is one decoder layer's shapes.
type chainModel struct {
	name     string
	H, I, KV uint32 // hidden, MLP, k/v rows (kv heads × head dim)
}

var chainModels = []chainModel{{"llama2-7b", 4096, 11008, 4096}, {"llama3-8b", 4096, 14336, 1024}}

// chainWork is one decoder layer's launches as decode runs them, T = 1,
// bf16, over enough copies of the layer's weights (≥ 768 MiB, at least 3)
// that each call reads them cold: RMSNorm → q/k/v (one MatmulGroup) → o →
// RMSNorm → gate/up (MatmulGroup) → SiluMul → down.
type chainWork struct {
	m                               chainModel
	tm                              *timer
	layers                          []chainLayer
	x, xn, q, k, v, o, g, u, act, y device.Ptr
	bytes                           float64 // the products' weights, X and Y per layer
	all                             []device.Ptr
	i                               int
}

type chainLayer struct{ wq, wk, wv, wo, wg, wu, wd, n1, n2 device.Ptr }

func newChainWork(t *testing.T, d device.Device, tm *timer, m chainModel) *chainWork {
	const elt = 2
	H, I, KV := uint64(m.H), uint64(m.I), uint64(m.KV)
	wBytes := (H*(H+2*KV) + H*H + 2*I*H + H*I) * elt
	c := &chainWork{m: m, tm: tm, layers: make([]chainLayer, max(3, int((768<<20)/wBytes)+1))}
	get := func(n uint64) device.Ptr {
		p := rawAlloc(t, d, n)
		c.all = append(c.all, p)
		return p
	}
	for i := range c.layers {
		l := &c.layers[i]
		for _, w := range []struct {
			p *device.Ptr
			n uint64
		}{{&l.wq, H * H}, {&l.wk, KV * H}, {&l.wv, KV * H}, {&l.wo, H * H}, {&l.wg, I * H}, {&l.wu, I * H}, {&l.wd, H * I}, {&l.n1, H}, {&l.n2, H}} {
			*w.p = get(w.n * elt)
			must(t, d.Memset8(*w.p, 0x3c, w.n*elt, tm.st))
		}
	}
	c.x, c.xn, c.q, c.k, c.v, c.o = get(4*H), get(elt*H), get(4*H), get(4*KV), get(4*KV), get(4*H)
	c.g, c.u, c.act, c.y = get(4*I), get(4*I), get(elt*I), get(4*H)
	must(t, d.Memset8(c.x, 0, 4*H, tm.st))
	must(t, d.Memset8(c.xn, 0x3c, elt*H, tm.st))
	c.bytes = float64(wBytes + 2*(H+H+H+I)*elt + 4*(H+2*KV+H+2*I+H))
	return c
}

// free frees the chain's buffers.
func (c *chainWork) free() {
	for _, p := range c.all {
		c.tm.d.Free(p)
	}
}

// layer queues the next copy's layer on s: every launch, or with
// productsOnly the four product launches alone.
func (c *chainWork) layer(s *Set, productsOnly bool) error {
	l, m, st := c.layers[c.i%len(c.layers)], c.m, c.tm.st
	c.i++
	steps := []func() error{
		func() error { return s.RMSNorm(c.x, l.n1, BF16, c.xn, BF16, 1, m.H, 1e-5, st) },
		func() error {
			return s.MatmulGroup(BF16, c.xn, m.H, 1, []MatmulOp{{l.wq, c.q, m.H}, {l.wk, c.k, m.KV}, {l.wv, c.v, m.KV}}, st)
		},
		func() error { return s.Matmul(BF16, l.wo, c.xn, c.o, m.H, m.H, 1, st) },
		func() error { return s.RMSNorm(c.o, l.n2, BF16, c.xn, BF16, 1, m.H, 1e-5, st) },
		func() error {
			return s.MatmulGroup(BF16, c.xn, m.H, 1, []MatmulOp{{l.wg, c.g, m.I}, {l.wu, c.u, m.I}}, st)
		},
		func() error { return s.SiluMul(c.g, c.u, c.act, BF16, uint64(m.I), st) },
		func() error { return s.Matmul(BF16, l.wd, c.act, c.y, m.H, m.I, 1, st) },
	}
	if productsOnly {
		steps = []func() error{steps[1], steps[2], steps[4], steps[6]}
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// chainSpin is the spin ahead of a timed batch of layers (20 layers of a
// 7B model: about 2.5 ms).
const chainSpin = 3 * time.Millisecond

// sweepChain times a chainWork of m, 20 layers queued behind a spin, for
// each Set and, on the compute_90 module, PDL off and on at several
// prefetch sizes. Prints
//
//	KCHAIN <target> <model> <pdl 0|1> <prefetch bytes> <µs per layer> <products' GB/s> <% of copy>
//
// where the products' bytes are their weights plus X and Y; the model
// name "<model>/products" is the four product launches alone.
func sweepChain(t *testing.T, d device.Device, sets []*Set, tm *timer, m chainModel, copyGBs float64) {
	c := newChainWork(t, d, tm, m)
	defer c.free()
	for _, s := range sets {
		target := strings.TrimSuffix(strings.TrimPrefix(s.Source(), "embedded kernels_"), ".ptx")
		type cfg struct {
			pdl      bool
			pf       uint32
			products bool // the products alone, without the norms and SiLU·mul
		}
		cfgs := []cfg{{false, s.GemvPrefetch(), false}}
		if s.overlap != nil {
			cfgs = []cfg{{false, 0, false}, {true, 0, false}, {true, 4 << 10, false}, {true, 8 << 10, false}, {true, 16 << 10, false},
				{true, DefaultGemvPrefetch, true}, {false, 0, true}}
		}
		was, wasPf := s.Overlap(), s.prefetch
		for _, cf := range cfgs {
			s.SetOverlap(cf.pdl)
			s.prefetch = cf.pf
			per := queuedSpin(t, s, tm, func() error { return c.layer(s, cf.products) }, chainSpin)
			gbs := c.bytes / per.Seconds() / 1e9
			name := m.name
			if cf.products {
				name += "/products"
			}
			fmt.Printf("KCHAIN %s %s %d %d %.1f %.0f %.1f\n", target, name, map[bool]int{false: 0, true: 1}[cf.pdl], cf.pf,
				float64(per.Nanoseconds())/1e3, gbs, 100*gbs/copyGBs)
		}
		s.SetOverlap(was)
		s.prefetch = wasPf
	}
}
