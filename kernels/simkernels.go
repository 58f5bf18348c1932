package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/memwall/memwall/device"
)

// memory is the part of the simulator's memory the Go kernels use.
type memory interface {
	// Bytes returns the n bytes at p, aliasing simulated device memory.
	Bytes(p device.Ptr, n uint64) ([]byte, error)
}

// goKernel is a kernel's Go implementation and cost model, independent of
// the simulator's types (sim.go adapts it).
type goKernel struct {
	name string
	run  func(mem memory, grid, block device.Dim3, args []any) error
	// cost returns the work a launch does; ok is false for arguments that
	// run would reject.
	cost func(grid, block device.Dim3, args []any) (c goCost, ok bool)
}

type goCost struct {
	flops, bytes float64
	fixed        time.Duration
}

// goKernels returns the Go implementations of every kernel in Names, same
// order. They check their arguments as the CUDA launch would need them
// (types, and a grid that covers the work) and fail rather than compute a
// partial result.
func goKernels() []goKernel {
	ks := []goKernel{
		{name: NameFill, run: runFill, cost: costFillCheck(3)},
		{name: NameCheck, run: runCheck, cost: costFillCheck(4)},
		{name: NameSpin, run: runSpin, cost: costSpin},
	}
	for _, dt := range DTypes() {
		ks = append(ks,
			goKernel{name: GemvName(dt), run: runMatmul(dt, matGemv), cost: costMatmul(dt, matGemv)},
			goKernel{name: GemmName(dt), run: runMatmul(dt, matGemm), cost: costMatmul(dt, matGemm)},
			goKernel{name: Gemv1Name(dt), run: runMatmul(dt, matGemv1), cost: costMatmul(dt, matGemv1)})
		for k := gemvMMA; k < gemvKinds; k++ {
			ks = append(ks, goKernel{name: gemvName(k, dt), run: runMatmul(dt, matStream+k), cost: costMatmul(dt, matStream+k)})
		}
		ks = append(ks, goKernel{name: gemvGroupName(dt), run: runGemvGroup(dt), cost: costGemvGroup(dt)})
	}
	ks = append(ks, llamaGoKernels()...)
	ks = append(ks, quantGoKernels()...)
	ks = append(ks, stateGoKernels()...)
	ks = append(ks, goKernel{name: NameRoPEGGUF, run: runRoPEGGUF, cost: costRoPEGGUF})
	ks = append(ks, dequantGoKernels()...)
	ks = append(ks, q8GoKernels()...)
	return append(ks, rowsGoKernels(runAttnDecode)...)
}

func argErr(kernel string, i int, want string, got any) error {
	return fmt.Errorf("kernels: %s: argument %d: want %s, got %T: %w", kernel, i, want, got, device.ErrInvalid)
}

func argPtr(kernel string, args []any, i int) (device.Ptr, error) {
	if v, ok := args[i].(device.Ptr); ok {
		return v, nil
	}
	return 0, argErr(kernel, i, "device.Ptr", args[i])
}

func argU64(kernel string, args []any, i int) (uint64, error) {
	if v, ok := args[i].(uint64); ok {
		return v, nil
	}
	return 0, argErr(kernel, i, "uint64", args[i])
}

func argU32(kernel string, args []any, i int) (uint32, error) {
	if v, ok := args[i].(uint32); ok {
		return v, nil
	}
	return 0, argErr(kernel, i, "uint32", args[i])
}

func argCount(kernel string, args []any, n int) error {
	if len(args) != n {
		return fmt.Errorf("kernels: %s: %d arguments, want %d: %w", kernel, len(args), n, device.ErrInvalid)
	}
	return nil
}

// words returns the n 32-bit words at p.
func words(kernel string, mem memory, p device.Ptr, n uint64) ([]byte, error) {
	if n > math.MaxUint64/4 {
		return nil, fmt.Errorf("kernels: %s: %d words overflow the address space: %w", kernel, n, device.ErrInvalid)
	}
	b, err := mem.Bytes(p, n*4)
	if err != nil {
		return nil, fmt.Errorf("kernels: %s: %w", kernel, err)
	}
	return b, nil
}

func runFill(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameFill
	if err := argCount(k, args, 3); err != nil {
		return err
	}
	dst, err := argPtr(k, args, 0)
	if err != nil {
		return err
	}
	n, err := argU64(k, args, 1)
	if err != nil {
		return err
	}
	seed, err := argU32(k, args, 2)
	if err != nil {
		return err
	}
	if err := checkLinearLaunch(k, grid, block); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	b, err := words(k, mem, dst, n)
	if err != nil {
		return err
	}
	for i := range n {
		binary.LittleEndian.PutUint32(b[4*i:], Pattern(seed, i))
	}
	return nil
}

