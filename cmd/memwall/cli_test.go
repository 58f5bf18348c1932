package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/kernels"
)

// TestExitCodes: 0 done, 1 the work failed, 2 a bad command line, for
// every verb that takes a device or a list (issue 16's cases first).
func TestExitCodes(t *testing.T) {
	cases := []struct {
		name string
		args []string
		code int
		want string // in stderr
	}{
		{"no command", nil, 2, "usage: memwall"},
		{"unknown command", []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"info bogus device", []string{"info", "--device", "bogus"}, 2, `--device "bogus": want auto, cuda, sim or cpu`},
		{"bench alloc bogus device", []string{"bench", "alloc", "--device", "bogus"}, 2, "--device"},
		{"bench alloc bogus strategy", []string{"bench", "alloc", "--device", "sim", "--strategies", "bogus"}, 2, `--strategies: no "bogus" (have tlsf, bestfit`},
		{"bench alloc slab", []string{"bench", "alloc", "--device", "sim", "--strategies", "slab"}, 2, "slab serves blocks up to 256.0 KiB"},
		{"bench alloc linear", []string{"bench", "alloc", "--device", "sim", "--strategies", "linear"}, 2, "linear"},
		{"bench alloc bogus policy", []string{"bench", "alloc", "--device", "sim", "--policies", "bogus"}, 2, "--policies"},
		{"bench alloc empty strategy", []string{"bench", "alloc", "--device", "sim", "--strategies", ","}, 2, `no ""`},
		{"bench transfer zero", []string{"bench", "transfer", "--device", "sim", "--size", "0"}, 2, `--size "0": want a size above zero`},
		{"bench transfer bad size", []string{"bench", "transfer", "--device", "sim", "--size", "1PiBB"}, 2, "KiB, MiB, GiB, TiB, PiB"},
		{"bench transfer above free", []string{"bench", "transfer", "--device", "sim", "--size", "5GiB"}, 1, "--size 5GiB: the copies need two device buffers of it, 10.0 GiB, and memwall-sim (8 GiB discrete, PCIe 4.0 x16) has 8.0 GiB free"},
		{"bench unknown", []string{"bench", "nothing"}, 2, `unknown benchmark "nothing"`},
		{"bench none", []string{"bench"}, 2, "want a benchmark"},
		{"bench alloc out missing dir", []string{"bench", "alloc", "--device", "sim", "--out", "/nonexistent/x.json"}, 1, "--out /nonexistent/x.json"},
		{"help unknown", []string{"help", "frobnicate"}, 2, "unknown command"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := runVerb(t, nil, c.args...)
			if code != c.code || !strings.Contains(stderr, c.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d mentioning %q", code, stderr, c.code, c.want)
			}
			if strings.Contains(stderr, "<nil>") {
				t.Errorf("stderr shows a nil error: %q", stderr)
			}
		})
	}
}

// TestBenchAllocOutCheckedFirst: an --out that cannot be written fails
// before the benchmark runs (it would take seconds here).
func TestBenchAllocOutCheckedFirst(t *testing.T) {
	t0 := time.Now()
	code, stdout, _ := runVerb(t, nil, "bench", "alloc", "--device", "sim", "--pairs", "100000", "--out", filepath.Join(t.TempDir(), "no", "x.json"))
	if code != 1 || stdout != "" || time.Since(t0) > 2*time.Second {
		t.Fatalf("exit %d after %v, stdout %q: want exit 1 at once, no report", code, time.Since(t0), stdout)
	}
}

// TestFlagErrorOnce: a flag error is printed once, and -h prints the
// verb's usage to stdout with exit 0.
func TestFlagErrorOnce(t *testing.T) {
	for _, verb := range [][]string{{"plan"}, {"replay"}, {"fit"}, {"info"}, {"gen-model"}, {"bench", "alloc"}, {"bench", "transfer"}} {
		code, stdout, stderr := runVerb(t, nil, append(verb, "--bogus-flag")...)
		if code != 2 || strings.Count(stderr, "bogus-flag") != 1 || stdout != "" {
			t.Errorf("%v --bogus-flag: exit %d, stdout %q, stderr %q; want exit 2 and the error once", verb, code, stdout, stderr)
		}
		code, stdout, stderr = runVerb(t, nil, append(verb, "-h")...)
		if code != 0 || !strings.Contains(stdout, "usage: memwall "+strings.Join(verb, " ")) || stderr != "" {
			t.Errorf("%v -h: exit %d, stdout %q, stderr %q", verb, code, stdout, stderr)
		}
	}
}

