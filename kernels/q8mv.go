package kernels

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/quant"
)

// The single-token products over block-quantized weights with the
// activations quantized to 8 bits (llama.cpp's MMVQ arithmetic; kernels.cu
// says exactly what they compute), in three layouts of the same arithmetic
// (Q8Layout): NameQ8MV and NameQ8MVR4 take up to three products that share
// X in one launch, memwall_q8mv(X, K, T, then per product W, Y, M, kind),
// 16 and 8 rows a block; Q8MVSName(dtype) one product, (W, X, Y, M, K, T),
// 32 rows a block with X staged in shared memory.
const (
	NameQ8MV   = "memwall_q8mv"
	NameQ8MVR4 = "memwall_q8mv_r4"
)

// Q8MVSName is the staged layout's kernel for dtype.
func Q8MVSName(dtype string) string { return "memwall_q8mvs_" + dtype }

// Q8Layout picks among the 8-bit-activation kernels (SetQ8Layout).
type Q8Layout int

const (
	// Q8Staged: one launch per product, 32 rows a block, X quantized once
	// per block into shared memory.
	Q8Staged Q8Layout = iota
	// Q8Grouped: q, k, v (or gate, up) in one launch, 16 rows a block, X
	// quantized in registers by every lane.
	Q8Grouped
	// Q8GroupedR4: Q8Grouped with 8 rows a block (fewer registers).
	Q8GroupedR4
)

// q8LayoutNames are the layouts' names for EnvQ8Layout.
var q8LayoutNames = map[string]Q8Layout{"staged": Q8Staged, "grouped": Q8Grouped, "grouped-r4": Q8GroupedR4}

// EnvQ8Layout is the environment variable that, set to staged, grouped or
// grouped-r4 when Load runs, picks the 8-bit-activation kernels' layout
// (SetQ8Layout), for A/B runs.
const EnvQ8Layout = "MEMWALL_KERNELS_Q8"

// DefaultQ8Layout is the layout a Set starts with.
const DefaultQ8Layout = Q8Grouped

// SetQ8Layout picks the 8-bit-activation kernels' layout; results differ
// only in the float32 order of each sum. It must not race with launches.
func (s *Set) SetQ8Layout(l Q8Layout) { s.q8Layout = l }

// Q8Layout returns the layout SetQ8Layout set.
func (s *Set) Q8Layout() Q8Layout { return s.q8Layout }

// q8Names are the 8-bit-activation kernels, in ExtraNames' order.
func q8Names() []string {
	n := []string{NameQ8MV, NameQ8MVR4}
	for _, dt := range Q8MVDTypes() {
		n = append(n, Q8MVSName(dt))
	}
	return n
}

// q8Rows is the weight rows one block of the grouped kernel of layout l
// takes (2·GR in kernels.cu), and q8SRows the staged kernel's (kQ8SRows).
func q8Rows(l Q8Layout) uint32 {
	if l == Q8GroupedR4 {
		return 8
	}
	return 16
}

const q8SRows = 32

// Q8MVDTypes are the block-quantized dtypes with an 8-bit-activation
// product: the two a Q4_K_M file is made of.
func Q8MVDTypes() []string { return []string{Q4_K, Q6_K} }

// q8Kinds are the kernel's kind argument per dtype: kernels.cu's QKind
// (the position in QuantDTypes).
var q8Kinds = map[string]uint32{Q4_K: 4, Q6_K: 6}

// q8Chunk is the activations that share one 8-bit scale.
const q8Chunk = 32

// Q8GroupMax is the most products one memwall_q8mv launch takes.
const Q8GroupMax = 3

// HasQ8MV reports whether the Set's module has the 8-bit-activation
// kernels and they take dtype.
func (s *Set) HasQ8MV(dtype string) bool {
	_, kind := q8Kinds[dtype]
	return kind && s.hasQ8()
}

func (s *Set) hasQ8() bool {
	for _, n := range q8Names() {
		if _, ok := s.extra[n]; !ok {
			return false
		}
	}
	return true
}

// SetQ8Activations turns the 8-bit-activation decode products on or off
// and reports whether they are now on (only where the module has them).
// On (the default on GPUs and the simulator), Matmul and QMatmulGroup over
// Q8MVDTypes weights with T = 1 quantize each 32-element chunk of X to 8
// bits and multiply with integer dot products: Y moves by at most
// Σ_c d_c/2·Σ|w| over each chunk c (d_c = max|x|/127) against the float32
// product, the error llama.cpp's decode has. Off, every product takes
// float32 activations. The CPU backend starts with them off: its float32
// products run at the host's memory rate already. It must not race with
// launches.
func (s *Set) SetQ8Activations(on bool) bool {
	s.q8Off = !on
	return s.Q8Activations()
}

// Q8Activations reports whether single-token products over the
// Q8MVDTypes quantize their activations to 8 bits (SetQ8Activations).
func (s *Set) Q8Activations() bool { return s.hasQ8() && !s.q8Off }

