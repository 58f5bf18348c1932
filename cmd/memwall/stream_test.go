package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/format/onnx"
	"github.com/memwall/memwall/format/onnx/onnxtest"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/format/weights"
	"github.com/memwall/memwall/kernels"
)

func runVerbSim(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	env := &env{ctx: context.Background(), stdout: &o, stderr: &e, getenv: func(string) string { return "" }}
	code = run(args, env)
	return code, o.String(), e.String()
}

// tinyFile writes the Tiny model in the format into a temp dir.
func tinyFile(t *testing.T, formatName string) string {
	t.Helper()
	p, err := synth.WriteTiny(context.Background(), t.TempDir(), formatName)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFitAndStreamJSON(t *testing.T) {
	for _, f := range []string{synth.Safetensors, synth.GGUF} {
		t.Run(f, func(t *testing.T) {
			path := tinyFile(t, f)
			code, out, errOut := runVerbSim(t, "fit", path, "--plain", "--vram", "5MiB", "--ctx", "128", "--device", "sim", "--json")
			if code != 0 {
				t.Fatalf("fit: exit %d: %s", code, errOut)
			}
			var fit map[string]any
			if err := json.Unmarshal([]byte(out), &fit); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"model_bytes", "resident_bytes", "streamed_bytes", "staging_bytes", "activation_bytes",
				"kv_bytes", "predicted_peak_bytes", "predicted_seconds_per_step", "link_GBps", "layers"} {
				if _, ok := fit[k]; !ok {
					t.Errorf("fit --json lacks %q", k)
				}
			}
			if fit["streamed_bytes"].(float64) == 0 || fit["kv_bytes"].(float64) == 0 {
				t.Errorf("fit: streamed %v, kv %v", fit["streamed_bytes"], fit["kv_bytes"])
			}
			if !strings.HasPrefix(fit["link_source"].(string), "measured") {
				t.Errorf("link source %q", fit["link_source"])
			}
			code, out, errOut = runVerbSim(t, "stream", path, "--vram", "5MiB", "--ctx", "128", "--tokens", "8", "--steps", "3", "--device", "sim", "--json")
			if code != 0 {
				t.Fatalf("stream: exit %d: %s", code, errOut)
			}
			var st map[string]any
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"peak_bytes", "seconds_per_step", "achieved_GBps", "overlap_efficiency", "verified", "predicted_peak_bytes"} {
				if _, ok := st[k]; !ok {
					t.Errorf("stream --json lacks %q", k)
				}
			}
			if st["verified"] != true {
				t.Errorf("not verified: %v", st["verify_note"])
			}
			// The plan counts the pool's 2 MiB pages and the benchmark holds
			// the KV cache the plan reserves: the prediction is the peak.
			if peak, pred := st["peak_bytes"].(float64), st["predicted_peak_bytes"].(float64); peak != pred || st["kv_bytes"].(float64) == 0 {
				t.Errorf("peak %v, predicted %v (KV %v)", peak, pred, st["kv_bytes"])
			}
			if st["peak_footprint_bytes"] != st["peak_bytes"] || st["context_bytes"].(float64) != 0 {
				t.Errorf("footprint %v, context %v on the simulator", st["peak_footprint_bytes"], st["context_bytes"])
			}
			m, p := st["seconds_per_step"].(float64), st["predicted_steady_seconds_per_step"].(float64)
			if math.Abs(m-p)/p > 0.02 || m > st["predicted_seconds_per_step"].(float64)*1.001 {
				t.Errorf("step %v s, predicted %v s steady, %v s cold", m, p, st["predicted_seconds_per_step"])
			}
			res := st["residency"].(map[string]any)
			if res["copies"].(float64) < 4*fit["streamed_layers"].(float64) || st["prefetch"].(float64) != 1 {
				t.Errorf("residency %v, prefetch %v over 4 steps of %v streamed layers", res, st["prefetch"], fit["streamed_layers"])
			}
			if stderr := errOut; stderr != "" {
				t.Errorf("stderr without a terminal: %q", stderr)
			}
		})
	}
}

