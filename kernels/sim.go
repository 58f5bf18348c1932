package kernels

import (
	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
)

// Sim returns Go implementations of every kernel in Names, for
// sim.Options.Kernels. They compute what the CUDA kernels compute (Pattern,
// the mismatch count added to the counter, HostMatmul's float32 math) on
// the simulator's memory, and reject launches the CUDA code would run only
// partly or not at all (wrong argument types, a grid that does not cover
// the output, T > GemvMaxTokens on a GEMV kernel, misaligned pointers) with
// errors wrapping device.ErrInvalid. Their costs: fill and check move 4·n
// bytes; spin takes exactly its nanoseconds; a matrix product does 2·M·K·T
// FLOPs over M·K·elt + T·K·elt + 4·T·M bytes. Each call returns a new slice.
func Sim() []sim.Kernel {
	var out []sim.Kernel
	for _, k := range goKernels() {
		out = append(out, sim.Kernel{
			Name: k.name,
			Run: func(m *sim.Mem, grid, block device.Dim3, args []any) error {
				return k.run(m, grid, block, args)
			},
			Cost: func(grid, block device.Dim3, args []any) sim.Cost {
				c, _ := k.cost(grid, block, args)
				return sim.Cost{FLOPs: c.flops, Bytes: c.bytes, Fixed: c.fixed}
			},
		})
	}
	return out
}
