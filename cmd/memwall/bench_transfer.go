package main

import (
	"fmt"

	"github.com/memwall/memwall/bench"
)

func init() { benchVerbs["transfer"] = runBenchTransfer }

type transferJSON struct {
	bench.TransferReport
	Reason string `json:"device_choice"`
	// PinnedOverPageable is H2D pinned over H2D pageable bandwidth; null
	// when the pageable figure is missing or zero.
	PinnedOverPageable *float64 `json:"pinned_over_pageable"`
}

func runBenchTransfer(e *env, args []string) error {
	fs := newFlags(e, "bench transfer", "[--device auto|cuda|sim] [--size BYTES] [--reps N] [--json]")
	var df deviceFlag
	df.add(fs)
	size := fs.String("size", "256MiB", "bytes per copy")
	reps := intFlagOf(fs, "reps", 10, 1, 10000, "timed copies per case (median reported)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	n, err := flagSize("size", *size, false)
	if err != nil {
		return err
	}
	d, ch, err := df.open(e)
	if err != nil {
		return err
	}
	defer d.Close()
	if free, _, err := d.MemInfo(); err == nil && 2*n > free {
		return fmt.Errorf("--size %s: the copies need two device buffers of it, %s, and %s has %s free", *size, humanBytes(2*n), d.Info().Name, humanBytes(free))
	}
	pb := newProgress(e, "transfer")
	pb.unit = "kinds of copy"
	rep, err := bench.Transfer(e.ctx, d, bench.TransferOptions{Bytes: n, Reps: *reps,
		Progress: func(done, total int, name string) { pb.update(float64(done), float64(total), name) }})
	pb.done()
	if err != nil {
		return err
	}
	out := transferJSON{TransferReport: rep, Reason: ch.Reason}
	pin, _ := rep.Get("h2d_pinned")
	pag, _ := rep.Get("h2d_pageable")
	if pag.GBps > 0 {
		r := pin.GBps / pag.GBps
		out.PinnedOverPageable = &r
	}
	if *asJSON {
		return writeJSON(e.stdout, out)
	}
	printTransfer(e, rep)
	if rep.Backend == "sim" {
		fmt.Fprintln(e.stdout, "(simulated device: times come from its model, not from hardware)")
	}
	return nil
}

func printTransfer(e *env, rep bench.TransferReport) {
	w := e.stdout
	fmt.Fprintf(w, "%s (%s)\n", rep.Device, rep.Backend)
	fmt.Fprintf(w, "%-14s %10s %10s %10s %10s\n", "copy", "size", "median", "best", "worst")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%-14s %10s %7.1f GB/s %5.1f GB/s %5.1f GB/s\n", r.Name, humanBytes(r.Size), r.GBps, r.Best, r.Worst)
	}
	pin, _ := rep.Get("h2d_pinned")
	pag, _ := rep.Get("h2d_pageable")
	fmt.Fprintf(w, "pinned H2D is %s pageable H2D: stream weights from pinned memory.\n", ratio(pin.GBps, pag.GBps))
}
