package hostmath

import (
	"fmt"
	"sync"
	"unsafe"
)

// MaxTile is the most tokens one pass of a product computes together (each
// weight row is read once per MaxTile tokens); products of more tokens take
// several passes over blocks of rows that stay in the core's cache.
const MaxTile = 8

// dotsFunc is an assembly product kernel: for r < R rows and t < T tokens
// (R and T fixed per kernel), y[t·ys + 4r] = Σ_{k<n} W(r, k)·x[t·xs + k·e],
// W's row r at byte r·ws, all strides in bytes; n is a positive multiple of
// the kernel's width.
type dotsFunc func(w unsafe.Pointer, ws uintptr, x unsafe.Pointer, xs uintptr, y unsafe.Pointer, ys uintptr, n uintptr)

// wsumFunc is an assembly weighted-sum kernel: for t < T and the kernel's
// width of columns j, acc[t·as + 4j] += Σ_{i<n} p[t·ps + 4i]·V(i, j), V's row
// i at byte i·vs, strides in bytes, n ≥ 1.
type wsumFunc func(acc unsafe.Pointer, as uintptr, v unsafe.Pointer, vs uintptr, p unsafe.Pointer, ps uintptr, n uintptr)

// dotsKernels are the kernels of one dtype and token count: wide takes
// rows rows at a time, one takes one row.
type dotsKernels struct {
	rows      int
	wide, one dotsFunc
}

// archKernels are a variant's assembly kernels; the zero value (no width)
// means the generic Go code runs.
type archKernels struct {
	width int                     // elements per step of dots and wsum
	dots  [3][MaxTile]dotsKernels // by DType, then T−1 (f32 activations)
	wsum  [3][MaxTile]wsumFunc    // by DType, then T−1
	bwide int                     // elements per step of bdots; 0: none
	bdots [MaxTile]dotsKernels    // bf16 weights × bf16 activations, by T−1
	deq   [numQTypes]deqFunc      // dequantizers by QType; nil: the Go twin
}

// checkDots panics unless the slices hold what Dots reads and writes: y
// and x (float32) by element, w by byte; xrow is the elements of x one
// token's K activations take (K for float32 activations), xs its stride.
func checkDots(what string, ylen, ys, wlen, ws int, dt DType, xlen, xs, xrow, M, K, T int) {
	elt := dt.Size()
	if elt == 0 || M < 0 || K < 0 || T < 0 || ys < 0 || ws < 0 || xs < 0 {
		panic(fmt.Sprintf("hostmath: %s: dtype %v, M=%d K=%d T=%d, strides y %d w %d x %d", what, dt, M, K, T, ys, ws, xs))
	}
	if M == 0 || T == 0 {
		return
	}
	if ylen < (T-1)*ys+M || K > 0 && (wlen < (M-1)*ws+K*elt || xlen < (T-1)*xs+xrow) {
		panic(fmt.Sprintf("hostmath: %s %v M=%d K=%d T=%d: y has %d elements, w %d bytes, x %d (strides y %d, w %d bytes, x %d)",
			what, dt, M, K, T, ylen, wlen, xlen, ys, ws, xs))
	}
}

// Dots computes y[t·ys + m] = Σ_{k<K} W(m, k)·x[t·xs + k] for m < M and
// t < T, on the calling goroutine: W's row m is the K elements of dt at
// byte m·ws of w (the rows of a weight matrix, ws = K·elt, or the K rows of
// a paged cache block, ws = its row pitch). Each sum is accumulated in
// float32 from exactly widened weights. T may exceed MaxTile. It panics when
// a slice is shorter than the dimensions and strides need.
func (k *Kernels) Dots(y []float32, ys int, w []byte, ws int, dt DType, x []float32, xs int, M, K, T int) {
	checkDots("dots", len(y), ys, len(w), ws, dt, len(x), xs, K, M, K, T)
	if M == 0 || T == 0 {
		return
	}
	for t0 := 0; t0 < T; t0 += MaxTile {
		k.dots(y[t0*ys:], ys, w, ws, dt, x[t0*xs:], xs, M, K, min(MaxTile, T-t0))
	}
}

// dots is Dots for T ≤ MaxTile, arguments checked.
func (k *Kernels) dots(y []float32, ys int, w []byte, ws int, dt DType, x []float32, xs int, M, K, T int) {
	a := &k.arch
	n := 0
	if a.width > 0 {
		n = K / a.width * a.width
	}
	if n == 0 {
		dotsGeneric(y, ys, w, ws, dt, x, xs, M, K, T)
		return
	}
	a.dots[dt][T-1].rowsOf(y, ys, w, ws, unsafe.Pointer(&x[0]), uintptr(xs)*4, M, n)
	if n < K {
		addTail(y, ys, w, ws, dt, M, T, n, K, func(t, k int) float32 { return x[t*xs+k] })
	}
}

