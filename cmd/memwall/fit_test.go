package main

import (
	"fmt"
	"github.com/memwall/memwall/internal/longtest"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestFitPredictsRun: for random prompts, generated lengths, budgets and
// chunk/slot flags, `memwall fit` on a Llama model predicts exactly the
// footprint `memwall run` plans (the same computation), the same chunk and
// slots, and the same minimum when the budget is below it; and the run's
// peak stays within the budget.
func TestFitPredictsRun(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 15))
	for _, preset := range []string{"tiny", "tiny-f16"} {
		dir, ggufPath := tinyDir(t, preset)
		vocab := map[string]int{"tiny": 1024, "tiny-f16": 768}[preset]
		for i := range longtest.Choose(2, 5) {
			model := []string{dir, ggufPath}[rng.IntN(2)]
			prompt, maxNew := 1+rng.IntN(120), 1+rng.IntN(8)
			var flags []string
			if rng.IntN(3) == 0 {
				flags = append(flags, "--prefill-chunk", strconv.Itoa(1+rng.IntN(prompt)))
			}
			if rng.IntN(3) == 0 {
				flags = append(flags, "--slots", strconv.Itoa(2+rng.IntN(3)))
			}
			fitArgs := append([]string{"fit", model, "--device", "sim", "--json", "--prompt-tokens", strconv.Itoa(prompt), "--max-new", strconv.Itoa(maxNew)}, flags...)
			ids := make([]string, prompt)
			for j := range ids {
				ids[j] = strconv.Itoa(3 + rng.IntN(vocab-3))
			}
			runArgs := append([]string{"run", model, "--device", "sim", "--json", "--prompt-ids", strings.Join(ids, ","), "--max-new", strconv.Itoa(maxNew), "--ignore-eos"}, flags...)
			// The minimum, from both verbs' errors at one byte.
			minimum := func(args []string) string {
				code, _, errOut := runVerbSim(t, append(args, "--vram", "1")...)
				m := regexp.MustCompile(`below the minimum (\d+) bytes`).FindStringSubmatch(errOut)
				if code != 1 || m == nil {
					t.Fatalf("%v at --vram 1: exit %d, %s", args, code, errOut)
				}
				return m[1]
			}
			fm, rm := minimum(fitArgs), minimum(runArgs)
			if fm != rm {
				t.Fatalf("%v: fit states the minimum %s, run %s", flags, fm, rm)
			}
			least, _ := strconv.ParseUint(fm, 10, 64)
			vram := strconv.FormatUint(least+rng.Uint64N([]uint64{1, 256 << 10, 2 << 20, 16 << 20}[i%4]), 10)
			fit := runJSONOut(t, append(fitArgs, "--vram", vram)...)
			run := runJSONOut(t, append(runArgs, "--vram", vram)...)
			fr := fit["run"].(map[string]any)
			for _, k := range [][2]string{{"predicted_peak_bytes", "predicted_peak_bytes"}, {"prefill_chunk", "prefill_chunk"}, {"slots", "slots"},
				{"prefill_chunk_chosen", "prefill_chunk_chosen"}, {"slots_chosen", "slots_chosen"}} {
				if fr[k[0]] != run[k[1]] {
					t.Errorf("%s %v --vram %s: fit's %s %v, run's %v", preset, flags, vram, k[0], fr[k[0]], run[k[1]])
				}
			}
			// The arena's pool block is its layout rounded up to the pool's
			// alignment.
			if a, ra := fit["activation_bytes"].(float64), run["arena_bytes"].(float64); fit["predicted_peak_bytes"] != run["predicted_peak_bytes"] ||
				fit["kv_bytes"] != run["kv_bytes"] || a > ra || ra-a >= 64<<10 || fit["slots"] != fr["slots"] && fit["streamed_layers"].(float64) > 0 {
				t.Errorf("fit: peak %v, KV %v, arena %v, slots %v (%v); run: %v, %v, %v", fit["predicted_peak_bytes"], fit["kv_bytes"], a, fit["slots"], fr["slots"],
					run["predicted_peak_bytes"], run["kv_bytes"], ra)
			}
			if peak, budget := run["peak_device_bytes"].(float64), run["budget_bytes"].(float64); peak > budget || fit["budget_bytes"].(float64) != budget {
				t.Errorf("run's peak %v above its budget %v (fit's %v)", peak, budget, fit["budget_bytes"])
			}
		}
	}
}

