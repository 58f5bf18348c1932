package main

import (
	"fmt"
	"time"

	"github.com/memwall/memwall/bench"
	"github.com/memwall/memwall/device"
)

func init() {
	register(verb{name: "demo", summary: "run memwall's main job on whatever device is present, nothing to download", run: runDemo})
}

// demoStep is one part of the demo; each capability adds one.
type demoStep struct {
	title string
	run   func(e *env, d device.Device) error
}

// demoSteps lists the demo's parts in order.
func demoSteps() []demoStep {
	return []demoStep{
		{"the link: host↔device bandwidth", demoTransfer},
	}
}

func runDemo(e *env, args []string) error {
	fs := newFlags(e, "demo", "[--device auto|cuda|sim]")
	var df deviceFlag
	fs.StringVar(&df.backend, "device", "auto", "device backend: auto, cuda or sim")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	d, ch, err := df.open(e)
	if err != nil {
		return err
	}
	defer d.Close()
	in := d.Info()
	free, total, _ := d.MemInfo()
	w := e.stdout
	fmt.Fprintf(w, "memwall demo on %s (%s)\n", in.Name, in.Backend)
	fmt.Fprintf(w, "  %s\n", ch.Reason)
	fmt.Fprintf(w, "  %s total, %s free; %s\n", humanBytes(total), humanBytes(free), strategyFor(in))
	steps := demoSteps()
	for i, s := range steps {
		fmt.Fprintf(w, "\n[%d/%d] %s\n", i+1, len(steps), s.title)
		t0 := time.Now()
		if err := s.run(e, d); err != nil {
			return fmt.Errorf("demo step %q: %w", s.title, err)
		}
		fmt.Fprintf(w, "  (%.1fs)\n", time.Since(t0).Seconds())
	}
	return nil
}

func demoTransfer(e *env, d device.Device) error {
	rep, err := bench.Transfer(e.ctx, d, bench.TransferOptions{Bytes: 64 << 20, Reps: 5})
	if err != nil {
		return err
	}
	for _, r := range rep.Results {
		fmt.Fprintf(e.stdout, "  %-13s %7.1f GB/s\n", r.Name, r.GBps)
	}
	pin, _ := rep.Get("h2d_pinned")
	pag, _ := rep.Get("h2d_pageable")
	fmt.Fprintf(e.stdout, "  pinned H2D is %s pageable: a model streamed from pinned memory runs at most %.1f GB/s.\n",
		ratio(pin.GBps, pag.GBps), pin.GBps)
	return nil
}
