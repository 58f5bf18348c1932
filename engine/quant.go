package engine

import (
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/plan"
)

// weightDType is the kernels dtype of a weight of format dtype fd: the
// float dtypes as plan.MatmulDType maps them, the block-quantized ones as
// kernels names them ("Q4_K" → "q4_k").
func weightDType(fd string) string {
	if dt := kernels.QuantDType(fd); dt != "" {
		return dt
	}
	return plan.MatmulDType(fd)
}

// productDType is the dtype a product over a weight of kernels dtype wdt
// runs in: the weight's own for a block-quantized weight (its activations
// are float32, the engine's e.dt for a quantized model), and in a
// quantized model the f16/bf16 weights' float32-activation twins
// (kernels.F16W, BF16W); else the model's.
func (e *Engine) productDType(wdt string) string {
	if _, ok := kernels.QuantType(wdt); ok {
		return wdt
	}
	if e.model.Tensors.Quantized {
		switch wdt {
		case kernels.F16:
			return kernels.F16W
		case kernels.BF16:
			return kernels.BF16W
		}
	}
	return e.dt
}

// weightBytes is the bytes an M×K weight of dtype dt holds.
func (e *Engine) weightBytes(dt string, M, K uint32) uint64 {
	if rb, err := kernels.QuantRowBytes(e.productDType(dt), K); err == nil {
		return uint64(M) * rb
	}
	return uint64(M) * uint64(K) * e.elt
}
