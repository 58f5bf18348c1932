package main

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/trace"
	"github.com/memwall/memwall/trace/replay"
	"github.com/memwall/memwall/viz"
)

func init() {
	register(verb{name: "replay", summary: "replay a PyTorch (or memwall) allocation trace through memwall's pool, against PyTorch's own figures", run: runReplay})
}

func runReplay(e *env, args []string) error {
	fs := newFlags(e, "replay", "TRACE [--strategy LIST] [--capacity BYTES] [--free-at completed|requested] [--lenient] [--json] [--html FILE]")
	strategy := fs.String("strategy", "all", "configurations to replay: all, default, a strategy (bestfit, tlsf, buddy) or configuration names, comma-separated")
	capacity := fs.String("capacity", "", "replay with this fixed pool capacity (e.g. 600MiB) instead of searching the smallest one")
	freeAt := fs.String("free-at", "completed", "free blocks at free_completed (completed) or free_requested (requested)")
	lenient := fs.Bool("lenient", false, "skip and count bad records instead of failing")
	asJSON := fs.Bool("json", false, "print JSON")
	html := fs.String("html", "", "write a self-contained HTML page (live vs reserved over time, address map at the peak) to FILE")
	noSearch := fs.Bool("no-search", false, "skip the search for the smallest capacity (one replay per configuration)")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("want exactly one trace file, got %d arguments", len(pos))
	}
	fa, err := replay.ParseFreeAt(*freeAt)
	if err != nil {
		return usagef("--free-at: %v", err)
	}
	var capBytes uint64
	if *capacity != "" {
		if capBytes, err = flagSize("capacity", *capacity, false); err != nil {
			return err
		}
	}
	cs, err := replay.SelectConfigs(replay.Configs(), *strategy)
	if err != nil {
		return usagef("--strategy: %v", err)
	}
	if len(cs) == 0 {
		return usagef("--strategy %q selects no configuration", *strategy)
	}
	hf, err := checkOutput(e.temps, "--html", *html)
	if err != nil {
		return err
	}
	if err := checkFiles(e, []input{{"TRACE", pos[0]}}, hf); err != nil {
		return err
	}
	// A trace may be read twice (its OOM below): a pipe is copied first.
	remove, _, err := spoolPipe(e, "TRACE", pos[0])
	if err != nil {
		return err
	}
	defer remove()
	t, err := loadTrace(e.local(pos[0]), pos[0], replay.LoadOptions{FreeAt: fa, Lenient: *lenient})
	if err != nil {
		return err
	}
	var oom *traceOOM
	if t.Meta.OOMs > 0 {
		if oom, err = readOOM(e.local(pos[0]), pos[0], *lenient); err != nil {
			return err
		}
	}
	if t.Allocs == 0 {
		if oom != nil {
			// An OOM snapshot of a pool that held nothing: no replay, but
			// the failure itself.
			return reportEmptyOOM(e, pos[0], t.Events, oom, hf, *asJSON)
		}
		return fmt.Errorf("%s: no allocations to replay (%d events read)", pos[0], t.Events)
	}
	t.Name = filepath.Base(pos[0])
	// The timeline is always sampled: the fragmentation figures come from it.
	pb := newProgress(e, "replay")
	pb.unit = "configurations"
	rep, err := replay.Evaluate(e.ctx, t, cs, replay.EvalOptions{Capacity: capBytes, NoSearch: *noSearch,
		Timeline: true, AddressMap: *html != "",
		Progress: func(i, n int, name string) { pb.update(float64(i), float64(n), name) }})
	pb.done()
	if err != nil {
		return err
	}
	rep.FreeAt = fa.String()
	var page []byte
	if hf != nil {
		if page, err = replayHTML(rep, oom); err != nil {
			return err
		}
	}
	// The page first, so that it is there when the report that names it
	// is read (and whatever the report's reader does); a page that could
	// not be written is the error after the report.
	werr := hf.write(page)
	if *asJSON {
		if err := writeJSON(e.stdout, replayJSON(rep, oom)); err != nil {
			return err
		}
	} else {
		printReplay(e.stdout, rep, t)
		if oom != nil {
			fmt.Fprintf(e.stdout, "\n%s\n", oom.note())
		}
	}
	if werr != nil {
		return werr
	}
	if hf != nil && !*asJSON {
		fmt.Fprintf(e.stdout, "\nwrote %s\n", *html)
	}
	var failed []string
	first := ""
	for _, r := range rep.Results {
		if r.Error != "" {
			failed = append(failed, r.Config)
			if first == "" {
				first = tidyMessage("replay", r.Error)
			}
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d configurations could not replay the trace: %s; the first: %s", len(failed), len(rep.Results), strings.Join(failed, ", "), first)
	}
	return nil
}

