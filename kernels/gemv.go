package kernels

import (
	"fmt"

	"github.com/memwall/memwall/device"
)

// GEMV variants: the kernels Matmul chooses between for T ≤ GemvMaxTokens
// (kernels.cu describes each).
// (The sweep of the earlier session also tried streamed CUDA-core kernels
// for T = 1 and T ≤ 8, a cp.async-ring T = 1 kernel, grid-strided row
// kernels and gemvm with a cp.async ring; none beat these three on the
// H200, and they were removed with their entry points.)
const (
	gemvOne = iota // memwall_gemv1_*: T = 1, one row per warp, grid ⌈M/8⌉
	gemvTwo        // memwall_gemv_*: T ≤ 8, two rows per warp, grid ⌈M/16⌉
	gemvMMA        // memwall_gemvm_*: T ≤ 8, tensor cores on compute_80, any grid
	gemvKinds
)

// gemvPrefixes are the kernel names of the variants, less the dtype.
var gemvPrefixes = [gemvKinds]string{"memwall_gemv1_", "memwall_gemv_", "memwall_gemvm_"}

// gemvName returns the kernel name of variant kind for dtype.
func gemvName(kind int, dtype string) string { return gemvPrefixes[kind] + dtype }

// gemvMaxT is the largest T variant kind computes.
func gemvMaxT(kind int) uint32 {
	if kind == gemvOne {
		return 1
	}
	return GemvMaxTokens
}

// gemvStreamed reports whether variant kind takes any grid (the block's
// share of the rows follows from the grid size).
func gemvStreamed(kind int) bool { return kind == gemvMMA }

// gemvUnits is how many shares of work the any-grid variant kind can split
// into: 16-row groups for the tensor-core kernel (rows for the CUDA-core
// kernel it runs for f32 and on compute_70: a grid of ⌈M/16⌉ blocks or
// fewer fits both), M for the others.
func gemvUnits(kind int, M uint32) uint32 {
	if kind == gemvMMA {
		return ceilDiv(M, 16)
	}
	return M
}

// gemvPlan is one GEMV launch: the variant and its grid size.
type gemvPlan struct {
	kind int
	grid uint32
}

// gemvGrid returns the fixed grid of the row-per-warp variants, and for the
// streamed ones the grid that gives each of about perSM·sms blocks an equal
// whole number of units (a block per unit when there are fewer units).
func gemvGrid(kind int, M, sms, perSM uint32) uint32 {
	switch kind {
	case gemvOne:
		return ceilDiv(M, gemvRowsPerBlock(1))
	case gemvTwo:
		return ceilDiv(M, gemvRowsPerBlock(2))
	}
	n := gemvUnits(kind, M)
	slots := max(1, uint64(sms)*uint64(perSM))
	per := (uint64(n) + slots - 1) / slots // units per block
	return uint32(max(1, (uint64(n)+per-1)/per))
}

// planGemv is the selection rule: the variant and grid Matmul launches for
// a T ≤ GemvMaxTokens product on a GPU with sms multiprocessors, where
// tensor says the module has the compute_80 kernels and off lists variants
// Load's self-test turned off. sms == 0 (a GPU of unknown size) keeps to
// the row-per-warp variants, whose grid follows from M alone.
//
// The rule comes from the H200 sweep (TestCUDAGemvSweep, bf16, weights
// cold; % of a device-to-device copy in the same run):
//   - T = 1: memwall_gemv1_* everywhere; 104% at 128256×4096, 95% at
//     32000×4096, 85-90% at 14336×4096 and 4096×14336, 80-84% at the
//     11008 shapes, 62% at 4096² and 31% at 1024×4096 (products under
//     ~40 MB pay a fixed ~5 µs per launch: ramp-up and drain, which the
//     compute_90 module's overlapped launches and L2 prefetch attack). The
//     streamed kernels (since removed) reached 68-81% at their best grid:
//     their 64-80 registers or 40 KiB ring per block kept fewer bytes in
//     flight per SM than memwall_gemv1_'s cp.async rings (compute_80) or
//     its full occupancy at 32 registers (compute_70).
//   - T = 2..8, bf16/f16 on compute_80: memwall_gemvm_* at 3 blocks per SM,
//     77-78% on the MLP shapes and 62% at 4096² at every T, where
//     memwall_gemv_* falls from 69% (T = 2) to 37% (T = 8).
//   - else memwall_gemv_*, the fastest at T ≥ 2 on compute_70.
func planGemv(dtype string, M, K, T, sms uint32, tensor bool, off *[gemvKinds]bool) gemvPlan {
	want := gemvTwo
	switch {
	case T == 1:
		want = gemvOne
	case sms > 0 && tensor && dtype != F32:
		want = gemvMMA
	}
	if off != nil && off[want] {
		want = gemvTwo
		if T == 1 && !off[gemvOne] {
			want = gemvOne
		}
	}
	return gemvPlan{kind: want, grid: gemvGrid(want, M, sms, gemvBlocksPerSM)}
}

