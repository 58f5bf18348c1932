package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/half"
	"github.com/memwall/memwall/internal/longtest"
)

// dequantSuite runs MatmulDequant over random quantized matrices of every
// type (M on and off the matrix library's multiple of 4, T from
// DequantMinTokens up): the bf16 weight it leaves in scratch is ggml's
// value rounded to nearest even, bit for bit; each output lies within
// float32 accumulation of the float64 product of the bf16 weight and bf16
// activations, and within bf16 rounding of quant.Dot's; below
// DequantMinTokens, with too little scratch or without the kernel, it is
// Matmul bit for bit.
func dequantSuite(t *testing.T, d device.Device, s *Set) {
	r := newRig(t, d, s)
	rng := rand.New(rand.NewPCG(31, 2))
	cases := 2
	if longtest.Enabled() {
		cases = 12
	}
	for _, dt := range QuantDTypes() {
		if !s.HasDequant(dt) {
			t.Fatalf("%s: no %s", s.Source(), QDequantName(dt))
		}
		typ, _ := QuantType(dt)
		for c := range cases {
			M := 1 + rng.IntN(90)
			if c == 0 {
				M = 4 * (1 + rng.IntN(24)) // the library's shapes
			}
			K := typ.BlockElems() * (1 + rng.IntN(3))
			if typ.BlockElems() == 1 {
				K = 8 * (1 + rng.IntN(40))
			}
			T := DequantMinTokens + rng.IntN(50)
			dequantCase(t, r, dt, typ, rng, M, K, T)
		}
	}
}

func dequantCase(t *testing.T, r *rig, dt string, typ quant.Type, rng *rand.Rand, M, K, T int) {
	t.Helper()
	s := r.s
	w, x := randQuant(t, rng, typ, M, K), randNormal(rng, T*K, 3)
	W, X := r.upload(w), r.f32(x)
	need := DequantScratchBytes(uint32(M), uint32(K), uint32(T))
	scratch := r.nans(need)
	Y := r.nans(uint64(4 * T * M))
	must(t, s.MatmulDequant(dt, W, X, Y, uint32(M), uint32(K), uint32(T), scratch, need, r.st))
	got := r.readDT(F32, Y, T*M)
	wb := r.read(scratch, uint64(2*M*K))
	rb := len(w) / M
	row := make([]float32, K)
	wq := make([]float64, M*K) // the bf16 weight
	for m := range M {
		must(t, quant.Dequantize(typ, row, w[m*rb:(m+1)*rb]))
		for k, v := range row {
			want := half.F32ToBF16(v)
			if g := binary.LittleEndian.Uint16(wb[2*(m*K+k):]); g != want {
				t.Fatalf("%s M=%d K=%d: bf16 weight [%d,%d] = %#04x, want %#04x (of %g)", dt, M, K, m, k, g, want, v)
			}
			wq[m*K+k] = float64(half.BF16ToF32(want))
		}
	}
	for tt := range T {
		for m := range M {
			var ref, mag float64
			for k := range K {
				xv := float64(half.BF16ToF32(half.F32ToBF16(x[tt*K+k])))
				ref += wq[m*K+k] * xv
				mag += math.Abs(wq[m*K+k] * xv)
			}
			want, err := quant.Dot(typ, w[m*rb:(m+1)*rb], x[tt*K:(tt+1)*K])
			must(t, err)
			g := float64(got[tt*M+m])
			if e := math.Abs(g - ref); !(e <= 1e-5*mag+1e-30) {
				t.Fatalf("%s M=%d K=%d T=%d: y[%d,%d] = %g, want %g over the bf16 operands (Σ|w·x| %g)", dt, M, K, T, tt, m, g, ref, mag)
			}
			if e := math.Abs(g - want); !(e <= 8e-3*mag+1e-30) {
				t.Fatalf("%s M=%d K=%d T=%d: y[%d,%d] = %g, the quantized product %g (Σ|w·x| %g)", dt, M, K, T, tt, m, g, want, mag)
			}
		}
	}
	// Matmul bit for bit where the bf16 path is not taken.
	for _, fb := range []struct {
		what    string
		T       int
		scratch uint64
	}{{"T below DequantMinTokens", DequantMinTokens - 1, need}, {"scratch a byte short", T, need - 1}} {
		Y1, Y2 := r.nans(uint64(4*fb.T*M)), r.nans(uint64(4*fb.T*M))
		must(t, s.MatmulDequant(dt, W, X, Y1, uint32(M), uint32(K), uint32(fb.T), scratch, fb.scratch, r.st))
		must(t, s.Matmul(dt, W, X, Y2, uint32(M), uint32(K), uint32(fb.T), r.st))
		if string(r.read(Y1, uint64(4*fb.T*M))) != string(r.read(Y2, uint64(4*fb.T*M))) {
			t.Fatalf("%s M=%d K=%d, %s: MatmulDequant differs from Matmul", dt, M, K, fb.what)
		}
	}
}

func TestDequantSim(t *testing.T) { withSet(t, newSim(t), nil, dequantSuite) }

func TestDequantCPU(t *testing.T) { withSet(t, newCPU(t, ""), nil, dequantSuite) }

// TestDequantCUDA runs the suite on the GPU (MEMWALL_TEST_DEVICE=cuda)
// with MEMWALL_KERNELS_PTX's module (or the embedded one, once it holds
// the kernels): the bf16 weights bit for bit against ggml's values, the
// products through cuBLASLt where it takes them and memwall's GEMM where
// it does not.
func TestDequantCUDA(t *testing.T) { withSet(t, openCUDA(t), os.Getenv, dequantSuite) }

// A module without the kernels (the frozen compute_70 one) runs Matmul.
func TestDequantWithout(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	for _, dt := range QuantDTypes() {
		delete(s.extra, QDequantName(dt))
	}
	rng := rand.New(rand.NewPCG(3, 3))
	r := newRig(t, d, s)
	typ, _ := QuantType(Q4_K)
	M, K, T := 8, 256, 20
	w, x := randQuant(t, rng, typ, M, K), randNormal(rng, T*K, 1)
	W, X := r.upload(w), r.f32(x)
	need := DequantScratchBytes(uint32(M), uint32(K), uint32(T))
	Y1, Y2 := r.nans(uint64(4*T*M)), r.nans(uint64(4*T*M))
	must(t, s.MatmulDequant(Q4_K, W, X, Y1, uint32(M), uint32(K), uint32(T), r.nans(need), need, r.st))
	must(t, s.Matmul(Q4_K, W, X, Y2, uint32(M), uint32(K), uint32(T), r.st))
	if string(r.read(Y1, uint64(4*T*M))) != string(r.read(Y2, uint64(4*T*M))) {
		t.Fatal("without memwall_qdequant_q4_k: MatmulDequant differs from Matmul")
	}
}