// TestFitLlamaFlags: fit's run flags are checked like run's.
func TestFitLlamaFlags(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--prompt-tokens", "600"}, 2, "does not fit the model's context of 512"},
		{[]string{"--ctx", "20", "--max-new", "20"}, 2, "a prompt of 0 tokens"},
		{[]string{"--ctx", "100", "--prompt-tokens", "50"}, 2, "at most one of --prompt-tokens and --ctx"},
		{[]string{"--max-new", "0"}, 2, "--max-new 0"},
		{[]string{"--prefill-chunk", "-1"}, 2, "--prefill-chunk -1"},
		{[]string{"--prompt-tokens", "200", "--prefill-chunk", "200", "--vram", "3500000"}, 1, "the largest chunk this budget holds is"},
	} {
		args := append([]string{"fit", dir, "--device", "sim", "--vram", "1GiB"}, c.args...)
		code, _, errOut := runVerbSim(t, args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", c.args, code, errOut, c.code, c.want)
		}
	}
	code, out, errOut := runVerbSim(t, "fit", dir, "--device", "sim", "--vram", "64MiB", "--prompt-tokens", "100")
	if code != 0 || !strings.Contains(out, "memwall run with a 100-token prompt and 132 tokens of context: prefill chunks of 100 tokens (chosen from the budget), 2 slots (chosen from the budget)") {
		t.Errorf("exit %d, %s %s", code, out, errOut)
	}
}

// TestFitDefaults: without --prompt-tokens or --ctx, fit plans a
// 512-token prompt and run's default 32 new tokens (not the whole
// context), and the minimum it states is run's own minimum for that
// prompt — the budget prefilling one token per chunk — not the budget the
// chunk was chosen to fill.
func TestFitDefaults(t *testing.T) {
	dir := t.TempDir()
	if code, _, errOut := runVerbSim(t, "gen-model", "--preset", "tiny", "--context", "4096", "--out", dir+"/model.safetensors"); code != 0 {
		t.Fatalf("gen-model: exit %d: %s", code, errOut)
	}
	ids := make([]string, 512)
	for i := range ids {
		ids[i] = strconv.Itoa(3 + i)
	}
	code, _, errOut := runVerbSim(t, "run", dir, "--device", "sim", "--prompt-ids", strings.Join(ids, ","), "--vram", "1")
	m := regexp.MustCompile(`below the minimum (\d+) bytes`).FindStringSubmatch(errOut)
	if code != 1 || m == nil {
		t.Fatalf("run at --vram 1: exit %d, %s", code, errOut)
	}
	least, _ := strconv.ParseUint(m[1], 10, 64)
	for _, vram := range []uint64{least + 1<<20, least + 16<<20} {
		v := strconv.FormatUint(vram, 10)
		j := runJSONOut(t, "fit", dir, "--device", "sim", "--vram", v, "--json")
		r := j["run"].(map[string]any)
		if r["prompt_tokens"] != float64(512) || r["max_tokens"] != float64(544) || j["minimum_bytes"] != float64(least) {
			t.Errorf("--vram %s: prompt %v, max tokens %v, minimum %v; want 512, 544, %d", v, r["prompt_tokens"], r["max_tokens"], j["minimum_bytes"], least)
		}
		code, out, errOut := runVerbSim(t, "fit", dir, "--device", "sim", "--vram", v)
		want := fmt.Sprintf("minimum to run %s (prefilling one token per chunk; this budget holds chunks of %v tokens)", humanBytes(least), r["prefill_chunk"])
		if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "memwall run with a 512-token prompt and 544 tokens of context") {
			t.Errorf("--vram %s: exit %d, %s%s; want %q", v, code, out, errOut, want)
		}
	}
}