// gemvBlocksPerSM is how many blocks of a streamed GEMV the rule puts on each
// multiprocessor.
const gemvBlocksPerSM = 3

// launchGemv queues plan's kernel for Y = X·Wᵀ (arguments as Matmul's,
// already validated).
func (s *Set) launchGemv(p gemvPlan, dtype string, W, X, Y device.Ptr, M, K, T uint32, st device.Stream) error {
	if T > gemvMaxT(p.kind) || p.grid == 0 {
		return fmt.Errorf("kernels: %s M=%d K=%d T=%d grid %d: not a launch of this kernel: %w", gemvName(p.kind, dtype), M, K, T, p.grid, ErrShape)
	}
	g := device.Dim3{X: p.grid, Y: 1, Z: 1}
	f := s.gemvk[p.kind][dtype]
	var err error
	if p.kind == gemvMMA && !s.gemvmOverlap {
		// Launched plainly, without prefetch: overlapped, its grid (sized so
		// that every SM gets the same share) lands unevenly on SMs the
		// previous kernel still holds (H200: 61% of the copy plain, 52-56%
		// overlapped at 4096² T = 2..8, 62-74% against 77-79% on the MLP
		// shapes).
		err = s.d.Launch(f, g, blockDim(), 0, st, W, X, Y, M, K, T, uint32(0))
	} else {
		err = s.launchK(f, g, blockDim(), 0, st, W, X, Y, M, K, T, s.prefetch)
	}
	if err != nil {
		return fmt.Errorf("kernels: %s M=%d K=%d T=%d: %w", gemvName(p.kind, dtype), M, K, T, err)
	}
	return nil
}

// MatmulOp is one product of a MatmulGroup: Y (T×M float32) = X·Wᵀ for W
// (M×K).
type MatmulOp struct {
	W, Y device.Ptr
	M    uint32
}

// MatmulGroupMax is the most products one grouped launch takes.
const MatmulGroupMax = 3

// gemvGroupName is the grouped single-token GEMV kernel for dtype.
func gemvGroupName(dtype string) string { return "memwall_gemvg1_" + dtype }

// MatmulGroup queues ops[i].Y = X·ops[i].Wᵀ for products that share X (T×K
// in dtype), such as a layer's q, k and v or its gate and up: with T = 1
// and at most MatmulGroupMax products, one launch of memwall_gemvg1_<dtype>
// (each product as memwall_gemv1_<dtype> computes it, its blocks after the
// previous product's), which pays the per-launch ramp-up once; otherwise one
// Matmul per product. Each product's result equals what Matmul gives with
// the same arguments bit for bit when T = 1 (the same kernel code). Products
// with M = 0 are skipped; arguments are checked as Matmul checks them,
// before anything is launched.
func (s *Set) MatmulGroup(dtype string, X device.Ptr, K, T uint32, ops []MatmulOp, st device.Stream) error {
	elt, err := ElemSize(dtype)
	if err != nil {
		return fmt.Errorf("kernels: matmul group: %w", err)
	}
	var live []MatmulOp
	var blocks uint64
	for i, op := range ops {
		if op.M == 0 || T == 0 {
			continue
		}
		for _, p := range []struct {
			name  string
			v     device.Ptr
			align uint64
		}{{"W", op.W, uint64(elt)}, {"X", X, uint64(elt)}, {"Y", op.Y, 4}} {
			if p.v == 0 || uint64(p.v)%p.align != 0 {
				return fmt.Errorf("kernels: matmul group %s product %d: %s %#x is not a %d-byte aligned address: %w", dtype, i, p.name, uint64(p.v), p.align, device.ErrInvalid)
			}
		}
		live = append(live, op)
		blocks += uint64(ceilDiv(op.M, gemvRowsPerBlock(1)))
	}
	if len(live) == 0 {
		return nil
	}
	if T != 1 || len(live) > MatmulGroupMax || blocks > maxGridX || s.gemvOff[gemvOne] {
		for _, op := range live {
			if err := s.Matmul(dtype, op.W, X, op.Y, op.M, K, T, st); err != nil {
				return err
			}
		}
		return nil
	}
	args := []any{X, K}
	for i := range MatmulGroupMax {
		op := MatmulOp{W: live[0].W, Y: live[0].Y} // M = 0: never read
		if i < len(live) {
			op = live[i]
		}
		args = append(args, op.W, op.Y, op.M)
	}
	g := device.Dim3{X: uint32(blocks), Y: 1, Z: 1}
	if s.groupOverlap {
		err = s.launchK(s.gemvg[dtype], g, blockDim(), 0, st, append(args, s.prefetch)...)
	} else {
		// Plainly, without prefetch: a module without overlap, or PDL off.
		err = s.d.Launch(s.gemvg[dtype], g, blockDim(), 0, st, append(args, uint32(0))...)
	}
	if err != nil {
		return fmt.Errorf("kernels: %s K=%d, %d products: %w", gemvGroupName(dtype), K, len(live), err)
	}
	return nil
}
