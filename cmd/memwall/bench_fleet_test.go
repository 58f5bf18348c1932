package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBenchFleet runs bench fleet on the simulator with two models in a
// budget that holds one whole: a request to the other moves weights (the
// bytes promoted equal to those the other gave back, an upload rate),
// every request generates, the halved budget streams, the pools never
// reserve more than the budget; the human table; usage errors.
func TestBenchFleet(t *testing.T) {
	dir, gguf := tinyDir(t, "tiny")
	code, out, errOut := runVerb(t, nil, "bench", "fleet", dir, gguf, "--device", "sim", "--vram", "13MiB", "--switches", "4", "--npp", "6", "--ntg", "4", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var j benchFleetJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(j.Models) != 2 || len(j.Rows) != 6 || j.PeakPoolReserved == 0 || j.PeakPoolReserved > j.PoolBudget {
		t.Fatalf("%+v", j)
	}
	moved := 0
	for i, r := range j.Rows {
		if r.DecodeTokS <= 0 || r.TTFT <= 0 || r.Model != j.Models[i%2] && r.Phase == "switch" {
			t.Errorf("row %d: %+v", i, r)
		}
		if r.PromotedBytes > 0 {
			moved++
			if r.UploadSeconds <= 0 || r.LinkGBps <= 0 || r.DemotedBytes == 0 {
				t.Errorf("row %d moved without its figures: %+v", i, r)
			}
		}
	}
	if moved < 2 {
		t.Errorf("%d of 4 alternating requests moved weights in a budget that holds one model whole:\n%s", moved, out)
	}
	if j.Rows[4].Phase != "halved" || j.Rows[4].StreamedGroups+j.Rows[5].StreamedGroups == 0 {
		t.Errorf("halved rows stream nothing: %+v %+v", j.Rows[4], j.Rows[5])
	}
	code, out, errOut = runVerb(t, nil, "bench", "fleet", dir, gguf, "--device", "sim", "--vram", "16MiB", "--switches", "2", "--npp", "4", "--ntg", "2")
	if code != 0 || !strings.Contains(out, "TTFT s") || !strings.Contains(out, "budget halved") {
		t.Errorf("human output: exit %d\n%s%s", code, out, errOut)
	}
	for _, bad := range [][]string{{dir}, {dir, gguf, "--switches", "0"}, {dir, gguf, "--vram", "x"}} {
		code, _, errOut := runVerb(t, nil, append([]string{"bench", "fleet", "--device", "sim"}, bad...)...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2: %s", bad, code, errOut)
		}
	}
	if code, _, errOut := runVerb(t, nil, "bench", "fleet", dir, gguf, "--device", "sim", "--vram", "3MiB"); code != 1 {
		t.Errorf("a budget below both minimums: exit %d, want 1: %s", code, errOut)
	}
}