// TestHelpVerb: `memwall help VERB` prints that verb's usage and flags,
// not the top-level help.
func TestHelpVerb(t *testing.T) {
	code, stdout, _ := runVerb(t, nil, "help")
	if code != 0 || !strings.Contains(stdout, "commands:") {
		t.Fatalf("help: exit %d %q", code, stdout)
	}
	code, stdout, stderr := runVerb(t, nil, "help", "plan")
	if code != 0 || !strings.Contains(stdout, "usage: memwall plan") || !strings.Contains(stdout, "-capacity") || strings.Contains(stdout, "commands:") {
		t.Fatalf("help plan: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, stdout, _ = runVerb(t, nil, "help", "bench")
	if code != 0 || !strings.Contains(stdout, "benchmarks: alloc, ") || !strings.Contains(stdout, "transfer") {
		t.Fatalf("help bench: exit %d, %q", code, stdout)
	}
	// A verb of sub-commands prints each one's usage and flags.
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"help", "bench"}, []string{"usage: memwall bench alloc", "-pairs", "usage: memwall bench kv", "-blocks", "usage: memwall bench transfer", "-size"}},
		{[]string{"help", "kv"}, []string{"sub-commands: simulate", "usage: memwall kv simulate", "-synthetic", "-block-tokens"}},
		{[]string{"help", "kv", "simulate"}, []string{"usage: memwall kv simulate", "-synthetic", "-vram"}},
		{[]string{"help", "bench", "alloc"}, []string{"usage: memwall bench alloc", "-pairs", "-goroutines"}},
		{[]string{"kv", "-h"}, []string{"usage: memwall kv simulate", "-synthetic"}},
	} {
		code, stdout, stderr := runVerb(t, nil, c.args...)
		for _, w := range c.want {
			if code != 0 || !strings.Contains(stdout, w) || stderr != "" {
				t.Errorf("%v: exit %d, stderr %q, stdout lacks %q:\n%s", c.args, code, stderr, w, stdout)
				break
			}
		}
	}
	code, stdout, _ = runVerb(t, nil, "help", "bench", "transfer")
	if code != 0 || !strings.Contains(stdout, "usage: memwall bench transfer") || !strings.Contains(stdout, "-size") {
		t.Fatalf("help bench transfer: exit %d, %q", code, stdout)
	}
	for name := range verbs {
		code, stdout, stderr := runVerb(t, nil, "help", name)
		if code != 0 || stdout == "" || stderr != "" {
			t.Errorf("help %s: exit %d, stdout %q, stderr %q", name, code, stdout, stderr)
		}
	}
}

// TestGenModelOutputs: --out never replaces a link or a device node, and a
// directory is named as such, without temporary paths or the package's
// prefix.
func TestGenModelOutputs(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "real.safetensors")
	link := filepath.Join(dir, "link.safetensors")
	if err := os.Symlink("real.safetensors", link); err != nil {
		t.Skip("no symbolic links:", err)
	}
	code, _, stderr := runGen(t, false, "--preset", "tiny", "--out", link)
	if code != 0 {
		t.Fatalf("through a link: exit %d: %s", code, stderr)
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced")
	}
	if st, err := os.Stat(target); err != nil || st.Size() < 1<<20 {
		t.Fatalf("the link's target was not written: %v", err)
	}
	code, _, stderr = runGen(t, false, "--preset", "tiny", "--out", dir)
	if code != 1 || !strings.Contains(stderr, "is a directory") || strings.Contains(stderr, ".tmp") || strings.Contains(stderr, "synth") {
		t.Errorf("--out DIR: exit %d, %q", code, stderr)
	}
	code, _, stderr = runGen(t, false, "--preset", "tiny", "--out", os.DevNull)
	if code != 1 || !strings.Contains(stderr, "not a regular file") {
		t.Errorf("--out %s: exit %d, %q", os.DevNull, code, stderr)
	}
	if st, err := os.Stat(os.DevNull); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("%s was replaced", os.DevNull)
	}
	noTemps(t, dir)
}

