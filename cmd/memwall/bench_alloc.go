package main

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/memwall/memwall/alloc"
	"github.com/memwall/memwall/bench"
	"github.com/memwall/memwall/pool"
)

func init() { benchVerbs["alloc"] = runBenchAlloc }

func runBenchAlloc(e *env, args []string) error {
	fs := newFlags(e, "bench alloc", "[--device auto|cuda|sim] [--pairs N] [--goroutines 1,4,16] [--mixes random,4KiB,1MiB,64MiB] [--policies virtual,virtual-keep,virtual-eager,chunks] [--json] [--out FILE] [--oom-snapshot FILE]")
	var df deviceFlag
	df.add(fs)
	pairs := intFlagOf(fs, "pairs", 20000, 100, maxAllocPairs, "timed free+alloc pairs per goroutine")
	gor := fs.String("goroutines", "1,4,16", "goroutine counts to measure")
	strategies := fs.String("strategies", "bestfit,tlsf", "pool strategies to measure")
	mixes := fs.String("mixes", "", "size mixes to measure, by name or a word of it (default all: random 512B-64MiB, fixed 4KiB, 1MiB, 64MiB)")
	policies := fs.String("policies", "", "pool configurations to measure (default virtual, virtual-keep, chunks; also virtual-eager)")
	asJSON := fs.Bool("json", false, "print JSON")
	out := fs.String("out", "", "also write the JSON report to this file")
	var snap oomSnapshot
	snap.add(fs)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	var gs []int
	for _, s := range strings.Split(*gor, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > maxGoroutines {
			return usagef("--goroutines %q: want counts from 1 to %d, comma-separated", s, maxGoroutines)
		}
		gs = append(gs, n)
	}
	if most := slices.Max(gs); *pairs > maxAllocPairs/most {
		return usagef("--pairs %d on --goroutines %d: at most %d pairs in all (%d per goroutine), each recorded in about %d bytes",
			*pairs, most, maxAllocPairs, maxAllocPairs/most, allocPairBytes)
	}
	ms, err := pickMixes(*mixes)
	if err != nil {
		return err
	}
	ps, err := pickPolicies(*policies)
	if err != nil {
		return err
	}
	strats, err := pickStrategies(*strategies, ms)
	if err != nil {
		return err
	}
	of, err := checkOutput(e.temps, "--out", *out)
	if err != nil {
		return err
	}
	if err := snap.check(e); err != nil {
		return err
	}
	if err := checkFiles(e, nil, of, snap.out); err != nil {
		return err
	}
	d, _, err := df.open(e)
	if err != nil {
		return err
	}
	defer d.Close()
	pb := newProgress(e, "alloc")
	pb.unit = "rows"
	rep, err := bench.Alloc(e.ctx, d, bench.AllocOptions{Pairs: *pairs, Goroutines: gs, Mixes: ms, Policies: ps,
		Strategies: strats,
		Progress:   func(done, total int, name string) { pb.update(float64(done), float64(total), name) }})
	pb.done()
	if err != nil {
		return snap.handle(err)
	}
	var buf bytes.Buffer
	if err := writeJSON(&buf, rep); err != nil {
		return err
	}
	// The file first, then the report (see planLifetimes); a file that
	// could not be written is the error after the report.
	werr := of.write(buf.Bytes())
	if *asJSON {
		if _, err := e.stdout.Write(buf.Bytes()); err != nil {
			return err
		}
	} else {
		printBenchAlloc(e, rep)
	}
	return werr
}

// Limits of bench alloc's command line. Every goroutine draws its requests
// and records its times before the pool's results are summed up: about
// allocPairBytes per pair (a size and a victim for 1.25 pairs, a time for
// 1.56), so maxAllocPairs in all holds that under 4 GB; maxGoroutines is
// far past any processor count.
const (
	maxAllocPairs  = 100_000_000
	allocPairBytes = 33
	maxGoroutines  = 1024
)

func printBenchAlloc(e *env, rep bench.AllocReport) {
	w := e.stdout
	fmt.Fprintf(w, "%s (%s); latency of one free+alloc pair: p50 over batches of %d pairs timed together, and p50/p99 of pairs timed one by one (clock overhead %.0f ns included)\n",
		rep.Device, rep.Backend, bench.BatchPairs, rep.TimerOverheadNs)
	fmt.Fprintf(w, "%-32s %-18s %3s %5s %9s %9s %9s %12s %10s %s\n", "allocator", "mix", "gor", "live", "p50", "p50 one", "p99 one", "pairs/s", "vs async", "")
	anchor := map[string]float64{}
	for _, r := range rep.Results {
		if (r.Allocator == bench.DriverAsync || r.Allocator == bench.DriverVulkan) && r.Goroutines == 1 {
			anchor[r.Mix] = r.BatchP50ns
		}
	}
	for _, r := range rep.Results {
		vs := "-"
		if r.VsAnchor > 0 {
			vs = fmt.Sprintf("%.3f×", r.VsAnchor)
		}
		fmt.Fprintf(w, "%-32s %-18s %3d %5d %7.0fns %7.0fns %7.0fns %12.0f %10s %s\n", r.Allocator, r.Mix, r.Goroutines, r.Live, r.BatchP50ns, r.P50ns, r.P99ns, r.PairsPerSec, vs, r.Note)
	}
	if len(anchor) > 0 {
		fmt.Fprintln(w, "(every pair frees one of the goroutine's live blocks and allocates its replacement; the driver replays the pool's goroutines' requests, each of its goroutines on a stream of its own, and \"freed at once\" rows allocate and free each block back to back;")
		fmt.Fprintln(w, " \"vs async\" is the p50 over cuMemAllocAsync's on one goroutine's requests; pairs/s counts the batched pairs over their time, for every row alike. The driver is timed here through memwall's Go binding; scripts/anchor-alloc.c times it from C)")
	}
	printInterleaved(e, rep.Interleaved)
	if rep.Backend == "sim" {
		fmt.Fprintln(w, "(simulated device: the driver anchors need a real GPU; pool times are real host times)")
	}
	if rep.Backend == "vulkan" {
		fmt.Fprintf(w, "(Vulkan has no stream-ordered allocator: \"vs async\" is against %s, each block its own VkDeviceMemory)\n", bench.DriverVulkan)
	}
}

