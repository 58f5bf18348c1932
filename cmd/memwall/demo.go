package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/memwall/memwall/bench"
	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/pool"
)

func init() {
	register(verb{name: "demo", summary: "run memwall's main job on whatever device is present, nothing to download", run: runDemo})
}

// demoStep is one part of the demo; each capability adds one.
type demoStep struct {
	title string
	run   func(e *env, d device.Device) error
	// llama marks a step that runs memwall's Llama kernels (PTX on CUDA,
	// Go on the simulator): skipped on a backend without them.
	llama bool
}

// demoSteps lists the demo's parts in order.
func demoSteps() []demoStep {
	return []demoStep{
		{"the link: host↔device bandwidth", demoTransfer, false},
		{"a pool under load, next to the driver", demoPool, false},
		{"activations of a real ONNX model packed by liveness", func(e *env, _ device.Device) error { return planDemo(e) }, false},
		{"a PyTorch trace replayed through the pool", demoReplay, false},
		{"a model larger than its VRAM budget, streamed", demoStream, false},
		{"a Llama model generates tokens: weights placed by the plan, KV paged, activations planned", demoRun, true},
	}
}

func runDemo(e *env, args []string) error {
	fs := newFlags(e, "demo", "[--device auto|cuda|sim|cpu] [--oom-snapshot FILE]")
	var df deviceFlag
	df.add(fs)
	var snap oomSnapshot
	snap.add(fs)
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := snap.check(e); err != nil {
		return err
	}
	if err := checkFiles(e, nil, snap.out); err != nil {
		return err
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
		if s.llama && !hasLlamaKernels(in.Backend) {
			fmt.Fprintf(w, "  skipped: the %s backend has no Llama kernels yet (they are PTX and Go only; --device cuda or sim runs it)\n", in.Backend)
			continue
		}
		t0 := time.Now()
		if err := s.run(e, d); err != nil {
			return snap.handle(fmt.Errorf("demo step %q: %w", s.title, err))
		}
		fmt.Fprintf(w, "  (%.1fs)\n", time.Since(t0).Seconds())
	}
	return nil
}

// demoPool runs two allocation workloads through a pool, a size repeated
// (the per-processor caches' fast path) and random sizes (the central
// allocator), and shows what they cost: latency, memory held, driver calls.
func demoPool(e *env, d device.Device) error {
	rep, err := bench.Alloc(e.ctx, d, bench.AllocOptions{
		Mixes: []bench.Mix{{Name: repeated, Min: 1 << 20, Max: 1 << 20},
			{Name: "random 512B-64MiB", Min: 512, Max: 64 << 20}},
		Strategies: []string{"bestfit"}, Policies: []bench.Policy{{Name: "default", Options: pool.DefaultOptions(d)},
			{Name: "keep-pages", Options: keepPages(pool.DefaultOptions(d))}},
		Goroutines: []int{1, 4}, Pairs: 5000, DriverPairs: 300,
	})
	if err != nil {
		return err
	}
	async := map[string]float64{}
	for _, r := range rep.Results {
		if r.Allocator == bench.DriverAsync && r.Goroutines == 1 {
			async[r.Mix] = r.BatchP50ns
		}
	}
	for _, r := range rep.Results {
		if r.Pairs == 0 || (r.Mix == repeated && strings.HasSuffix(r.Allocator, "keep-pages")) {
			continue // a repeated size makes no driver call either way
		}
		line := fmt.Sprintf("  %-17s %-28s %d goroutine(s): free+alloc p50 %5.0f ns, p99 %7.0f ns", r.Mix, r.Allocator, r.Goroutines, r.BatchP50ns, r.P99ns)
		if strings.HasPrefix(r.Allocator, "memwall") {
			line += fmt.Sprintf(", %d driver calls in %d pairs, peak %s held", r.DeviceCalls, r.TotalPairs, humanBytes(r.ReservedPeak))
			if a := async[r.Mix]; a > 0 {
				line += fmt.Sprintf(" (%.2f× cuMemAllocAsync)", r.BatchP50ns/a)
			}
		}
		fmt.Fprintln(e.stdout, line)
	}
	fmt.Fprintln(e.stdout, "  the default keeps reserved memory near 1.02x its peak use by moving pages, which random sizes make frequent;")
	fmt.Fprintln(e.stdout, "  keep-pages (Options.TargetRatio pool.NoTarget) calls the driver only when its footprint grows, and holds more memory")
	if rep.Backend == "sim" {
		fmt.Fprintln(e.stdout, "  (no GPU: the driver's allocators are measured only on a real one)")
	}
	return nil
}

const repeated = "1 MiB repeated"

// keepPages is o with the soft memory target off.
func keepPages(o pool.Options) pool.Options {
	o.TargetRatio = pool.NoTarget
	return o
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

// hasLlamaKernels reports whether memwall's Llama kernels run on the
// backend: PTX on CUDA, their Go twins on the simulator, the host kernels
// on the CPU; Vulkan has only the SPIR-V matrix product so far.
func hasLlamaKernels(backend string) bool {
	return backend == auto.CUDA || backend == auto.Sim || backend == auto.CPU
}