// loadTrace loads the trace at path (a pipe's copy: see spoolPipe) as
// name, which its errors and its format's guess from the extension use.
func loadTrace(path, name string, o replay.LoadOptions) (*replay.Trace, error) {
	r, done, err := openTrace(path, name, o.Lenient)
	if err != nil {
		return nil, err
	}
	defer done()
	return replay.Read(r, name, o)
}

// openTrace opens the trace at path as name (see loadTrace); done closes it.
func openTrace(path, name string, lenient bool) (r *trace.Reader, done func(), err error) {
	opts := trace.Options{Lenient: lenient}
	if path == name {
		if r, err = trace.Open(path, opts); err != nil {
			return nil, nil, err
		}
		return r, func() { r.Close() }, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("trace: %w", err)
	}
	if r, err = trace.NewReader(f, name, opts); err != nil {
		f.Close()
		return nil, nil, err
	}
	return r, func() { r.Close(); f.Close() }, nil
}

// replayJSON is the report as JSON with no placeholder: a configuration
// whose replay took no sample (it failed at once) has null fragmentation
// figures rather than the initial 1 and 0.
func replayJSON(rep *replay.Report, oom *traceOOM) any {
	b, err := json.Marshal(rep)
	if err != nil {
		return rep
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return rep
	}
	if oom != nil {
		m["oom"] = oom
	}
	results, _ := m["results"].([]any)
	for i, r := range results {
		line, ok := r.(map[string]any)
		if !ok || i >= len(rep.Runs) || rep.Runs[i] == nil {
			continue
		}
		if len(rep.Runs[i].Timeline) == 0 {
			line["fragmentation_min"], line["fragmentation_mean"] = nil, nil
		}
	}
	return m
}

// printReplay writes the human table.
func printReplay(w io.Writer, rep *replay.Report, t *replay.Trace) {
	fmt.Fprintf(w, "trace %s (%s, freed at free_%s): %d events, %d allocs, peak live %s\n",
		rep.Trace, rep.Format, rep.FreeAt, rep.Events, rep.Allocs, humanBytes(rep.PeakLive))
	if rep.Skipped > 0 {
		fmt.Fprintf(w, "skipped %d bad records (first: %v)\n", rep.Skipped, t.FirstSkipped)
	}
	switch {
	case rep.PyTorchReserved != nil && rep.PyTorchRatio != nil:
		fmt.Fprintf(w, "PyTorch reserved %s (%.2f× peak live)", humanBytes(*rep.PyTorchReserved), *rep.PyTorchRatio)
		if rep.PyTorchDeviceAllocs != nil {
			fmt.Fprintf(w, " with %d cudaMalloc calls", *rep.PyTorchDeviceAllocs)
		}
		if rep.PyTorchDriverPer1k != nil {
			fmt.Fprintf(w, " (%.0f µs in the driver per 1,000 allocs)", *rep.PyTorchDriverPer1k)
		}
		fmt.Fprintln(w)
	default:
		fmt.Fprintln(w, "PyTorch's reserved bytes: not in this trace")
	}
	fmt.Fprintf(w, "goal: peak reserved ≤ %.2f× peak live with device calls ≤ %.0f%% of allocs\n\n", rep.GoalRatio, 100*rep.GoalCallShare)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "configuration\tpeak reserved\t× live\tutil\tdevice calls\t% allocs\tdriver µs/1k\tmin capacity\tgoal\t")
	for _, r := range rep.Results {
		name := r.Config
		if name == rep.Default {
			name += " *"
		}
		if r.Error != "" {
			fmt.Fprintf(tw, "%s\t%s\t\t\t%d\t\t\t\tfailed\t\n", name, humanBytes(r.PeakReserved), r.DeviceCalls)
			continue
		}
		minCap := "-"
		if r.MinCapacity != nil {
			minCap = humanBytes(*r.MinCapacity)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%.1f%%\t%d\t%.2f%%\t%.0f\t%s\t%s\t\n", name, humanBytes(r.PeakReserved), r.Ratio,
			100*r.Utilization, r.DeviceCalls, 100*r.CallsPerAlloc, r.DriverPer1k, minCap, goalText(r))
	}
	tw.Flush()
	fmt.Fprintln(w, "\n* the pool's default. goal: met, or how far off (memory ×, calls ×) the 1.05× / 1% bounds.")
	fmt.Fprintln(w, "driver µs/1k: the device calls' time per 1,000 allocations at the H200's costs (cuMemAlloc 34 µs, cuMemFree 30 µs, page map 55 µs, unmap 21 µs).")
	for _, r := range rep.Results {
		if r.Error != "" {
			fmt.Fprintf(w, "%s failed: %s\n", r.Config, tidyMessage("replay", r.Error))
		}
	}
}

