package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/internal/longtest"
)

// q8Suite runs the 8-bit-activation products over random shapes (rows
// across several blocks of kQ8Rows, K across one and two slabs, W and X
// at every offset each path allows) and checks each output against q8Dot
// over q8Quantize's activations (the kernels' definition, float32 rounding
// of its terms apart), that definition against the float64 product within
// its stated bound, zero and NaN chunks, and ties in the rounding.
func q8Suite(t *testing.T, d device.Device, s *Set) {
	r := newRig(t, d, s)
	if !s.SetQ8Activations(true) {
		t.Fatalf("8-bit-activation products not available on %s", s.Source())
	}
	for _, dt := range Q8MVDTypes() {
		if !s.HasQ8MV(dt) {
			t.Fatalf("%s: no %s", dt, NameQ8MV)
		}
	}
	rng := rand.New(rand.NewPCG(8, 27))
	cases := 5 // per layout
	if longtest.Enabled() {
		cases = 50
	}
	dts := Q8MVDTypes()
	defer s.SetQ8Layout(s.Q8Layout())
	for n := range 3 * (cases + 2) {
		layout, c := Q8Layout(n%3), n/3
		s.SetQ8Layout(layout)
		K, T := 256*(1+rng.IntN(12)), 1+rng.IntN(3)
		if c >= cases {
			K, T = 256*(40+rng.IntN(30)), 1 // past a group's 16 blocks a step several times
		}
		x := randNormal(rng, T*K, 1)
		q8Special(rng, x)
		xOff := 4 * rng.IntN(4)
		X := r.uploadAt(f32Bytes(x), xOff)
		type prod struct {
			dt   string
			w    []byte
			M    int
			wOff int
		}
		var ps []prod
		var ops []QMatmulOp
		for range 1 + rng.IntN(Q8GroupMax) {
			p := prod{dt: dts[rng.IntN(len(dts))], M: 1 + rng.IntN(70)}
			if c >= cases {
				p.M = 1 + rng.IntN(20)
			}
			typ, _ := QuantType(p.dt)
			p.w = randQuant(t, rng, typ, p.M, K)
			p.wOff = 16 * rng.IntN(2)
			if p.dt == Q6_K {
				p.wOff = 2 * rng.IntN(8)
			}
			W := r.uploadAt(p.w, p.wOff)
			if !s.q8Path(p.dt, W, 1) {
				t.Fatalf("%s W+%d: not the 8-bit path", p.dt, p.wOff)
			}
			ps = append(ps, p)
			ops = append(ops, QMatmulOp{DType: p.dt, W: W, Y: r.nans(uint64(4 * T * p.M)), M: uint32(p.M)})
		}
		// T > 1 through the kernel itself (Matmul and the group keep it to
		// T = 1), T = 1 through QMatmulGroup.
		if T > 1 {
			must(t, s.launchQ8(X, uint32(K), uint32(T), ops, r.st))
		} else {
			must(t, s.QMatmulGroup(X, uint32(K), 1, ops, r.st))
		}
		for i, p := range ps {
			typ, _ := QuantType(p.dt)
			got := r.readDT(F32, ops[i].Y, T*p.M)
			q8Check(t, typ, p.w, x, got, p.M, K, T, func() string {
				return fmt.Sprintf("%s (layout %d, product %d of %d, W+%d X+%d) on %s", p.dt, layout, i, len(ps), p.wOff, xOff, s.Source())
			})
			if T == 1 { // alone through Matmul: the same bits as in the group
				Y2 := r.nans(uint64(4 * p.M))
				must(t, s.Matmul(p.dt, ops[i].W, X, Y2, uint32(p.M), uint32(K), 1, r.st))
				for m, v := range r.readDT(F32, Y2, p.M) {
					if math.Float32bits(v) != math.Float32bits(got[m]) {
						t.Fatalf("%s: Matmul y[%d] = %g, in the group %g", p.dt, m, v, got[m])
					}
				}
			}
		}
	}
	// Q4_K weights off a 16-byte boundary, and T = 2, take the float32 path.
	if s.q8Path(Q4_K, device.Ptr(1<<20+2), 1) || s.q8Path(Q4_K, device.Ptr(1<<20), 2) || s.q8Path(Q8_0, device.Ptr(1<<20), 1) {
		t.Errorf("q8Path: a misaligned Q4_K weight, T = 2 or Q8_0 took the 8-bit path")
	}
	if s.SetQ8Activations(false) || s.q8Path(Q4_K, device.Ptr(1<<20), 1) {
		t.Errorf("SetQ8Activations(false): still on")
	}
	s.SetQ8Activations(true)
}