// printInterleaved prints the pool against the anchor timed in alternating
// windows, one line a mix.
func printInterleaved(e *env, rows []bench.InterleavedResult) {
	if len(rows) == 0 {
		return
	}
	w := e.stdout
	fmt.Fprintf(w, "interleaved: windows of %d pool pairs on each of its goroutines, then %d of the driver's on one, so both are timed at the same moments of the host\n",
		bench.WindowPoolPairs, bench.WindowAnchorPairs)
	for _, r := range rows {
		if r.Note != "" {
			fmt.Fprintf(w, "  %-18s %s ×%d against %s: %s\n", r.Mix, r.Pool, r.Goroutines, r.Anchor, r.Note)
			continue
		}
		fmt.Fprintf(w, "  %-18s %s ×%-2d p50 %.0f ns, %s ×1 %.0f ns: %.3f× (per window: p50 %.3f×, p90 %.3f×); pairs/s %.0f against %.0f: %.1f× (%d windows, %d pool device calls)\n",
			r.Mix, r.Pool, r.Goroutines, r.PoolBatchP50ns, r.Anchor, r.AnchorBatchP50ns, r.P50Ratio, r.WindowRatioP50, r.WindowRatioP90,
			r.PoolPairsPerSec, r.AnchorPairsPerSec, r.ThroughputRatio, r.Windows, r.DeviceCalls)
	}
}

// pickStrategies checks the comma-separated pool strategies against
// package alloc's and against the mixes: slab serves blocks up to
// alloc.SlabMaxAlloc only, and linear reclaims space only from its ring's
// ends, which a benchmark freeing blocks at random soon exhausts.
func pickStrategies(list string, mixes []bench.Mix) ([]string, error) {
	var out []string
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		switch {
		case !slices.Contains(alloc.Strategies(), s):
			return nil, usagef("--strategies: no %q (have %s)", s, strings.Join(alloc.Strategies(), ", "))
		case s == "linear":
			return nil, usagef("--strategies linear: a ring allocator reclaims space only at its ends, and the benchmark frees blocks at random (use tlsf, bestfit or buddy)")
		case s == "slab":
			for _, m := range mixes {
				if m.Max > alloc.SlabMaxAlloc {
					return nil, usagef("--strategies slab: slab serves blocks up to %s, and mix %q reaches %s (pick --mixes 4KiB, or another strategy)",
						humanBytes(alloc.SlabMaxAlloc), m.Name, humanBytes(m.Max))
				}
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// pickMixes selects from bench.DefaultMixes by comma-separated names or
// words of names ("random", "4KiB"); empty selects all.
func pickMixes(list string) ([]bench.Mix, error) {
	return pick("--mixes", list, bench.DefaultMixes(), func(m bench.Mix) string { return m.Name },
		func(m bench.Mix, w string) bool { return m.Name == w || slices.Contains(strings.Fields(m.Name), w) })
}

// pickPolicies selects from bench.DefaultPolicies and extraPolicies by
// name; empty selects bench.DefaultPolicies.
func pickPolicies(list string) ([]bench.Policy, error) {
	if list == "" {
		return bench.DefaultPolicies(), nil
	}
	return pick("--policies", list, append(bench.DefaultPolicies(), extraPolicies()...), func(p bench.Policy) string { return p.Name },
		func(p bench.Policy, w string) bool { return p.Name == w })
}

// extraPolicies are pool configurations measured by name only:
// virtual-eager is the default with no hold time (pages beyond the soft
// target move on the allocating goroutine, the default before the
// reclaimer).
func extraPolicies() []bench.Policy {
	return []bench.Policy{{Name: "virtual-eager", Options: pool.Options{Growth: pool.GrowVirtual, HoldTime: -1}}}
}

// pick selects the items of all that match a word of the comma-separated
// list (all of them when it is empty); a word that matches none is a
// usage error naming flag and what there is.
func pick[T any](flag, list string, all []T, name func(T) string, match func(T, string) bool) ([]T, error) {
	if list == "" {
		return all, nil
	}
	var out []T
	for _, w := range strings.Split(list, ",") {
		w = strings.TrimSpace(w)
		n := len(out)
		for _, x := range all {
			if match(x, w) {
				out = append(out, x)
			}
		}
		if len(out) == n {
			names := make([]string, len(all))
			for i, x := range all {
				names[i] = name(x)
			}
			return nil, usagef("%s: no %q (have %s)", flag, w, strings.Join(names, ", "))
		}
	}
	return out, nil
}
