package replay

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
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
		{Name: "keep-pages", Options: pool.Options{TargetRatio: pool.NoTarget}},
		{Name: "keep-strategy", Options: pool.Options{TargetRatio: pool.NoTarget, Placement: pool.PlaceStrategy}},
		{Name: "target1.01", Options: pool.Options{TargetRatio: 1.01}},
		{Name: "target1.03", Options: pool.Options{TargetRatio: 1.03}},
		{Name: "target1.05", Options: pool.Options{TargetRatio: 1.05}},
		{Name: "target1.10", Options: pool.Options{TargetRatio: 1.10}},
		{Name: "target1.20", Options: pool.Options{TargetRatio: 1.20}},
		{Name: "unmap-all", Options: pool.Options{TargetRatio: pool.NoTarget, KeepFreeBytes: 1}},
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
//
// MEMWALL_POLICY_SCALES (a comma-separated list of factors, such as
// 0.9,0.95,1.05,1.1) also replays each trace with every request scaled
// by each factor (a line named trace@factor): the same program at other
// widths, whose blocks fall differently on page boundaries. Placement
// rules that win on one trace by where its sizes happen to fall lose on
// its variants, so a rule is judged on both. The table ends with each
// configuration's totals over every line: the lines meeting both goals,
// within 1.05× and within 1% calls, the geometric mean of the ratio and
// the sum of driver time.
func TestPolicyTable(t *testing.T) {
	sel := os.Getenv("MEMWALL_POLICY_TABLE")
	if sel == "" {
		t.Skip("set MEMWALL_POLICY_TABLE=1 (or trace/config names) to print the policy table")
	}
	want := map[string]bool{}
	for _, s := range strings.Split(sel, ",") {
		want[s] = true
	}
	scales := []float64{1}
	if env := os.Getenv("MEMWALL_POLICY_SCALES"); env != "" {
		for _, s := range strings.Split(env, ",") {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil || f <= 0 {
				t.Fatalf("MEMWALL_POLICY_SCALES: %q is not a positive factor", s)
			}
			scales = append(scales, f)
		}
	}
	files, _ := filepath.Glob(tracesDir + "*.csv.gz")
	var out strings.Builder
	fmt.Fprintf(&out, "%-27s %-14s %6s %8s %8s %10s %10s %s\n", "trace", "config", "hold", "ratio", "calls%", "drv µs/1k", "bg µs/1k", "goal")
	totals := map[string]*policyTotals{}
	var order []string
	for _, f := range files {
		base := strings.TrimSuffix(filepath.Base(f), ".csv.gz")
		cs := policyConfigs()
		if !want["1"] && !want[base] {
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
		loaded, err := Load(f, LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, scale := range scales {
			tr, name := loaded, base
			if scale != 1 {
				tr, name = scaledTrace(loaded, scale), fmt.Sprintf("%s@%g", base, scale)
			}
			policyLines(&out, tr, name, cs, totals, &order)
		}
	}
	fmt.Fprintf(&out, "\n%-14s %6s %8s %8s %8s %10s %12s\n", "config", "lines", "goals", "≤1.05×", "≤1%", "gm ratio", "drv µs/1k Σ")
	for _, name := range order {
		tt := totals[name]
		fmt.Fprintf(&out, "%-14s %6d %8d %8d %8d %10.4f %12.0f\n", name, tt.lines, tt.both, tt.mem, tt.calls, math.Exp(tt.logRatio/float64(tt.lines)), tt.driver)
	}
	t.Log("\n" + out.String())
}

// policyTotals sums one configuration's lines of TestPolicyTable.
type policyTotals struct {
	lines, both, mem, calls int
	logRatio, driver        float64
}

// policyLines replays tr (named name) through each configuration, writes
// a line for each to out and adds it to the configuration's totals.
func policyLines(out *strings.Builder, tr *Trace, name string, cs []Config, totals map[string]*policyTotals, order *[]string) {
	allocs := float64(tr.Allocs)
	for _, c := range cs {
		ro := Options{Samples: -1}
		if strings.HasSuffix(c.Name, "@5µs") {
			ro.OpTime = 5 * time.Microsecond
		}
		r, err := Run(context.Background(), tr, c, ro)
		if err != nil {
			fmt.Fprintf(out, "%-27s %-14s error: %v\n", name, c.Name, err)
			continue
		}
		calls := float64(r.DeviceCalls) / allocs
		goal := ""
		if r.Ratio <= GoalRatio && calls <= GoalCallsPerAlloc {
			goal = "✓"
		}
		hold := "eager"
		if o := r.Options; o.HoldTime > 0 && o.TargetRatio < pool.NoTarget {
			hold = o.HoldTime.String()
		} else if o.TargetRatio == pool.NoTarget {
			hold = "-"
		}
		drv := float64(r.DriverTime/time.Microsecond) * 1000 / allocs
		fmt.Fprintf(out, "%-27s %-14s %6s %8.3f %7.2f%% %10.0f %10.0f %s\n", name, c.Name, hold, r.Ratio, 100*calls,
			drv, float64(r.ReclaimTime/time.Microsecond)*1000/allocs, goal)
		tt := totals[c.Name]
		if tt == nil {
			tt = &policyTotals{}
			totals[c.Name] = tt
			*order = append(*order, c.Name)
		}
		tt.lines++
		tt.logRatio += math.Log(r.Ratio)
		tt.driver += drv
		if goal != "" {
			tt.both++
		}
		if r.Ratio <= GoalRatio {
			tt.mem++
		}
		if calls <= GoalCallsPerAlloc {
			tt.calls++
		}
	}
}

// scaledTrace returns t with every request multiplied by f and rounded up
// to 512 bytes (frees follow their allocation's new size): the same
// sequence of allocations and frees at other tensor widths.
func scaledTrace(t *Trace, f float64) *Trace {
	n := *t
	n.Ops = make([]Op, len(t.Ops))
	sizes := make([]uint64, t.MaxID)
	var live uint64
	n.PeakLive, n.PeakOp = 0, 0
	for i, op := range t.Ops {
		if op.Free {
			op.Size = sizes[op.ID]
			live -= op.Size
		} else {
			op.Size = max(512, (uint64(float64(op.Size)*f)+511)&^511)
			sizes[op.ID] = op.Size
			live += op.Size
			if live > n.PeakLive {
				n.PeakLive, n.PeakOp = live, i
			}
		}
		n.Ops[i] = op
	}
	return &n
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
		r, err := Run(context.Background(), tr, c, Options{Samples: -1, OpTime: op})
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

// TestScaledTrace: a scaled trace keeps every op and block, each request
// becomes at least f times its size in whole 512-byte units, each free
// names its allocation's new size, and the peak is the new sequence's.
func TestScaledTrace(t *testing.T) {
	tr, err := Load(tracesDir+"unet_denoise.csv.gz", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(13, 2))
	for range 4 {
		f := 0.5 + r.Float64()
		s := scaledTrace(tr, f)
		if len(s.Ops) != len(tr.Ops) || s.MaxID != tr.MaxID {
			t.Fatalf("×%.3f: %d ops, %d ids; want %d, %d", f, len(s.Ops), s.MaxID, len(tr.Ops), tr.MaxID)
		}
		sizes := make([]uint64, s.MaxID)
		var live, peak uint64
		peakOp := 0
		for i, op := range s.Ops {
			o := tr.Ops[i]
			if op.ID != o.ID || op.Free != o.Free {
				t.Fatalf("×%.3f op %d: %+v, want the block and action of %+v", f, i, op, o)
			}
			if op.Free {
				if op.Size != sizes[op.ID] || live < op.Size {
					t.Fatalf("×%.3f op %d: free of %d bytes, allocated %d, %d live", f, i, op.Size, sizes[op.ID], live)
				}
				live -= op.Size
				continue
			}
			if op.Size%512 != 0 || float64(op.Size) < float64(o.Size)*f || op.Size > max(512, uint64(float64(o.Size)*f)+512) {
				t.Fatalf("×%.3f op %d: %d bytes for a request of %d", f, i, op.Size, o.Size)
			}
			sizes[op.ID] = op.Size
			if live += op.Size; live > peak {
				peak, peakOp = live, i
			}
		}
		if s.PeakLive != peak || s.PeakOp != peakOp {
			t.Fatalf("×%.3f: peak %d at op %d, recomputed %d at %d", f, s.PeakLive, s.PeakOp, peak, peakOp)
		}
	}
	if p := scaledTrace(tr, 1).PeakLive; p < tr.PeakLive {
		t.Fatalf("×1 (sizes rounded up) lowers the peak: %d < %d", p, tr.PeakLive)
	}
}
