package main

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// verbPaths lists every command with flags: each verb, each benchmark,
// kv's sub-command.
func verbPaths() [][]string {
	var out [][]string
	for _, n := range verbNames() {
		switch n {
		case "bench":
			var names []string
			for b := range benchVerbs {
				names = append(names, b)
			}
			sort.Strings(names)
			for _, b := range names {
				out = append(out, []string{"bench", b})
			}
		case "kv":
			out = append(out, []string{"kv", "simulate"})
		default:
			out = append(out, []string{n})
		}
	}
	return out
}

var (
	helpFlag   = regexp.MustCompile(`(?m)^  -(\S+) (\S+)\n\s+(.*)$`)
	intRange   = regexp.MustCompile(`\((-?\d+)\.\.(\d+)\)`)
	floatRange = regexp.MustCompile(`\((-?[0-9.e+]+)\.\.([0-9.e+]+)\)|\(above (-?[0-9.e+]+), at most ([0-9.e+]+)\)`)
)

// TestEveryNumericFlagBounded: every numeric flag of every command states
// its range in the help, and refuses a value past either end, NaN, an
// infinity and a number past 64 bits with exit status 2 and one line
// naming the flag and the limit, before any work.
func TestEveryNumericFlagBounded(t *testing.T) {
	exempt := map[string]bool{"seed": true, "time-limit": true} // any uint64 seeds; the duration is checked below
	checked := 0
	for _, verb := range verbPaths() {
		code, help, _ := runVerb(t, nil, append([]string{"help"}, verb...)...)
		if code != 0 {
			t.Fatalf("help %v: exit %d", verb, code)
		}
		for _, m := range helpFlag.FindAllStringSubmatch(help, -1) {
			name, kind, usage := m[1], m[2], m[3]
			tryFlag := func(value, want string) {
				t.Helper()
				t0 := time.Now()
				code, stdout, stderr := runVerb(t, nil, append(append([]string{}, verb...), "--"+name, value)...)
				if code != exitUsage || !strings.Contains(stderr, want) || strings.Count(stderr, "\n") != 2 || stdout != "" {
					t.Errorf("%v --%s %s: exit %d, stderr %q; want exit 2 saying %q", verb, name, value, code, stderr, want)
				}
				if d := time.Since(t0); d > 2*time.Second {
					t.Errorf("%v --%s %s: took %v: the work started", verb, name, value, d)
				}
			}
			switch kind {
			case "int":
				r := intRange.FindAllStringSubmatch(usage, -1)
				if len(r) == 0 {
					t.Errorf("%v --%s: an integer flag without its range in the help: %q", verb, name, usage)
					continue
				}
				lo, _ := strconv.Atoi(r[len(r)-1][1])
				hi, _ := strconv.Atoi(r[len(r)-1][2])
				tryFlag(strconv.Itoa(hi+1), fmt.Sprintf("--%s %d: at most %d", name, hi+1, hi))
				tryFlag(strconv.Itoa(lo-1), fmt.Sprintf("--%s %d: at least %d", name, lo-1, lo))
				tryFlag("99999999999999999999", fmt.Sprintf("--%s 99999999999999999999: at most %d", name, hi))
				tryFlag("NaN", fmt.Sprintf(`--%s "NaN": want an integer from %d to %d`, name, lo, hi))
				checked++
			case "float":
				r := floatRange.FindAllStringSubmatch(usage, -1)
				if len(r) == 0 {
					t.Errorf("%v --%s: a number flag without its range in the help: %q", verb, name, usage)
					continue
				}
				g := r[len(r)-1]
				loText, hiText, open := g[1], g[2], false
				if loText == "" {
					loText, hiText, open = g[3], g[4], true
				}
				hi, _ := strconv.ParseFloat(hiText, 64)
				tryFlag(num(hi*10), fmt.Sprintf("--%s %s: at most %s", name, num(hi*10), hiText))
				tryFlag("Inf", fmt.Sprintf("--%s Inf: at most %s", name, hiText))
				tryFlag("-Inf", fmt.Sprintf("--%s -Inf: ", name))
				tryFlag("NaN", fmt.Sprintf(`--%s "NaN": want a number`, name))
				if open {
					tryFlag(loText, fmt.Sprintf("--%s %s: want above %s", name, loText, loText))
				} else {
					tryFlag("-1e-9", fmt.Sprintf("--%s -1e-9: at least %s", name, loText))
				}
				checked++
			case "uint", "uint64", "int64", "duration":
				if !exempt[name] {
					t.Errorf("%v --%s: a %s flag outside the bounded ones", verb, name, kind)
				}
			}
		}
	}
	t.Logf("checked %d numeric flags", checked)
	if checked < 40 {
		t.Errorf("checked %d numeric flags; the help parsing missed some", checked)
	}
	code, _, stderr := runVerb(t, nil, "plan", "--lifetimes", "x.csv", "--time-limit", "2h")
	if code != exitUsage || !strings.Contains(stderr, "--time-limit 2h0m0s: want 0s..1h0m0s") {
		t.Errorf("--time-limit 2h: exit %d, %q", code, stderr)
	}
}

// TestReportedFlags: the command lines of the report, as written, are
// usage errors naming the flag and the limit; bench alloc bounds its pairs
// by the memory their records take on the most goroutines.
func TestReportedFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"bench", "alloc", "--pairs", "1000000000000", "--goroutines", "1", "--mixes", "1MiB", "--strategies", "bestfit", "--policies", "virtual"},
			"memwall bench alloc: --pairs 1000000000000: at most 100000000\n"},
		{[]string{"bench", "alloc", "--pairs", "20000000"},
			"memwall bench alloc: --pairs 20000000 on --goroutines 16: at most 100000000 pairs in all (6250000 per goroutine)"},
		{[]string{"bench", "alloc", "--goroutines", "1,2000"}, `--goroutines "2000": want counts from 1 to 1024`},
		{[]string{"bench", "kv", "--blocks", "1000", "--ops", "1000000000000", "--no-swap"}, "memwall bench kv: --ops 1000000000000: at most 1000000000\n"},
		{[]string{"fit", "model.safetensors", "--vram", "8GiB", "--link-gbps", "NaN"}, `memwall fit: --link-gbps "NaN": want a number above 0, at most 1000000` + "\n"},
		{[]string{"kv", "simulate", "--synthetic", "sharegpt", "--model", "llama-7b", "--vram", "40GiB", "--tflops", "0"}, "memwall kv simulate: --tflops 0: want above 0\n"},
		{[]string{"run", "m", "--prompt-ids", "1", "--slots", "1"}, "--slots 1: want 2..16"},
	}
	for _, c := range cases {
		code, stdout, stderr := runVerb(t, nil, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) || stdout != "" {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 saying %q", c.args, code, stderr, c.want)
		}
	}
}
