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

func runReplayVerb(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runVerb(t, nil, append([]string{"replay"}, args...)...)
}

const bertTrace = "../../testdata/traces/bert_base_varlen.csv.gz"

func TestReplayJSON(t *testing.T) {
	code, out, errOut := runReplayVerb(t, bertTrace, "--json", "--strategy", "default,chunks-bestfit")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"trace", "events", "allocs", "peak_live_bytes", "pytorch_reserved_bytes", "pytorch_device_allocs", "default", "results"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	if m["pytorch_reserved_bytes"].(float64) != 530<<20 || m["pytorch_device_allocs"].(float64) != 15 || m["allocs"].(float64) != 36145 {
		t.Errorf("PyTorch figures or allocs wrong: %v %v %v", m["pytorch_reserved_bytes"], m["pytorch_device_allocs"], m["allocs"])
	}
	rs := m["results"].([]any)
	if len(rs) != 2 {
		t.Fatalf("%d results, want 2", len(rs))
	}
	first := rs[0].(map[string]any)
	if first["config"] != m["default"] {
		t.Errorf("first result %v is not the default %v", first["config"], m["default"])
	}
	for _, r := range rs {
		r := r.(map[string]any)
		for _, k := range []string{"strategy", "peak_reserved_bytes", "utilization", "device_calls", "min_capacity_bytes", "meets_goal", "ratio_to_goal", "calls_to_goal"} {
			if _, ok := r[k]; !ok {
				t.Errorf("result lacks %q", k)
			}
		}
		if mc, _ := r["min_capacity_bytes"].(float64); mc < m["peak_live_bytes"].(float64) {
			t.Errorf("min capacity %v below peak live", r["min_capacity_bytes"])
		}
	}
}

func TestReplayTableAndHTML(t *testing.T) {
	html := filepath.Join(t.TempDir(), "r.html")
	code, out, errOut := runReplayVerb(t, bertTrace, "--strategy", "default,chunks-tlsf", "--no-search", "--html", html, "--free-at", "requested")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"36145 allocs", "PyTorch reserved 530.0 MiB (2.33× peak live)", "free_requested", " *", "chunks-tlsf"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	if strings.Count(s, "<svg") != 3 || !strings.Contains(s, "address space at the peak") {
		t.Errorf("page has %d SVGs (want 2 timelines and a map)", strings.Count(s, "<svg"))
	}
	if strings.Contains(s, "<script") || strings.Contains(s, "src=") || strings.Contains(s, "href=") {
		t.Error("page is not self-contained")
	}
}

func TestReplayErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	full, err := os.ReadFile(bertTrace)
	if err != nil {
		t.Fatal(err)
	}
	hdr := "action,addr,size,stream\n"
	tests := []struct {
		name    string
		args    []string
		code    int
		stderr  string
		lenient bool // --lenient makes it succeed
	}{
		{"truncated gzip", []string{write("cut.csv.gz", full[:len(full)/3])}, 1, "truncated", false},
		{"unknown address", []string{write("u.csv", []byte(hdr+"alloc,4096,512,0\nfree_completed,8192,512,0\n"))}, 1, "line 3", true},
		{"unknown action", []string{write("a.csv", []byte(hdr+"alloc,4096,512,0\nmalloc,1,2,0\n"))}, 1, "line 3", true},
		{"absurd size", []string{write("s.csv", []byte(hdr+"alloc,4096,4000000000000000,0\nalloc,8192,512,0\n"))}, 1, "line 2", true},
		{"hostile pickle", []string{"../../trace/testdata/hostile_reduce_p2.pickle"}, 1, "offset 50", false},
		{"missing file", []string{filepath.Join(dir, "none.csv")}, 1, "none.csv", false},
		{"no trace", nil, 2, "exactly one", false},
		{"bad free-at", []string{"x.csv", "--free-at", "never"}, 2, "free-at", false},
		{"bad capacity", []string{"x.csv", "--capacity", "lots"}, 2, "capacity", false},
		{"bad strategy", []string{"x.csv", "--strategy", "fifo"}, 2, "fifo", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runReplayVerb(t, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.stderr) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, errOut, tc.code, tc.stderr)
			}
			if !tc.lenient {
				return
			}
			code, out, errOut := runReplayVerb(t, append(tc.args, "--lenient", "--no-search", "--strategy", "default")...)
			if code != 0 || !strings.Contains(out, "skipped 1 bad records") {
				t.Errorf("--lenient: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
		})
	}
}

func TestReplayCapacity(t *testing.T) {
	// Far below the peak live bytes: every configuration fails, says so
	// in the report, and the run fails (exit 1) saying why on stderr too
	// (a --json report on stdout may go to a file).
	code, out, errOut := runReplayVerb(t, bertTrace, "--capacity", "64MiB", "--strategy", "default")
	if code != 1 || !strings.Contains(out, "failed") || !strings.Contains(out, "cannot allocate 14066688 bytes") ||
		!strings.Contains(errOut, "1 of 1 configurations could not replay the trace") ||
		!strings.Contains(errOut, "the first: ") || !strings.Contains(errOut, "cannot allocate 14066688 bytes") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestDemoReplay(t *testing.T) {
	var o bytes.Buffer
	e := &env{ctx: context.Background(), stdout: &o, stderr: &o, getenv: func(string) string { return "" }}
	if err := demoReplay(e, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"peak live 227.5 MiB", "memwall pool", "PyTorch's caching allocator", "2.33×", "device calls"} {
		if !strings.Contains(o.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, o.String())
		}
	}
}