func runCheck(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameCheck
	if err := argCount(k, args, 4); err != nil {
		return err
	}
	src, err := argPtr(k, args, 0)
	if err != nil {
		return err
	}
	n, err := argU64(k, args, 1)
	if err != nil {
		return err
	}
	seed, err := argU32(k, args, 2)
	if err != nil {
		return err
	}
	ctr, err := argPtr(k, args, 3)
	if err != nil {
		return err
	}
	if err := checkLinearLaunch(k, grid, block); err != nil {
		return err
	}
	if block.X%32 != 0 || block.Y != 1 || block.Z != 1 {
		return fmt.Errorf("kernels: %s: block %dx%dx%d: want a 1-D block of a multiple of 32 threads: %w",
			k, block.X, block.Y, block.Z, device.ErrInvalid)
	}
	var bad uint64
	if n > 0 {
		b, err := words(k, mem, src, n)
		if err != nil {
			return err
		}
		for i := range n {
			if binary.LittleEndian.Uint32(b[4*i:]) != Pattern(seed, i) {
				bad++
			}
		}
	}
	c, err := mem.Bytes(ctr, 8)
	if err != nil {
		return fmt.Errorf("kernels: %s: counter: %w", k, err)
	}
	if bad != 0 { // one atomicAdd per block that found mismatches; none otherwise
		binary.LittleEndian.PutUint64(c, binary.LittleEndian.Uint64(c)+bad)
	}
	return nil
}

// checkLinearLaunch accepts what CUDA would run for a grid-stride kernel.
func checkLinearLaunch(kernel string, grid, block device.Dim3) error {
	if grid.X == 0 || grid.Y == 0 || grid.Z == 0 || block.X == 0 || block.Y == 0 || block.Z == 0 ||
		uint64(block.X)*uint64(block.Y)*uint64(block.Z) > 1024 {
		return fmt.Errorf("kernels: %s: launch grid %v block %v is not runnable: %w", kernel, grid, block, device.ErrInvalid)
	}
	return nil
}

func runSpin(_ memory, grid, block device.Dim3, args []any) error {
	// The simulator accounts the time through the cost; nothing to compute.
	if err := argCount(NameSpin, args, 1); err != nil {
		return err
	}
	if _, err := argU64(NameSpin, args, 0); err != nil {
		return err
	}
	return checkLinearLaunch(NameSpin, grid, block)
}

func costFillCheck(nargs int) func(grid, block device.Dim3, args []any) (goCost, bool) {
	return func(_, _ device.Dim3, args []any) (goCost, bool) {
		if len(args) != nargs {
			return goCost{}, false
		}
		n, ok := args[1].(uint64)
		if !ok {
			return goCost{}, false
		}
		return goCost{bytes: 4 * float64(n)}, true
	}
}

func costSpin(_, _ device.Dim3, args []any) (goCost, bool) {
	if len(args) != 1 {
		return goCost{}, false
	}
	ns, ok := args[0].(uint64)
	if !ok || ns > math.MaxInt64 {
		return goCost{}, false
	}
	return goCost{fixed: time.Duration(ns)}, true
}

type matArgs struct {
	W, X, Y device.Ptr
	M, K, T uint32
}

// parseMatArgs reads W, X, Y, M, K, T, and for the GEMV kernels (gemv
// true) their seventh argument, the L2 prefetch bytes, which the Go twins
// ignore (a hint to the GPU's cache).
func parseMatArgs(kernel string, args []any, gemv bool) (matArgs, error) {
	var a matArgs
	n := 6
	if gemv {
		n = 7
	}
	if err := argCount(kernel, args, n); err != nil {
		return a, err
	}
	if gemv {
		if _, err := argU32(kernel, args, 6); err != nil {
			return a, err
		}
	}
	var err error
	for i, p := range []*device.Ptr{&a.W, &a.X, &a.Y} {
		if *p, err = argPtr(kernel, args, i); err != nil {
			return a, err
		}
	}
	for i, p := range []*uint32{&a.M, &a.K, &a.T} {
		if *p, err = argU32(kernel, args, 3+i); err != nil {
			return a, err
		}
	}
	return a, nil
}

// Matrix kernel kinds: memwall_gemv1_* (T = 1), memwall_gemv_* (T ≤ 8),
// memwall_gemm_*, and from matStream on the streamed GEMV variant
// kind-matStream (gemv.go), which takes any grid.
const (
	matGemv1 = iota
	matGemv
	matGemm
	matStream
)

