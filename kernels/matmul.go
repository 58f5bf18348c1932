package kernels

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"sync"
)

// Tolerance returns the relative error (‖Y − ref‖₂ / ‖ref‖₂ over the checked
// outputs) that CheckMatmul accepts for dtype: 1e-2 for bf16, 2e-3 for f16,
// 1e-5 for f32. Unknown dtypes get 0.
func Tolerance(dtype string) float64 {
	switch dtype {
	case BF16:
		return 1e-2
	case F16:
		return 2e-3
	case F32:
		return 1e-5
	}
	return 0
}

// matDims validates a product's dimensions against its buffers and returns
// the element size. yLen < 0 skips the Y check.
func matDims(dtype string, wLen, xLen, yLen, M, K, T int) (int, error) {
	elt, err := ElemSize(dtype)
	if err != nil {
		return 0, fmt.Errorf("kernels: matmul: %w", err)
	}
	if M < 0 || K < 0 || T < 0 {
		return 0, fmt.Errorf("kernels: matmul %s M=%d K=%d T=%d: negative dimension: %w", dtype, M, K, T, ErrShape)
	}
	need := func(what string, have, a, b, c int) error {
		n, ok := mul3(a, b, c)
		if !ok {
			return fmt.Errorf("kernels: matmul %s M=%d K=%d T=%d: %s size overflows: %w", dtype, M, K, T, what, ErrShape)
		}
		if have < n {
			return fmt.Errorf("kernels: matmul %s M=%d K=%d T=%d: %s has %d bytes, needs %d: %w", dtype, M, K, T, what, have, n, ErrShape)
		}
		return nil
	}
	if err := need("W", wLen, M, K, elt); err != nil {
		return 0, err
	}
	if err := need("X", xLen, T, K, elt); err != nil {
		return 0, err
	}
	if yLen >= 0 {
		if err := need("Y", yLen, T, M, 4); err != nil {
			return 0, err
		}
	}
	return elt, nil
}

// mul3 returns a·b·c for non-negative ints, or false when it overflows int.
func mul3(a, b, c int) (int, bool) {
	hi, ab := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || ab > math.MaxInt {
		return 0, false
	}
	hi, abc := bits.Mul64(ab, uint64(c))
	if hi != 0 || abc > math.MaxInt {
		return 0, false
	}
	return int(abc), true
}

