package replay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/memwall/memwall/pool"
)

// The goal a configuration is measured against (issue 6): peak reserved at
// most GoalRatio × peak live bytes, with at most GoalCallsPerAlloc driver
// calls per allocation.
const (
	GoalRatio         = 1.05
	GoalCallsPerAlloc = 0.01
)

// DefaultConfig returns the pool's default configuration, named after its
// effective options (e.g. "virtual-bestfit-target1.02").
func DefaultConfig() Config {
	d := NewDevice(0)
	defer d.Close()
	return Config{Name: ConfigName(pool.DefaultOptions(d)), Options: pool.Options{}}
}

// ConfigName names effective pool options: growth, strategy, then the
// virtual-memory knobs that differ from a plain growable range.
func ConfigName(o pool.Options) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s-%s", o.Growth, o.Strategy)
	if o.Growth != pool.GrowVirtual {
		return b.String()
	}
	if o.PageBytes != 0 && o.PageBytes != 2<<20 {
		fmt.Fprintf(&b, "-page%dM", o.PageBytes>>20)
	}
	switch {
	case o.KeepFreeBytes > 0 && o.KeepFreeBytes < 2<<20:
		b.WriteString("-unmapall")
	case o.KeepFreeBytes > 0:
		fmt.Fprintf(&b, "-keep%dM", o.KeepFreeBytes>>20)
	}
	if o.TargetRatio > 0 && o.TargetRatio < pool.NoTarget {
		fmt.Fprintf(&b, "-target%.2f", o.TargetRatio)
	}
	if o.SmallMax == pool.Off {
		b.WriteString("-mixsmall")
	}
	if o.Placement == pool.PlaceStrategy {
		b.WriteString("-strategyplace")
	}
	return b.String()
}

// Configs returns the configurations a report compares: the default first,
// then every strategy under both growth policies, then the virtual-memory
// knobs one at a time (the trade-off between reserved memory and driver
// calls).
func Configs() []Config {
	def := DefaultConfig()
	cs := []Config{def}
	add := func(o pool.Options) {
		d := NewDevice(0)
		defer d.Close()
		p, err := pool.New(d, o)
		name := fmt.Sprintf("%s-%s", o.Growth, o.Strategy)
		if err == nil {
			name = ConfigName(p.Options())
			p.Close()
		}
		if name != def.Name {
			cs = append(cs, Config{Name: name, Options: o})
		}
	}
	for _, s := range []string{"tlsf", "buddy"} {
		add(pool.Options{Strategy: s})
	}
	add(pool.Options{Strategy: "bestfit", Placement: pool.PlaceStrategy})                  // best fit's own placement (before issue 13)
	add(pool.Options{Strategy: "bestfit", TargetRatio: pool.NoTarget})                     // keep every page: the previous default
	add(pool.Options{Strategy: "bestfit", TargetRatio: pool.NoTarget, SmallMax: pool.Off}) // ... with small blocks among large
	add(pool.Options{Strategy: "bestfit", TargetRatio: 1.2})                               // a looser target
	add(pool.Options{Strategy: "bestfit", PageBytes: 4 << 20})                             // larger pages
	add(pool.Options{Strategy: "bestfit", PageBytes: 8 << 20})                             // ...
	add(pool.Options{Strategy: "bestfit", TargetRatio: pool.NoTarget, KeepFreeBytes: 1})   // unmap every free page
	for _, s := range []string{"bestfit", "tlsf", "buddy"} {
		add(pool.Options{Strategy: s, Growth: pool.GrowChunks})
	}
	return cs
}

