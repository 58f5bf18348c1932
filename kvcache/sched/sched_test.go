package sched

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/kvcache"
)

var update = flag.Bool("update", false, "rewrite testdata/kv/long-system-prompts.jsonl")

func llama7b(t testing.TB) Model {
	m, ok := Preset("llama-7b")
	if !ok {
		t.Fatal("no llama-7b preset")
	}
	return m
}

func TestReadRequests(t *testing.T) {
	good := `{"arrival_s": 0.5, "prompt_tokens": 10, "output_tokens": 3}

{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 1, "prefix_id": "sys", "prefix_tokens": 64, "extra": [1]}
{"arrival_s": 0.25, "prompt_tokens": 7, "output_tokens": 2, "prefix_id": 12, "prefix_tokens": 7}
`
	reqs, err := ReadRequests(strings.NewReader(good), "r.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 || reqs[0].PrefixID != "sys" || reqs[1].PrefixID != "12" || reqs[2].PromptTokens != 10 {
		t.Fatalf("parsed %+v", reqs)
	}
	var buf bytes.Buffer
	if err := WriteRequests(&buf, reqs); err != nil {
		t.Fatal(err)
	}
	again, err := ReadRequests(&buf, "again")
	if err != nil || len(again) != 3 || again[0] != reqs[0] || again[1] != reqs[1] {
		t.Fatalf("round trip: %+v, %v", again, err)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"prompt_tokens": 1, "output_tokens": 1}`, `f:1: missing field "arrival_s"`},
		{`{"arrival_s": -1, "prompt_tokens": 1, "output_tokens": 1}`, `f:1: field "arrival_s": -1`},
		{`{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 1}`, `f:1: field "prompt_tokens": 0, want 1..16777216`},
		{`{"arrival_s": 0, "prompt_tokens": 1.5, "output_tokens": 1}`, `field "prompt_tokens": 1.5, want an integer`},
		{`{"arrival_s": 0, "prompt_tokens": 1}`, `missing field "output_tokens"`},
		{`{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 99999999}`, `field "output_tokens": 99999999`},
		{`{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": -1}`, `field "output_tokens": -1, want 0..`},
		{`{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 1, "prefix_tokens": 2}`, `"prefix_tokens" without "prefix_id"`},
		{`{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 1, "prefix_id": "a", "prefix_tokens": 5}`, `more than prompt_tokens 4`},
		{`{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 1, "prefix_id": [1]}`, `field "prefix_id": [1], want a string or an integer`},
		{"{\"arrival_s\": 0, \"prompt_tokens\": 4, \"output_tokens\": 1}\n[1]", `f:2: not a JSON object`},
		{`{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 1} {}`, `more than one JSON value`},
		{"\n\n", `f: no requests`},
		{`{"arrival_s": 1e400, "prompt_tokens": 4, "output_tokens": 1}`, `f:1: not a JSON object`},
	} {
		_, err := ReadRequests(strings.NewReader(tc.in), "f")
		var fe *FileError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want a FileError containing %q", tc.in, err, tc.want)
		}
	}
}