// rowsOf runs the kernels over M rows: e.rows at a time, then one by one;
// x is the first token's activations, xs the tokens' stride in bytes, n
// the elements of each row the kernels take.
func (e *dotsKernels) rowsOf(y []float32, ys int, w []byte, ws int, x unsafe.Pointer, xs uintptr, M, n int) {
	wsu, ysu := uintptr(ws), uintptr(ys)*4
	m := 0
	for ; m+e.rows <= M; m += e.rows {
		e.wide(unsafe.Pointer(&w[m*ws]), wsu, x, xs, unsafe.Pointer(&y[m]), ysu, uintptr(n))
	}
	for ; m < M; m++ {
		e.one(unsafe.Pointer(&w[m*ws]), wsu, x, xs, unsafe.Pointer(&y[m]), ysu, uintptr(n))
	}
}

// addTail adds Σ_{k0≤k<K} W(m, k)·x(t, k) to y[t·ys + m].
func addTail(y []float32, ys int, w []byte, ws int, dt DType, M, T, k0, K int, x func(t, k int) float32) {
	for m := range M {
		row := w[m*ws:]
		for t := range T {
			var acc float32
			for k := k0; k < K; k++ {
				acc += Load(dt, row, k) * x(t, k)
			}
			y[t*ys+m] += acc
		}
	}
}

// rowBlock is how many rows of a product of more than MaxTile tokens one
// block takes: about blockBytes of weights, which stay in the core's cache
// while every tile of tokens passes over them.
func rowBlock(K int, dt DType) int {
	const blockBytes = 256 << 10
	return max(4, blockBytes/max(1, K*dt.Size()))
}

// Matmul computes y[t·M + m] = Σ_{k<K} W[m, k]·x[t·K + k]: W is M×K
// row-major in dt (w holds its bytes, at any alignment), x is T×K float32,
// y is T×M float32 — memwall's product contract (Y = X·Wᵀ) with float32
// activations. The rows are split over r's workers, each streaming its own
// contiguous range of w. It panics when a slice is shorter than the
// dimensions need.
func (k *Kernels) Matmul(r *Runner, y []float32, w []byte, dt DType, x []float32, M, K, T int) {
	checkDots("matmul", len(y), M, len(w), K*dt.Size(), dt, len(x), K, K, M, K, T)
	if M == 0 || T == 0 {
		return
	}
	if K == 0 {
		clear(y[:T*M])
		return
	}
	ws := K * dt.Size()
	split(r, M, K, T, dt, func(m0, n, t0, tt int) {
		k.dots(y[t0*M+m0:], M, w[m0*ws:], ws, dt, x[t0*K:], K, n, K, tt)
	})
}

// split runs tile(m0, n, t0, tt) over a product's rows [m0, m0+n) and
// tokens [t0, t0+tt), tt ≤ MaxTile, the rows split over r (see tiles).
func split(r *Runner, M, K, T int, dt DType, tile func(m0, n, t0, tt int)) {
	rb := rowBlock(K, dt)
	r.Run(M, grainRows, func(lo, hi int) { tiles(lo, hi, T, rb, tile) })
}

// tiles covers rows [lo, hi) and T tokens with tiles: with T ≤ MaxTile one
// tile, the whole range; above, blocks of rb rows, each passed over by
// every tile of tokens while it stays in cache.
func tiles(lo, hi, T, rb int, tile func(m0, n, t0, tt int)) {
	if T <= MaxTile {
		tile(lo, hi-lo, 0, T)
		return
	}
	for b := lo; b < hi; b += rb {
		n := min(rb, hi-b)
		for t0 := 0; t0 < T; t0 += MaxTile {
			tile(b, n, t0, min(MaxTile, T-t0))
		}
	}
}

// grainRows is the row granularity of the parallel split.
const grainRows = 4

// f32Pool recycles the float32 copies of activations MatmulNative widens.
var f32Pool = sync.Pool{New: func() any { return new([]float32) }}

// MatmulNative is Matmul with the activations in the weights' dtype, as
// memwall's matrix kernels take them: x holds T×K elements of dt. bf16 ×
// bf16 products run on VDPBF16PS in the AVX512BF16 variant (which treats
// subnormal inputs as zero); every other case widens x to float32 first
// (exactly) and runs the float32-activation kernels.
func (k *Kernels) MatmulNative(r *Runner, y []float32, w, x []byte, dt DType, M, K, T int) {
	k.MatmulGroupNative(r, []Product{{Y: y, W: w, M: M}}, x, dt, K, T)
}

