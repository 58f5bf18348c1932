package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/format/synth"
)

// runVerbFault runs a command line on devices wrapped with cfg's faults.
func runVerbFault(t *testing.T, cfg *fault.Config, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runEnv(t, func(e *env) { e.wrapDevice = func(d device.Device) device.Device { return fault.Wrap(d, cfg) } }, args...)
}

// oomCases are the verbs that allocate through a pool, each a small run on
// the simulator.
func oomCases(t *testing.T) map[string][]string {
	dir, _ := tinyDir(t, "tiny")
	tiny, err := synth.WriteTiny(context.Background(), t.TempDir(), synth.Safetensors)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]string{
		"bench alloc": {"bench", "alloc", "--device", "sim", "--pairs", "200", "--goroutines", "1", "--mixes", "1MiB", "--strategies", "bestfit", "--policies", "virtual,chunks"},
		"bench kv":    {"bench", "kv", "--device", "sim", "--blocks", "1000", "--ops", "1000", "--reps", "1", "--swap-bytes", "16MiB"},
		"stream":      {"stream", tiny, "--vram", "12MiB", "--ctx", "128", "--steps", "1", "--device", "sim"},
		"run":         {"run", dir, "--vram", "6MiB", "--prompt-ids", "5,17,300", "--max-new", "3", "--device", "sim"},
	}
}

// TestOOMSnapshotPerVerb fails the device's memory at random points of each
// verb that allocates through a pool (an allocation, a physical chunk or
// a mapping refused, and every one after it) and checks what the user
// gets: exit 1; when a pool ran out, the --oom-snapshot file, named in the
// message, which memwall replay --html draws; when the failure was outside
// a pool, no file and no claim of one. Some failure point of every verb
// must reach a pool.
func TestOOMSnapshotPerVerb(t *testing.T) {
	for name, args := range oomCases(t) {
		t.Run(name, func(t *testing.T) {
			var clean fault.Config
			if code, _, stderr := runVerbFault(t, &clean, args...); code != 0 {
				t.Fatalf("clean run: exit %d: %s", code, stderr)
			}
			c := clean.Counts()
			calls := map[string]uint64{"alloc": c.Alloc, "physical": c.CreatePhysical, "map": c.Map}
			r := rand.New(rand.NewPCG(uint64(len(name)), 5))
			snapshots := 0
			tries := 4
			if testing.Short() {
				tries = 2
			}
			for i := 0; i < tries || snapshots == 0 && i < 12; i++ {
				var methods []string
				for m, n := range calls {
					if n > 0 {
						methods = append(methods, m)
					}
				}
				if len(methods) == 0 {
					t.Fatalf("the clean run made no device allocation: %+v", c)
				}
				m := methods[r.IntN(len(methods))]
				nth := 1 + uint64(r.IntN(int(calls[m])))
				var rules fault.Rules
				switch m {
				case "alloc":
					rules.Alloc = fault.From(nth)
				case "physical":
					rules.CreatePhysical = fault.From(nth)
				default:
					rules.Map = fault.From(nth)
				}
				var cfg fault.Config
				cfg.Set(rules)
				snap := filepath.Join(t.TempDir(), "oom.jsonl")
				code, _, stderr := runVerbFault(t, &cfg, append(args, "--oom-snapshot", snap)...)
				what := fmt.Sprintf("%s %d and after failing", m, nth)
				if code == exitOK {
					// The pool's calls vary a little from run to run (a
					// background reclaimer, timing): this run made fewer.
					t.Logf("%s: the run made fewer calls and succeeded", what)
					continue
				}
				if code != exitFail {
					t.Fatalf("%s: exit %d, want 1: %s", what, code, stderr)
				}
				if strings.Contains(stderr, "panic") || strings.Contains(stderr, "<nil>") {
					t.Fatalf("%s: %s", what, stderr)
				}
				if _, err := os.Stat(snap); err != nil {
					if strings.Contains(stderr, "snapshot at the failure is in") {
						t.Fatalf("%s: no file, yet the message claims one: %s", what, stderr)
					}
					continue
				}
				snapshots++
				t.Logf("%s: %s", what, strings.TrimSpace(stderr))
				if !strings.Contains(stderr, "snapshot at the failure is in "+snap) || !strings.Contains(stderr, "replay --html") {
					t.Fatalf("%s: the message does not say where the snapshot went: %s", what, stderr)
				}
				checkSnapshotDraws(t, snap)
			}
			if snapshots == 0 {
				t.Fatalf("no failure point reached a pool (calls %v)", calls)
			}
		})
	}
}

