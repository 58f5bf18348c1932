package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