// Product is one product of a group that shares its activations: Y (T×M
// float32, row-major) = X·Wᵀ for W (M×K row-major in the group's dtype).
type Product struct {
	Y []float32
	W []byte
	M int
}

// MatmulGroupNative computes every product of ops with the same
// activations x (T×K elements of dt), as MatmulNative computes each, in one
// split of all their rows over r (a layer's q, k and v, or its gate and
// up: one hand-off to the workers instead of one per product). It panics
// when a slice is shorter than the dimensions need.
func (k *Kernels) MatmulGroupNative(r *Runner, ops []Product, x []byte, dt DType, K, T int) {
	ws := K * dt.Size()
	total := 0
	for _, op := range ops {
		checkDots("matmul", len(op.Y), op.M, len(op.W), ws, dt, len(x), ws, ws, op.M, K, T)
		total += op.M
	}
	if total == 0 || T == 0 {
		return
	}
	if K == 0 {
		for _, op := range ops {
			clear(op.Y[:T*op.M])
		}
		return
	}
	native := dt == BF16 && k.arch.bwide > 0 && K >= k.arch.bwide
	var xf []float32
	if !native {
		bp := f32Pool.Get().(*[]float32)
		defer f32Pool.Put(bp)
		if cap(*bp) < T*K {
			*bp = make([]float32, T*K)
		}
		xf = (*bp)[:T*K]
		Widen(xf, x, dt)
	}
	rb := rowBlock(K, dt)
	r.Run(total, grainRows, func(lo, hi int) {
		base := 0
		for i := range ops {
			op := &ops[i]
			a, b := max(lo, base), min(hi, base+op.M)
			base += op.M
			if a >= b {
				continue
			}
			a, b = a-(base-op.M), b-(base-op.M)
			tiles(a, b, T, rb, func(m0, n, t0, tt int) {
				y, w := op.Y[t0*op.M+m0:], op.W[m0*ws:]
				if native {
					k.bdots(y, op.M, w, ws, x[t0*ws:], ws, n, K, tt)
				} else {
					k.dots(y, op.M, w, ws, dt, xf[t0*K:], K, n, K, tt)
				}
			})
		}
	})
}

// bdots is dots for bf16 rows and bf16 activations (x row t at byte t·xs),
// on the VDPBF16PS kernels, T ≤ MaxTile, K ≥ bwide.
func (k *Kernels) bdots(y []float32, ys int, w []byte, ws int, x []byte, xs int, M, K, T int) {
	a := &k.arch
	n := K / a.bwide * a.bwide
	a.bdots[T-1].rowsOf(y, ys, w, ws, unsafe.Pointer(&x[0]), uintptr(xs), M, n)
	if n < K {
		addTail(y, ys, w, ws, BF16, M, T, n, K, func(t, k int) float32 { return Load(BF16, x[t*xs:], k) })
	}
}

// WeightedSum adds Σ_{i<n} p[t·ps + i]·V(i, j) to acc[t·as + j] for t < T
// and j < hd: V's row i is the hd elements of dt at byte i·vs of v (the V
// rows of a paged cache block), widened exactly, products accumulated in
// float32. It panics when a slice is shorter than the dimensions need.
func (k *Kernels) WeightedSum(acc []float32, as int, p []float32, ps int, v []byte, vs int, dt DType, n, hd, T int) {
	elt := dt.Size()
	if elt == 0 || n < 0 || hd < 0 || T < 0 || as < 0 || ps < 0 || vs < 0 {
		panic(fmt.Sprintf("hostmath: weighted sum: dtype %v, n=%d hd=%d T=%d", dt, n, hd, T))
	}
	if n == 0 || hd == 0 || T == 0 {
		return
	}
	if len(acc) < (T-1)*as+hd || len(p) < (T-1)*ps+n || len(v) < (n-1)*vs+hd*elt {
		panic(fmt.Sprintf("hostmath: weighted sum %v n=%d hd=%d T=%d: acc %d, p %d, v %d bytes", dt, n, hd, T, len(acc), len(p), len(v)))
	}
	a := &k.arch
	for t0 := 0; t0 < T; t0 += MaxTile {
		tt := min(MaxTile, T-t0)
		acc, p := acc[t0*as:], p[t0*ps:]
		j := 0
		if a.width > 0 {
			f := a.wsum[dt][tt-1]
			for ; j+a.width <= hd; j += a.width {
				f(unsafe.Pointer(&acc[j]), uintptr(as)*4, unsafe.Pointer(&v[j*elt]), uintptr(vs), unsafe.Pointer(&p[0]), uintptr(ps)*4, uintptr(n))
			}
		}
		if j < hd {
			wsumGeneric(acc[j:], as, p, ps, v[j*elt:], vs, dt, n, hd-j, tt)
		}
	}
}
