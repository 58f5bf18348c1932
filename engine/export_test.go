package engine

import "github.com/memwall/memwall/device"

// SetResidualNorm makes e fuse each residual add with the RMSNorm after it
// through f, as it does when the kernels have ResidualRMSNorm (tests).
func SetResidualNorm(e *Engine, f func(x, y device.Ptr, rdt string, w device.Ptr, wdt string, out device.Ptr, odt string, T, H uint32, eps float32, st device.Stream) error) {
	e.resNorm = f
}

// SetSiluMulIn makes e run SiLU·up with its inputs' rounding through f, as
// it does when the kernels have SiluMulIn (tests).
func SetSiluMulIn(e *Engine, f func(g, u device.Ptr, rdt string, out device.Ptr, odt string, n uint64, st device.Stream) error) {
	e.siluIn = f
}