// q8Path reports whether Matmul takes memwall_q8mv for these operands:
// one token, the kernel present and on, and W aligned as the kernel reads
// it (16 bytes for Q4_K, whose blocks it loads 16 bytes at a time).
func (s *Set) q8Path(dtype string, W device.Ptr, T uint32) bool {
	if T != 1 || s.q8Off || !s.HasQ8MV(dtype) {
		return false
	}
	return dtype != Q4_K || uint64(W)%16 == 0
}

// QMatmulOp is one product of QMatmulGroup: Y = X·Wᵀ with W M rows of
// DType.
type QMatmulOp struct {
	DType string
	W, Y  device.Ptr
	M     uint32
}

// QMatmulGroup queues ops[i].Y = X·ops[i].Wᵀ for products over weights of
// any dtypes that share X (T×K float32), such as a quantized layer's q, k
// and v (Q4_K and Q6_K mixed in a Q4_K_M file): one memwall_q8mv launch
// when T = 1, at most Q8GroupMax products and each would take the 8-bit
// path in Matmul, with each product's bits those Matmul gives; otherwise
// one Matmul each (and in the staged layout, which has no group kernel,
// one launch each). Products with M = 0 are skipped.
func (s *Set) QMatmulGroup(X device.Ptr, K, T uint32, ops []QMatmulOp, st device.Stream) error {
	var live []QMatmulOp
	one := T == 1
	for _, op := range ops {
		if op.M == 0 || T == 0 {
			continue
		}
		live = append(live, op)
		one = one && s.q8Path(op.DType, op.W, T)
	}
	if !one || len(live) > Q8GroupMax || len(live) == 0 || s.q8Layout == Q8Staged {
		for _, op := range live {
			if err := s.Matmul(op.DType, op.W, X, op.Y, op.M, K, T, st); err != nil {
				return err
			}
		}
		return nil
	}
	for _, op := range live {
		if err := s.checkQuant(QMatmulName(op.DType), op.DType, op.W, X, op.Y, op.M, K, T); err != nil {
			return err
		}
	}
	return s.launchQ8(X, K, T, live, st)
}

// launchQ8 launches the layout's kernel over ops (1..Q8GroupMax, checked;
// the staged layout one launch each).
func (s *Set) launchQ8(X device.Ptr, K, T uint32, ops []QMatmulOp, st device.Stream) error {
	if s.q8Layout == Q8Staged {
		for _, op := range ops {
			name := Q8MVSName(op.DType)
			g := device.Dim3{X: ceilDiv(op.M, q8SRows), Y: 1, Z: 1}
			if err := s.launchK(s.extra[name], g, blockDim(), 0, st, op.W, X, op.Y, op.M, K, T); err != nil {
				return fmt.Errorf("kernels: %s M=%d K=%d T=%d: %w", name, op.M, K, T, err)
			}
		}
		return nil
	}
	name, rows := NameQ8MV, q8Rows(s.q8Layout)
	if s.q8Layout == Q8GroupedR4 {
		name = NameQ8MVR4
	}
	args := []any{X, K, T}
	var g uint64
	for i := range Q8GroupMax {
		op := QMatmulOp{DType: ops[0].DType, W: ops[0].W, Y: ops[0].Y} // M = 0: never read
		if i < len(ops) {
			op = ops[i]
		}
		g += uint64(ceilDiv(op.M, rows))
		args = append(args, op.W, op.Y, op.M, q8Kinds[op.DType])
	}
	if g > maxGridX {
		return fmt.Errorf("kernels: %s K=%d: grid %d exceeds %d: %w", name, K, g, maxGridX, ErrShape)
	}
	if err := s.launchK(s.extra[name], device.Dim3{X: uint32(g), Y: 1, Z: 1}, blockDim(), 0, st, args...); err != nil {
		return fmt.Errorf("kernels: %s K=%d T=%d, %d products: %w", name, K, T, len(ops), err)
	}
	return nil
}

// q8Quantize writes x (a whole number of 32-element chunks) quantized as
// memwall_q8mv_ quantizes it: per chunk c, d[c] = amax/127 and q[k] =
// round-half-even(x[k]·(127/amax)) clamped to ±127 (0 when amax = 0; a NaN
// in the chunk makes d[c] NaN), each operation rounded to float32.
func q8Quantize(x []float32, q []int8, d []float32) {
	for c := range len(x) / q8Chunk {
		xs := x[c*q8Chunk : (c+1)*q8Chunk]
		var a float32
		for _, v := range xs {
			if b := float32(math.Abs(float64(v))); b > a || b != b {
				a = b
			}
		}
		d[c] = a / 127
		var id float32
		if a > 0 {
			id = 127 / a
		}
		for i, v := range xs {
			p := float32(v * id)
			r := math.RoundToEven(float64(p))
			q[c*q8Chunk+i] = int8(max(-127, min(127, r)))
		}
	}
}

// q8Dot is the reference of memwall_q8mv_'s output for one row: Σ_c d[c]·
// Σ_{k∈c} w[k]·q[k] summed in float64, w the dequantized row.
func q8Dot(w []float32, q []int8, d []float32) float64 {
	var y float64
	for c := range len(w) / q8Chunk {
		var s float64
		for k := c * q8Chunk; k < (c+1)*q8Chunk; k++ {
			s += float64(w[k]) * float64(q[k])
		}
		y += float64(d[c]) * s
	}
	return y
}

