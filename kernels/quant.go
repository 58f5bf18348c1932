package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/quant"
)

// Block-quantized weight dtypes, as Matmul and Embed name them: GGUF's
// types, lower case. A product over one takes float32 activations (X is
// T×K float32) and writes float32; its weight rows are whole blocks in
// package quant's layouts (K a multiple of 32, or of 256 for the k-quants).
const (
	Q8_0 = "q8_0"
	Q4_0 = "q4_0"
	Q5_0 = "q5_0"
	Q5_1 = "q5_1"
	Q4_K = "q4_k"
	Q5_K = "q5_k"
	Q6_K = "q6_k"
	// F16W and BF16W are f16 and bf16 weights under float32 activations:
	// the matrices a quantized file keeps in 16 bits (a row length no
	// block type tiles) multiplied as its quantized matrices are.
	F16W  = "f16w"
	BF16W = "bf16w"
)

// QuantDTypes lists the dtypes of products over float32 activations
// (the block-quantized ones, then F16W and BF16W) in a fixed order.
func QuantDTypes() []string { return []string{Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16W, BF16W} }

var quantTypes = map[string]quant.Type{
	Q8_0: quant.Q8_0, Q4_0: quant.Q4_0, Q5_0: quant.Q5_0, Q5_1: quant.Q5_1,
	Q4_K: quant.Q4_K, Q5_K: quant.Q5_K, Q6_K: quant.Q6_K, F16W: quant.F16, BF16W: quant.BF16,
}

// QuantType returns the package quant type of a block-quantized dtype, and
// false for any other dtype.
func QuantType(dtype string) (quant.Type, bool) {
	t, ok := quantTypes[dtype]
	return t, ok
}

// QuantDType returns the dtype name of a GGUF type name ("Q4_K" → "q4_k"),
// or "" when it is not a block-quantized type this package multiplies.
func QuantDType(formatDType string) string {
	for dt, t := range quantTypes {
		if t.IsQuantized() && t.String() == formatDType {
			return dt
		}
	}
	return ""
}

// QuantRowBytes returns the bytes of one K-element row of dtype, or an
// error wrapping ErrShape when K is not a whole number of its blocks, or
// ErrDType when dtype is not block-quantized.
func QuantRowBytes(dtype string, K uint32) (uint64, error) {
	t, ok := quantTypes[dtype]
	if !ok {
		return 0, fmt.Errorf("kernels: dtype %q is not block-quantized: %w", dtype, ErrDType)
	}
	be := uint32(t.BlockElems())
	if K%be != 0 {
		return 0, fmt.Errorf("kernels: %s row of %d elements: not a multiple of its %d-element blocks: %w", dtype, K, be, ErrShape)
	}
	return uint64(K/be) * uint64(t.BlockBytes()), nil
}

// QMatmulName is the kernel of a product over block-quantized weights of
// dtype: memwall_qmatmul_<dtype>(W, X, Y, M, K, T), one warp per weight row
// (quantRows rows a block of 256 threads), any T.
func QMatmulName(dtype string) string { return "memwall_qmatmul_" + dtype }

// QEmbedName is the kernel of an embedding lookup in a block-quantized
// table: memwall_qembed_<dtype>(table, ids, out, T, H), a block a token.
func QEmbedName(dtype string) string { return "memwall_qembed_" + dtype }

// QuantNames lists the quantized kernels, in a fixed order. They are not
// in Names: a module without them (a PTX built before them) still loads,
// and only products over quantized weights then fail.
func QuantNames() []string {
	var n []string
	for _, dt := range QuantDTypes() {
		n = append(n, QMatmulName(dt), QEmbedName(dt))
	}
	return n
}

// quantRows is the weight rows one block of memwall_qmatmul_* takes (a
// warp each).
const quantRows = threadsPerBlock / 32

// resolveQuant looks up the quantized kernels in the loaded module,
// keeping those it has: on a GPU those ptx declares (PTXEntries), on the
// simulator and the CPU (goKernels, all bool true) every one registered.
func (s *Set) resolveQuant(ptx []byte, all bool, get func(string) (device.Function, error)) {
	s.quant = map[string]device.Function{}
	have := map[string]bool{}
	for _, e := range PTXEntries(ptx) {
		have[e] = true
	}
	for _, n := range QuantNames() {
		if !all && !have[n] {
			continue
		}
		if f, err := get(n); err == nil {
			s.quant[n] = f
		}
	}
}

func (s *Set) quantKernel(name string) (device.Function, error) {
	f, ok := s.quant[name]
	if !ok {
		return 0, fmt.Errorf("kernels: %s: not in %s (rebuild with scripts/build-ptx.sh): %w", name, s.source, device.ErrUnsupported)
	}
	return f, nil
}

