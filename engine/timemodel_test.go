package engine_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/safetensors"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
)

// sparseModel writes cfg's safetensors header and config.json into a temp
// dir and extends the file to its full size without writing the data (a
// sparse file: the simulator without backing memory never reads it).
func sparseModel(t *testing.T, cfg synth.Config) string {
	t.Helper()
	dir := t.TempDir()
	var specs []format.TensorSpec
	for _, ts := range cfg.Tensors(synth.Safetensors) {
		specs = append(specs, format.TensorSpec{Name: ts.Name, DType: ts.DType, Shape: ts.Shape})
	}
	header, tensors, err := safetensors.Layout(specs, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	var end uint64
	for _, ts := range tensors {
		end = max(end, ts.Offset+ts.Bytes)
	}
	f, err := os.Create(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(header); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(end)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(cfg.HFConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// h200 is the simulator's time model with an H200's rates: pinned
// host-to-device copies at 55 GB/s, 4.3 TB/s device memory, 700 TFLOP/s,
// 132 SMs, 2 MiB pages, and no backing memory (kernels are timed, not run).
func h200() *sim.Device {
	o := sim.DefaultOptions()
	o.TotalBytes, o.Multiprocessors, o.Granularity = 141<<30, 132, 2<<20
	o.PinnedHtoDGBps, o.PinnedDtoHGBps, o.DeviceGBps, o.PeakFLOPS = 55, 55, 4300, 700e12
	o.Backing, o.Kernels = false, kernels.Sim()
	return sim.New(o)
}

// TestTimeModel7B: a Llama-7B-shaped bf16 model in --vram 8GiB's pool
// share (8 GiB less 640 MiB for the context, the modules and the lazy
// reserve) prefills a 2,048-token prompt with the default chunk and slots
// within 1.15× the larger of its weight copies' device time and its
// products' time at the simulated rate, in one chunk.
func TestTimeModel7B(t *testing.T) {
	if onGPU() || testing.Short() {
		t.Skip("the simulator's time model at 7B scale (not -short)")
	}
	ctx := context.Background()
	cfg := synth.Llama7B()
	m := open(t, sparseModel(t, cfg))
	d := h200()
	t.Cleanup(func() { d.Close() })
	r := newRig(t, d)
	const prompt = 2048
	o := engine.Options{Budget: 8<<30 - 640<<20, MaxTokens: prompt + 2, PromptTokens: prompt, Timing: true}
	e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	f := e.Footprint()
	if f.PrefillChunk != prompt || f.Slots != 3 {
		t.Errorf("chose chunk %d and %d slots, want %d and 3", f.PrefillChunk, f.Slots, prompt)
	}
	res, err := e.Generate(ctx, make([]int, prompt), engine.Sampling{MaxNew: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	params := float64(m.Weights.DataBytes) / 2
	gemm := 2 * params * prompt / 700e12
	bound := max(res.PrefillCopySeconds, gemm)
	ratio := res.PrefillDeviceSeconds / bound
	t.Logf("chunk %d, %d slots, %d of %d groups streamed (%.2f GB): prefill %.4f s on the device, weight copies %.4f s, products %.4f s: %.3f× the bound",
		f.PrefillChunk, f.Slots, len(f.Plan.Streamed()), len(f.Plan.Groups), float64(f.Plan.StreamedBytes)/1e9,
		res.PrefillDeviceSeconds, res.PrefillCopySeconds, gemm, ratio)
	if ratio > 1.15 {
		t.Errorf("prefill %.4f s is %.3f× max(copies %.4f s, products %.4f s), above 1.15", res.PrefillDeviceSeconds, ratio, res.PrefillCopySeconds, gemm)
	}
}

// TestTimeModel7BDecodeDefaults: the decode check's run (a 448-token
// prompt in a 512-token context, --vram 8GiB) gets a 448-token chunk and
// two slots by default, so its arena and staging take no more than they
// must: about 6.1 GB streams per token with this context estimate.
func TestTimeModel7BDecodeDefaults(t *testing.T) {
	if onGPU() || testing.Short() {
		t.Skip("the simulator's time model at 7B scale (not -short)")
	}
	m := open(t, sparseModel(t, synth.Llama7B()))
	d := h200()
	t.Cleanup(func() { d.Close() })
	f, err := engine.Estimate(context.Background(), m, engine.Options{Budget: 8<<30 - 640<<20, MaxTokens: 512, PromptTokens: 448}, d.Info())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("chunk %d, %d slots, %.3f GB streamed per token, arena %d MiB", f.PrefillChunk, f.Slots, float64(f.Plan.StreamedBytes)/1e9, f.ArenaBytes>>20)
	if f.PrefillChunk != 448 || f.Slots != 2 || f.Plan.StreamedBytes > 6.15e9 {
		t.Errorf("chunk %d, %d slots, %d bytes streamed per token", f.PrefillChunk, f.Slots, f.Plan.StreamedBytes)
	}
}