// q8GoKernels are the Go twins of the 8-bit-activation kernels: package
// quant's dequantized rows against q8Quantize's activations, each output
// q8Dot rounded to float32.
func q8GoKernels() []goKernel {
	ks := []goKernel{
		{name: NameQ8MV, run: runQ8MV(NameQ8MV, q8Rows(Q8Grouped)), cost: costQ8MV},
		{name: NameQ8MVR4, run: runQ8MV(NameQ8MVR4, q8Rows(Q8GroupedR4)), cost: costQ8MV},
	}
	for _, dt := range Q8MVDTypes() {
		ks = append(ks, goKernel{name: Q8MVSName(dt), run: runQ8MVS(dt), cost: costQMatmul(dt)})
	}
	return ks
}

// q8Operands are a grouped kernel's products, checked: each as a qmatOp.
func q8Operands(name string, rows uint32, mem memory, grid, block device.Dim3, args []any) ([]qmatOp, error) {
	a, err := parseArgs(name, "puu"+"ppuu"+"ppuu"+"ppuu", args)
	if err != nil {
		return nil, err
	}
	if err := checkLinearLaunch(name, grid, block); err != nil {
		return nil, err
	}
	K, T := a.u[0], a.u[1]
	var ops []qmatOp
	var blocks uint64
	for i := range Q8GroupMax {
		W, Y := a.p[1+2*i], a.p[2+2*i]
		M, kind := a.u[2+2*i], a.u[3+2*i]
		if M == 0 {
			continue
		}
		blocks += uint64(ceilDiv(M, rows))
		dt := ""
		for d, k := range q8Kinds {
			if k == kind {
				dt = d
			}
		}
		if dt == "" {
			return nil, fmt.Errorf("kernels: %s: product %d: kind %d is not Q4_K or Q6_K: %w", name, i, kind, device.ErrInvalid)
		}
		op, err := qmatOperandsNamed(name, dt, uint64(rows), mem, device.Dim3{X: ceilDiv(M, rows), Y: 1, Z: 1}, block,
			[]any{W, a.p[0], Y, M, K, T})
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
	}
	if uint64(grid.X) != blocks {
		return nil, fmt.Errorf("kernels: %s: grid %v, the products take %d blocks: %w", name, grid, blocks, device.ErrInvalid)
	}
	return ops, nil
}

func runQ8MV(name string, rows uint32) func(mem memory, grid, block device.Dim3, args []any) error {
	return func(mem memory, grid, block device.Dim3, args []any) error {
		ops, err := q8Operands(name, rows, mem, grid, block, args)
		if err != nil {
			return err
		}
		for i := range ops {
			if err := q8Run(&ops[i]); err != nil {
				return err
			}
		}
		return nil
	}
}

func runQ8MVS(dtype string) func(mem memory, grid, block device.Dim3, args []any) error {
	return func(mem memory, grid, block device.Dim3, args []any) error {
		op, err := qmatOperandsNamed(Q8MVSName(dtype), dtype, q8SRows, mem, grid, block, args)
		if err != nil || op.M == 0 {
			return err
		}
		return q8Run(&op)
	}
}

// q8Run computes op as the 8-bit-activation kernels define it.
func q8Run(op *qmatOp) error {
	if op.K%quant.Q4_K.BlockElems() != 0 {
		return fmt.Errorf("kernels: %s K=%d: not a multiple of 256: %w", op.name, op.K, device.ErrInvalid)
	}
	q, d := make([]int8, op.K), make([]float32, op.K/q8Chunk)
	row := make([]float32, op.K)
	for t := range op.T {
		q8Quantize(op.x[t*op.K:(t+1)*op.K], q, d)
		for m := range op.M {
			if err := quant.Dequantize(op.typ, row, op.w[m*op.rowB:(m+1)*op.rowB]); err != nil {
				return fmt.Errorf("kernels: %s: row %d: %w", op.name, m, err)
			}
			binary.LittleEndian.PutUint32(op.y[4*(t*op.M+m):], math.Float32bits(float32(q8Dot(row, q, d))))
		}
	}
	return nil
}

func costQ8MV(_, _ device.Dim3, args []any) (goCost, bool) {
	a, err := parseArgs("", "puu"+"ppuu"+"ppuu"+"ppuu", args)
	if err != nil {
		return goCost{}, false
	}
	K, T := float64(a.u[0]), float64(a.u[1])
	c := goCost{bytes: T * K * 4}
	for i := range Q8GroupMax {
		M := a.u[2+2*i]
		dt := Q4_K
		if a.u[3+2*i] == q8Kinds[Q6_K] {
			dt = Q6_K
		}
		rb, err := QuantRowBytes(dt, a.u[0])
		if err != nil {
			return goCost{}, false
		}
		c.flops += 2 * float64(M) * K * T
		c.bytes += float64(M)*float64(rb) + T*float64(M)*4
	}
	return c, true
}