// matmulQuant is Matmul for a block-quantized W: X and Y float32.
func (s *Set) matmulQuant(dtype string, W, X, Y device.Ptr, M, K, T uint32, st device.Stream) error {
	name := QMatmulName(dtype)
	if err := s.checkQuant(name, dtype, W, X, Y, M, K, T); err != nil {
		return err
	}
	if s.q8Path(dtype, W, T) && M > 0 {
		return s.launchQ8(X, K, T, []QMatmulOp{{DType: dtype, W: W, Y: Y, M: M}}, st)
	}
	g := ceilDiv(M, quantRows)
	f, err := s.quantKernel(name)
	if err != nil {
		return err
	}
	if err := s.launchK(f, device.Dim3{X: g, Y: 1, Z: 1}, blockDim(), 0, st, W, X, Y, M, K, T); err != nil {
		return fmt.Errorf("kernels: %s M=%d K=%d T=%d: %w", name, M, K, T, err)
	}
	return nil
}

// checkQuant checks a quantized product's operands for kernel name.
func (s *Set) checkQuant(name, dtype string, W, X, Y device.Ptr, M, K, T uint32) error {
	if _, err := QuantRowBytes(dtype, K); err != nil {
		return fmt.Errorf("kernels: %s M=%d K=%d T=%d: %w", name, M, K, T, err)
	}
	if err := errors.Join(checkPtr(name, "W", W, 2), checkPtr(name, "X", X, 4), checkPtr(name, "Y", Y, 4)); err != nil {
		return err
	}
	if g := ceilDiv(M, quantRows); g > maxGridX {
		return fmt.Errorf("kernels: %s M=%d: grid %d exceeds %d: %w", name, M, g, maxGridX, ErrShape)
	}
	return nil
}

// embedQuant is Embed for a block-quantized table.
func (s *Set) embedQuant(table device.Ptr, dtype string, ids, out device.Ptr, T, H uint32, st device.Stream) error {
	name := QEmbedName(dtype)
	if T == 0 {
		return nil
	}
	if _, err := QuantRowBytes(dtype, H); err != nil || H == 0 {
		return fmt.Errorf("kernels: %s H=%d: %w", name, H, errors.Join(err, ErrShape))
	}
	if err := errors.Join(checkPtr(name, "table", table, 2), checkPtr(name, "ids", ids, 4), checkPtr(name, "out", out, 4)); err != nil {
		return err
	}
	f, err := s.quantKernel(name)
	if err != nil {
		return err
	}
	return s.launch(name, f, s.rowGrid(T), st, table, ids, out, T, H)
}

// quantGoKernels are the Go twins of QuantNames: they dequantize with
// package quant (ggml's values, bit for bit) and sum in float32, k
// ascending.
func quantGoKernels() []goKernel {
	var ks []goKernel
	for _, dt := range QuantDTypes() {
		ks = append(ks,
			goKernel{name: QMatmulName(dt), run: runQMatmul(dt), cost: costQMatmul(dt)},
			goKernel{name: QEmbedName(dt), run: runQEmbed(dt), cost: costQEmbed(dt)})
	}
	return ks
}

// qmatOp is a checked launch of memwall_qmatmul_*: W's bytes, X as
// float32, Y's bytes.
type qmatOp struct {
	name    string
	typ     quant.Type
	M, K, T int
	rowB    int
	w, y    []byte
	x       []float32
}

func qmatOperands(dtype string, mem memory, grid, block device.Dim3, args []any) (qmatOp, error) {
	return qmatOperandsNamed(QMatmulName(dtype), dtype, quantRows, mem, grid, block, args)
}

// qmatOperandsNamed is qmatOperands for kernel name, which takes
// memwall_qmatmul_'s arguments (W, X, Y, M, K, T) and rows weight rows a
// block.
func qmatOperandsNamed(name, dtype string, rows uint64, mem memory, grid, block device.Dim3, args []any) (qmatOp, error) {
	a, err := parseMatArgs(name, args, false)
	if err != nil {
		return qmatOp{}, err
	}
	if err := checkLinearLaunch(name, grid, block); err != nil {
		return qmatOp{}, err
	}
	if block.X*block.Y*block.Z != threadsPerBlock || uint64(grid.X)*rows < uint64(a.M) {
		return qmatOp{}, fmt.Errorf("kernels: %s M=%d: grid %v block %v does not cover the rows: %w", name, a.M, grid, block, device.ErrInvalid)
	}
	rb, err := QuantRowBytes(dtype, a.K)
	if err != nil {
		return qmatOp{}, fmt.Errorf("kernels: %s: %w", name, errors.Join(err, device.ErrInvalid))
	}
	op := qmatOp{name: name, typ: quantTypes[dtype], M: int(a.M), K: int(a.K), T: int(a.T), rowB: int(rb)}
	if a.M == 0 || a.T == 0 {
		return op, nil
	}
	if op.w, err = buf(name, "W", mem, a.W, uint64(a.M)*rb, 1); err == nil && uint64(a.W)%2 != 0 {
		err = fmt.Errorf("kernels: %s: W %#x is not 2-byte aligned: %w", name, uint64(a.W), device.ErrInvalid)
	}
	if err != nil {
		return op, err
	}
	xb, err := buf(name, "X", mem, a.X, uint64(a.T)*uint64(a.K), 4)
	if err != nil {
		return op, err
	}
	op.x = make([]float32, len(xb)/4)
	for i := range op.x {
		op.x[i] = math.Float32frombits(binary.LittleEndian.Uint32(xb[4*i:]))
	}
	if op.y, err = buf(name, "Y", mem, a.Y, uint64(a.T)*uint64(a.M), 4); err != nil {
		return op, err
	}
	return op, nil
}

