package kernels

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/internal/longtest"
)

// quantSuite multiplies random quantized matrices (M and T not multiples
// of the warp's rows or of a vector width, one to three blocks a row) on
// s and compares every output with quant.Dot's float64 sum over the
// dequantized row, and checks Embed's rows against quant.Dequantize
// exactly, all with the 8-bit-activation products off.
func quantSuite(t *testing.T, d device.Device, s *Set) {
	r := newRig(t, d, s)
	// (the float32 products: q8Suite tests the 8-bit-activation ones)
	defer s.SetQ8Activations(s.Q8Activations())
	s.SetQ8Activations(false)
	rng := rand.New(rand.NewPCG(27, 1))
	cases := 4
	if longtest.Enabled() {
		cases = 40
	}
	for _, dt := range QuantDTypes() {
		typ, _ := QuantType(dt)
		n, blocks, tokens := cases, 3, 11
		if dt == Q4_K || dt == Q6_K {
			// (the GPU's wide-load kernels: more shapes, tiles past the
			// first, and the misaligned operands that take the chunk walk)
			n, blocks, tokens = 3*cases, 6, 20
		}
		for range n {
			M, T := 1+rng.IntN(37), 1+rng.IntN(tokens)
			K := typ.BlockElems() * (1 + rng.IntN(blocks))
			if typ.BlockElems() == 1 {
				K = 1 + rng.IntN(300)
			}
			w, x := randQuant(t, rng, typ, M, K), randNormal(rng, T*K, 1)
			// W at any 2-byte and X at any 4-byte offset from an aligned
			// allocation: each kernel path's alignment condition, both ways.
			wOff, xOff := 2*rng.IntN(4), 4*rng.IntN(4)
			W, X, Y := r.uploadAt(w, wOff), r.uploadAt(f32Bytes(x), xOff), r.nans(uint64(4*T*M))
			must(t, s.Matmul(dt, W, X, Y, uint32(M), uint32(K), uint32(T), r.st))
			got := r.readDT(F32, Y, T*M)
			rb := len(w) / M
			for tt := range T {
				for m := range M {
					want, err := quant.Dot(typ, w[m*rb:(m+1)*rb], x[tt*K:(tt+1)*K])
					must(t, err)
					var mag float64
					row := make([]float32, K)
					must(t, quant.Dequantize(typ, row, w[m*rb:(m+1)*rb]))
					for k, v := range row {
						mag += math.Abs(float64(v) * float64(x[tt*K+k]))
					}
					if e := math.Abs(float64(got[tt*M+m]) - want); !(e <= 1e-5*mag+1e-30) {
						t.Fatalf("%s M=%d K=%d T=%d W+%d X+%d: y[%d,%d] = %g, want %g (Σ|w·x| %g)", dt, M, K, T, wOff, xOff, tt, m, got[tt*M+m], want, mag)
					}
				}
			}
			// Embed: every row of the table, in a random order.
			ids := make([]int32, T)
			for i := range ids {
				ids[i] = int32(rng.IntN(M))
			}
			out := r.nans(uint64(4 * T * K))
			if err := s.Embed(W, dt, r.i32(ids), out, uint32(T), uint32(K), r.st); err != nil {
				t.Fatalf("%s: embed: %v", dt, err)
			}
			emb := r.readDT(F32, out, T*K)
			for i, id := range ids {
				row := make([]float32, K)
				must(t, quant.Dequantize(typ, row, w[int(id)*rb:(int(id)+1)*rb]))
				for k := range row {
					if math.Float32bits(emb[i*K+k]) != math.Float32bits(row[k]) {
						t.Fatalf("%s: embed row %d element %d = %g, want %g", dt, id, k, emb[i*K+k], row[k])
					}
				}
			}
		}
	}
	// A row that is no whole number of blocks is refused before a launch.
	if err := s.Matmul(Q4_K, r.upload(make([]byte, 144)), r.f32(make([]float32, 128)), r.nans(4), 1, 128, 1, r.st); !errors.Is(err, ErrShape) {
		t.Errorf("q4_k K=128: %v, want ErrShape", err)
	}
}

// randQuant is an M×K matrix of normal values quantized to typ.
func randQuant(t *testing.T, rng *rand.Rand, typ quant.Type, M, K int) []byte {
	t.Helper()
	w := make([]byte, M*(K/typ.BlockElems())*typ.BlockBytes())
	must(t, quant.Quantize(typ, w, randNormal(rng, M*K, 1)))
	return w
}

// randNormal is n normal values of standard deviation sd.
func randNormal(rng *rand.Rand, n int, sd float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * sd)
	}
	return v
}

func TestQuantSim(t *testing.T) { withSet(t, newSim(t), nil, quantSuite) }

func TestQuantCPU(t *testing.T) { withSet(t, newCPU(t, ""), nil, quantSuite) }

// withSet loads the kernels on d (getenv as Load takes it) and runs suite
// with them.
func withSet(t *testing.T, d device.Device, getenv func(string) string, suite func(*testing.T, device.Device, *Set)) {
	s, err := Load(d, getenv)
	must(t, err)
	defer s.Close()
	suite(t, d, s)
}

func TestQuantDType(t *testing.T) {
	for _, dt := range []string{Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K} {
		typ, _ := QuantType(dt)
		if got := QuantDType(typ.String()); got != dt {
			t.Errorf("QuantDType(%s) = %q, want %q", typ, got, dt)
		}
	}
	for _, fd := range []string{"F16", "BF16", "F32", "Q2_K", ""} {
		if got := QuantDType(fd); got != "" {
			t.Errorf("QuantDType(%q) = %q, want none", fd, got)
		}
	}
}

// TestQuantCUDA runs the suite on the GPU (MEMWALL_TEST_DEVICE=cuda) with
// the module Load picks, or MEMWALL_KERNELS_PTX's: the CUDA kernels against
// the same float64 references as the Go twins.
func TestQuantCUDA(t *testing.T) {
	d := openCUDA(t)
	s, err := Load(d, os.Getenv)
	must(t, err)
	defer s.Close()
	for _, n := range QuantNames() {
		if _, err := s.quantKernel(n); err != nil {
			t.Fatalf("%v", err)
		}
	}
	quantSuite(t, d, s)
}