// matName is the kernel name of matrix kernel kind for dtype.
func matName(dtype string, kind int) string {
	if kind >= matStream {
		return gemvName(kind-matStream, dtype)
	}
	return [...]string{Gemv1Name(dtype), GemvName(dtype), GemmName(dtype)}[kind]
}

func runMatmul(dtype string, kind int) func(mem memory, grid, block device.Dim3, args []any) error {
	return func(mem memory, grid, block device.Dim3, args []any) error {
		op, err := matOperands(dtype, kind, mem, grid, block, args)
		if err != nil {
			return err
		}
		y := make([]float32, op.T*op.M)
		if err := HostMatmul(dtype, op.w, op.x, y, int(op.M), int(op.K), int(op.T)); err != nil {
			return fmt.Errorf("kernels: %s: %w", op.name, err)
		}
		for i, v := range y {
			binary.LittleEndian.PutUint32(op.y[4*i:], math.Float32bits(v))
		}
		return nil
	}
}

// matOp is a checked launch of a matrix kernel and its operands' bytes.
type matOp struct {
	name    string
	M, K, T uint64
	w, x, y []byte
}

// matOperands parses and checks a launch of matrix kernel kind for dtype
// and returns the bytes of W, X and Y.
func matOperands(dtype string, kind int, mem memory, grid, block device.Dim3, args []any) (matOp, error) {
	name := matName(dtype, kind)
	elt, _ := ElemSize(dtype)
	a, err := parseMatArgs(name, args, kind != matGemm)
	if err != nil {
		return matOp{}, err
	}
	if err := checkMatLaunch(name, dtype, kind, a, grid, block); err != nil {
		return matOp{}, err
	}
	op := matOp{name: name, M: uint64(a.M), K: uint64(a.K), T: uint64(a.T)}
	if op.w, err = mem.Bytes(a.W, op.M*op.K*uint64(elt)); err != nil {
		return op, fmt.Errorf("kernels: %s: W: %w", name, err)
	}
	if op.x, err = mem.Bytes(a.X, op.T*op.K*uint64(elt)); err != nil {
		return op, fmt.Errorf("kernels: %s: X: %w", name, err)
	}
	if op.y, err = mem.Bytes(a.Y, op.T*op.M*4); err != nil {
		return op, fmt.Errorf("kernels: %s: Y: %w", name, err)
	}
	return op, nil
}

// checkMatLaunch rejects launches the CUDA kernel would run only partly or
// wrongly: a grid that does not cover the output, a block other than 256
// threads, T > 1 on memwall_gemv1_*, T > GemvMaxTokens on a GEMV kernel,
// misaligned pointers.
func checkMatLaunch(name, dtype string, kind int, a matArgs, grid, block device.Dim3) error {
	elt, _ := ElemSize(dtype)
	if a.W%device.Ptr(elt) != 0 || a.X%device.Ptr(elt) != 0 || a.Y%4 != 0 {
		return fmt.Errorf("kernels: %s: misaligned pointer (W %#x, X %#x, Y %#x): %w", name, uint64(a.W), uint64(a.X), uint64(a.Y), device.ErrInvalid)
	}
	if block != blockDim() {
		return fmt.Errorf("kernels: %s: block %v, want %v: %w", name, block, blockDim(), device.ErrInvalid)
	}
	maxT := map[int]uint32{matGemv1: 1, matGemv: GemvMaxTokens, matGemm: math.MaxUint32}[kind]
	if kind >= matStream {
		maxT = gemvMaxT(kind - matStream)
	}
	if a.T > maxT {
		return fmt.Errorf("kernels: %s: T=%d exceeds %d: %w", name, a.T, maxT, device.ErrInvalid)
	}
	var rowsX, rowsY uint64
	switch kind {
	case matStream + gemvMMA:
		// Any grid: each block takes its share of the rows.
		if grid.X == 0 || grid.Y != 1 || grid.Z != 1 {
			return fmt.Errorf("kernels: %s: grid %v, want X ≥ 1, Y = Z = 1: %w", name, grid, device.ErrInvalid)
		}
		return nil
	case matGemv1:
		rowsX, rowsY = uint64(gemvRowsPerBlock(1)), 1
	case matGemv:
		rowsX, rowsY = uint64(gemvRowsPerBlock(GemvMaxTokens)), GemvMaxTokens
	default:
		rowsX, rowsY = gemmTile16, gemmTile16
		if dtype == F32 {
			rowsX, rowsY = gemmTileF32, gemmTileF32
		}
	}
	if uint64(grid.X)*rowsX < uint64(a.M) || uint64(grid.Y)*rowsY < uint64(a.T) || grid.Z == 0 {
		return fmt.Errorf("kernels: %s M=%d T=%d: grid %v does not cover the output: %w", name, a.M, a.T, grid, device.ErrInvalid)
	}
	return nil
}

