package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/sim"
)

// The same suite runs on the simulator (always) and on a GPU
// (MEMWALL_TEST_DEVICE=cuda, with MEMWALL_KERNELS_PTX or a real embedded
// PTX).

func newSim(t testing.TB) device.Device {
	o := sim.DefaultOptions()
	o.Kernels = Sim()
	d := sim.New(o)
	t.Cleanup(func() { d.Close() })
	return d
}

func openCUDA(t testing.TB) device.Device {
	if os.Getenv("MEMWALL_TEST_DEVICE") != "cuda" {
		t.Skip("set MEMWALL_TEST_DEVICE=cuda on a GPU machine to run the kernels on the GPU")
	}
	d, err := cuda.Open(cuda.Options{})
	if err != nil {
		t.Fatalf("MEMWALL_TEST_DEVICE=cuda: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestSimKernels(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	kernelSuite(t, d, s, false)
}

// TestCUDAKernels runs the kernel suite on the module Load picks (or the
// one in MEMWALL_KERNELS_PTX), with the device's matrix library for
// prefill products where it has one and again with memwall's own GEMM,
// then on the other embedded targets with memwall's GEMM (the library does
// not depend on the module).
func TestCUDAKernels(t *testing.T) {
	d := openCUDA(t)
	info := d.Info()
	picked := TargetFor(info.ComputeMajor, info.ComputeMinor)
	if os.Getenv(EnvPTX) != "" {
		picked = "env"
	}
	s, err := Load(countLaunches(t, d, picked), os.Getenv)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	defer s.Close()
	t.Logf("kernels from %s on %s", s.Source(), info.Name)
	suite := func(target string, s *Set) {
		t.Run(target+" "+s.GemmLibrary(), func(t *testing.T) { kernelSuite(t, d, s, true) })
		if s.GemmLibrary() != "memwall" {
			s.SetGemmLibrary(nil)
			t.Run(target+" memwall", func(t *testing.T) { kernelSuite(t, d, s, true) })
		}
	}
	suite(picked, s)
	for _, target := range Targets() {
		if target != picked {
			s := loadChecked(t, d, target)
			s.SetGemmLibrary(nil)
			suite(target, s)
		}
	}
}

func alloc(t testing.TB, d device.Device, n uint64) device.Ptr {
	t.Helper()
	p, err := d.Alloc(max(n, 1))
	if err != nil {
		t.Fatalf("Alloc(%d): %v", n, err)
	}
	if p == 0 {
		t.Fatalf("Alloc(%d) returned a null pointer and no error (a device backend bug)", n)
	}
	t.Cleanup(func() { d.Free(p) })
	return p
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func kernelSuite(t *testing.T, d device.Device, s *Set, gpu bool) {
	st, err := d.NewStream()
	must(t, err)
	defer d.DestroyStream(st)

	t.Run("fill and check", func(t *testing.T) {
		n := uint64(100_003)
		if gpu {
			n = 50_000_017
		}
		buf := alloc(t, d, 4*n+4)
		ctr := alloc(t, d, 8)
		must(t, d.Memset32(buf, 0xDEADBEEF, n+1, st))
		must(t, s.Fill(buf, n, 42, st))
		bad, err := s.Mismatches(buf, n, 42, ctr, st)
		must(t, err)
		if bad != 0 {
			t.Fatalf("%d mismatches right after fill", bad)
		}
		host := make([]byte, 4*n+4)
		must(t, d.CopyDtoH(host, buf, st))
		must(t, d.StreamSynchronize(st))
		for _, i := range []uint64{0, 1, n / 3, n - 1} {
			if got := binary.LittleEndian.Uint32(host[4*i:]); got != Pattern(42, i) {
				t.Fatalf("word %d = %#x, want Pattern = %#x", i, got, Pattern(42, i))
			}
		}
		if got := binary.LittleEndian.Uint32(host[4*n:]); got != 0xDEADBEEF {
			t.Fatalf("fill wrote word n: %#x", got)
		}
		for _, i := range []uint64{5, n / 2} {
			must(t, d.Memset32(buf.Add(4*i), ^Pattern(42, i), 1, st))
		}
		bad, err = s.Mismatches(buf, n, 42, ctr, st)
		must(t, err)
		if bad != 2 {
			t.Fatalf("%d mismatches after corrupting 2 words", bad)
		}
		bad, err = s.Mismatches(buf, n, 43, ctr, st)
		must(t, err)
		if bad < n-2 {
			t.Fatalf("another seed: %d mismatches of %d", bad, n)
		}
	})

	t.Run("spin holds the stream", func(t *testing.T) {
		a, err := d.NewEvent(true)
		must(t, err)
		b, err := d.NewEvent(true)
		must(t, err)
		defer d.DestroyEvent(a)
		defer d.DestroyEvent(b)
		const want = 3 * time.Millisecond
		must(t, d.EventRecord(a, st))
		must(t, s.Spin(want, st))
		must(t, d.EventRecord(b, st))
		must(t, d.EventSynchronize(b))
		got, err := d.EventElapsed(a, b)
		must(t, err)
		// The host's own clock runs the CPU device's spin: a loaded machine
		// (the test suite runs packages in parallel) can only make it late,
		// never early, so only a gross overrun fails there.
		late := want / 2
		if d.Info().Backend == "cpu" {
			late = 250 * time.Millisecond
		}
		if got < want || got > want+late {
			t.Fatalf("spin of %v took %v", want, got)
		}
	})

	type shape struct {
		M, K, T uint32
		offset  uint64 // bytes added to W and X (4 for f32): takes the unaligned paths
	}
	shapes := []shape{{1, 1, 1, 0}, {37, 13, 1, 0}, {203, 99, 3, 0}, {130, 256, 8, 0},
		{77, 200, 9, 0}, {130, 64, 130, 0}, {64, 0, 20, 0}, {100, 128, 5, 2}, {100, 128, 40, 2}}
	if gpu {
		shapes = append(shapes, shape{4096, 4096, 1, 0}, shape{1003, 1024, 300, 0},
			shape{3, 4104, 129, 0}, shape{2048, 2048, 512, 0})
	}
	for _, dt := range DTypes() {
		for _, sh := range shapes {
			t.Run(fmt.Sprintf("matmul %s M=%d K=%d T=%d off=%d", dt, sh.M, sh.K, sh.T, sh.offset), func(t *testing.T) {
				M, K, T := int(sh.M), int(sh.K), int(sh.T)
				W, X := randMatrices(t, dt, M, K, T, uint64(M+K+T))
				off := sh.offset
				if dt == F32 && off%4 != 0 {
					off = 4
				}
				pw := alloc(t, d, uint64(len(W))+off)
				px := alloc(t, d, uint64(len(X))+off)
				py := alloc(t, d, uint64(4*M*T)+256)
				if len(W) > 0 {
					must(t, d.CopyHtoD(pw.Add(off), W, st))
				}
				if len(X) > 0 {
					must(t, d.CopyHtoD(px.Add(off), X, st))
				}
				must(t, d.Memset8(py, 0xFF, uint64(4*M*T)+256, st)) // NaN: unwritten outputs fail
				must(t, s.Matmul(dt, pw.Add(off), px.Add(off), py, sh.M, sh.K, sh.T, st))
				yb := make([]byte, 4*M*T+256)
				must(t, d.CopyDtoH(yb, py, st))
				must(t, d.StreamSynchronize(st))
				y := make([]float32, M*T)
				for i := range y {
					y[i] = math.Float32frombits(binary.LittleEndian.Uint32(yb[4*i:]))
				}
				for i := 4 * M * T; i < len(yb); i++ {
					if yb[i] != 0xFF {
						t.Fatalf("byte %d past Y was written", i-4*M*T)
					}
				}
				must(t, CheckMatmul(dt, W, X, y, M, K, T, 2000, 1))
			})
		}
	}
}

// On the simulator the modelled durations follow the costs.
func TestSimKernelTimes(t *testing.T) {
	o := sim.DefaultOptions()
	o.Kernels = Sim()
	o.Backing = false // time only: shapes too large to compute in a test
	d := sim.New(o)
	defer d.Close()
	s, err := Load(d, nil)
	must(t, err)
	st, err := d.NewStream()
	must(t, err)
	a, err := d.NewEvent(true)
	must(t, err)
	b, err := d.NewEvent(true)
	must(t, err)
	measure := func(f func() error) time.Duration {
		must(t, d.EventRecord(a, st))
		must(t, f())
		must(t, d.EventRecord(b, st))
		must(t, d.EventSynchronize(b))
		el, err := d.EventElapsed(a, b)
		must(t, err)
		return el
	}
	big := alloc(t, d, 1<<30)
	tests := []struct {
		name string
		f    func() error
		want time.Duration
	}{
		{"spin", func() error { return s.Spin(2*time.Millisecond, st) }, 2 * time.Millisecond},
		{"fill 1 GiB", func() error { return s.Fill(big, 1<<28, 1, st) },
			o.LaunchLatency + time.Duration(float64(1<<30)/o.DeviceGBps)},
		// Decode step: 4096×4096 bf16 weights are 32 MiB, memory-bound.
		{"gemv bf16", func() error { return s.Matmul(BF16, big, big, big, 4096, 4096, 1, st) },
			o.LaunchLatency + time.Duration((4096*4096*2+4096*2+4096*4)/o.DeviceGBps)},
		// Prefill: 2·4096³ FLOPs, compute-bound.
		{"gemm bf16", func() error { return s.Matmul(BF16, big, big, big, 4096, 4096, 4096, st) },
			o.LaunchLatency + time.Duration(2*4096.0*4096*4096/o.PeakFLOPS*1e9)},
	}
	for _, tc := range tests {
		got := measure(tc.f)
		if d := got - tc.want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// BenchmarkCUDA times the kernels on a GPU with device events and reports
// the figures that matter: GB/s for fill, check and GEMV (memory-bound),
// TFLOP/s for GEMM. Run with MEMWALL_TEST_DEVICE=cuda -bench CUDA.
func BenchmarkCUDA(b *testing.B) {
	d := openCUDA(b)
	s, err := Load(d, os.Getenv)
	if err != nil {
		b.Fatalf("Load: %v", err)
	}
	defer s.Close()
	st, err := d.NewStream()
	must(b, err)
	ev0, err := d.NewEvent(true)
	must(b, err)
	ev1, err := d.NewEvent(true)
	must(b, err)
	timed := func(b *testing.B, f func() error) time.Duration {
		must(b, f()) // warm-up
		must(b, d.StreamSynchronize(st))
		b.ResetTimer()
		must(b, d.EventRecord(ev0, st))
		for range b.N {
			must(b, f())
		}
		must(b, d.EventRecord(ev1, st))
		must(b, d.EventSynchronize(ev1))
		el, err := d.EventElapsed(ev0, ev1)
		must(b, err)
		return el / time.Duration(b.N)
	}
	b.Run("fill 4GiB", func(b *testing.B) {
		const n = 1 << 30
		buf := alloc(b, d, 4*n)
		per := timed(b, func() error { return s.Fill(buf, n, 1, st) })
		b.ReportMetric(4*n/per.Seconds()/1e9, "GB/s")
	})
	b.Run("check 4GiB", func(b *testing.B) {
		const n = 1 << 30
		buf := alloc(b, d, 4*n)
		ctr := alloc(b, d, 8)
		per := timed(b, func() error { return s.Check(buf, n, 1, ctr, st) })
		b.ReportMetric(4*n/per.Seconds()/1e9, "GB/s")
	})
	shapes := []struct{ M, K, T uint32 }{
		{4096, 4096, 1}, {16384, 8192, 1}, {28672, 8192, 1}, {16384, 8192, 4}, {16384, 8192, 8},
		{4096, 4096, 4096}, {11008, 4096, 4096},
	}
	for _, dt := range DTypes() {
		elt, _ := ElemSize(dt)
		for _, sh := range shapes {
			b.Run(fmt.Sprintf("matmul %s M=%d K=%d T=%d", dt, sh.M, sh.K, sh.T), func(b *testing.B) {
				M, K, T := uint64(sh.M), uint64(sh.K), uint64(sh.T)
				w := alloc(b, d, M*K*uint64(elt))
				x := alloc(b, d, T*K*uint64(elt))
				y := alloc(b, d, 4*T*M)
				must(b, d.Memset8(w, 0x3c, M*K*uint64(elt), st))
				must(b, d.Memset8(x, 0x3c, T*K*uint64(elt), st))
				per := timed(b, func() error { return s.Matmul(dt, w, x, y, sh.M, sh.K, sh.T, st) })
				bytes := float64(M*K*uint64(elt) + T*K*uint64(elt) + 4*T*M)
				b.ReportMetric(bytes/per.Seconds()/1e9, "GB/s")
				b.ReportMetric(2*float64(M*K*T)/per.Seconds()/1e12, "TFLOP/s")
			})
		}
	}
}

func TestSimWithoutKernels(t *testing.T) {
	d := sim.New(sim.DefaultOptions()) // no Kernels
	defer d.Close()
	_, err := Load(d, nil)
	if err == nil || !strings.Contains(err.Error(), "kernels.Sim()") || !strings.Contains(err.Error(), NameFill) {
		t.Fatalf("Load on a sim without kernels: %v, want a hint naming kernels.Sim() and %s", err, NameFill)
	}
}
