package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runEnv runs a command line on an env over buffers that tweak (nil: none)
// may change first: the one helper the other runVerb* variants use.
func runEnv(t *testing.T, tweak func(*env), args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	env := &env{ctx: context.Background(), stdout: &o, stderr: &e, getenv: func(string) string { return "" }}
	if tweak != nil {
		tweak(env)
	}
	code = run(args, env)
	return code, o.String(), e.String()
}

// runVerbTerminal runs a command line as if stdout were a terminal.
func runVerbTerminal(t *testing.T, terminal bool, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runEnv(t, func(e *env) { e.terminal = terminal }, args...)
}

// TestProgressOnTerminal: the verbs that can run for seconds draw a bar
// on stderr when stdout is a terminal, clear it at the end, and draw none
// otherwise (the replay over every configuration, the offset search).
func TestProgressOnTerminal(t *testing.T) {
	trace := filepath.Join("..", "..", "testdata", "traces", "gpt2_medium_generate.csv.gz")
	lifetimes := filepath.Join("..", "..", "testdata", "minimalloc", "A.1048576.csv")
	cases := map[string][]string{
		"replay": {"replay", trace, "--no-search", "--strategy", "default"},
		"plan":   {"plan", "--lifetimes", lifetimes, "--capacity", "4MiB", "--time-limit", "600ms"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			code, _, stderr := runVerbTerminal(t, true, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if !strings.Contains(stderr, "\r"+name+" [") || !strings.Contains(stderr, "%") {
				t.Fatalf("no progress bar on a terminal: %q", stderr)
			}
			if !strings.HasSuffix(stderr, "\r") {
				t.Fatalf("the bar is not cleared at the end: %q", stderr[max(0, len(stderr)-100):])
			}
			if code, _, stderr := runVerbTerminal(t, false, args...); code != 0 || stderr != "" {
				t.Fatalf("not a terminal: exit %d, stderr %q, want silence", code, stderr)
			}
		})
	}
}

// TestInterrupted: a verb stopped before its work started (its context
// cancelled: by the caller, or by SIGINT through the env's interruption)
// says it was interrupted, not "context canceled", exits 1 or the
// signal's status, and writes no output file.
func TestInterrupted(t *testing.T) {
	for _, c := range []struct {
		name   string
		signal bool
		code   int
		want   string
	}{
		{"cancelled", false, exitFail, "memwall bench alloc: interrupted by its context"},
		{"SIGINT", true, exitSIGINT, "memwall bench alloc: interrupted by SIGINT"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, stop := interruptible(context.Background())
			if c.signal {
				stop.signal(os.Interrupt)
			} else {
				stop.cancel()
			}
			out := filepath.Join(t.TempDir(), "alloc.json")
			code, _, stderr := runEnv(t, func(e *env) { e.ctx, e.stop = ctx, stop },
				"bench", "alloc", "--device", "sim", "--pairs", "200", "--goroutines", "1", "--mixes", "1MiB", "--out", out)
			if code != c.code || !strings.HasPrefix(stderr, c.want) || strings.Contains(stderr, "context canceled") {
				t.Fatalf("exit %d, stderr %q; want %d, %q", code, stderr, c.code, c.want)
			}
			if _, err := os.Stat(out); err == nil {
				t.Fatal("an interrupted run wrote its --out file")
			}
		})
	}
}

// TestVulkanKernelsSaysWhy: the demo skips its Llama step on the Vulkan
// backend (and only there), which has no Llama kernels; its streaming step
// runs there on the SPIR-V product (TestStreamVulkan runs stream itself).
func TestVulkanKernelsSaysWhy(t *testing.T) {
	for b, want := range map[string]bool{"cuda": true, "sim": true, "vulkan": false} {
		if hasLlamaKernels(b) != want {
			t.Errorf("hasLlamaKernels(%q) = %v", b, !want)
		}
	}
	for _, s := range demoSteps() {
		if s.llama != strings.Contains(s.title, "Llama") {
			t.Errorf("demo step %q: llama %v", s.title, s.llama)
		}
	}
}
