package replay

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/pool"
)

// policyConfigs are the pool configurations TestPolicyTable compares: the
// default, then the mechanisms measured for issue 13 one at a time (hold
// times: the reclaimer's passes at trace time, Options.OpTime per op).
func policyConfigs() []Config {
	return []Config{
		{Name: "default", Options: pool.Options{}},
		{Name: "eager", Options: pool.Options{HoldTime: -1}},
		{Name: "hold10ms", Options: pool.Options{HoldTime: 10 * time.Millisecond}},
		{Name: "hold300ms", Options: pool.Options{HoldTime: 300 * time.Millisecond}},
		// The default at a faster pace than recorded: 5 µs per alloc or
		// free is 100,000 placements a second, a hot pool.
		{Name: "default@5µs", Options: pool.Options{}},
		{Name: "eager@5µs", Options: pool.Options{HoldTime: -1}},
		{Name: "strategy-place", Options: pool.Options{Placement: pool.PlaceStrategy}},
		{Name: "keep-pages", Options: pool.Options{TargetRatio: -1}},
		{Name: "keep-strategy", Options: pool.Options{TargetRatio: -1, Placement: pool.PlaceStrategy}},
		{Name: "target1.01", Options: pool.Options{TargetRatio: 1.01}},
		{Name: "target1.03", Options: pool.Options{TargetRatio: 1.03}},
		{Name: "target1.05", Options: pool.Options{TargetRatio: 1.05}},
		{Name: "target1.10", Options: pool.Options{TargetRatio: 1.10}},
		{Name: "target1.20", Options: pool.Options{TargetRatio: 1.20}},
		{Name: "unmap-all", Options: pool.Options{TargetRatio: -1, KeepFreeBytes: 1}},
		{Name: "page4M", Options: pool.Options{PageBytes: 4 << 20}},
		{Name: "mixsmall", Options: pool.Options{SmallMax: pool.Off}},
		{Name: "small64k", Options: pool.Options{SmallMax: 64 << 10}},
		{Name: "cache16k", Options: pool.Options{CacheMax: 16 << 10}},
		{Name: "cache4k", Options: pool.Options{CacheMax: 4 << 10, SmallMax: 64 << 10}},
		{Name: "small128k", Options: pool.Options{SmallMax: 128 << 10}},
		{Name: "small32k", Options: pool.Options{SmallMax: 32 << 10}},
		{Name: "c16-s64", Options: pool.Options{CacheMax: 16 << 10, SmallMax: 64 << 10}},
		{Name: "c32-s64", Options: pool.Options{CacheMax: 32 << 10, SmallMax: 64 << 10}},
		{Name: "c16-s128", Options: pool.Options{CacheMax: 16 << 10, SmallMax: 128 << 10}},
	}
}

// TestPolicyTable replays every trace in testdata/traces through
// policyConfigs and prints peak reserved / peak live, device calls per
// allocation and driver time per 1,000 allocations at the H200's costs
// (the table of docs/pool-policy.md). It runs only when
// MEMWALL_POLICY_TABLE is set (to a comma-separated list of trace names
// or config names to restrict it, or to 1 for all): a full table takes
// about a minute.
func TestPolicyTable(t *testing.T) {
	sel := os.Getenv("MEMWALL_POLICY_TABLE")
	if sel == "" {
		t.Skip("set MEMWALL_POLICY_TABLE=1 (or trace/config names) to print the policy table")
	}
	want := map[string]bool{}
	for _, s := range strings.Split(sel, ",") {
		want[s] = true
	}
	files, _ := filepath.Glob(tracesDir + "*.csv.gz")
	var out strings.Builder
	fmt.Fprintf(&out, "%-22s %-14s %6s %8s %8s %10s %10s %s\n", "trace", "config", "hold", "ratio", "calls%", "drv µs/1k", "bg µs/1k", "goal")
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".csv.gz")
		cs := policyConfigs()
		if !want["1"] && !want[name] {
			var keep []Config
			for _, c := range cs {
				if want[c.Name] {
					keep = append(keep, c)
				}
			}
			if len(keep) == 0 {
				continue
			}
			cs = keep
		}
		tr, err := Load(f, LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		allocs := float64(tr.Allocs)
		for _, c := range cs {
			ro := Options{Samples: -1}
			if strings.HasSuffix(c.Name, "@5µs") {
				ro.OpTime = 5 * time.Microsecond
			}
			r, err := Run(tr, c, ro)
			if err != nil {
				fmt.Fprintf(&out, "%-22s %-14s error: %v\n", name, c.Name, err)
				continue
			}
			calls := float64(r.DeviceCalls) / allocs
			goal := ""
			if r.Ratio <= GoalRatio && calls <= GoalCallsPerAlloc {
				goal = "✓"
			}
			hold := "eager"
			if o := r.Options; o.HoldTime > 0 && o.TargetRatio > 0 {
				hold = o.HoldTime.String()
			} else if o.TargetRatio < 0 {
				hold = "-"
			}
			fmt.Fprintf(&out, "%-22s %-14s %6s %8.3f %7.2f%% %10.0f %10.0f %s\n", name, c.Name, hold, r.Ratio, 100*calls,
				float64(r.DriverTime/time.Microsecond)*1000/allocs, float64(r.ReclaimTime/time.Microsecond)*1000/allocs, goal)
		}
	}
	t.Log("\n" + out.String())
}

// TestReclaimAtTraceTime: the reclaimer's passes run on the replay's clock,
// so a replay with a hold time is reproducible; at the recorded pace the
// default is the eager pool (never hot), and at 5 µs per op BERT makes it
// hot: fewer calls than eager, more memory, passes run, and the driver
// time charged to them is part of the total.
func TestReclaimAtTraceTime(t *testing.T) {
	tr, err := Load(tracesDir+"bert_base_varlen.csv.gz", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	run := func(c Config, op time.Duration) *Result {
		r, err := Run(tr, c, Options{Samples: -1, OpTime: op})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	def, eager := Config{Name: "default"}, Config{Name: "eager", Options: pool.Options{HoldTime: -1}}
	same := func(a, b *Result) bool {
		return a.PeakReserved == b.PeakReserved && a.DeviceCalls == b.DeviceCalls && a.DriverTime == b.DriverTime && a.ReclaimTime == b.ReclaimTime
	}
	d, e := run(def, 0), run(eager, 0)
	if !same(d, e) || d.Passes == 0 || e.Passes != 0 {
		t.Errorf("recorded pace: default %d B, %d calls, %d passes; eager %d B, %d calls, %d passes", d.PeakReserved, d.DeviceCalls, d.Passes, e.PeakReserved, e.DeviceCalls, e.Passes)
	}
	fast, again := run(def, 5*time.Microsecond), run(def, 5*time.Microsecond)
	if !same(fast, again) {
		t.Errorf("two replays at 5 µs per op differ: %d/%d B, %d/%d calls", fast.PeakReserved, again.PeakReserved, fast.DeviceCalls, again.DeviceCalls)
	}
	if fast.DeviceCalls >= e.DeviceCalls || fast.PeakReserved <= e.PeakReserved || fast.ReclaimTime > fast.DriverTime {
		t.Errorf("hot at 5 µs per op: %d calls, %d B (eager %d calls, %d B), reclaim %v of %v", fast.DeviceCalls, fast.PeakReserved, e.DeviceCalls, e.PeakReserved, fast.ReclaimTime, fast.DriverTime)
	}
}
