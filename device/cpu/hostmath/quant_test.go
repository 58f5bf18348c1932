package hostmath

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/half"
)

// quantOf is the format/quant type of each QType: package quant is the
// oracle (ggml's values) for the dequantizers and the products.
var quantOf = [numQTypes]quant.Type{Q8_0: quant.Q8_0, Q4_0: quant.Q4_0, Q4_K: quant.Q4_K, Q5_K: quant.Q5_K, Q6_K: quant.Q6_K}

// scaleFields are the byte offsets of each type's f16 scales in a block.
var scaleFields = [numQTypes][]int{Q8_0: {0}, Q4_0: {0}, Q4_K: {0, 2}, Q5_K: {0, 2}, Q6_K: {208}}

// randBlocks returns nb random blocks of q at byte offset off of a new
// slice. Each block's quants are random bytes; its f16 scales are, by
// block, random bits (any f16: subnormals, the largest, Inf and NaN) when
// wild, else finite values 2^−14..2^4 or their extremes (the smallest
// subnormal, 65504); one block in eight is all zero.
func randBlocks(r *rand.Rand, q QType, nb, off int, wild bool) []byte {
	bb := q.BlockBytes()
	b := make([]byte, off+nb*bb)[off:]
	for i := range nb {
		blk := b[i*bb : (i+1)*bb]
		if r.IntN(8) == 0 {
			continue
		}
		for j := range blk {
			blk[j] = byte(r.Uint32())
		}
		if wild {
			continue
		}
		for _, f := range scaleFields[q] {
			var h uint16
			switch r.IntN(10) {
			case 0:
				h = 1 // the smallest subnormal
			case 1:
				h = 0x7BFF // 65504
			case 2:
				h = 0
			default:
				h = half.F32ToF16(float32(math.Ldexp(r.Float64()+0.5, -14+r.IntN(18))))
			}
			binary.LittleEndian.PutUint16(blk[f:], h)
		}
	}
	return b
}

// sameBits reports whether a and b are the same float32, or both NaN.
func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b
}

// TestDequantExact holds every variant's dequantizers to package quant's
// values bit for bit, over random blocks of any bytes at any alignment.
func TestDequantExact(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, k := range variants(t) {
		for _, q := range QTypes() {
			for range 20 {
				nb, off := r.IntN(9), r.IntN(5)
				src := randBlocks(r, q, nb, off, r.IntN(2) == 0)
				want := make([]float32, nb*q.BlockElems())
				if err := quant.Dequantize(quantOf[q], want, src); err != nil {
					t.Fatal(err)
				}
				got := make([]float32, len(want)+1)
				got[len(want)] = 42
				k.Dequant(q, got[:len(want)], src)
				for i, v := range want {
					if !sameBits(got[i], v) {
						t.Fatalf("%v %v %d blocks at +%d: element %d = %g (%#x), want %g (%#x)", k.Variant(), q, nb, off, i, got[i], math.Float32bits(got[i]), v, math.Float32bits(v))
					}
				}
				if got[len(want)] != 42 {
					t.Fatalf("%v %v: wrote past the blocks", k.Variant(), q)
				}
			}
		}
	}
}

// TestQMatmul checks every variant's quantized products over random
// shapes against package quant's float64 dot over the dequantized rows, on
// the caller and on a runner, and against the generic variant bit for bit
// where the variants' float32 dots agree (T within one vector step).
func TestQMatmul(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	ks := variants(t)
	runner := NewRunner(3)
	defer runner.Close()
	for range 24 {
		q := QTypes()[r.IntN(int(numQTypes))]
		e := q.BlockElems()
		M, K, T := 1+r.IntN(20), e*(1+r.IntN(max(1, 1024/e))), 1+r.IntN(9)
		rowB := K / e * q.BlockBytes()
		w := randBlocks(r, q, M*K/e, r.IntN(3), false)
		x := randF32(r, T*K, r.IntN(3))
		wf := make([]float32, M*K)
		if err := quant.Dequantize(quantOf[q], wf, w); err != nil {
			t.Fatal(err)
		}
		for _, k := range ks {
			for _, run := range []*Runner{nil, runner} {
				y := make([]float32, T*M)
				for i := range y {
					y[i] = float32(math.NaN())
				}
				k.QMatmul(run, y, w, q, x, M, K, T)
				yd := make([]float32, T*M)
				wb := make([]byte, 4*M*K)
				Narrow(wb, wf, F32)
				k.Matmul(nil, yd, wb, F32, x, M, K, T)
				for ti := range T {
					for m := range M {
						what := fmt.Sprintf("%v %v M=%d K=%d T=%d workers %d: y[%d, %d]", k.Variant(), q, M, K, T, run.Workers(), ti, m)
						ref, err := quant.Dot(quantOf[q], w[m*rowB:(m+1)*rowB], x[ti*K:(ti+1)*K])
						if err != nil {
							t.Fatal(err)
						}
						_, abs := sum(0, K, func(i int) float64 { return math.Abs(float64(wf[m*K+i]) * float64(x[ti*K+i])) })
						within(t, what, y[ti*M+m], ref, abs, K)
						if !sameBits(y[ti*M+m], yd[ti*M+m]) {
							t.Fatalf("%s = %g, Matmul over the dequantized rows %g", what, y[ti*M+m], yd[ti*M+m])
						}
					}
				}
			}
		}
	}
}

// TestQMatmulPanics: shapes that are not whole blocks, and short slices,
// panic before anything is written.
func TestQMatmulPanics(t *testing.T) {
	k, _ := New(Generic)
	for _, c := range []struct {
		M, K, T, w, x, y int
	}{{1, 31, 1, 34, 31, 1}, {2, 32, 1, 34, 32, 2}, {1, 32, 2, 34, 32, 1}, {1, 32, 1, 34, 16, 1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("QMatmul%v did not panic", c)
				}
			}()
			k.QMatmul(nil, make([]float32, c.y), make([]byte, c.w), Q8_0, make([]float32, c.x), c.M, c.K, c.T)
		}()
	}
}
