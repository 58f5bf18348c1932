package main

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKVSimulateJSON(t *testing.T) {
	code, out, errOut := runVerb(t, nil, "kv", "simulate", "--synthetic", "sharegpt", "--n", "200", "--model", "llama-7b", "--vram", "40GiB", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m["prefix_hit_rate"]; !ok {
		t.Error("JSON lacks prefix_hit_rate")
	}
	for _, policy := range []string{"paged", "contiguous"} {
		p, ok := m[policy].(map[string]any)
		if !ok {
			t.Fatalf("JSON lacks %q", policy)
		}
		for _, k := range []string{"waste_ratio", "mean_batch", "max_batch", "tokens_per_s", "preemptions", "swapped_bytes", "prefix_hit_rate"} {
			if _, ok := p[k]; !ok {
				t.Errorf("%s lacks %q", policy, k)
			}
		}
	}
	p, c := m["paged"].(map[string]any), m["contiguous"].(map[string]any)
	if p["waste_ratio"].(float64) > 0.04 || p["mean_batch"].(float64) < 2*c["mean_batch"].(float64) {
		t.Errorf("paged %v vs contiguous %v", p, c)
	}
}

func TestKVSimulateFileHTMLAndEvents(t *testing.T) {
	dir := t.TempDir()
	html, events := filepath.Join(dir, "kv.html"), filepath.Join(dir, "ev.jsonl")
	code, out, errOut := runVerb(t, nil, "kv", "simulate", "--requests", "../../testdata/kv/long-system-prompts.jsonl",
		"--model", "llama-7b", "--vram", "40GiB", "--html", html, "--events", events, "--preempt", "swap")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"waste_ratio", "mean_batch", "prefix_hit_rate", "paged runs"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	page, err := os.ReadFile(html)
	if err != nil || !strings.Contains(string(page), "<svg") {
		t.Fatalf("html: %v", err)
	}
	ev, err := os.ReadFile(events)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(ev)), "\n")
	var first map[string]any
	if len(lines) < 100 || json.Unmarshal([]byte(lines[0]), &first) != nil || first["event"] != "stored" || first["block_hash"] == nil {
		t.Fatalf("%d event lines, first %q", len(lines), lines[0])
	}
}

func TestKVSimulateErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	os.WriteFile(bad, []byte("{\"arrival_s\": 0, \"prompt_tokens\": 5, \"output_tokens\": 1}\n{\"arrival_s\": 0, \"prompt_tokens\": -5, \"output_tokens\": 1}\n"), 0o644)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"kv"}, 2, "want a sub-command"},
		{[]string{"kv", "simulat"}, 2, "unknown sub-command"},
		{[]string{"kv", "simulate", "--model", "llama-7b", "--vram", "40GiB"}, 2, "give one of --requests"},
		{[]string{"kv", "simulate", "--synthetic", "sharegpt", "--requests", bad, "--model", "llama-7b", "--vram", "40GiB"}, 2, "give one of"},
		{[]string{"kv", "simulate", "--synthetic", "sharegpt", "--vram", "40GiB"}, 2, "--model is required"},
		{[]string{"kv", "simulate", "--synthetic", "sharegpt", "--model", "llama-7b"}, 2, "--vram is required"},
		{[]string{"kv", "simulate", "--synthetic", "sharegpt", "--model", "llama-7b", "--vram", "40 potatoes"}, 2, "--vram"},
		{[]string{"kv", "simulate", "--synthetic", "nope", "--model", "llama-7b", "--vram", "40GiB"}, 2, "--synthetic"},
		{[]string{"kv", "simulate", "--synthetic", "sharegpt", "--model", "llama-7b", "--vram", "40GiB", "--preempt", "drop"}, 2, "--preempt"},
		{[]string{"kv", "simulate", "--requests", bad, "--model", "llama-7b", "--vram", "40GiB"}, 1, "bad.jsonl:2: field \"prompt_tokens\": -5"},
		{[]string{"kv", "simulate", "--synthetic", "sharegpt", "--model", "no-such-model", "--vram", "40GiB"}, 1, "not a gen-model preset"},
		{[]string{"kv", "simulate", "--synthetic", "sharegpt", "--model", "llama-7b", "--vram", "8GiB"}, 1, "leaves nothing for K/V"},
		{[]string{"kv", "simulate", "--synthetic", "sharegpt", "--model", "llama-7b", "--vram", "40GiB", "--html", t.TempDir()}, 1, "is a directory"},
		{[]string{"bench", "kv", "--blocks", "10"}, 2, "--blocks"},
		{[]string{"bench", "kv", "--blocks", "999"}, 2, "want sizes of 1000.."},
		{[]string{"kv", "simulate", "--synthetic", "sharegpt", "--model", "llama-7b", "--vram", "40GiB", "--time-model", "tpu"}, 2, "--time-model"},
	} {
		code, _, errOut := runVerb(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

// The simulated device's time model is slower than the H200's: fewer tokens
// per second for the same schedule.
func TestKVSimulateTimeModel(t *testing.T) {
	tps := map[string]float64{}
	for _, tm := range []string{"h200", "sim"} {
		code, out, errOut := runVerb(t, nil, "kv", "simulate", "--synthetic", "alpaca", "--n", "100", "--model", "llama-7b", "--vram", "40GiB", "--time-model", tm, "--json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var r struct {
			Paged struct {
				TokensPerS float64 `json:"tokens_per_s"`
			}
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		tps[tm] = r.Paged.TokensPerS
	}
	if !(tps["sim"] > 0 && tps["sim"] < tps["h200"]/5) {
		t.Fatalf("tokens/s %v: the simulated device (448 GB/s) should be far slower than the H200 (4.8 TB/s)", tps)
	}
}

func TestKVSimulateModelFile(t *testing.T) {
	for _, f := range []string{"safetensors", "gguf"} {
		kvModelFile(t, tinyFile(t, f))
	}
}

// A model whose tensors the engine would refuse (here: a config.json that
// contradicts them) still gives its K/V shape from its config.
func TestKVSimulateModelConfigOnly(t *testing.T) {
	path := tinyFile(t, "safetensors")
	cfgPath := filepath.Join(filepath.Dir(path), "config.json")
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Skipf("no config.json beside %s: %v", path, err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["intermediate_size"] = 999
	b, _ = json.Marshal(cfg)
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	kvModelFile(t, path)
}

func kvModelFile(t *testing.T, path string) {
	code, out, errOut := runVerb(t, nil, "kv", "simulate", "--synthetic", "alpaca", "--n", "50", "--model", path, "--vram", "1GiB", "--json")
	if code != 0 {
		t.Fatalf("%s: exit %d: %s", path, code, errOut)
	}
	var m struct {
		Model struct {
			Layers  int `json:"layers"`
			KVHeads int `json:"kv_heads"`
			HeadDim int `json:"head_dim"`
		}
		BytesPerToken uint64 `json:"kv_bytes_per_token"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	// Tiny: 4 layers, 4 KV heads of 32 (hidden 256 / 8 heads), bf16.
	if m.Model.Layers != 4 || m.Model.KVHeads != 4 || m.Model.HeadDim != 32 || m.BytesPerToken != 4*4*32*2*2 {
		t.Fatalf("model read from %s: %+v, %d bytes per token", path, m.Model, m.BytesPerToken)
	}
}

func TestBenchKVSim(t *testing.T) {
	code, out, errOut := runVerb(t, nil, "bench", "kv", "--device", "sim", "--blocks", "1000,2000", "--ops", "2000", "--swap-bytes", "16MiB", "--reps", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Ops  []map[string]float64
		Swap []struct {
			Layout   string
			Verified bool
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Ops) != 2 || len(rep.Swap) != 2 || !rep.Swap[0].Verified || rep.Swap[1].Layout != "per-layer" {
		t.Fatalf("report %s", out)
	}
	code, out, errOut = runVerb(t, nil, "bench", "kv", "--no-swap", "--blocks", "1000", "--ops", "2000")
	if code != 0 || !strings.Contains(out, "largest over smallest") {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
}

var updateKV = flag.Bool("update-kv", false, "rewrite testdata/kv_simulate.golden")

// The human report of a small deterministic simulation, held to a golden
// file (go test ./cmd/memwall -run TestKVSimulateGolden -update-kv).
func TestKVSimulateGolden(t *testing.T) {
	code, out, errOut := runVerb(t, nil, "kv", "simulate", "--synthetic", "shared-prefix", "--n", "120", "--model", "llama-7b", "--vram", "24GiB", "--preempt", "swap")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	golden := filepath.Join("testdata", "kv_simulate.golden")
	if *updateKV {
		if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update-kv to create it)", err)
	}
	if out != string(want) {
		t.Errorf("report differs from %s (rerun with -update-kv after checking):\n%s", golden, out)
	}
}
