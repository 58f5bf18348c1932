package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
)

// runShaped does what `memwall run` does on d: kernels, a device pool
// limited to the budget and a pinned host pool, the engine planned with
// the chunk and slots chosen from the budget, a prompt of several chunks
// and some decode steps, then everything closed in order. It returns the
// pools' stats after the engine closed (before the pools themselves close)
// and the first error.
func runShaped(ctx context.Context, d *sim.Device, w *fault.Config, m *llama.Model, budget uint64, prompt []int) (devStats, hostStats pool.Stats, runErr error) {
	fd := fault.Wrap(d, w)
	ks, err := kernels.Load(fd, nil)
	if err != nil {
		return devStats, hostStats, err
	}
	defer ks.Close()
	po := pool.DefaultOptions(fd)
	po.Limit = budget
	dev, err := pool.New(fd, po)
	if err != nil {
		return devStats, hostStats, err
	}
	defer dev.Close()
	host, err := pool.NewHost(fd, pool.Options{Name: "host"})
	if err != nil {
		return devStats, hostStats, err
	}
	defer host.Close()
	e, err := engine.New(ctx, fd, ks, dev, host, m, engine.Options{Budget: budget, MaxTokens: len(prompt) + 8, PromptTokens: 48, Slots: 2})
	if err == nil {
		_, err = e.Generate(ctx, prompt, engine.Sampling{MaxNew: 6, IgnoreEOS: true}, nil)
		err = errors.Join(err, e.Close())
	}
	return dev.Stats(), host.Stats(), err
}

