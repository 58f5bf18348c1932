package llama_test

import (
	"strings"
	"testing"

	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/format/weights"
)

// A Q4_K_M file binds with mixed matrix types; a quantized tensor whose
// bytes are not its rows' blocks, or a quantized norm, is refused naming
// the tensor and the dtype field.
func TestQuantizedBind(t *testing.T) {
	cfg := synth.Tiny()
	cfg.DType = "q4_k_m"
	path := gen(t, cfg, "model.gguf")
	m, err := llama.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if !m.Tensors.Quantized || m.Tensors.MatrixDType != "F32" || m.Tensors.Blocks[0].AttnNorm.DType != "F32" {
		t.Fatalf("quantized %v, matrix dtype %s, norm %s", m.Tensors.Quantized, m.Tensors.MatrixDType, m.Tensors.Blocks[0].AttnNorm.DType)
	}
	types := map[string]bool{}
	for _, b := range m.Tensors.Blocks {
		types[b.Q.DType], types[b.Down.DType] = true, true
	}
	if len(types) < 2 {
		t.Errorf("matrix types %v, want a mix", types)
	}
	w, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range w.Tensors {
		q := &w.Tensors[i]
		if strings.HasSuffix(q.Name, "blk.1.attn_q.weight") {
			q.Bytes -= 144
		}
		if strings.HasSuffix(q.Name, "blk.2.attn_norm.weight") {
			q.DType = "Q8_0"
		}
	}
	_, err = llama.Bind(m.Config, w)
	if err == nil || !strings.Contains(err.Error(), `"blk.1.attn_q.weight": dtype:`) && !strings.Contains(err.Error(), `"blk.2.attn_norm.weight": dtype:`) {
		t.Errorf("Bind: %v, want a dtype error naming the tensor", err)
	}
}
