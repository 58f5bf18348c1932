package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/bench"
)

func runVerb(t *testing.T, getenv func(string) string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	env := &env{ctx: context.Background(), stdout: &o, stderr: &e, getenv: getenv}
	code = run(args, env)
	return code, o.String(), e.String()
}

// TestBenchAllocSelect: --mixes and --policies pick the rows measured, and
// an unknown name is a usage error that lists the names there are.
func TestBenchAllocSelect(t *testing.T) {
	code, out, errOut := runVerb(t, nil, "bench", "alloc", "--device", "sim", "--goroutines", "1", "--pairs", "200",
		"--mixes", "4KiB,random", "--policies", "chunks", "--strategies", "tlsf", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Results []struct {
			Allocator, Mix string
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rep.Results {
		got = append(got, r.Allocator+" | "+r.Mix)
	}
	want := []string{"memwall tlsf/chunks | fixed 4KiB", "memwall tlsf/chunks | random 512B-64MiB"} // in the order asked
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, c := range []struct{ flag, value, msg string }{
		{"--mixes", "8KiB", `--mixes: no "8KiB" (have random 512B-64MiB, fixed 4KiB, fixed 1MiB, fixed 64MiB)`},
		{"--policies", "virtual,keep", `--policies: no "keep" (have virtual, virtual-keep, chunks, virtual-eager)`},
	} {
		code, _, errOut := runVerb(t, nil, "bench", "alloc", "--device", "sim", c.flag, c.value)
		if code != 2 || !strings.Contains(errOut, c.msg) {
			t.Errorf("%s %s: exit %d, %q; want 2 and %q", c.flag, c.value, code, errOut, c.msg)
		}
	}
}

// TestCPUProfile: MEMWALL_CPUPROFILE writes a profile of the run, and a
// path that cannot be created fails the run, naming it.
func TestCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	env := func(k string) string {
		if k == "MEMWALL_CPUPROFILE" {
			return path
		}
		return ""
	}
	if code, _, errOut := runVerb(t, env, "info", "--device", "sim"); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if st, err := os.Stat(path); err != nil || st.Size() == 0 {
		t.Fatalf("profile %s: %v", path, err)
	}
	path = filepath.Join(t.TempDir(), "missing", "cpu.pprof")
	code, _, errOut := runVerb(t, env, "info", "--device", "sim")
	if code != 1 || !strings.Contains(errOut, "MEMWALL_CPUPROFILE") || !strings.Contains(errOut, "missing") {
		t.Fatalf("exit %d, %q; want 1 naming the variable and the path", code, errOut)
	}
}

// TestPrintInterleaved: the interleaved rows print the numbers the JSON
// carries, a failed one its note.
func TestPrintInterleaved(t *testing.T) {
	var o bytes.Buffer
	e := &env{ctx: context.Background(), stdout: &o, stderr: &o, getenv: func(string) string { return "" }}
	printInterleaved(e, nil)
	if o.Len() != 0 {
		t.Fatalf("no rows printed %q", o.String())
	}
	printInterleaved(e, []bench.InterleavedResult{
		{Pool: "memwall bestfit/virtual", Anchor: "cuMemAllocAsync", Mix: "random 512B-64MiB", Goroutines: 16, Windows: 125,
			PoolBatchP50ns: 171, AnchorBatchP50ns: 1812, P50Ratio: 171.0 / 1812, WindowRatioP50: 0.093, WindowRatioP90: 0.12, PoolPairsPerSec: 5.3e6, AnchorPairsPerSec: 5e5, ThroughputRatio: 10.6, DeviceCalls: 3},
		{Pool: "memwall bestfit/virtual", Anchor: "cuMemAllocAsync", Mix: "fixed 64MiB", Goroutines: 1, Note: "out of memory"},
	})
	for _, want := range []string{"windows of 640 pool pairs on each of its goroutines, then 64", "virtual ×16 p50 171 ns, cuMemAllocAsync ×1 1812 ns: 0.094×",
		"p50 0.093×, p90 0.120×", "pairs/s 5300000 against 500000: 10.6× (125 windows, 3 pool device calls)", "fixed 64MiB", "×1 against cuMemAllocAsync: out of memory"} {
		if !strings.Contains(o.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, o.String())
		}
	}
}