// SelectConfigs returns the configurations of cs whose name or strategy is
// in names (comma-separated; "" or "all" selects all). The default config
// is always kept first. An unknown name is an error.
func SelectConfigs(cs []Config, names string) ([]Config, error) {
	if names == "" || names == "all" {
		return cs, nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(names, ",") {
		if n = strings.TrimSpace(n); n != "" {
			want[n] = false
		}
	}
	var out []Config
	for i, c := range cs {
		strat := c.Options.Strategy
		if strat == "" {
			strat = "bestfit"
		}
		hit := false
		for n := range want {
			if n == c.Name || n == strat || (n == "default" && i == 0) {
				want[n] = true
				hit = true
			}
		}
		if hit {
			out = append(out, c)
		}
	}
	for n, found := range want {
		if !found {
			names := make([]string, len(cs))
			for i, c := range cs {
				names[i] = c.Name
			}
			return nil, fmt.Errorf("no configuration %q (strategies: bestfit, tlsf, buddy; configurations: default, %s)", n, strings.Join(names, ", "))
		}
	}
	return out, nil
}

// EvalOptions tune Evaluate.
type EvalOptions struct {
	// Capacity, when non-zero, replays every configuration with that
	// fixed pool Limit and skips the capacity search.
	Capacity uint64
	// NoSearch skips the capacity search.
	NoSearch bool
	// Timeline and AddressMap ask for each Result's timeline and address
	// map (for pictures).
	Timeline, AddressMap bool
	// Progress, when set, is called before each configuration.
	Progress func(i, n int, name string)
}

// Report is the comparison of configurations on one trace, in the shape
// of `memwall replay --json`.
type Report struct {
	Trace  string `json:"trace"`
	Format string `json:"format"`
	FreeAt string `json:"free_at"`
	Events int64  `json:"events"`
	Allocs int64  `json:"allocs"`
	// Skipped counts bad records dropped by --lenient.
	Skipped  int64  `json:"skipped"`
	PeakLive uint64 `json:"peak_live_bytes"`
	// PyTorch's own figures; nil when the trace does not say.
	PyTorchReserved     *uint64  `json:"pytorch_reserved_bytes"`
	PyTorchDeviceAllocs *int64   `json:"pytorch_device_allocs"`
	PyTorchRatio        *float64 `json:"pytorch_ratio"`
	// PyTorchDriverPer1k is the driver time of PyTorch's cudaMalloc calls
	// (and expandable segments' page maps) per 1,000 allocations, at
	// H200Costs, in microseconds; nil when the trace does not say.
	PyTorchDriverPer1k *float64 `json:"pytorch_driver_us_per_1k_allocs"`
	// Default is the name of the pool's default configuration.
	Default       string       `json:"default"`
	GoalRatio     float64      `json:"goal_ratio"`
	GoalCallShare float64      `json:"goal_calls_per_alloc"`
	Capacity      uint64       `json:"capacity_bytes,omitempty"`
	Results       []ResultJSON `json:"results"`
	// Runs is each configuration's full Result, in Results order.
	Runs []*Result `json:"-"`
}

// ResultJSON is one configuration's line of a Report.
type ResultJSON struct {
	Config        string  `json:"config"`
	Strategy      string  `json:"strategy"`
	Growth        string  `json:"growth"`
	PeakReserved  uint64  `json:"peak_reserved_bytes"`
	Ratio         float64 `json:"reserved_ratio"`
	Utilization   float64 `json:"utilization"`
	DeviceCalls   uint64  `json:"device_calls"`
	CallsPerAlloc float64 `json:"device_calls_per_alloc"`
	// DriverPer1k is the driver time of the pool's device calls per 1,000
	// allocations at H200Costs, in microseconds.
	DriverPer1k float64 `json:"driver_us_per_1k_allocs"`
	// ReclaimPer1k is the part of DriverPer1k spent in the reclaimer's
	// passes, off the allocating goroutine; HoldMs the pool's hold time
	// in milliseconds (0: none, pages move at once).
	ReclaimPer1k      float64 `json:"reclaim_us_per_1k_allocs"`
	HoldMs            float64 `json:"hold_ms"`
	MinCapacity       *uint64 `json:"min_capacity_bytes"`
	FragMin           float64 `json:"fragmentation_min"`
	FragMean          float64 `json:"fragmentation_mean"`
	EventsPerSecond   float64 `json:"events_per_second"`
	MeetsGoal         bool    `json:"meets_goal"`
	RatioToGoal       float64 `json:"ratio_to_goal"`
	CallsToGoal       float64 `json:"calls_to_goal"`
	Error             string  `json:"error,omitempty"`
	MinCapacityReplay int     `json:"min_capacity_replays,omitempty"`
}

// Evaluate replays t through each configuration and compares them. A
// configuration the pool cannot run the trace with (out of memory under
// Capacity, a strategy that refuses a size, a pool that cannot be built)
// gets a line with Error set. The error is ctx's, wrapped, when ctx is
// done before every configuration was replayed; the report then holds the
// configurations replayed in full.
func Evaluate(ctx context.Context, t *Trace, cs []Config, o EvalOptions) (*Report, error) {
	rep := &Report{Trace: t.Name, Format: t.Format.String(), Events: t.Events, Allocs: t.Allocs,
		Skipped: t.Skipped, PeakLive: t.PeakLive, Default: DefaultConfig().Name,
		GoalRatio: GoalRatio, GoalCallShare: GoalCallsPerAlloc, Capacity: o.Capacity}
	if v, ok := t.PyTorchReserved(); ok {
		rep.PyTorchReserved = &v
		if t.PeakLive > 0 {
			r := float64(v) / float64(t.PeakLive)
			rep.PyTorchRatio = &r
		}
	}
	if v, ok := t.PyTorchDeviceAllocs(); ok {
		rep.PyTorchDeviceAllocs = &v
		if t.Allocs > 0 {
			us := float64(v) * H200Costs.Alloc.Seconds() * 1e6 / float64(t.Allocs) * 1000
			rep.PyTorchDriverPer1k = &us
		}
	}
	ro := Options{Limit: o.Capacity, AddressMap: o.AddressMap, Samples: -1}
	if o.Timeline {
		ro.Samples = 0
	}
	for i, c := range cs {
		if o.Progress != nil {
			o.Progress(i, len(cs), c.Name)
		}
		r, err := Run(ctx, t, c, ro)
		if ctx.Err() != nil {
			return rep, fmt.Errorf("%d of %d configurations replayed: %w", i, len(cs), stopCause(ctx, err))
		}
		line := ResultJSON{Config: c.Name, Strategy: r.Strategy, Growth: r.Growth,
			PeakReserved: r.PeakReserved, Ratio: r.Ratio, Utilization: r.Utilization,
			DeviceCalls: r.DeviceCalls, FragMin: r.FragMin, FragMean: r.FragMean}
		if t.Allocs > 0 {
			line.CallsPerAlloc = float64(r.DeviceCalls) / float64(t.Allocs)
			line.DriverPer1k = r.DriverTime.Seconds() * 1e6 / float64(t.Allocs) * 1000
			line.ReclaimPer1k = r.ReclaimTime.Seconds() * 1e6 / float64(t.Allocs) * 1000
		}
		if ro := r.Options; ro.HoldTime > 0 && ro.TargetRatio < pool.NoTarget && r.Growth == "virtual" {
			line.HoldMs = ro.HoldTime.Seconds() * 1000
		}
		if r.Elapsed > 0 {
			line.EventsPerSecond = float64(r.Ops) / r.Elapsed.Seconds()
		}
		if err != nil {
			line.Error = err.Error()
		} else if !o.NoSearch && o.Capacity == 0 {
			c2, runs, err := MinCapacity(ctx, t, c, Options{}, r.PeakReserved, 0)
			if ctx.Err() != nil {
				return rep, fmt.Errorf("%d of %d configurations replayed: the smallest capacity of %s: %w", i, len(cs), c.Name, stopCause(ctx, err))
			}
			line.MinCapacityReplay = runs
			if err == nil {
				line.MinCapacity = &c2
			}
		}
		line.RatioToGoal = line.Ratio / GoalRatio
		line.CallsToGoal = line.CallsPerAlloc / GoalCallsPerAlloc
		line.MeetsGoal = line.Error == "" && line.Ratio <= GoalRatio && line.CallsPerAlloc <= GoalCallsPerAlloc
		rep.Results = append(rep.Results, line)
		rep.Runs = append(rep.Runs, r)
	}
	return rep, nil
}

// stopCause is err when it is ctx's own error, wrapped with where the
// work stopped, else ctx's error (the work ended, or failed otherwise, as
// ctx was done).
func stopCause(ctx context.Context, err error) error {
	if err != nil && errors.Is(err, ctx.Err()) {
		return err
	}
	return ctx.Err()
}