// checkSnapshotDraws runs memwall replay --html and --json on a snapshot
// file: the page shows the failure (and the pool's memory when it held
// any), the JSON its figures.
func checkSnapshotDraws(t *testing.T, snap string) {
	t.Helper()
	page := filepath.Join(t.TempDir(), "oom.html")
	code, _, stderr := runVerbSim(t, "replay", snap, "--html", page, "--no-search", "--strategy", "default")
	if code != 0 {
		t.Fatalf("replay --html %s: exit %d: %s", snap, code, stderr)
	}
	b, err := os.ReadFile(page)
	if err != nil || !bytes.Contains(b, []byte("out of memory at event")) {
		t.Fatalf("replay --html shows no failure (%v): %s", err, b)
	}
	code, out, stderr := runVerbSim(t, "replay", snap, "--json", "--no-search", "--strategy", "default")
	if code != 0 {
		t.Fatalf("replay --json %s: exit %d: %s", snap, code, stderr)
	}
	var rep struct {
		Allocs int64 `json:"allocs"`
		OOM    *struct {
			Requested  uint64 `json:"requested_bytes"`
			LiveBlocks int    `json:"live_blocks"`
		} `json:"oom"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.OOM == nil || rep.OOM.Requested == 0 {
		t.Fatalf("replay --json: no oom figures (%v): %s", err, out)
	}
	if rep.OOM.LiveBlocks > 0 && !bytes.Contains(b, []byte("<svg")) {
		t.Fatalf("a snapshot of %d live blocks drew no map", rep.OOM.LiveBlocks)
	}
}

// failFirstMap fails every page mapping and every allocation: the first
// pool allocation of any verb runs out of device memory.
func failFirstMap() *fault.Config {
	var cfg fault.Config
	cfg.Set(fault.Rules{Map: fault.Always(), Alloc: fault.Always(), CreatePhysical: fault.Always()})
	return &cfg
}

// TestOOMSnapshotChecked: --oom-snapshot is checked before the work like
// every output file (a missing directory, a directory), and without the
// flag an out-of-memory error says how to get a snapshot.
func TestOOMSnapshotChecked(t *testing.T) {
	base := []string{"bench", "alloc", "--device", "sim", "--pairs", "200", "--goroutines", "1", "--mixes", "1MiB", "--strategies", "bestfit", "--policies", "virtual"}
	for _, bad := range []string{"/nonexistent/oom.jsonl", t.TempDir()} {
		var cfg fault.Config
		code, _, stderr := runVerbFault(t, &cfg, append(base, "--oom-snapshot", bad)...)
		if code != exitFail || !strings.Contains(stderr, "--oom-snapshot "+bad) {
			t.Errorf("--oom-snapshot %s: exit %d, %s", bad, code, stderr)
		}
		if n := cfg.Counts().Alloc + cfg.Counts().Map; n != 0 {
			t.Errorf("--oom-snapshot %s: %d device allocations before the refusal", bad, n)
		}
	}
	code, _, stderr := runVerbFault(t, failFirstMap(), base...)
	if code != exitFail || !strings.Contains(stderr, "give --oom-snapshot FILE") {
		t.Errorf("an OOM without the flag: exit %d, %s", code, stderr)
	}
}

// TestPoolFlagsCheckedFirst: every verb that takes --oom-snapshot (and
// --pool-log) refuses a file it could not write before opening a device.
func TestPoolFlagsCheckedFirst(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "missing", "x.jsonl")
	cases := map[string][]string{"demo --oom-snapshot": {"demo", "--device", "sim", "--oom-snapshot", bad}}
	for name, args := range oomCases(t) {
		cases[name+" --oom-snapshot"] = append(slices.Clip(args), "--oom-snapshot", bad)
		if name == "run" || name == "stream" {
			cases[name+" --pool-log"] = append(slices.Clip(args), "--pool-log", bad)
		}
	}
	for name, args := range cases {
		flag := args[len(args)-2]
		var cfg fault.Config
		code, _, stderr := runVerbFault(t, &cfg, args...)
		if code != exitFail || !strings.Contains(stderr, flag+" "+bad) {
			t.Errorf("%s: exit %d, %s", name, code, stderr)
		}
		if c := cfg.Counts(); c.Alloc+c.Map+c.MemInfo != 0 {
			t.Errorf("%s: the device was used before the refusal (%+v)", name, c)
		}
	}
}

// TestOOMSnapshotThroughLink: a snapshot path that is a symbolic link
// stays a link; its target gets the snapshot.
func TestOOMSnapshotThroughLink(t *testing.T) {
	dir := t.TempDir()
	target, link := filepath.Join(dir, "target.jsonl"), filepath.Join(dir, "link.jsonl")
	if err := os.WriteFile(target, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	args := []string{"bench", "alloc", "--device", "sim", "--pairs", "200", "--goroutines", "1", "--mixes", "1MiB",
		"--strategies", "bestfit", "--policies", "virtual", "--oom-snapshot", link}
	if code, _, stderr := runVerbFault(t, failFirstMap(), args...); code != exitFail {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced (%v)", err)
	}
	b, err := os.ReadFile(target)
	if err != nil || !bytes.Contains(b, []byte(`"oom"`)) {
		t.Fatalf("target holds %q (%v), want the snapshot", b, err)
	}
	if st, _ := os.Stat(target); st.Mode().Perm() != 0o600 {
		t.Errorf("target's mode %v, want the 0600 it had", st.Mode().Perm())
	}
	checkSnapshotDraws(t, link)
}

// TestStreamPoolLog: memwall stream --pool-log writes the device pool's
// log, which replay reads.
func TestStreamPoolLog(t *testing.T) {
	tiny, err := synth.WriteTiny(context.Background(), t.TempDir(), synth.Safetensors)
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "stream.jsonl")
	if code, _, stderr := runVerbSim(t, "stream", tiny, "--vram", "12MiB", "--ctx", "128", "--steps", "1", "--device", "sim", "--pool-log", logPath); code != 0 {
		t.Fatalf("stream --pool-log: exit %d: %s", code, stderr)
	}
	code, out, stderr := runVerbSim(t, "replay", logPath, "--json", "--no-search", "--strategy", "default")
	if code != 0 || !strings.Contains(out, `"allocs"`) {
		t.Fatalf("replay of stream's pool log: exit %d: %s%s", code, stderr, out)
	}
}

// TestPoolLog: memwall run --pool-log writes the device pool's every
// allocation and free, which replay reads: as many allocations as the
// pool made; and a run that fails still leaves its log up to the failure.
func TestPoolLog(t *testing.T) {
	dir, _ := tinyDir(t, "tiny")
	logPath := filepath.Join(t.TempDir(), "pool.jsonl")
	args := []string{"run", dir, "--vram", "6MiB", "--prompt-ids", "5,17,300", "--max-new", "3", "--device", "sim", "--json", "--pool-log", logPath}
	var clean fault.Config
	if code, _, stderr := runVerbFault(t, &clean, args...); code != 0 {
		t.Fatalf("run --pool-log: exit %d: %s", code, stderr)
	}
	code, out, stderr := runVerbSim(t, "replay", logPath, "--json", "--no-search", "--strategy", "default")
	if code != 0 {
		t.Fatalf("replay of the pool log: exit %d: %s", code, stderr)
	}
	var rep struct {
		Allocs   int64  `json:"allocs"`
		PeakLive uint64 `json:"peak_live_bytes"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Allocs == 0 || rep.PeakLive == 0 {
		t.Fatalf("replay of the pool log: %v: %s", err, out)
	}
	// Fail the pool's growth part-way: the log holds what came before.
	var cfg fault.Config
	cfg.Set(fault.Rules{Map: fault.From(max(2, clean.Counts().Map/2))})
	failed := filepath.Join(t.TempDir(), "failed.jsonl")
	args[len(args)-1] = failed
	if code, _, stderr := runVerbFault(t, &cfg, args...); code != exitFail {
		t.Fatalf("run with maps failing: exit %d: %s", code, stderr)
	}
	b, err := os.ReadFile(failed)
	if err != nil || !bytes.Contains(b, []byte(`"alloc"`)) {
		t.Fatalf("a failed run's log: %v, %d bytes", err, len(b))
	}
}
