package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/half"
)

// DequantMinTokens is the fewest tokens for which MatmulDequant takes its
// bf16 path: below it the quantized product kernels, which read each
// weight once per kQTile tokens, move fewer bytes than writing and reading
// the bf16 copy.
const DequantMinTokens = 16

// QDequantName is the kernel that writes a block-quantized matrix as
// bf16: memwall_qdequant_<dtype>(W, out, M, K), a block a row.
func QDequantName(dtype string) string { return "memwall_qdequant_" + dtype }

// DequantScratchBytes is the scratch MatmulDequant needs for an M×K
// weight and T tokens: the bf16 weight, then the bf16 activations, each
// from a 256-byte boundary.
func DequantScratchBytes(M, K, T uint32) uint64 {
	return align256(2*uint64(M)*uint64(K)) + align256(2*uint64(T)*uint64(K))
}

func align256(n uint64) uint64 { return (n + 255) &^ 255 }

// HasDequant reports whether the Set's module has memwall_qdequant_ for
// the block-quantized dtype (PTX built from this kernels.cu, or the Go
// twins), which MatmulDequant's bf16 path needs.
func (s *Set) HasDequant(dtype string) bool {
	_, ok := s.extra[QDequantName(dtype)]
	return ok
}

// MatmulDequant is Matmul for a block-quantized W (X and Y float32) that,
// for T ≥ DequantMinTokens where the module has the kernel and scratch
// holds DequantScratchBytes(M, K, T), dequantizes W into scratch as bf16
// (ggml's values rounded to nearest even), rounds X to bf16 after it and
// runs the bf16 product (the matrix library where the device has one): a
// prefill product at the rate of the bf16 model's instead of the
// quantized kernels', with the activations in bf16 as a bf16 model's are.
// Otherwise, and for any other dtype, it is Matmul. scratch is 256-byte
// aligned and not read by anything else queued on st meanwhile.
func (s *Set) MatmulDequant(dtype string, W, X, Y device.Ptr, M, K, T uint32, scratch device.Ptr, scratchBytes uint64, st device.Stream) error {
	if _, ok := QuantType(dtype); !ok || T < DequantMinTokens || M == 0 || !s.HasDequant(dtype) ||
		scratchBytes < DequantScratchBytes(M, K, T) {
		return s.Matmul(dtype, W, X, Y, M, K, T, st)
	}
	name := QDequantName(dtype)
	if _, err := QuantRowBytes(dtype, K); err != nil {
		return fmt.Errorf("kernels: %s M=%d K=%d: %w", name, M, K, err)
	}
	if err := errors.Join(checkPtr(name, "W", W, 2), checkPtr(name, "X", X, 4), checkPtr(name, "Y", Y, 4),
		checkPtr(name, "scratch", scratch, 256)); err != nil {
		return err
	}
	wb := scratch
	xb := scratch.Add(align256(2 * uint64(M) * uint64(K)))
	// (a thread a 32-element chunk; an element for f16w and bf16w)
	if err := s.launch(name, s.extra[name], s.gridFor(uint64(M)*uint64(K)/32+1), st, W, wb, M, K); err != nil {
		return err
	}
	if err := s.Cast(X, xb, BF16, uint64(T)*uint64(K), st); err != nil {
		return err
	}
	return s.Matmul(BF16, wb, xb, Y, M, K, T, st)
}

// dequantGoKernels are the Go twins of the memwall_qdequant_ kernels.
func dequantGoKernels() []goKernel {
	var ks []goKernel
	for _, dt := range QuantDTypes() {
		ks = append(ks, goKernel{name: QDequantName(dt), run: runQDequant(dt), cost: costQDequant(dt)})
	}
	return ks
}

func runQDequant(dtype string) func(mem memory, grid, block device.Dim3, args []any) error {
	name := QDequantName(dtype)
	return func(mem memory, grid, block device.Dim3, args []any) error {
		a, err := parseArgs(name, "pp"+"uu", args)
		if err != nil {
			return err
		}
		if err := checkLinearLaunch(name, grid, block); err != nil {
			return err
		}
		M, K := uint64(a.u[0]), uint64(a.u[1])
		if M == 0 {
			return nil
		}
		rb, err := QuantRowBytes(dtype, uint32(K))
		if err != nil || K == 0 {
			return fmt.Errorf("kernels: %s K=%d: %w", name, K, errors.Join(err, device.ErrInvalid))
		}
		w, err := buf(name, "W", mem, a.p[0], M*rb, 1)
		if err != nil {
			return err
		}
		out, err := buf(name, "out", mem, a.p[1], M*K, 2)
		if err != nil {
			return err
		}
		row := make([]float32, K)
		for r := range M {
			if err := quant.Dequantize(quantTypes[dtype], row, w[r*rb:(r+1)*rb]); err != nil {
				return fmt.Errorf("kernels: %s: row %d: %w", name, r, err)
			}
			for i, v := range row {
				binary.LittleEndian.PutUint16(out[2*(r*K+uint64(i)):], half.F32ToBF16(v))
			}
		}
		return nil
	}
}

func costQDequant(dtype string) func(grid, block device.Dim3, args []any) (goCost, bool) {
	return func(_, _ device.Dim3, args []any) (goCost, bool) {
		a, err := parseArgs("", "pp"+"uu", args)
		if err != nil {
			return goCost{}, false
		}
		rb, err := QuantRowBytes(dtype, a.u[1])
		if err != nil {
			return goCost{}, false
		}
		M, K := float64(a.u[0]), float64(a.u[1])
		return goCost{flops: 2 * M * K, bytes: M*float64(rb) + 2*M*K}, true
	}
}