// FuzzReadRequests: the parser never panics, and what it accepts is valid
// and survives a round trip.
func FuzzReadRequests(f *testing.F) {
	f.Add([]byte(`{"arrival_s": 0.5, "prompt_tokens": 10, "output_tokens": 3}`))
	f.Add([]byte("{\"arrival_s\": 0, \"prompt_tokens\": 100, \"output_tokens\": 1, \"prefix_id\": \"sys\", \"prefix_tokens\": 64}\n\n"))
	f.Add([]byte(`{"arrival_s": 1, "prompt_tokens": 7, "output_tokens": 2, "prefix_id": 12, "prefix_tokens": 7}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := ReadRequests(bytes.NewReader(data), "fuzz")
		if err != nil {
			var fe *FileError
			if !errors.As(err, &fe) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		for i, r := range reqs {
			if r.PromptTokens < 1 || r.OutputTokens < 0 || r.PrefixTokens > r.PromptTokens || r.ArrivalS < 0 ||
				(r.PrefixTokens > 0 && r.PrefixID == "") || (i > 0 && reqs[i-1].ArrivalS > r.ArrivalS) {
				t.Fatalf("accepted a bad request %+v", r)
			}
		}
		var buf bytes.Buffer
		if err := WriteRequests(&buf, reqs); err != nil {
			t.Fatal(err)
		}
		again, err := ReadRequests(&buf, "again")
		if err != nil || len(again) != len(reqs) {
			t.Fatalf("round trip: %d of %d, %v", len(again), len(reqs), err)
		}
	})
}

func checked(m *kvcache.Manager) error { return m.Check() }

// The first target: on a ShareGPT-like mix the paged policy
// wastes at most 4% and batches at least twice as many sequences as the
// contiguous one on the same VRAM; every request finishes under both, with
// the same tokens.
func TestShareGPTTarget(t *testing.T) {
	m := llama7b(t)
	reqs, err := Synthetic(context.Background(), SyntheticOptions{Kind: "sharegpt", Requests: 600, Seed: 3, MaxLen: m.Context})
	if err != nil {
		t.Fatal(err)
	}
	res, err := Simulate(context.Background(), reqs, Options{Model: m, VRAMBytes: 40 << 30, check: checked})
	if err != nil {
		t.Fatal(err)
	}
	p, c := res.Paged, res.Contiguous
	if p.WasteRatio > 0.04 {
		t.Errorf("paged waste %.3f > 0.04", p.WasteRatio)
	}
	if p.MeanBatch < 2*c.MeanBatch {
		t.Errorf("paged mean batch %.1f < 2 × contiguous %.1f", p.MeanBatch, c.MeanBatch)
	}
	if c.WasteRatio < 0.5 {
		t.Errorf("contiguous waste %.3f: reserving 4096 tokens for ~500 should waste most of it", c.WasteRatio)
	}
	var out uint64
	for _, r := range reqs {
		out += uint64(r.OutputTokens)
	}
	for _, pr := range []PolicyResult{p, c} {
		if pr.Finished != len(reqs) || pr.OutputTokens != out {
			t.Errorf("%s: %d of %d finished, %d of %d tokens", pr.Policy, pr.Finished, len(reqs), pr.OutputTokens, out)
		}
	}
	if p.TokensPerS <= c.TokensPerS {
		t.Errorf("paged %.0f tokens/s not above contiguous %.0f", p.TokensPerS, c.TokensPerS)
	}
	t.Logf("paged waste %.4f batch %.1f (max %d) %.0f tok/s, %d preemptions; contiguous waste %.3f batch %.1f %.0f tok/s",
		p.WasteRatio, p.MeanBatch, p.MaxBatch, p.TokensPerS, p.Preemptions, c.WasteRatio, c.MeanBatch, c.TokensPerS)
}

// The second target on the committed long-system-prompt trace:
// prefix hit rate ≥ 90% of shareable full blocks, waste ≤ 4%.
func TestLongSystemPromptTrace(t *testing.T) {
	path := filepath.Join("..", "..", "testdata", "kv", "long-system-prompts.jsonl")
	if *update {
		if err := os.WriteFile(path, longSystemPrompts(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reqs, err := ReadRequests(f, path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Simulate(context.Background(), reqs, Options{Model: llama7b(t), VRAMBytes: 40 << 30, check: checked})
	if err != nil {
		t.Fatal(err)
	}
	if res.PrefixHitRate < 0.9 || res.Paged.WasteRatio > 0.04 || res.ReusableHitRate < res.PrefixHitRate {
		t.Errorf("prefix hit rate %.3f (want ≥ 0.9; %.3f of reusable blocks), waste %.4f (want ≤ 0.04)", res.PrefixHitRate, res.ReusableHitRate, res.Paged.WasteRatio)
	}
	if res.Paged.Finished != len(reqs) {
		t.Errorf("%d of %d finished", res.Paged.Finished, len(reqs))
	}
	t.Logf("hit rate %.4f (%d of %d blocks; %.4f of reusable ones), waste %.4f, batch %.1f vs %.1f, %d preemptions",
		res.PrefixHitRate, res.HitBlocks, res.ShareableBlocks, res.ReusableHitRate, res.Paged.WasteRatio, res.Paged.MeanBatch, res.Contiguous.MeanBatch, res.Paged.Preemptions)
}

// Swap preemption under pressure: sequences go to the host and come back,
// every request still finishes, and the invariants hold after every step.
func TestSwapPreemption(t *testing.T) {
	m := llama7b(t)
	reqs, err := Synthetic(context.Background(), SyntheticOptions{Kind: "sharegpt", Requests: 300, Seed: 5, MaxLen: m.Context})
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"swap", "recompute"} {
		res, err := Simulate(context.Background(), reqs, Options{Model: m, VRAMBytes: m.WeightBytes + 6<<30, Preempt: mode, HostBytes: 2 << 30, check: checked})
		if err != nil {
			t.Fatal(err)
		}
		p := res.Paged
		if p.Preemptions == 0 || p.Finished != len(reqs) {
			t.Fatalf("%s: %d preemptions, %d of %d finished", mode, p.Preemptions, p.Finished, len(reqs))
		}
		if (mode == "swap") != (p.SwappedBytes > 0) {
			t.Fatalf("%s: %d bytes swapped", mode, p.SwappedBytes)
		}
		if p.SwappedBytes%res.BlockBytes != 0 {
			t.Fatalf("swapped %d bytes, not whole blocks of %d", p.SwappedBytes, res.BlockBytes)
		}
	}
}

// Prefill-only requests (no output) finish after their prompt and produce
// no token.
func TestPrefillOnly(t *testing.T) {
	reqs := []Request{{PromptTokens: 100, OutputTokens: 0}, {ArrivalS: 0.1, PromptTokens: 50, OutputTokens: 3}}
	res, err := Simulate(context.Background(), reqs, Options{Model: llama7b(t), VRAMBytes: 40 << 30, check: checked})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []PolicyResult{res.Paged, res.Contiguous} {
		if p.Finished != 2 || p.OutputTokens != 3 {
			t.Errorf("%s: %d finished, %d tokens; want 2 and 3", p.Policy, p.Finished, p.OutputTokens)
		}
	}
}

func TestSimulateErrors(t *testing.T) {
	m := llama7b(t)
	reqs := []Request{{PromptTokens: 10, OutputTokens: 10}}
	if _, err := Simulate(context.Background(), reqs, Options{Model: m, VRAMBytes: m.WeightBytes}); err == nil || !strings.Contains(err.Error(), "leaves nothing for K/V") {
		t.Errorf("VRAM = weights: %v", err)
	}
	big := []Request{{PromptTokens: 4000, OutputTokens: 90}}
	if _, err := Simulate(context.Background(), big, Options{Model: m, VRAMBytes: m.WeightBytes + 1<<30}); err == nil || !strings.Contains(err.Error(), "request 0") {
		t.Errorf("a request larger than the budget: %v", err)
	}
	// Contiguous cannot hold one full context: a note, not an error.
	res, err := Simulate(context.Background(), reqs, Options{Model: m, VRAMBytes: m.WeightBytes + 1<<30})
	if err != nil || res.Contiguous.Note == "" || res.Paged.Finished != 1 {
		t.Errorf("contiguous with no room: %v, %+v", err, res.Contiguous)
	}
	if _, err := Simulate(context.Background(), reqs, Options{Model: m, VRAMBytes: 40 << 30, Preempt: "drop"}); err == nil {
		t.Error("preempt mode drop accepted")
	}
}

func TestSyntheticMeans(t *testing.T) {
	for _, tc := range []struct {
		kind        string
		prompt, out float64
	}{{"sharegpt", 161, 338}, {"alpaca", 19, 58}} {
		reqs, err := Synthetic(context.Background(), SyntheticOptions{Kind: tc.kind, Requests: 20000, Seed: 9})
		if err != nil {
			t.Fatal(err)
		}
		var p, o float64
		for _, r := range reqs {
			p += float64(r.PromptTokens)
			o += float64(r.OutputTokens)
		}
		p /= float64(len(reqs))
		o /= float64(len(reqs))
		if p < 0.9*tc.prompt || p > 1.1*tc.prompt || o < 0.9*tc.out || o > 1.1*tc.out {
			t.Errorf("%s: means %.1f / %.1f, published %.0f / %.0f", tc.kind, p, o, tc.prompt, tc.out)
		}
	}
	if _, err := Synthetic(context.Background(), SyntheticOptions{Kind: "nope"}); err == nil {
		t.Error("unknown mix accepted")
	}
}