func TestFitHuman(t *testing.T) {
	path := tinyFile(t, synth.Safetensors)
	code, out, errOut := runVerbSim(t, "fit", path, "--vram", "1GiB", "--link-gbps", "12.5", "--device", "sim")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"streamed   nothing: the whole model fits", "12.5 GB/s, given (--link-gbps)", "predicted  peak"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = runVerbSim(t, "stream", path, "--vram", "5MiB", "--steps", "2", "--device", "sim")
	if code != 0 {
		t.Fatalf("stream: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"measured   peak", "streamed", "verified   "} {
		if !strings.Contains(out, want) {
			t.Errorf("stream output lacks %q:\n%s", want, out)
		}
	}
}

func TestFitBadInput(t *testing.T) {
	path := tinyFile(t, synth.Safetensors)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	trunc := filepath.Join(t.TempDir(), "trunc.safetensors")
	if err := os.WriteFile(trunc, data[:len(data)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	gpath := tinyFile(t, synth.GGUF)
	gdata, err := os.ReadFile(gpath)
	if err != nil {
		t.Fatal(err)
	}
	gtrunc := filepath.Join(t.TempDir(), "trunc.gguf")
	if err := os.WriteFile(gtrunc, gdata[:len(gdata)-1000], 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"truncated safetensors", []string{"fit", trunc, "--vram", "1GiB", "--device", "sim"}, 1, "trunc.safetensors"},
		{"truncated gguf", []string{"stream", gtrunc, "--vram", "1GiB", "--device", "sim"}, 1, "trunc.gguf"},
		{"missing file", []string{"fit", filepath.Join(t.TempDir(), "none"), "--vram", "1GiB", "--device", "sim"}, 1, "none"},
		{"below the minimum", []string{"fit", path, "--plain", "--vram", "2MiB", "--device", "sim"}, 1, "below the minimum 4194304 bytes"},
		{"stream below the minimum", []string{"stream", path, "--vram", "1MiB", "--device", "sim"}, 1, "try --vram 4194304"},
		{"no vram", []string{"fit", path}, 2, "--vram is required"},
		{"bad vram", []string{"fit", path, "--vram", "lots"}, 2, "--vram"},
		{"no model", []string{"stream", "--vram", "1GiB"}, 2, "MODEL"},
		{"one slot", []string{"stream", path, "--vram", "1GiB", "--slots", "1"}, 2, "--slots"},
		{"zero steps", []string{"stream", path, "--vram", "1GiB", "--steps", "0"}, 2, "--steps"},
		{"bad source", []string{"stream", path, "--vram", "1GiB", "--source", "floppy"}, 2, "--source"},
		{"negative ctx", []string{"fit", path, "--vram", "1GiB", "--ctx", "-1"}, 2, "--ctx"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, errOut := runVerbSim(t, c.args...)
			if code != c.code || !strings.Contains(errOut, c.want) {
				t.Errorf("exit %d, stderr %q; want exit %d mentioning %q", code, errOut, c.code, c.want)
			}
		})
	}
}

func TestDemoStream(t *testing.T) {
	o := sim.DefaultOptions()
	o.Kernels = kernels.Sim()
	d := sim.New(o)
	defer d.Close()
	var out bytes.Buffer
	e := &env{ctx: context.Background(), stdout: &out, stderr: &out, getenv: func(string) string { return "" }}
	if err := demoStream(e, d); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(out.String(), "\n"); lines < 3 || lines > 4 || !strings.Contains(out.String(), "verified: ") {
		t.Errorf("demo printed %d lines:\n%s", lines, out.String())
	}
	t.Log("\n" + out.String())
}

// TestStreamONNXExternalData streams an ONNX model whose initializers are
// external data: the tiny model's safetensors file, referenced by offset
// from a .onnx written beside it (as exporters do for large models). The
// products must verify, as for the safetensors file itself.
func TestStreamONNXExternalData(t *testing.T) {
	st := tinyFile(t, synth.Safetensors)
	m, err := weights.Open(st)
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]int32{"BF16": int32(onnx.BFloat16), "F16": int32(onnx.Float16), "F32": int32(onnx.Float)}
	var inits []onnxtest.Initializer
	for _, ts := range m.Tensors {
		dims := make([]int64, len(ts.Shape))
		for i, d := range ts.Shape {
			dims[i] = int64(d)
		}
		inits = append(inits, onnxtest.Initializer{Name: ts.Name, Dims: dims, DataType: codes[ts.DType],
			Location: filepath.Base(ts.File), Offset: int64(ts.Offset), Length: int64(ts.Bytes)})
	}
	m.Close()
	p := filepath.Join(filepath.Dir(st), "tiny.onnx")
	if err := os.WriteFile(p, onnxtest.Model(inits), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runVerbSim(t, "stream", p, "--vram", "5MiB", "--tokens", "4", "--steps", "2", "--device", "sim", "--json")
	if code != 0 {
		t.Fatalf("stream: exit %d: %s", code, errOut)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res["verified"] != true || res["streamed_bytes"].(float64) == 0 {
		t.Fatalf("ONNX external data: verified %v, streamed %v (%v)", res["verified"], res["streamed_bytes"], res["verify_note"])
	}
}

// TestStreamSlotsAndBudget: --slots is honoured when the budget holds that
// many slots and refused (naming the slots that fit) when it does not;
// --prefetch needs a slot more than it prefetches; a budget above the
// device's memory is refused naming both.
func TestStreamSlotsAndBudget(t *testing.T) {
	path := tinyFile(t, synth.Safetensors)
	code, out, errOut := runVerbSim(t, "stream", path, "--vram", "6MiB", "--slots", "3", "--prefetch", "2", "--steps", "2", "--device", "sim", "--json")
	if code != 0 {
		t.Fatalf("--slots 3 in 6 MiB: exit %d: %s", code, errOut)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatal(err)
	}
	if st["slots"].(float64) != 3 || st["prefetch"].(float64) != 2 || st["verified"] != true {
		t.Errorf("--slots 3 --prefetch 2: slots %v, prefetch %v, verified %v", st["slots"], st["prefetch"], st["verified"])
	}
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"three slots do not fit", []string{"stream", path, "--vram", "5MiB", "--slots", "3"}, 1, "--slots 3 does not fit --vram 5.0 MiB"},
		{"prefetch without a slot", []string{"stream", path, "--vram", "5MiB", "--prefetch", "2"}, 2, "--prefetch 2 needs 3 slots"},
		{"above the device", []string{"stream", path, "--vram", "100GiB"}, 1, "total memory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, errOut := runVerbSim(t, append(c.args, "--device", "sim")...)
			if code != c.code || !strings.Contains(errOut, c.want) {
				t.Errorf("exit %d, stderr %q; want exit %d mentioning %q", code, errOut, c.code, c.want)
			}
		})
	}
}

