package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/plan"
)

// runInterrupted runs a command line in-process and delivers sig (as
// newEnv's handler would) after the given delay. It returns the exit
// status, stderr and how long the run went on after the signal (negative
// when it ended before it).
func runInterrupted(t *testing.T, sig os.Signal, after time.Duration, args ...string) (code int, stderr string, late time.Duration) {
	t.Helper()
	var o, e bytes.Buffer
	ctx, stop := interruptible(context.Background())
	env := &env{ctx: ctx, stop: stop, stdout: &o, stderr: &e, getenv: func(string) string { return "" }}
	sent := make(chan time.Time, 1)
	timer := time.AfterFunc(after, func() {
		sent <- time.Now()
		stop.signal(sig)
	})
	defer timer.Stop()
	code = run(args, env)
	ended := time.Now()
	select {
	case at := <-sent:
		late = ended.Sub(at)
	default:
		late = -1
	}
	return code, e.String(), late
}

// TestInterruptStops: SIGINT or SIGTERM in the middle of each long loop
// (huge --ops, --pairs, --n, --steps, --max-new, --reps, a 13.5 GB model
// to write, one of 174 MiB to quantize and the plan of the most buffers
// plan takes) stops the command within a second, with the signal's exit status
// (130, 143), one message saying so and how far the work got, and no
// temporary or output file left behind.
func TestInterruptStops(t *testing.T) {
	if testing.Short() {
		t.Skip("interrupts runs of seconds")
	}
	model := t.TempDir()
	if _, err := synth.Generate(context.Background(), synth.Config{Arch: "llama", Layers: 2, Hidden: 64, Inter: 128, Heads: 4, Vocab: 256, Context: 1 << 20, DType: "F32"},
		filepath.Join(model, "model.safetensors"), synth.Options{Workers: 2}); err != nil {
		t.Fatal(err)
	}
	// 174 MiB of bf16 weights: seconds of Q4_K_M.
	big := filepath.Join(model, "big.gguf")
	if _, err := synth.Generate(context.Background(), synth.Config{Arch: "llama", Layers: 2, Hidden: 1024, Inter: 2816, Heads: 8, Vocab: 32000, Context: 4096, DType: "BF16"},
		big, synth.Options{Workers: 2, Format: synth.GGUF}); err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join("..", "..", "testdata", "traces", "gpt2_medium_generate.csv.gz")
	// The most buffers plan takes, all live at once: each greedy pass is
	// quadratic, seconds long.
	lifetimes := filepath.Join(model, "wide.csv")
	var csv strings.Builder
	csv.WriteString("id,lower,upper,size\n")
	for i := range plan.MaxBuffers {
		fmt.Fprintf(&csv, "%d,0,%d,%d\n", i, 1+i%7, 1+i%4093)
	}
	if err := os.WriteFile(lifetimes, []byte(csv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		sig   os.Signal
		after time.Duration
		args  []string // OUT stands for a file in the output directory
		want  []string // in stderr; "re:X": X matches stderr's line
	}{
		{"bench kv", syscall.SIGTERM, 300 * time.Millisecond,
			[]string{"bench", "kv", "--blocks", "1000", "--ops", "1000000000", "--no-swap"}, []string{"interrupted by SIGTERM", "of 1000000000 ops"}},
		{"bench alloc", os.Interrupt, 500 * time.Millisecond,
			[]string{"bench", "alloc", "--device", "sim", "--pairs", "5000000", "--goroutines", "1", "--mixes", "1MiB", "--strategies", "bestfit", "--policies", "virtual", "--out", "OUT"},
			[]string{"interrupted by SIGINT", "bestfit/virtual fixed 1MiB ×1: ", `re:goroutine 0: stopped (after [0-9]+ of [0-9]+ (warm-up pairs|batched pairs|pairs timed one by one|pairs with the free and the alloc timed apart)|while drawing the requests \([0-9]+ of [0-9]+ drawn\), before any pair was timed)\)$`}},
		{"bench transfer", os.Interrupt, 500 * time.Millisecond,
			[]string{"bench", "transfer", "--device", "sim", "--size", "64MiB", "--reps", "10000"}, []string{"interrupted by SIGINT", "of 10000 copies"}},
		{"kv simulate", os.Interrupt, 1200 * time.Millisecond,
			[]string{"kv", "simulate", "--synthetic", "sharegpt", "--n", "4000000", "--model", "llama-7b", "--vram", "40GiB", "--html", "OUT"},
			[]string{"interrupted by SIGINT", "of 4000000 "}},
		{"replay", syscall.SIGTERM, 500 * time.Millisecond,
			[]string{"replay", trace, "--html", "OUT"}, []string{"interrupted by SIGTERM after ", "of 13 configurations"}},
		{"stream", os.Interrupt, 1500 * time.Millisecond,
			[]string{"stream", filepath.Join(model, "model.safetensors"), "--vram", "64MiB", "--link-gbps", "25", "--device", "sim", "--steps", "100000", "--pool-log", "OUT"},
			[]string{"interrupted by SIGINT after ", "of 100001 steps"}},
		{"run", os.Interrupt, 1500 * time.Millisecond,
			[]string{"run", model, "--prompt-ids", "1,2,3", "--max-new", "1000000", "--ignore-eos", "--device", "sim", "--json", "--pool-log", "OUT"},
			[]string{"interrupted by SIGINT", "of 1000000 tokens generated"}},
		{"gen-model", os.Interrupt, 800 * time.Millisecond,
			[]string{"gen-model", "--preset", "llama-7b", "--out", "OUT"}, []string{"interrupted by SIGINT after ", "of 12.6 GiB"}},
		{"quantize", syscall.SIGTERM, 600 * time.Millisecond,
			[]string{"quantize", big, "OUT", "--type", "Q4_K_M"}, []string{`re:^memwall quantize: interrupted by SIGTERM( after [0-9.]+ [KM]iB of 174\.0 MiB)?$`}}, // no bytes yet on a slow machine
		{"plan", os.Interrupt, 300 * time.Millisecond,
			[]string{"plan", "--lifetimes", lifetimes, "--out", "OUT"}, []string{`re:interrupted by SIGINT \(stopped (in greedy-size, before any planner finished: [0-9]+ of 65536 buffers placed|before greedy-size, before any planner finished)\)$`}},
		{"demo", syscall.SIGTERM, 800 * time.Millisecond,
			[]string{"demo", "--device", "sim"}, []string{"interrupted by SIGTERM", "demo step"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			out := filepath.Join(dir, "out")
			args := make([]string, len(c.args))
			for i, a := range c.args {
				args[i] = strings.ReplaceAll(a, "OUT", out)
			}
			code, stderr, late := runInterrupted(t, c.sig, c.after, args...)
			if late < 0 {
				t.Fatalf("ended (exit %d) before the signal: %s", code, stderr)
			}
			if want := signalStatus(c.sig); code != want {
				t.Errorf("exit %d, want %d; stderr %q", code, want, stderr)
			}
			if late > time.Second {
				t.Errorf("went on %v after the signal", late)
			}
			for _, w := range c.want {
				if re, ok := strings.CutPrefix(w, "re:"); ok {
					if !regexp.MustCompile(re).MatchString(strings.TrimSuffix(stderr, "\n")) {
						t.Errorf("stderr %q does not match %s", stderr, re)
					}
				} else if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q lacks %q", stderr, w)
				}
			}
			if n := strings.Count(stderr, "memwall "); n != 1 || strings.Contains(stderr, "context canceled") {
				t.Errorf("want one message without the context's words, got %q", stderr)
			}
			noTemps(t, dir)
			if c.name != "stream" && c.name != "run" { // the pool log is written also when the work fails
				if entries, _ := os.ReadDir(dir); len(entries) != 0 {
					t.Errorf("an interrupted run left %s", entries[0].Name())
				}
			}
		})
	}
}

