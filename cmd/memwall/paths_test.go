package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/device/sim"
)

// TestPlanModelCapacity: a model plan above --capacity prints its report,
// says so, and exits 1; one below says it fits and exits 0; --json carries
// the capacity and the verdict (null without --capacity).
func TestPlanModelCapacity(t *testing.T) {
	m := filepath.Join(planTestONNX, "squeezenet1_1.onnx")
	code, out, errOut := runPlanVerb(t, m, "--capacity", "1MiB", "--time-limit", "0s")
	if code != 1 || !strings.Contains(out, "does NOT fit") || !strings.Contains(errOut, "does not fit --capacity 1.0 MiB") {
		t.Errorf("1MiB: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runPlanVerb(t, m, "--capacity", "1GiB", "--time-limit", "0s")
	if code != 0 || !strings.Contains(out, "capacity     1.0 GiB (1073741824 bytes): the in-place plan's arena fits") {
		t.Errorf("1GiB: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runPlanVerb(t, m, "--capacity", "1MiB", "--time-limit", "0s", "--json")
	j := planJSON(t, out, "capacity_bytes", "fits_capacity", "weights_bytes", "declared_tensors")
	if code != 1 || j["fits_capacity"] != false || planNum(t, j, "capacity_bytes") != 1<<20 {
		t.Errorf("--json 1MiB: exit %d %v", code, j)
	}
	code, out, _ = runPlanVerb(t, m, "--time-limit", "0s", "--json")
	j = planJSON(t, out, "capacity_bytes", "fits_capacity")
	if code != 0 || j["fits_capacity"] != nil || j["capacity_bytes"] != nil {
		t.Errorf("no capacity: exit %d, capacity %v, fits %v; want null", code, j["capacity_bytes"], j["fits_capacity"])
	}
}

// TestPlanORT: --ort prints the settings and the lines to paste, and the
// same numbers in --json: gpu_mem_limit = weights + no-in-place arena +
// workspace, rounded up to a MiB.
func TestPlanORT(t *testing.T) {
	m := filepath.Join(planTestONNX, "squeezenet1_1.onnx")
	code, out, errOut := runPlanVerb(t, m, "--ort", "--json", "--time-limit", "0s")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var j struct {
		Weights uint64 `json:"weights_bytes"`
		Arena   uint64 `json:"no_inplace_arena_bytes"`
		ORT     struct {
			Weights, Arena, Workspace, Total uint64
			CUDA                             map[string]string `json:"cuda_provider_options"`
		} `json:"ort"`
	}
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatal(err)
	}
	var raw map[string]map[string]any
	json.Unmarshal([]byte(out), &raw)
	o := raw["ort"]
	w, a, ws, total := uint64(o["weights_bytes"].(float64)), uint64(o["arena_bytes"].(float64)), uint64(o["workspace_bytes"].(float64)), uint64(o["total_bytes"].(float64))
	// squeezenet1_1's 1.2 M parameters, float32.
	if w != j.Weights || w < 4_000_000 || w > 5_500_000 || a != j.Arena || total < w+a+ws || total-(w+a+ws) >= 1<<20 {
		t.Errorf("ort %v; weights %d arena %d", o, j.Weights, j.Arena)
	}
	code, out, _ = runPlanVerb(t, m, "--ort", "--ort-workspace", "1MiB", "--time-limit", "0s")
	for _, want := range []string{"ONNX Runtime settings", "gpu_mem_limit", "kSameAsRequested", "import onnxruntime as ort",
		"ort.OrtArenaCfg(", "session.use_env_allocators", "workspace 1.0 MiB"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("--ort human output lacks %q (exit %d)\n%s", want, code, out)
		}
	}
	if code, _, errOut := runPlanVerb(t, m, "--ort-workspace", "1MiB"); code != 2 || !strings.Contains(errOut, "needs --ort") {
		t.Errorf("--ort-workspace alone: exit %d %s", code, errOut)
	}
}

// TestPlanInputKinds: the file's bytes decide what it is. A gzip CSV is
// read; a text file is not an ONNX model; an empty or header-only CSV has
// no buffers; nothing prints raw bytes.
func TestPlanInputKinds(t *testing.T) {
	dir := t.TempDir()
	csv, _ := os.ReadFile(filepath.Join(planTestMinimalloc, "A.1048576.csv"))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(csv)
	zw.Close()
	gzPath := filepath.Join(dir, "A.csv.gz")
	os.WriteFile(gzPath, gz.Bytes(), 0o644)
	code, out, errOut := runPlanVerb(t, "--lifetimes", gzPath, "--json", "--time-limit", "0s")
	if code != 0 {
		t.Fatalf("gzip CSV: exit %d %s", code, errOut)
	}
	if j := planJSON(t, out, "buffers"); planNum(t, j, "buffers") == 0 {
		t.Errorf("gzip CSV: %v", j)
	}
	header := filepath.Join(dir, "header.csv")
	os.WriteFile(header, []byte("id,lower,upper,size\n"), 0o644)
	empty := filepath.Join(dir, "empty.csv")
	os.WriteFile(empty, nil, 0o644)
	bin := filepath.Join(dir, "bin.csv")
	os.WriteFile(bin, append([]byte{0, 1, 2, 0xff, 0xfe}, bytes.Repeat([]byte{0x80}, 2000)...), 0o644)
	readme := filepath.Join(dir, "README.md")
	os.WriteFile(readme, []byte("# memwall\n\nGPU memory for ML inference.\n"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--lifetimes", header}, "no buffers"},
		{[]string{"--lifetimes", empty}, "empty"},
		{[]string{"--lifetimes", bin}, "not a CSV file: it is a binary file"},
		{[]string{readme}, "not an ONNX model: it is a text file"},
		{[]string{empty}, "not an ONNX model: it is an empty file"},
	} {
		code, _, errOut := runPlanVerb(t, c.args...)
		if code != 1 || !strings.Contains(errOut, c.want) || len(errOut) > 400 {
			t.Errorf("%v: exit %d, %q; want exit 1 saying %q, briefly", c.args, code, errOut, c.want)
		}
	}
}

// TestPlanSideFiles: --out and --svg are checked before the work, and a
// report is printed even when writing a side file fails.
func TestPlanSideFiles(t *testing.T) {
	inst := filepath.Join(planTestMinimalloc, "A.1048576.csv")
	code, out, errOut := runPlanVerb(t, "--lifetimes", inst, "--out", "/nonexistent/x.json")
	if code != 1 || out != "" || !strings.Contains(errOut, "--out /nonexistent/x.json") {
		t.Errorf("missing dir: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	code, out, errOut = runPlanVerb(t, "--lifetimes", inst, "--svg", "/dev/full", "--time-limit", "0s")
	if code != 1 || !strings.Contains(out, "arena") || !strings.Contains(errOut, "--svg /dev/full") {
		t.Errorf("/dev/full: exit %d, stdout %q, stderr %q; want the report and the error", code, out, errOut)
	}
}

// TestFitFileKinds: fit names what a file is when it is not a model.
func TestFitFileKinds(t *testing.T) {
	dir := t.TempDir()
	readme := filepath.Join(dir, "README.md")
	os.WriteFile(readme, []byte("# memwall\n\nGPU memory for ML inference: pools, plans, streaming.\n"), 0o644)
	empty := filepath.Join(dir, "empty.gguf")
	os.WriteFile(empty, nil, 0o644)
	gz := filepath.Join(dir, "m.safetensors")
	os.WriteFile(gz, []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3}, 0o644)
	for _, c := range []struct{ path, want string }{
		{readme, "not a model file: it is a text file"},
		{empty, "not a model file: it is an empty file"},
		{gz, "not a model file: it is a gzip-compressed file"},
	} {
		code, _, errOut := runVerb(t, nil, "fit", c.path, "--vram", "1GiB", "--device", "sim")
		if code != 1 || !strings.Contains(errOut, c.want) || strings.Contains(errOut, "header length") || strings.Contains(errOut, "safetensors "+c.path) {
			t.Errorf("%s: exit %d, %q; want %q", c.path, code, errOut, c.want)
		}
	}
}

// TestFitBudgetAboveDevice: a --vram above the simulated device's memory
// is refused naming both figures, not planned into a device that grows.
func TestFitBudgetAboveDevice(t *testing.T) {
	path := tinyFile(t, "safetensors")
	code, out, errOut := runVerb(t, nil, "fit", path, "--vram", "100GiB", "--device", "sim", "--link-gbps", "10")
	if code != 1 || out != "" || !strings.Contains(errOut, "--vram 100.0 GiB (107374182400 bytes) is above") || !strings.Contains(errOut, "total memory, 8.0 GiB") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestReplayPaths: empty traces and empty selections are refused, --json's
// fragmentation figures are real (or null for a replay that took no
// sample), an --html that cannot be written fails before the work, and one
// that fails on writing still leaves the report printed.
func TestReplayPaths(t *testing.T) {
	dir := t.TempDir()
	header := filepath.Join(dir, "h.csv")
	os.WriteFile(header, []byte("action,addr,size,stream\n"), 0o644)
	empty := filepath.Join(dir, "e.jsonl")
	os.WriteFile(empty, nil, 0o644)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{header}, 1, "no allocations to replay"},
		{[]string{empty}, 1, ""},
		{[]string{bertTrace, "--strategy", ","}, 2, "--strategy"},
		{[]string{bertTrace, "--html", "/nonexistent/x.html"}, 1, "--html /nonexistent/x.html"},
	} {
		code, out, errOut := runReplayVerb(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) || strings.Contains(out, "goal") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d saying %q", c.args, code, out, errOut, c.code, c.want)
		}
	}
	code, out, errOut := runReplayVerb(t, bertTrace, "--strategy", "default", "--no-search", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Results []map[string]any `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Results) != 1 {
		t.Fatalf("%v %s", err, out)
	}
	fmin, ok1 := rep.Results[0]["fragmentation_min"].(float64)
	fmean, ok2 := rep.Results[0]["fragmentation_mean"].(float64)
	if !ok1 || !ok2 || fmean <= 0 || fmin > fmean || fmean > 1 || fmin == 1 {
		t.Errorf("fragmentation min %v mean %v: placeholders, not measurements", rep.Results[0]["fragmentation_min"], rep.Results[0]["fragmentation_mean"])
	}
	code, out, _ = runReplayVerb(t, bertTrace, "--strategy", "default", "--no-search", "--capacity", "1MiB", "--json")
	if err := json.Unmarshal([]byte(out), &rep); code != 1 || err != nil || rep.Results[0]["fragmentation_min"] != nil {
		t.Errorf("a replay failing at once: exit %d, fragmentation_min %v (want null)", code, rep.Results[0]["fragmentation_min"])
	}
	if _, err := os.Stat("/dev/full"); err == nil {
		code, out, errOut = runReplayVerb(t, bertTrace, "--strategy", "default", "--no-search", "--html", "/dev/full")
		if code != 1 || !strings.Contains(out, "configuration") || !strings.Contains(errOut, "--html /dev/full") {
			t.Errorf("--html /dev/full: exit %d, stdout %q, stderr %q; want the report, then the error", code, out, errOut)
		}
	}
}

func TestTidyMessage(t *testing.T) {
	for in, want := range map[string]string{
		"pool pool: cannot allocate":      "pool: cannot allocate",
		"plan: x":                         "x",
		"replay a of b: op 3: pool p: no": "replay a of b: op 3: pool p: no",
		"stream stream: a; pool pool: b":  "stream: a; pool: b",
	} {
		if got := tidyMessage("plan", in); got != want {
			t.Errorf("tidyMessage(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzSniff: no input panics, every input gets one of the known kinds, and
// a kind found from a prefix of a file is found again for the same bytes.
func FuzzSniff(f *testing.F) {
	for _, s := range [][]byte{nil, []byte("GGUF\x03"), {0x1f, 0x8b, 8}, []byte("# README\n"), {8, 7, 0x12}, []byte("{\"a\":1}"),
		append([]byte{2, 0, 0, 0, 0, 0, 0, 0}, "{}"...), {0xff, 0xfe, 0}} {
		f.Add(s, int64(len(s)))
	}
	known := map[string]bool{kindEmpty: true, kindGGUF: true, kindSafetensors: true, kindJSON: true, kindONNX: true,
		kindGzip: true, kindZip: true, kindText: true, kindBinary: true}
	f.Fuzz(func(t *testing.T, head []byte, size int64) {
		if size < int64(len(head)) {
			size = int64(len(head))
		}
		k := sniff(head, size)
		if !known[k] || sniff(head, size) != k {
			t.Fatalf("sniff(%q, %d) = %q", head, size, k)
		}
		if kindPhrase(k) == "" {
			t.Fatalf("no phrase for %q", k)
		}
	})
}

// TestCheckBudget: a budget above the device's total is refused naming
// both figures; above what is free it is accepted with a warning naming
// both; within what is free, silently.
func TestCheckBudget(t *testing.T) {
	o := sim.DefaultOptions()
	o.Backing = false
	d := sim.New(o)
	defer d.Close()
	if _, err := d.Alloc(5 << 30); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	e := &env{stderr: &stderr}
	if err := checkBudget(e, d, 9<<30); err == nil || !strings.Contains(err.Error(), "9.0 GiB") || !strings.Contains(err.Error(), "8.0 GiB") {
		t.Errorf("above total: %v", err)
	}
	if err := checkBudget(e, d, 4<<30); err != nil || !strings.Contains(stderr.String(), "warning: --vram 4.0 GiB") || !strings.Contains(stderr.String(), "free on") {
		t.Errorf("above free: %v, %q", err, stderr.String())
	}
	stderr.Reset()
	if err := checkBudget(e, d, 2<<30); err != nil || stderr.Len() != 0 {
		t.Errorf("within free: %v, %q", err, stderr.String())
	}
}