// TestFaultMidRun: a copy (of any kind, then host-to-device only, then by
// bytes moved) or an allocation (device memory — the attention kernel's
// scratch, taken on the first decode step —, physical pages, mappings,
// pinned host memory) fails at a random point of a streaming run: the run
// ends with an error naming the injected failure, within a time limit (no
// hang, no panic), and every byte is given back — the device and host
// pools hold nothing once the engine is closed, and the simulated device
// has no allocation, physical page or pinned byte left once the pools and
// kernels close.
func TestFaultMidRun(t *testing.T) {
	if onGPU() {
		t.Skip("the simulator's own allocation counts")
	}
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	// Past 128 positions the attention kernel splits its work and takes a
	// scratch buffer from the device on the first decode step: an
	// allocation in the middle of the run.
	p := prompt(130, m.Config.Vocab, 5)
	newSim := func() *sim.Device {
		o := sim.DefaultOptions()
		o.TotalBytes, o.Kernels, o.Granularity, o.Shuffle = 1<<30, kernels.Sim(), 64<<10, true
		return sim.New(o)
	}
	// The budget streams most blocks: the minimum plus one block.
	var budget uint64
	{
		o := engine.Options{Budget: 1, MaxTokens: len(p) + 8, PromptTokens: 48, Slots: 2}
		_, err := engine.Estimate(ctx, m, o, newSim().Info())
		var be *engine.BudgetError
		if !errors.As(err, &be) {
			t.Fatal(err)
		}
		b := m.Tensors.Blocks[0]
		budget = be.Minimum + b.Q.Bytes + b.K.Bytes + b.V.Bytes + b.O.Bytes + b.Gate.Bytes + b.Up.Bytes + b.Down.Bytes + 64<<10
	}
	// A clean run counts each kind of call.
	clean := &fault.Config{}
	if _, _, err := runShaped(ctx, newSim(), clean, m, budget, p); err != nil {
		t.Fatal(err)
	}
	c := clean.Counts()
	if c.Copies == 0 || c.CopyHtoD == 0 || c.Alloc == 0 || c.CreatePhysical == 0 || c.HostAlloc == 0 {
		t.Fatalf("clean run: %+v", c)
	}
	var totalBytes uint64
	{
		d := newSim()
		if _, _, err := runShaped(ctx, d, &fault.Config{}, m, budget, p); err != nil {
			t.Fatal(err)
		}
		st := d.Stats()
		totalBytes = st.HtoDBytes + st.DtoHBytes + st.DtoDBytes
	}
	t.Logf("clean run: %d copies (%d host-to-device), %d bytes copied, %d allocations, %d physical pages, %d maps, %d pinned host allocations",
		c.Copies, c.CopyHtoD, totalBytes, c.Alloc, c.CreatePhysical, c.Map, c.HostAlloc)
	rng := rand.New(rand.NewPCG(17, 4))
	// A failed copy ends the run; a failed allocation may be absorbed (the
	// pool gives back free pages and retries a refused map), so the run
	// either succeeds or fails naming the fault — every byte comes back
	// either way. mustFail kinds fail every run; a growth that fails from
	// some page on fails at least one run.
	kinds := []struct {
		name     string
		calls    uint64
		rule     func(n uint64) fault.Rules
		says     string
		mustFail bool
	}{
		{"any copy", c.Copies, func(n uint64) fault.Rules { return fault.Rules{FailCopies: fault.CopyRule{Call: fault.Nth(n)}} }, "copy of", true},
		{"host-to-device copies from", c.CopyHtoD, func(n uint64) fault.Rules {
			return fault.Rules{FailCopies: fault.CopyRule{Kinds: fault.HtoD, Call: fault.From(n)}}
		}, "host-to-device copy", true},
		{"copy past bytes", totalBytes, func(n uint64) fault.Rules {
			return fault.Rules{FailCopies: fault.CopyRule{Bytes: n - 1}}
		}, "copy of", true},
		{"alloc", c.Alloc, func(n uint64) fault.Rules { return fault.Rules{Alloc: fault.Nth(n)} }, "alloc", true},
		{"physical from", c.CreatePhysical, func(n uint64) fault.Rules { return fault.Rules{CreatePhysical: fault.From(n)} }, "physical", false},
		{"physical", c.CreatePhysical, func(n uint64) fault.Rules { return fault.Rules{CreatePhysical: fault.Nth(n)} }, "physical", false},
		{"map", c.Map, func(n uint64) fault.Rules { return fault.Rules{Map: fault.Nth(n)} }, "map", false},
		{"pinned host", c.HostAlloc, func(n uint64) fault.Rules { return fault.Rules{HostAlloc: fault.Nth(n)} }, "pinned host alloc", true},
	}
	failedRuns := map[string]int{}
	for _, k := range kinds {
		if k.calls == 0 {
			continue
		}
		for range short(2, 6) {
			n := 1 + rng.Uint64N(k.calls)
			t.Run(fmt.Sprintf("%s/%d", k.name, n), func(t *testing.T) {
				d := newSim()
				cfg := &fault.Config{}
				cfg.Set(k.rule(n))
				type result struct {
					err        error
					dev, host  pool.Stats
					panicValue any
				}
				done := make(chan result, 1)
				go func() {
					var r result
					defer func() {
						r.panicValue = recover()
						done <- r
					}()
					r.dev, r.host, r.err = runShaped(ctx, d, cfg, m, budget, p)
				}()
				var r result
				select {
				case r = <-done:
				case <-time.After(60 * time.Second):
					t.Fatalf("the run did not end within 60 s")
				}
				if r.panicValue != nil {
					t.Fatalf("panic: %v", r.panicValue)
				}
				injected := cfg.Counts().Injected
				switch {
				case injected == 0:
					t.Fatalf("the fault never fired (%+v)", cfg.Rules())
				case r.err == nil && k.mustFail:
					t.Fatalf("%d faults injected, the run succeeded", injected)
				case r.err == nil:
					t.Logf("the pool absorbed the injected %s", k.says)
				default:
					failedRuns[k.name]++
				}
				if r.err != nil && (!errors.Is(r.err, fault.ErrInjected) || !strings.Contains(r.err.Error(), k.says)) {
					t.Fatalf("error %q does not name the injected %s", r.err, k.says)
				}
				if r.dev.UsedBytes != 0 || r.dev.LiveBlocks != 0 || r.host.UsedBytes != 0 || r.host.LiveBlocks != 0 {
					t.Errorf("after %v: device pool %d bytes in %d blocks, host pool %d in %d", r.err, r.dev.UsedBytes, r.dev.LiveBlocks, r.host.UsedBytes, r.host.LiveBlocks)
				}
				if st := d.Stats(); st.AllocatedBytes != 0 || st.PhysicalBytes != 0 || st.PinnedHostBytes != 0 || st.AllocCalls != st.FreeCalls {
					t.Errorf("after %v: the device holds %d allocated, %d physical, %d pinned bytes; %d allocations, %d frees",
						r.err, st.AllocatedBytes, st.PhysicalBytes, st.PinnedHostBytes, st.AllocCalls, st.FreeCalls)
				}
			})
		}
	}
	t.Logf("runs that failed, by fault: %v", failedRuns)
	if failedRuns["physical from"] == 0 {
		t.Errorf("no run failed on a physical page refused from some point on")
	}
}
