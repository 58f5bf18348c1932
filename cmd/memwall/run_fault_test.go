package main

import (
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/memwall/memwall/device/fault"
)

// TestRunCopyFault: `memwall run` whose weights stream, with a copy
// failing at a random call (of the copies a clean run makes), exits 1 with
// an error naming the failed copy, and nothing panics.
func TestRunCopyFault(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	args := []string{"run", dir, "--device", "sim", "--prompt-ids", "5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20", "--max-new", "4", "--ignore-eos", "--prefill-chunk", "8", "--json"}
	code, _, errOut := runVerbSim(t, append(args, "--vram", "1")...)
	m := regexp.MustCompile(`below the minimum (\d+) bytes`).FindStringSubmatch(errOut)
	if code != 1 || m == nil {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	least, _ := strconv.ParseUint(m[1], 10, 64)
	args = append(args, "--vram", strconv.FormatUint(least+512<<10, 10))
	clean := &fault.Config{}
	if code, out, errOut := runVerbFault(t, clean, args...); code != 0 || !regexp.MustCompile(`"streamed_groups": *[1-9]`).MatchString(out) {
		t.Fatalf("clean run: exit %d, %s", code, errOut)
	}
	copies := clean.Counts().Copies
	rng := rand.New(rand.NewPCG(8, 1))
	for range 5 {
		n := 1 + rng.Uint64N(copies)
		cfg := &fault.Config{}
		cfg.Set(fault.Rules{FailCopies: fault.CopyRule{Call: fault.Nth(n)}})
		code, _, errOut := runVerbFault(t, cfg, args...)
		if code != 1 || !strings.Contains(errOut, "fault: ") || !strings.Contains(errOut, "copy of") || strings.Contains(errOut, "panic") {
			t.Errorf("copy %d of %d failing: exit %d, %q", n, copies, code, errOut)
		}
	}
}