func costMatmul(dtype string, kind int) func(grid, block device.Dim3, args []any) (goCost, bool) {
	elt, _ := ElemSize(dtype)
	return func(_, _ device.Dim3, args []any) (goCost, bool) {
		a, err := parseMatArgs("", args, kind != matGemm)
		if err != nil {
			return goCost{}, false
		}
		M, K, T := float64(a.M), float64(a.K), float64(a.T)
		e := float64(elt)
		return goCost{flops: 2 * M * K * T, bytes: M*K*e + T*K*e + T*M*4}, true
	}
}

// gemvGroupKinds are memwall_gemvg1_*'s arguments: X, K, then W, Y, M of
// each of the MatmulGroupMax products, then the L2 prefetch bytes (a hint
// the Go twin ignores).
const gemvGroupKinds = "pu" + "ppu" + "ppu" + "ppu" + "u"

// runGemvGroup computes each product of a grouped launch with HostMatmul
// (T = 1), after checking that the grid covers every product's blocks.
func runGemvGroup(dtype string) func(mem memory, grid, block device.Dim3, args []any) error {
	return func(mem memory, grid, block device.Dim3, args []any) error {
		x, ops, err := groupOperands(dtype, mem, grid, block, args)
		if err != nil {
			return err
		}
		for _, op := range ops {
			y := make([]float32, op.M)
			if err := HostMatmul(dtype, op.w, x, y, int(op.M), int(op.K), 1); err != nil {
				return fmt.Errorf("kernels: %s: %w", gemvGroupName(dtype), err)
			}
			for j, v := range y {
				binary.LittleEndian.PutUint32(op.y[4*j:], math.Float32bits(v))
			}
		}
		return nil
	}
}

// groupOperands parses and checks a launch of the grouped GEMV for dtype
// and returns the bytes of X and of each product with M > 0 (T = 1).
func groupOperands(dtype string, mem memory, grid, block device.Dim3, args []any) ([]byte, []matOp, error) {
	name := gemvGroupName(dtype)
	elt, _ := ElemSize(dtype)
	a, err := parseArgs(name, gemvGroupKinds, args)
	if err != nil {
		return nil, nil, err
	}
	if block != blockDim() {
		return nil, nil, fmt.Errorf("kernels: %s: block %v, want %v: %w", name, block, blockDim(), device.ErrInvalid)
	}
	K := uint64(a.u[0])
	var blocks uint64
	for i := range MatmulGroupMax {
		blocks += (uint64(a.u[1+i]) + 7) / 8
	}
	if grid.Y != 1 || grid.Z != 1 || uint64(grid.X) < blocks {
		return nil, nil, fmt.Errorf("kernels: %s: grid %v does not cover the %d blocks of the products: %w", name, grid, blocks, device.ErrInvalid)
	}
	xb, err := mem.Bytes(a.p[0], K*uint64(elt))
	if err != nil {
		return nil, nil, fmt.Errorf("kernels: %s: X: %w", name, err)
	}
	var ops []matOp
	for i := range MatmulGroupMax {
		op := matOp{name: name, M: uint64(a.u[1+i]), K: K, T: 1, x: xb}
		if op.M == 0 {
			continue
		}
		if op.w, err = mem.Bytes(a.p[1+2*i], op.M*K*uint64(elt)); err != nil {
			return nil, nil, fmt.Errorf("kernels: %s: W%d: %w", name, i, err)
		}
		if op.y, err = mem.Bytes(a.p[2+2*i], op.M*4); err != nil {
			return nil, nil, fmt.Errorf("kernels: %s: Y%d: %w", name, i, err)
		}
		ops = append(ops, op)
	}
	return xb, ops, nil
}

func costGemvGroup(dtype string) func(grid, block device.Dim3, args []any) (goCost, bool) {
	elt, _ := ElemSize(dtype)
	return func(_, _ device.Dim3, args []any) (goCost, bool) {
		a, err := parseArgs("", gemvGroupKinds, args)
		if err != nil {
			return goCost{}, false
		}
		K, e := float64(a.u[0]), float64(elt)
		c := goCost{bytes: K * e}
		for i := range MatmulGroupMax {
			M := float64(a.u[1+i])
			c.flops += 2 * M * K
			c.bytes += M*K*e + 4*M
		}
		return c, true
	}
}