func runQMatmul(dtype string) func(mem memory, grid, block device.Dim3, args []any) error {
	return func(mem memory, grid, block device.Dim3, args []any) error {
		op, err := qmatOperands(dtype, mem, grid, block, args)
		if err != nil || op.M == 0 || op.T == 0 {
			return err
		}
		row := make([]float32, op.K)
		for m := range op.M {
			if err := quant.Dequantize(op.typ, row, op.w[m*op.rowB:(m+1)*op.rowB]); err != nil {
				return fmt.Errorf("kernels: %s: row %d: %w", op.name, m, err)
			}
			for t := range op.T {
				x := op.x[t*op.K : (t+1)*op.K]
				var s float32
				for k, w := range row {
					s += w * x[k]
				}
				binary.LittleEndian.PutUint32(op.y[4*(t*op.M+m):], math.Float32bits(s))
			}
		}
		return nil
	}
}

func costQMatmul(dtype string) func(grid, block device.Dim3, args []any) (goCost, bool) {
	return func(_, _ device.Dim3, args []any) (goCost, bool) {
		a, err := parseMatArgs("", args, false)
		if err != nil {
			return goCost{}, false
		}
		rb, err := QuantRowBytes(dtype, a.K)
		if err != nil {
			return goCost{}, false
		}
		M, K, T := float64(a.M), float64(a.K), float64(a.T)
		return goCost{flops: 2 * M * K * T, bytes: M*float64(rb) + T*K*4 + T*M*4}, true
	}
}

func runQEmbed(dtype string) func(mem memory, grid, block device.Dim3, args []any) error {
	name := QEmbedName(dtype)
	return func(mem memory, grid, block device.Dim3, args []any) error {
		a, err := parseArgs(name, "ppp"+"uu", args)
		if err != nil {
			return err
		}
		if err := checkLinearLaunch(name, grid, block); err != nil {
			return err
		}
		T, H := uint64(a.u[0]), uint64(a.u[1])
		if T == 0 {
			return nil
		}
		rb, err := QuantRowBytes(dtype, uint32(H))
		if err != nil || H == 0 {
			return fmt.Errorf("kernels: %s H=%d: %w", name, H, errors.Join(err, device.ErrInvalid))
		}
		ids, err := buf(name, "ids", mem, a.p[1], T, 4)
		if err != nil {
			return err
		}
		out, err := buf(name, "out", mem, a.p[2], T*H, 4)
		if err != nil {
			return err
		}
		row := make([]float32, H)
		for t := range T {
			id := uint64(binary.LittleEndian.Uint32(ids[4*t:]))
			src, err := buf(name, fmt.Sprintf("table row %d", id), mem, a.p[0].Add(id*rb), rb, 1)
			if err != nil {
				return err
			}
			if err := quant.Dequantize(quantTypes[dtype], row, src); err != nil {
				return fmt.Errorf("kernels: %s: row %d: %w", name, id, err)
			}
			for i, v := range row {
				binary.LittleEndian.PutUint32(out[4*(t*H+uint64(i)):], math.Float32bits(v))
			}
		}
		return nil
	}
}

func costQEmbed(dtype string) func(grid, block device.Dim3, args []any) (goCost, bool) {
	return func(_, _ device.Dim3, args []any) (goCost, bool) {
		a, err := parseArgs("", "ppp"+"uu", args)
		if err != nil {
			return goCost{}, false
		}
		rb, err := QuantRowBytes(dtype, a.u[1])
		if err != nil {
			return goCost{}, false
		}
		T, H := float64(a.u[0]), float64(a.u[1])
		return goCost{flops: 2 * T * H, bytes: T*float64(rb) + T*H*4 + T*4}, true
	}
}