// TestGenModelCancelled: a cancelled run (what SIGINT and SIGTERM do)
// leaves no temporary file.
func TestGenModelCancelled(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var o, e bytes.Buffer
	code := run([]string{"gen-model", "--preset", "tiny", "--out", filepath.Join(dir, "m.safetensors")},
		&env{ctx: ctx, stdout: &o, stderr: &e, getenv: func(string) string { return "" }})
	if code != 1 {
		t.Fatalf("exit %d: %s", code, e.String())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("a cancelled run left %d files", len(entries))
	}
}

// TestVersion: version prints the Go version and one hash per embedded PTX
// build, the same in --json, with unknown build facts null.
func TestVersion(t *testing.T) {
	code, out, errOut := runVerb(t, nil, "version")
	if code != 0 || !strings.Contains(out, runtime.Version()) || !strings.Contains(out, "kernels  sm80 PTX sha256 ") || !strings.Contains(out, "kernels  sm70") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = runVerb(t, nil, "version", "--json")
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil {
		t.Fatalf("exit %d: %v\n%s", code, err, out)
	}
	for _, k := range []string{"module", "version", "commit", "commit_time", "modified", "commit_from", "go", "ptx"} {
		if _, ok := v[k]; !ok {
			t.Errorf("--json lacks %q", k)
		}
	}
	ptx, _ := v["ptx"].([]any)
	if len(ptx) != len(kernels.Targets()) {
		t.Fatalf("ptx %v", v["ptx"])
	}
	for i, p := range ptx {
		sum := sha256.Sum256(kernels.EmbeddedFor(kernels.Targets()[i]))
		if p.(map[string]any)["sha256"] != hex.EncodeToString(sum[:]) {
			t.Errorf("ptx %d hash %v", i, p)
		}
	}
	if code, _, _ := runVerb(t, nil, "version", "extra"); code != 2 {
		t.Errorf("version extra: exit %d", code)
	}
}

// TestVersionCommit: a test binary records no commit (go test stamps none),
// and version says so with how to get one instead of blaming the checkout;
// a commit from the toolchain or from the linker flag is printed with
// where it came from.
func TestVersionCommit(t *testing.T) {
	code, out, _ := runVerb(t, nil, "version")
	if code != 0 || !strings.Contains(out, "commit   not recorded in this build (go run and go test record none") ||
		!strings.Contains(out, `-ldflags "-X main.buildCommit=$(git rev-parse HEAD)"`) || strings.Contains(out, "outside a git checkout)") {
		t.Errorf("exit %d:\n%s", code, out)
	}
	sha, when, tool, linker, yes := "0123abcd", "2026-12-02T00:00:00Z", "toolchain", "linker flag", true
	for _, c := range []struct {
		v    versionJSON
		want string
	}{
		{versionJSON{Commit: &sha, CommitTime: &when, CommitFrom: &tool}, "0123abcd (2026-12-02T00:00:00Z)"},
		{versionJSON{Commit: &sha, Modified: &yes, CommitFrom: &linker}, "0123abcd, with uncommitted changes (from the linker flag)"},
	} {
		if got := commitLine(c.v); got != c.want {
			t.Errorf("commitLine = %q, want %q", got, c.want)
		}
	}
	// The linker's commit fills the JSON when the toolchain stamped none.
	defer func(c, m string) { buildCommit, buildModified = c, m }(buildCommit, buildModified)
	buildCommit, buildModified = sha, "false"
	if v := buildVersion(); v.Commit == nil || *v.Commit != sha || v.CommitFrom == nil || *v.CommitFrom != linker || v.Modified == nil || *v.Modified {
		t.Errorf("with main.buildCommit set: %+v", v)
	}
}