func goalText(r replay.ResultJSON) string {
	if r.MeetsGoal {
		return "met"
	}
	s := ""
	if r.RatioToGoal > 1 {
		s = fmt.Sprintf("mem %.3f×", r.RatioToGoal)
	}
	if r.CallsToGoal > 1 {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("calls %.1f×", r.CallsToGoal)
	}
	return s
}

// replayHTML draws the report's timelines and the default's address map at
// the peak as a self-contained page.
func replayHTML(rep *replay.Report, oom *traceOOM) ([]byte, error) {
	pic := viz.ReplayPicture{Title: "memwall replay: " + rep.Trace}
	pic.Notes = append(pic.Notes, fmt.Sprintf("%d events, %d allocs, peak live %s.", rep.Events, rep.Allocs, humanBytes(rep.PeakLive)))
	if oom != nil {
		// The trace's own memory at its failure is the picture to see;
		// the replays' timelines stay.
		pic.Notes = append(pic.Notes, oom.note())
		pic.Map = oom.picture()
	}
	if rep.PyTorchReserved != nil && rep.PyTorchRatio != nil {
		pic.Notes = append(pic.Notes, fmt.Sprintf("PyTorch reserved %s (%.2f× peak live).", humanBytes(*rep.PyTorchReserved), *rep.PyTorchRatio))
	}
	for i, r := range rep.Runs {
		line := rep.Results[i]
		s := viz.ReplaySeries{Name: fmt.Sprintf("%s: peak reserved %s (%.3f×), %d device calls", line.Config, humanBytes(line.PeakReserved), line.Ratio, line.DeviceCalls)}
		if line.Error != "" {
			s.Name = line.Config + ": failed: " + line.Error
		}
		for _, smp := range r.Timeline {
			s.X = append(s.X, float64(smp.Op))
			s.Live = append(s.Live, smp.Live)
			s.Reserved = append(s.Reserved, smp.Reserved)
		}
		pic.Series = append(pic.Series, s)
		if pic.Map == nil && r.Map != nil {
			m := &viz.ReplayMap{Name: fmt.Sprintf("%s, after op %d", line.Config, r.Map.Op)}
			for _, sp := range r.Map.Reserved {
				m.Reserved = append(m.Reserved, viz.ReplaySpan{Off: sp.Off, Size: sp.Size})
			}
			for _, sp := range r.Map.Blocks {
				m.Blocks = append(m.Blocks, viz.ReplaySpan{Off: sp.Off, Size: sp.Size})
			}
			pic.Map = m
		}
	}
	var buf bytes.Buffer
	if err := viz.ReplayHTML(&buf, pic); err != nil {
		return nil, fmt.Errorf("html: %w", err)
	}
	return buf.Bytes(), nil
}

//go:embed demodata/bert_base_varlen.csv.gz
var demoTrace []byte

// demoReplay replays the bundled BERT trace through the pool's default
// configuration (on the simulated device: a replay measures placement, not
// the GPU) and compares it with what PyTorch reserved.
func demoReplay(e *env, d device.Device) error {
	r, err := trace.NewReader(bytes.NewReader(demoTrace), "bert_base_varlen.csv.gz", trace.Options{})
	if err != nil {
		return err
	}
	defer r.Close()
	t, err := replay.Read(r, "bert_base_varlen.csv.gz", replay.LoadOptions{})
	if err != nil {
		return err
	}
	def := replay.DefaultConfig()
	res, err := replay.Run(e.ctx, t, def, replay.Options{Samples: -1})
	if err != nil {
		return err
	}
	w := e.stdout
	fmt.Fprintf(w, "  BERT-base, 150 forward calls of varying shape: %d allocs, peak live %s\n", t.Allocs, humanBytes(t.PeakLive))
	fmt.Fprintf(w, "  memwall pool (%s): reserved %s, %.2f× peak live\n", def.Name, humanBytes(res.PeakReserved), res.Ratio)
	if v, ok := t.PyTorchReserved(); ok && t.PeakLive > 0 {
		fmt.Fprintf(w, "  PyTorch's caching allocator:           reserved %s, %.2f× peak live\n", humanBytes(v), float64(v)/float64(t.PeakLive))
	}
	fmt.Fprintf(w, "  device calls: %d (%.2f%% of allocs", res.DeviceCalls, 100*float64(res.DeviceCalls)/float64(max(t.Allocs, 1)))
	if n, ok := t.PyTorchDeviceAllocs(); ok {
		fmt.Fprintf(w, "; PyTorch made %d cudaMalloc calls", n)
	}
	fmt.Fprintf(w, "); replayed at %.1fM events/s\n", float64(res.Ops)/res.Elapsed.Seconds()/1e6)
	return nil
}