// q8Special overwrites a few 32-element chunks of x: all zeros, halves
// that the rounding must send to the even neighbour (amax 127, so the
// scale is exactly 1), a chunk with one huge value, and (in one x in four)
// a NaN.
func q8Special(rng *rand.Rand, x []float32) {
	chunks := len(x) / q8Chunk
	for range 3 {
		c := rng.IntN(chunks) * q8Chunk
		switch rng.IntN(3) {
		case 0:
			clear(x[c : c+q8Chunk])
		case 1:
			for i := range q8Chunk {
				x[c+i] = float32(rng.IntN(254)-127) + 0.5
			}
			x[c+rng.IntN(q8Chunk)] = 127
		case 2:
			x[c+rng.IntN(q8Chunk)] = 1e30
		}
	}
	if rng.IntN(4) == 0 {
		x[rng.IntN(len(x))] = float32(math.NaN())
	}
}

// q8Check compares got (T×M) with the definition for w (M rows of typ) and
// x (T×K).
func q8Check(t *testing.T, typ quant.Type, w []byte, x, got []float32, M, K, T int, what func() string) {
	t.Helper()
	rb := len(w) / M
	q, dq := make([]int8, K), make([]float32, K/q8Chunk)
	row := make([]float32, K)
	for tt := range T {
		xt := x[tt*K : (tt+1)*K]
		q8Quantize(xt, q, dq)
		nan := false
		for _, v := range xt {
			nan = nan || v != v
		}
		for m := range M {
			must(t, quant.Dequantize(typ, row, w[m*rb:(m+1)*rb]))
			y := got[tt*M+m]
			if nan {
				if y == y {
					t.Fatalf("%s K=%d: token %d has a NaN, y[%d] = %g", what(), K, tt, m, y)
				}
				continue
			}
			want := q8Dot(row, q, dq)
			var mag, bound, exact float64
			for k, v := range row {
				c := k / q8Chunk
				mag += math.Abs(float64(dq[c]) * float64(v) * float64(q[k]))
				bound += (0.5 + 1e-4) * float64(dq[c]) * math.Abs(float64(v))
				exact += float64(v) * float64(xt[k])
			}
			if e := math.Abs(float64(y) - want); !(e <= 1e-5*mag+1e-30) {
				t.Fatalf("%s M=%d K=%d T=%d: y[%d,%d] = %g, want %g (Σ|d·w·q| %g)", what(), M, K, T, tt, m, y, want, mag)
			}
			if e := math.Abs(want - exact); !(e <= bound*(1+1e-6)+1e-30) {
				t.Fatalf("%s K=%d: the 8-bit product %g is %g from the float one %g, more than its bound %g", what(), K, want, e, exact, bound)
			}
		}
	}
}

func TestQ8Quantize(t *testing.T) {
	x := []float32{127, 2.5, -2.5, 3.5, 0.49, -126.5}
	x = append(x, make([]float32, 26)...)
	q, d := make([]int8, 32), make([]float32, 1)
	q8Quantize(x, q, d)
	want := []int8{127, 2, -2, 4, 0, -126}
	for i, v := range want {
		if q[i] != v {
			t.Errorf("q[%d] = %d, want %d", i, q[i], v)
		}
	}
	if d[0] != 1 {
		t.Errorf("d = %g, want 1", d[0])
	}
	clear(x)
	q8Quantize(x, q, d)
	if d[0] != 0 || q[0] != 0 {
		t.Errorf("zero chunk: d %g q %d", d[0], q[0])
	}
	x[5] = float32(math.NaN())
	q8Quantize(x, q, d)
	if d[0] == d[0] {
		t.Errorf("NaN chunk: d = %g, want NaN", d[0])
	}
}

func TestQ8Sim(t *testing.T) { withSet(t, newSim(t), nil, q8Suite) }

func TestQ8CPU(t *testing.T) {
	d := newCPU(t, "")
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	if s.Q8Activations() {
		t.Errorf("the CPU backend starts with 8-bit activations on")
	}
	q8Suite(t, d, s)
}

// TestQ8CUDA runs the suite on the GPU (MEMWALL_TEST_DEVICE=cuda).
func TestQ8CUDA(t *testing.T) { withSet(t, openCUDA(t), os.Getenv, q8Suite) }

