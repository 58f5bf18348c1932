package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBenchBatch runs bench batch on the simulator: a row per sequence
// count with llama-batched-bench's figures consistent with each other, the
// profile of one decode step when asked, the human table, and usage errors
// for bad counts.
func TestBenchBatch(t *testing.T) {
	_, m := tinyDir(t, "tiny")
	code, out, errOut := runVerb(t, nil, "bench", "batch", m, "--device", "sim", "--vram", "1GiB", "--npl", "1,3", "--npp", "12", "--ntg", "5",
		"--prefill-chunk", "16", "--profile", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var j benchBatchJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(j.Rows) != 2 || j.PrefillChunk != 16 {
		t.Fatalf("%+v", j)
	}
	for i, r := range j.Rows {
		n := []int{1, 3}[i]
		if r.B != n || r.PP != 12 || r.TG != 5 || r.NKV != n*17 || r.Steps != 5 || r.TPP <= 0 || r.TTG <= 0 {
			t.Errorf("row %d: %+v", i, r)
		}
		if d := r.STG*r.TTG - float64(n*5); d > 1e-6 || d < -1e-6 {
			t.Errorf("row %d: S_TG %g × T_TG %g is not the %d tokens generated", i, r.STG, r.TTG, n*5)
		}
		if r.Profile == nil || r.Profile.Seconds <= 0 || r.Profile.Ops["attention"].Count == 0 {
			t.Errorf("row %d: profile %+v", i, r.Profile)
		}
	}
	code, out, errOut = runVerb(t, nil, "bench", "batch", m, "--device", "sim", "--vram", "1GiB", "--npl", "2", "--npp", "4", "--ntg", "2")
	if code != 0 || !strings.Contains(out, "S_TG t/s") || !strings.Contains(out, "|     4 |      2 |    2 |     12 |") {
		t.Errorf("human output: exit %d\n%s%s", code, out, errOut)
	}
	for _, bad := range [][]string{{"--npl", "0"}, {"--npl", "2,x"}, {"--npp", "0"}, {"--npp", "100000", "--ntg", "1"}} {
		code, _, errOut := runVerb(t, nil, append([]string{"bench", "batch", m, "--device", "sim"}, bad...)...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2: %s", bad, code, errOut)
		}
	}
}
