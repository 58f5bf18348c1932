package kernels

import (
	"unsafe"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cpu"
	"github.com/memwall/memwall/device/cpu/hostmath"
	"github.com/memwall/memwall/format/quant"
)

// quantCPURows is the weight rows a CPU worker dequantizes at a time into
// its float32 buffer before hostmath's vector dots multiply them (16 rows
// of a 4096-wide matrix are 256 KiB: they stay in the core's L2).
const quantCPURows = 16

// quantCPU returns the CPU device's quantized products: rows split over
// the device's workers, each dequantizing a few rows at a time (ggml's
// values) and multiplying them with hostmath's float32 dots — hostmath's
// QMatmul for the types it has dequantizers for (assembly in its vector
// variants), package quant's dequantizer for the others. The embedding
// lookup stays the Go twin.
func quantCPU() map[string]func(m *cpu.Mem, grid, block device.Dim3, args []any) error {
	out := map[string]func(m *cpu.Mem, grid, block device.Dim3, args []any) error{}
	for _, dt := range QuantDTypes() {
		out[QMatmulName(dt)] = cpuQMatmul(dt)
	}
	return out
}

func cpuQMatmul(dtype string) func(m *cpu.Mem, grid, block device.Dim3, args []any) error {
	return func(m *cpu.Mem, grid, block device.Dim3, args []any) error {
		op, err := qmatOperands(dtype, m, grid, block, args)
		if err != nil || op.M == 0 || op.T == 0 {
			return err
		}
		if err := writable(m, op.name, "Y", op.y); err != nil {
			return err
		}
		qmatmulHost(m.Runner(), m.Math(), f32s(op.y), &op)
		return nil
	}
}

// hostQTypes are the types hostmath.QMatmul takes, by quant.Type.
var hostQTypes = map[quant.Type]hostmath.QType{
	quant.Q8_0: hostmath.Q8_0, quant.Q4_0: hostmath.Q4_0, quant.Q4_K: hostmath.Q4_K, quant.Q5_K: hostmath.Q5_K, quant.Q6_K: hostmath.Q6_K,
}

// qmatmulHost computes op into y (T×M) over r's workers.
func qmatmulHost(r *hostmath.Runner, k *hostmath.Kernels, y []float32, op *qmatOp) {
	if q, ok := hostQTypes[op.typ]; ok {
		k.QMatmul(r, y, op.w[:op.M*op.rowB], q, op.x, op.M, op.K, op.T)
		return
	}
	r.Run(op.M, quantCPURows, func(lo, hi int) {
		buf := make([]float32, quantCPURows*op.K)
		for m0 := lo; m0 < hi; m0 += quantCPURows {
			n := min(quantCPURows, hi-m0)
			rows := buf[:n*op.K]
			// The blocks were checked whole by qmatOperands: Dequantize
			// cannot fail here.
			_ = quant.Dequantize(op.typ, rows, op.w[m0*op.rowB:(m0+n)*op.rowB])
			wb := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(rows))), 4*len(rows))
			k.Dots(y[m0:], op.M, wb, 4*op.K, hostmath.F32, op.x, op.K, n, op.K, op.T)
		}
	})
}
