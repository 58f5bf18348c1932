package sched

import (
	"fmt"

	"github.com/memwall/memwall/format/synth"
)

// Model is what the simulation needs of a model: its K/V shape, its weights
// (read once per step) and its parameters (2 FLOPs each per token).
type Model struct {
	Name        string `json:"name"`
	Layers      int    `json:"layers"`
	Heads       int    `json:"heads"`
	KVHeads     int    `json:"kv_heads"`
	HeadDim     int    `json:"head_dim"`
	ElemBytes   int    `json:"elem_bytes"`
	Params      uint64 `json:"params"`
	WeightBytes uint64 `json:"weight_bytes"`
	// Context is the longest sequence (the contiguous policy reserves it).
	Context int `json:"context"`
}

// KVBytesPerToken is layers × KV heads × head dim × 2 (K and V) × element
// bytes.
func (m Model) KVBytesPerToken() uint64 {
	return uint64(m.Layers) * uint64(m.KVHeads) * uint64(m.HeadDim) * 2 * uint64(m.ElemBytes)
}

// Validate reports a shape the simulation cannot use.
func (m Model) Validate() error {
	if m.Layers < 1 || m.Heads < 1 || m.KVHeads < 1 || m.HeadDim < 1 || m.Context < 2 {
		return fmt.Errorf("sched: model %s: layers %d, heads %d, kv heads %d, head dim %d, context %d: each must be positive (context ≥ 2)",
			m.Name, m.Layers, m.Heads, m.KVHeads, m.HeadDim, m.Context)
	}
	if m.ElemBytes != 1 && m.ElemBytes != 2 && m.ElemBytes != 4 {
		return fmt.Errorf("sched: model %s: K/V elements of %d bytes, want 1, 2 or 4", m.Name, m.ElemBytes)
	}
	return nil
}

// ModelFromSynth is the model a gen-model shape describes (K/V in its dtype).
func ModelFromSynth(name string, c synth.Config) Model {
	kv := c.KVHeads
	if kv == 0 {
		kv = c.Heads
	}
	ctx := c.Context
	if ctx == 0 {
		ctx = 4096
	}
	elem := 2
	if c.DType == "F32" {
		elem = 4
	}
	return Model{Name: name, Layers: c.Layers, Heads: c.Heads, KVHeads: kv, HeadDim: c.Hidden / c.Heads,
		ElemBytes: elem, Params: c.Params(), WeightBytes: c.DataBytes(synth.Safetensors), Context: ctx}
}

// Preset returns a gen-model preset by name (synth.Presets).
func Preset(name string) (Model, bool) {
	c, ok := synth.Presets()[name]
	if !ok {
		return Model{}, false
	}
	return ModelFromSynth(name, c), true
}

// Hardware is the device time model: a step costs
//
//	max((weight bytes + K/V bytes read and written) / HBM bandwidth, FLOPs / FLOPS)
//
// where FLOPs = 2 · params · tokens + 4 · layers · heads · head dim · Σ
// attended positions (QKᵀ and PV), and a swap costs its bytes over the link,
// added to the clock (not overlapped).
type Hardware struct {
	Name     string  `json:"name"`
	HBMGBps  float64 `json:"hbm_GBps"`
	FLOPS    float64 `json:"flops"`
	LinkGBps float64 `json:"link_GBps"`
}

// H200 is the default time model: 4.8 TB/s of HBM3e, 989 TFLOP/s dense
// bf16 (NVIDIA's figures), 55 GB/s pinned PCIe (measured, BENCHMARKS.md).
func H200() Hardware {
	return Hardware{Name: "H200 (4.8 TB/s, 989 TFLOP/s bf16, PCIe 55 GB/s)", HBMGBps: 4800, FLOPS: 989e12, LinkGBps: 55}
}