// TestSecondSignal: the handler interrupts the run on the first signal and
// exits at once on the second, with the first one's status.
func TestSecondSignal(t *testing.T) {
	ctx, stop := interruptible(context.Background())
	sigs := make(chan os.Signal)
	exited := make(chan int, 1)
	var stderr bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		handleSignals(sigs, stop, nil, &stderr, func(code int) { exited <- code })
	}()
	sigs <- syscall.SIGTERM
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the first signal did not cancel the context")
	}
	if got := stop.signalled(); got != syscall.SIGTERM {
		t.Fatalf("recorded %v", got)
	}
	select {
	case code := <-exited:
		t.Fatalf("exited (%d) on the first signal", code)
	default:
	}
	sigs <- os.Interrupt
	<-done
	if code := <-exited; code != exitSIGTERM {
		t.Errorf("exit %d, want %d", code, exitSIGTERM)
	}
	if got := stderr.String(); got != "memwall: SIGINT after SIGTERM: exiting at once\n" {
		t.Errorf("stderr %q", got)
	}
	if _, help, _ := runVerb(t, nil, "help"); !strings.Contains(help, "130 stopped by SIGINT, 143 by SIGTERM") {
		t.Errorf("the help does not list the signals' exit statuses:\n%s", help)
	}
	for sig, code := range map[os.Signal]int{os.Interrupt: 130, syscall.SIGTERM: 143} {
		if signalStatus(sig) != code {
			t.Errorf("signalStatus(%v) = %d, want %d", sig, signalStatus(sig), code)
		}
	}
}

// TestCPUProfileUnwritable: a MEMWALL_CPUPROFILE that cannot be written
// (a full device, a missing directory) fails a run that succeeded, with
// one line naming the variable, and leaves a failed run's status as it was.
func TestCPUProfileUnwritable(t *testing.T) {
	getenv := func(path string) func(string) string {
		return func(k string) string {
			if k == "MEMWALL_CPUPROFILE" {
				return path
			}
			return ""
		}
	}
	missing := filepath.Join(t.TempDir(), "no", "cpu.prof")
	cases := []struct {
		path string
		args []string
		code int
	}{
		{missing, []string{"version"}, exitFail},
		{"/dev/full", []string{"version"}, exitFail},
		{"/dev/full", []string{"version", "extra"}, exitUsage},
	}
	if _, err := os.Stat("/dev/full"); err != nil {
		cases = cases[:1]
	}
	for _, c := range cases {
		code, _, stderr := runVerb(t, getenv(c.path), c.args...)
		if code != c.code || strings.Count(stderr, "MEMWALL_CPUPROFILE "+c.path) != 1 {
			t.Errorf("%s %v: exit %d, stderr %q; want exit %d and one line naming the variable", c.path, c.args, code, stderr, c.code)
		}
	}
	prof := filepath.Join(t.TempDir(), "cpu.prof")
	if code, _, stderr := runVerb(t, getenv(prof), "version"); code != exitOK {
		t.Fatalf("a writable profile: exit %d, %s", code, stderr)
	}
	if st, err := os.Stat(prof); err != nil || st.Size() == 0 {
		t.Errorf("no profile written: %v", err)
	}
}