// TestStreamPredictsPeak: on small models of several shapes, streamed and
// resident, stream's predicted peak is within 2% of the peak it measures on
// the simulator (whose pool maps 2 MiB pages), and the peak stays within
// --vram.
func TestStreamPredictsPeak(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name  string
		shape []string
		vrams []string
	}{
		{"2x128", []string{"--layers", "2", "--hidden", "128", "--inter", "384", "--heads", "2", "--vocab", "500"}, []string{"3MiB"}},
		{"4x256", []string{"--layers", "4", "--hidden", "256", "--inter", "512", "--heads", "4", "--vocab", "1000"}, []string{"5MiB", "9MiB"}},
		{"6x384", []string{"--layers", "6", "--hidden", "384", "--inter", "1024", "--heads", "6", "--vocab", "2000"}, []string{"9MiB", "17MiB", "40MiB"}},
		{"3x512-f32", []string{"--layers", "3", "--hidden", "512", "--inter", "1536", "--heads", "8", "--vocab", "4000", "--dtype", "f32"}, []string{"40MiB"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name+".safetensors")
			if code, _, errOut := runVerbSim(t, append([]string{"gen-model", "--out", path}, c.shape...)...); code != 0 {
				t.Fatalf("gen-model: exit %d: %s", code, errOut)
			}
			for _, vram := range c.vrams {
				j := runJSONOut(t, "stream", path, "--vram", vram, "--steps", "1", "--device", "sim", "--json")
				peak, pred, budget := j["peak_bytes"].(float64), j["predicted_peak_bytes"].(float64), j["budget_bytes"].(float64)
				if math.Abs(peak-pred) > 0.02*peak || peak > budget {
					t.Errorf("--vram %s: measured peak %v, predicted %v, budget %v", vram, peak, pred, budget)
				}
				t.Logf("--vram %s: %v streamed bytes, peak %v, predicted %v", vram, j["streamed_bytes"], peak, pred)
			}
		})
	}
}

// TestStreamVulkan: on a Vulkan device (lavapipe is enough) stream runs the
// products with package spirv's kernel, verified against the float64
// reference, streaming when the budget asks for it; the pool there grows
// by chunks, which pack the allocations fit charges in 2 MiB units, so the
// measured peak is at most the prediction, itself within --vram. fit
// --plain measures the products there too. Skips where no Vulkan device
// opens.
func TestStreamVulkan(t *testing.T) {
	path := tinyFile(t, synth.Safetensors)
	code, out, errOut := runVerbSim(t, "fit", path, "--plain", "--vram", "64MiB", "--device", "vulkan", "--json")
	if code != 0 {
		if strings.Contains(strings.ToLower(errOut), "vulkan") && os.Getenv("MEMWALL_TEST_DEVICE") != "vulkan" {
			t.Skipf("no Vulkan device here: %s", strings.TrimSpace(errOut))
		}
		t.Fatalf("fit --plain on vulkan: exit %d: %s", code, errOut)
	}
	var fit map[string]any
	if err := json.Unmarshal([]byte(out), &fit); err != nil {
		t.Fatal(err)
	}
	if src, _ := fit["compute_source"].(string); !strings.HasPrefix(src, "measured") {
		t.Errorf("fit --plain on vulkan: compute %q", src)
	}
	for _, vram := range []string{"9MiB", "64MiB"} {
		j := runJSONOut(t, "stream", path, "--vram", vram, "--steps", "1", "--device", "vulkan", "--json")
		peak, pred, budget := j["peak_bytes"].(float64), j["predicted_peak_bytes"].(float64), j["budget_bytes"].(float64)
		if j["verified"] != true || peak > pred || pred > budget || vram == "9MiB" && j["streamed_bytes"].(float64) == 0 {
			t.Errorf("--vram %s: verified %v (%v), peak %v, predicted %v, budget %v, streamed %v", vram, j["verified"], j["verify_note"], peak, pred, budget, j["streamed_bytes"])
		}
	}
}