// TestCUDAQ8Speed times the 7B Q4_K_M decode products on the 8-bit path
// and on the float32 path, queued behind a spin, PDL as Load sets it:
//
//	KPERF q8mv <dtype> M=<M>,K=<K> float32 <µs> us  <layout> <µs> us <GB/s> GB/s ...
func TestCUDAQ8Speed(t *testing.T) {
	_, tm, s, r := timedRig(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, sh := range []struct {
		dt   string
		M, K int
	}{
		{Q4_K, 4096, 4096}, {Q4_K, 11008, 4096}, {Q4_K, 4096, 11008}, {Q6_K, 4096, 11008},
		{Q6_K, 4096, 4096}, {Q6_K, 32000, 4096}, {Q4_K, 14336, 4096}, {Q4_K, 1024, 4096},
	} {
		typ, _ := QuantType(sh.dt)
		w := q8SpeedWeights(rng, typ, sh.M, sh.K)
		W, X, Y := r.upload(w), r.f32(randNormal(rng, sh.K, 1)), r.nans(uint64(4*sh.M))
		M, K := uint32(sh.M), uint32(sh.K)
		run := func() error { return s.Matmul(sh.dt, W, X, Y, M, K, 1, tm.st) }
		s.SetQ8Activations(false)
		f32 := queued(t, s, tm, run)
		s.SetQ8Activations(true)
		line := fmt.Sprintf("KPERF q8mv %s M=%d,K=%d float32 %.2f us", sh.dt, sh.M, sh.K, float64(f32)/float64(time.Microsecond))
		for _, l := range q8Layouts {
			s.SetQ8Layout(l)
			q8 := queued(t, s, tm, run)
			line += fmt.Sprintf("  %s %.2f us %.0f GB/s", q8LayoutName(l), float64(q8)/float64(time.Microsecond), float64(len(w))/q8.Seconds()/1e9)
		}
		t.Logf("%s", line)
	}
	// A layer's q, k, v (one of them Q6_K, as in half a Q4_K_M's layers)
	// and gate, up: one launch each group.
	for _, g := range []struct {
		name string
		dts  []string
		M, K int
	}{{"q,k,v", []string{Q4_K, Q4_K, Q6_K}, 4096, 4096}, {"gate,up", []string{Q4_K, Q4_K}, 11008, 4096}} {
		var ops []QMatmulOp
		var bytes int
		for _, dt := range g.dts {
			typ, _ := QuantType(dt)
			w := q8SpeedWeights(rng, typ, g.M, g.K)
			bytes += len(w)
			ops = append(ops, QMatmulOp{DType: dt, W: r.upload(w), Y: r.nans(uint64(4 * g.M)), M: uint32(g.M)})
		}
		X := r.f32(randNormal(rng, g.K, 1))
		line := fmt.Sprintf("KPERF q8mv group %s M=%d,K=%d", g.name, g.M, g.K)
		for _, l := range q8Layouts {
			s.SetQ8Layout(l)
			el := queued(t, s, tm, func() error { return s.QMatmulGroup(X, uint32(g.K), 1, ops, tm.st) })
			line += fmt.Sprintf("  %s %.2f us %.0f GB/s", q8LayoutName(l), float64(el)/float64(time.Microsecond), float64(bytes)/el.Seconds()/1e9)
		}
		t.Logf("%s", line)
	}
	s.SetQ8Layout(DefaultQ8Layout)
}

var q8Layouts = []Q8Layout{Q8Staged, Q8Grouped, Q8GroupedR4}

func q8LayoutName(l Q8Layout) string {
	for n, v := range q8LayoutNames {
		if v == l {
			return n
		}
	}
	return "?"
}

// q8SpeedWeights is M×K of typ with random quants and unit scales: the
// bytes a product reads, made without quantizing 100 M values.
func q8SpeedWeights(rng *rand.Rand, typ quant.Type, M, K int) []byte {
	bb := typ.BlockBytes()
	w := make([]byte, M*K/typ.BlockElems()*bb)
	for i := range w {
		w[i] = byte(rng.Uint32())
	}
	for b := 0; b < len(w); b += bb {
		switch typ {
		case quant.Q4_K:
			binary.LittleEndian.PutUint32(w[b:], 0x1C001C00) // d, dmin 1/256
		case quant.Q6_K:
			binary.LittleEndian.PutUint16(w[b+208:], 0x1C00)
		}
	}
	return w
}

func TestQ8LayoutEnv(t *testing.T) {
	d := newSim(t)
	for v, want := range q8LayoutNames {
		s, err := Load(d, func(k string) string {
			if k == EnvQ8Layout {
				return v
			}
			return ""
		})
		must(t, err)
		if s.Q8Layout() != want {
			t.Errorf("%s=%s: layout %d, want %d", EnvQ8Layout, v, s.Q8Layout(), want)
		}
		s.Close()
	}
	if _, err := Load(d, func(k string) string {
		if k == EnvQ8Layout {
			return "fastest"
		}
		return ""
	}); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("%s=fastest: %v, want ErrInvalid", EnvQ8Layout, err)
	}
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	if s.Q8Layout() != DefaultQ8Layout || !s.Q8Activations() {
		t.Errorf("default: layout %d, 8-bit activations %v", s.Q8Layout(), s.Q8Activations())
	}
}