// HostMatmul computes on the host what the matrix kernels compute on the
// GPU: Y[t, m] = Σ_k W[m, k]·X[t, k] with W (M×K) and X (T×K) row-major
// little-endian dtype bytes, widened exactly to float32, and Y (T×M,
// row-major) accumulated in float32 in order of k, each product rounded to
// float32 (no fused multiply-add, so results are the same on every
// platform). The simulated device runs it. It fails with ErrDType or
// ErrShape (a buffer shorter than its dimensions) before touching Y.
// Work is spread over GOMAXPROCS goroutines; the result does not depend on
// how.
func HostMatmul(dtype string, W, X []byte, Y []float32, M, K, T int) error {
	elt, err := matDims(dtype, len(W), len(X), len(Y)*4, M, K, T)
	if err != nil {
		return err
	}
	if M == 0 || T == 0 {
		return nil
	}
	xf := make([]float32, T*K)
	decodeInto(dtype, xf, X)
	rowBytes := K * elt
	workers := min(runtime.GOMAXPROCS(0), max(1, M/8))
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := M*w/workers, M*(w+1)/workers
		wg.Go(func() {
			wrow := make([]float32, K)
			for m := lo; m < hi; m++ {
				decodeInto(dtype, wrow, W[m*rowBytes:])
				for t := range T {
					xr := xf[t*K : t*K+K]
					var acc float32
					for k, wv := range wrow {
						acc += float32(wv * xr[k])
					}
					Y[t*M+m] = acc
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// ReferenceRow returns Σ_k W[m, k]·X[t, k] in float64 from the same inputs
// HostMatmul and the kernels take (one output: row t of X against row m of
// W). Products of widened inputs are exact in float64, so the only error is
// float64 summation. It returns NaN when the dtype is unknown, a buffer is
// too short, or t or m is out of range.
func ReferenceRow(dtype string, W, X []byte, M, K, T, t, m int) float64 {
	elt, err := matDims(dtype, len(W), len(X), -1, M, K, T)
	if err != nil || t < 0 || t >= T || m < 0 || m >= M {
		return math.NaN()
	}
	return refDot(dtype, W[m*K*elt:], X[t*K*elt:], K)
}

func refDot(dtype string, w, x []byte, K int) float64 {
	var wf, xf [256]float32
	var sum float64
	elt := 4
	if dtype != F32 {
		elt = 2
	}
	for k0 := 0; k0 < K; k0 += len(wf) {
		n := min(len(wf), K-k0)
		decodeInto(dtype, wf[:n], w[k0*elt:])
		decodeInto(dtype, xf[:n], x[k0*elt:])
		for i := range n {
			sum += float64(wf[i]) * float64(xf[i])
		}
	}
	return sum
}

// MatmulError reports a product whose checked outputs differ from the
// float64 reference by more than the tolerance. It matches ErrMismatch.
type MatmulError struct {
	DType   string
	M, K, T int
	Samples int     // outputs checked
	RelErr  float64 // ‖Y − ref‖₂ / ‖ref‖₂ over them (absolute when ‖ref‖ = 0); +Inf if one was not finite
	Tol     float64
	// The checked output with the largest absolute difference.
	WorstT, WorstM int
	Got            float32
	Want           float64
}

func (e *MatmulError) Error() string {
	return fmt.Sprintf("kernels: matmul %s M=%d K=%d T=%d: relative error %.3g over %d checked outputs exceeds tolerance %.0e (worst Y[%d, %d] = %g, reference %g)",
		e.DType, e.M, e.K, e.T, e.RelErr, e.Samples, e.Tol, e.WorstT, e.WorstM, e.Got, e.Want)
}

// Unwrap makes errors.Is(err, ErrMismatch) true.
func (e *MatmulError) Unwrap() error { return ErrMismatch }

// CheckMatmul compares Y (T×M, as produced by the matrix kernels or
// HostMatmul from W and X) with the float64 reference on sampled outputs:
// the four corners plus random (t, m) pairs drawn from a PCG seeded with
// seed, samples in all; samples ≤ 0 or ≥ T·M checks every output. It returns
// nil when ‖Y − ref‖₂ / ‖ref‖₂ over the checked outputs is within
// Tolerance(dtype), a *MatmulError (matching ErrMismatch) when not or when a
// checked output is not finite, and an error wrapping ErrDType or ErrShape
// for bad arguments.
func CheckMatmul(dtype string, W, X []byte, Y []float32, M, K, T, samples int, seed uint64) error {
	elt, err := matDims(dtype, len(W), len(X), len(Y)*4, M, K, T)
	if err != nil {
		return err
	}
	if M == 0 || T == 0 {
		return nil
	}
	var num, den, worstDiff float64
	e := &MatmulError{DType: dtype, M: M, K: K, T: T, Tol: Tolerance(dtype), WorstT: -1, WorstM: -1}
	finite := true
	one := func(t, m int) {
		ref := refDot(dtype, W[m*K*elt:], X[t*K*elt:], K)
		got := Y[t*M+m]
		d := float64(got) - ref
		if math.IsNaN(d) || math.IsInf(d, 0) {
			finite = false
			d = math.Inf(1)
		}
		num += d * d
		den += ref * ref
		e.Samples++
		if math.Abs(d) > worstDiff || e.WorstT < 0 {
			worstDiff = math.Abs(d)
			e.WorstT, e.WorstM, e.Got, e.Want = t, m, got, ref
		}
	}
	if samples <= 0 || uint64(samples) >= uint64(T)*uint64(M) {
		for t := range T {
			for m := range M {
				one(t, m)
			}
		}
	} else {
		one(0, 0)
		one(0, M-1)
		one(T-1, 0)
		one(T-1, M-1)
		r := rand.New(rand.NewPCG(seed, seed^0x9E3779B97F4A7C15))
		for i := 4; i < samples; i++ {
			one(r.IntN(T), r.IntN(M))
		}
	}
	switch {
	case !finite:
		e.RelErr = math.Inf(1)
	case den > 0:
		e.RelErr = math.Sqrt(num / den)
	default:
		e.RelErr = math.Sqrt(num)
	}
	if e.RelErr <= e.Tol {
		return nil
	}
	return e
}
