package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/format/weights"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/residency"
)

// tinyModel writes the synthetic Tiny model in the format and opens it.
func tinyModel(t testing.TB, formatName string) *format.Model {
	t.Helper()
	path, err := synth.WriteTiny(context.Background(), t.TempDir(), formatName)
	if err != nil {
		t.Fatal(err)
	}
	m, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func simDevice(t testing.TB, mod func(*sim.Options)) *sim.Device {
	o := sim.DefaultOptions()
	o.Kernels = kernels.Sim()
	if mod != nil {
		mod(&o)
	}
	d := sim.New(o)
	t.Cleanup(func() { d.Close() })
	return d
}

func loadKernels(t testing.TB, d device.Device) *kernels.Set {
	ks, err := kernels.Load(d, os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ks.Close() })
	return ks
}

// simCost is the cost model of a sim device's matrix kernels.
func simCost(d *sim.Device) plan.MatmulCost {
	o := d.Options()
	return plan.Roofline(o.PeakFLOPS, o.DeviceGBps*1e9, o.LaunchLatency)
}

// planFor plans m's groups under budget.
func planFor(t testing.TB, m *format.Model, budget uint64, o plan.WeightOptions) *plan.WeightPlan {
	t.Helper()
	groups, err := plan.GroupWeights(m.Tensors)
	if err != nil {
		t.Fatal(err)
	}
	o.Budget = budget
	if o.LinkGBps == 0 {
		o.LinkGBps = 25
		o.CopyLatency = 2 * time.Microsecond
	}
	p, err := plan.PlanWeights(groups, o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// halfBudget is a budget that keeps the stand-alone groups and one block
// of the Tiny model resident and streams the other three.
func halfBudget(t testing.TB, m *format.Model, o plan.WeightOptions) uint64 {
	o.LinkGBps = 25
	// One byte short of everything: two slots take two blocks' room, a
	// third block no longer fits whole.
	return planFor(t, m, 1<<40, o).PeakBytes - 1
}

// pageUp rounds n up to the simulator's 2 MiB pages, what the pools map.
func pageUp(n uint64) uint64 { return (n + 2<<20 - 1) / (2 << 20) * (2 << 20) }

func TestStreamSimTiny(t *testing.T) {
	for _, f := range []string{synth.Safetensors, synth.GGUF} {
		for _, tokens := range []int{1, 16} {
			t.Run(fmt.Sprintf("%s/tokens=%d", f, tokens), func(t *testing.T) {
				m := tinyModel(t, f)
				d := simDevice(t, nil)
				ks := loadKernels(t, d)
				wo := plan.WeightOptions{Tokens: tokens, Cost: simCost(d), Ctx: 64}
				p := planFor(t, m, halfBudget(t, m, wo), wo)
				if len(p.Streamed()) == 0 || len(p.Streamed()) == len(p.Groups) {
					t.Fatalf("plan streams %d of %d groups; want some of each", len(p.Streamed()), len(p.Groups))
				}
				rep, err := Stream(context.Background(), d, m, p, 4, StreamOptions{Kernels: ks, ContextBytes: 1000})
				if err != nil {
					t.Fatal(err)
				}
				if !rep.Verified || rep.Checked == 0 {
					t.Errorf("verified %v, %d products checked (%s)", rep.Verified, rep.Checked, rep.VerifyNote)
				}
				if rep.Source != residency.Register.String() || rep.Slots != 2 || rep.Prefetch != 1 {
					t.Errorf("source %s, %d slots, prefetch %d; want %s, 2, 1", rep.Source, rep.Slots, rep.Prefetch, residency.Register)
				}
				// The pools map whole pages: the device sees the plan's
				// bytes rounded up to them, KV cache aside (nothing
				// allocates it here).
				lo, hi := p.PeakBytes-p.KVBytes, pageUp(p.PeakBytes)
				if rep.PeakBytes < lo || rep.PeakBytes > hi || rep.FootprintBytes != rep.PeakBytes+1000 {
					t.Errorf("measured peak %d (footprint %d), want %d..%d", rep.PeakBytes, rep.FootprintBytes, lo, hi)
				}
				steady := SteadyStep(p, 1, 8).Seconds()
				if math.Abs(rep.SecondsPerStep-steady)/steady > 0.02 {
					t.Errorf("step %.6fs, predicted steady step %.6fs", rep.SecondsPerStep, steady)
				}
				if cold := p.StepTime.Seconds(); rep.SecondsPerStep > cold*1.001 {
					t.Errorf("step %.6fs is longer than the plan's cold step %.6fs", rep.SecondsPerStep, cold)
				}
				st := rep.Residency
				if want := uint64(5 * len(p.Streamed())); st.Copies < want || st.StreamedBytes < 5*p.StreamedBytes {
					t.Errorf("residency copied %d groups (%d bytes) in 5 steps of %d streamed groups", st.Copies, st.StreamedBytes, len(p.Streamed()))
				}
				t.Logf("streamed %d B/step: step %.3gs (steady %.3gs, cold %.3gs) copy %.3gs compute %.3gs stall %.3gs, %.1f GB/s, overlap %.3f",
					p.StreamedBytes, rep.SecondsPerStep, steady, p.StepTime.Seconds(), rep.CopySecondsPerStep, rep.ComputeSecondsPerStep,
					rep.StallSecondsPerStep, rep.AchievedGBps, rep.OverlapEfficiency)
				if st := d.Stats(); st.AllocatedBytes != 0 || st.PinnedHostBytes != 0 {
					t.Errorf("after Stream: %d device bytes, %d pinned host bytes still allocated", st.AllocatedBytes, st.PinnedHostBytes)
				}
			})
		}
	}
}

// runOnce streams the Tiny model one step after the warm-up (three of four
// blocks streamed, or with all, every group).
func runOnce(t *testing.T, d device.Device, m *format.Model, o StreamOptions, all bool) (*StreamReport, error) {
	t.Helper()
	ks := loadKernels(t, d)
	wo := plan.WeightOptions{Tokens: 2}
	budget := halfBudget(t, m, wo)
	if all {
		budget = planFor(t, m, 1<<40, wo).MinimumBytes
	}
	p := planFor(t, m, budget, wo)
	if all && len(p.Streamed()) != len(p.Groups) {
		t.Fatalf("at the minimum budget %d of %d groups stream", len(p.Streamed()), len(p.Groups))
	}
	o.Kernels = ks
	return Stream(context.Background(), d, m, p, 2, o)
}

// TestComputeWaitNeeded runs on a simulator that executes ready work in a
// random order: with the compute stream's wait on residency's event every
// seed verifies; without it some seed multiplies a slot before its copy
// landed, and the check fails.
func TestComputeWaitNeeded(t *testing.T) {
	m := tinyModel(t, synth.Safetensors)
	for _, noWait := range []bool{false, true} {
		t.Run(fmt.Sprintf("noComputeWait=%v", noWait), func(t *testing.T) {
			corrupt := 0
			const seeds = 12
			for seed := uint64(1); seed <= seeds; seed++ {
				d := simDevice(t, func(o *sim.Options) { o.Shuffle, o.Seed = true, seed })
				_, err := runOnce(t, d, m, StreamOptions{Residency: residency.Options{Source: residency.Register}, noComputeWait: noWait, verifyAll: true}, true)
				switch {
				case err == nil:
				case errors.Is(err, ErrVerify) && errors.Is(err, kernels.ErrMismatch):
					corrupt++
				default:
					t.Fatalf("seed %d: %v", seed, err)
				}
				if st := d.Stats(); st.AllocatedBytes != 0 || st.PinnedHostBytes != 0 {
					t.Errorf("seed %d: %d device, %d pinned bytes left", seed, st.AllocatedBytes, st.PinnedHostBytes)
				}
			}
			if noWait && corrupt == 0 {
				t.Errorf("no seed of %d saw corrupted data without the wait", seeds)
			}
			if !noWait && corrupt != 0 {
				t.Errorf("%d of %d seeds saw corrupted data with the wait", corrupt, seeds)
			}
		})
	}
}

// TestStreamSources streams from each host source and checks the data.
func TestStreamSources(t *testing.T) {
	m := tinyModel(t, synth.GGUF)
	cases := []struct {
		name string
		opt  func(*sim.Options)
		o    residency.Options
		want residency.Source
	}{
		{"auto registers", nil, residency.Options{}, residency.Register},
		{"auto without read-only register copies", func(o *sim.Options) { o.ReadOnlyHostRegister = false }, residency.Options{}, residency.Pinned},
		{"auto with little host memory bounces", func(o *sim.Options) { o.ReadOnlyHostRegister = false }, residency.Options{HostBytes: 1 << 20, BounceBytes: 256 << 10}, residency.Bounce},
		{"pinned", nil, residency.Options{Source: residency.Pinned}, residency.Pinned},
		{"bounce, small buffers", nil, residency.Options{Source: residency.Bounce, BounceBytes: 100 << 10, Bounces: 2}, residency.Bounce},
		{"bounce under shuffle", func(o *sim.Options) { o.Shuffle, o.Seed = true, 7 }, residency.Options{Source: residency.Bounce, BounceBytes: 64 << 10, Bounces: 2}, residency.Bounce},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := simDevice(t, c.opt)
			rep, err := runOnce(t, d, m, StreamOptions{Residency: c.o, verifyAll: true}, false)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Source != c.want.String() || !rep.Verified {
				t.Errorf("source %s verified %v; want %s verified", rep.Source, rep.Verified, c.want)
			}
			if st := d.Stats(); st.PinnedHostBytes != 0 || st.AllocatedBytes != 0 {
				t.Errorf("%d pinned host bytes, %d device bytes left", st.PinnedHostBytes, st.AllocatedBytes)
			}
		})
	}
	t.Run("register refused", func(t *testing.T) {
		d := simDevice(t, func(o *sim.Options) { o.ReadOnlyHostRegister = false })
		_, err := runOnce(t, d, m, StreamOptions{Residency: residency.Options{Source: residency.Register}}, false)
		if !errors.Is(err, device.ErrUnsupported) {
			t.Fatalf("Source Register on a device without read-only register: %v, want ErrUnsupported", err)
		}
		if st := d.Stats(); st.AllocatedBytes != 0 {
			t.Errorf("failed run left %d device bytes allocated", st.AllocatedBytes)
		}
	})
}

// TestStreamBadInput: a plan that does not belong to the model, a device
// that runs out of memory, bad options.
func TestStreamBadInput(t *testing.T) {
	m := tinyModel(t, synth.Safetensors)
	d := simDevice(t, nil)
	ks := loadKernels(t, d)
	wo := plan.WeightOptions{}
	p := planFor(t, m, halfBudget(t, m, wo), wo)
	ctx := context.Background()
	if _, err := Stream(ctx, d, m, p, 1, StreamOptions{}); err == nil {
		t.Error("Stream without kernels succeeded")
	}
	if _, err := Stream(ctx, d, m, p, 0, StreamOptions{Kernels: ks}); err == nil {
		t.Error("Stream of 0 steps succeeded")
	}
	other := tinyModel(t, synth.GGUF)
	po := planFor(t, other, halfBudget(t, other, wo), wo)
	if _, err := Stream(ctx, d, m, po, 1, StreamOptions{Kernels: ks}); err == nil {
		t.Error("Stream with another model's plan succeeded")
	}
	small := simDevice(t, func(o *sim.Options) { o.TotalBytes = 4 << 20 })
	ks2 := loadKernels(t, small)
	if _, err := Stream(ctx, small, m, p, 1, StreamOptions{Kernels: ks2}); !errors.Is(err, device.ErrOutOfMemory) && !errors.Is(err, pool.ErrOutOfMemory) {
		t.Errorf("Stream on a device smaller than the plan: %v, want an out-of-memory error", err)
	}
	if st := small.Stats(); st.AllocatedBytes != 0 {
		t.Errorf("failed Stream left %d bytes allocated", st.AllocatedBytes)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Stream(cctx, d, m, p, 1, StreamOptions{Kernels: ks}); !errors.Is(err, context.Canceled) {
		t.Errorf("Stream with a cancelled context: %v", err)
	}
	if st := d.Stats(); st.AllocatedBytes != 0 || st.PinnedHostBytes != 0 {
		t.Errorf("%d device, %d pinned bytes left", st.AllocatedBytes, st.PinnedHostBytes)
	}
}

// TestMeasureMatmuls: on the simulator the measured times are its model's.
func TestMeasureMatmuls(t *testing.T) {
	m := tinyModel(t, synth.Safetensors)
	d := simDevice(t, func(o *sim.Options) { o.Backing = false })
	ks := loadKernels(t, d)
	groups, err := plan.GroupWeights(m.Tensors)
	if err != nil {
		t.Fatal(err)
	}
	ts, cost, err := MeasureMatmuls(context.Background(), d, ks, groups, 64, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 5 { // q/o, k/v, gate/up, down, embed/head
		t.Errorf("%d shapes measured, want 5: %+v", len(ts), ts)
	}
	model := simCost(d)
	for _, x := range ts {
		if got, want := cost(x.DType, x.M, x.K, 64), model(x.DType, x.M, x.K, 64); got != want {
			t.Errorf("%s %dx%d: measured %v, sim model %v", x.DType, x.M, x.K, got, want)
		}
	}
	if st := d.Stats(); st.AllocatedBytes != 0 {
		t.Errorf("%d scratch bytes left allocated", st.AllocatedBytes)
	}
}

// TestSteadyStep: the steady-state model is between max(copy, compute)
// and the plan's cold step, and equals the cold step's compute when
// nothing streams.
func TestSteadyStep(t *testing.T) {
	m := tinyModel(t, synth.Safetensors)
	for _, tokens := range []int{1, 64, 4096} {
		wo := plan.WeightOptions{Tokens: tokens, Slots: 3}
		p := planFor(t, m, halfBudget(t, m, wo), wo)
		for _, pf := range []int{1, 2} {
			s := SteadyStep(p, pf, 6)
			if s < max(p.CopyTime, p.ComputeTime) || s > p.StepTime {
				t.Errorf("tokens %d prefetch %d: steady %v outside [max(copy %v, compute %v), cold %v]", tokens, pf, s, p.CopyTime, p.ComputeTime, p.StepTime)
			}
		}
		all := planFor(t, m, 1<<40, wo)
		if s := SteadyStep(all, 1, 3); s != all.ComputeTime {
			t.Errorf("all resident: steady %v, compute %v", s, all.ComputeTime)
		}
	}
}

// TestCUDAStream streams a generated model on the GPU
// (MEMWALL_TEST_DEVICE=cuda): data verified, the step close to max(copy,
// compute).
func TestCUDAStream(t *testing.T) {
	if os.Getenv("MEMWALL_TEST_DEVICE") != "cuda" {
		t.Skip("set MEMWALL_TEST_DEVICE=cuda on a GPU machine to stream on the GPU")
	}
	d, err := cuda.Open(cuda.Options{})
	if err != nil {
		t.Fatalf("MEMWALL_TEST_DEVICE=cuda: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	cfg := synth.Config{Arch: "llama", Layers: 8, Hidden: 2048, Inter: 5504, Heads: 16, Vocab: 8192, DType: "BF16"}
	for _, f := range []string{synth.Safetensors, synth.GGUF} {
		path := t.TempDir() + "/model." + f
		if _, err := synth.Generate(context.Background(), cfg, path, synth.Options{Format: f}); err != nil {
			t.Fatal(err)
		}
		m, err := weights.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		ks := loadKernels(t, d)
		for _, tokens := range []int{1, 512} {
			for _, src := range []residency.Source{residency.Register, residency.Pinned, residency.Bounce} {
				t.Run(fmt.Sprintf("%s/%s/tokens=%d", f, src, tokens), func(t *testing.T) {
					groups, _ := plan.GroupWeights(m.Tensors)
					_, cost, err := MeasureMatmuls(context.Background(), d, ks, groups, tokens, 3)
					if err != nil {
						t.Fatal(err)
					}
					wo := plan.WeightOptions{Tokens: tokens, LinkGBps: 50, Cost: cost, Granule: 2 << 20}
					full := planFor(t, m, 1<<40, wo)
					p := planFor(t, m, full.PeakBytes/2, wo)
					rep, err := Stream(context.Background(), d, m, p, 3, StreamOptions{Kernels: ks, Residency: residency.Options{Source: src}})
					if err != nil {
						t.Fatal(err)
					}
					if !rep.Verified {
						t.Errorf("not verified: %s", rep.VerifyNote)
					}
					ratio := rep.SecondsPerStep / max(rep.CopySecondsPerStep, rep.ComputeSecondsPerStep)
					t.Logf("%s: %d streamed B, step %.4fs copy %.4fs compute %.4fs stall %.4fs ratio %.3f, %.1f GB/s; peak %d (pred %d), pred step %.4fs",
						rep.Source, p.StreamedBytes, rep.SecondsPerStep, rep.CopySecondsPerStep, rep.ComputeSecondsPerStep,
						rep.StallSecondsPerStep, ratio, rep.AchievedGBps, rep.PeakBytes, p.PeakBytes, p.StepTime.Seconds())
					if src != residency.Bounce && ratio > 1.10 {
						t.Errorf("step %.4fs is %.2f× max(copy, compute)", rep.SecondsPerStep, ratio)
					}
					if rep.PeakBytes > p.PeakBytes {
						t.Errorf("measured peak %d above the plan's %d", rep.PeakBytes, p.PeakBytes)
					}
				})
			}
		}
		m.Close()
	}
}

// TestSteadyStepMatchesSim: for every slot count and prefetch depth the
// simulator's measured step is the steady-state model's, within 2%.
func TestSteadyStepMatchesSim(t *testing.T) {
	m := tinyModel(t, synth.Safetensors)
	for _, slots := range []int{2, 3, 4} {
		for pf := 1; pf < slots; pf++ {
			for _, tokens := range []int{1, 64} {
				t.Run(fmt.Sprintf("slots=%d/prefetch=%d/tokens=%d", slots, pf, tokens), func(t *testing.T) {
					d := simDevice(t, func(o *sim.Options) { o.Backing = false })
					ks := loadKernels(t, d)
					wo := plan.WeightOptions{Tokens: tokens, Cost: simCost(d), Slots: slots}
					full := planFor(t, m, 1<<40, wo)
					p := planFor(t, m, full.MinimumBytes+uint64(slots-2)*full.SlotBytes+full.SlotBytes/2, wo)
					if p.Slots != slots || len(p.Streamed()) < slots {
						t.Skipf("plan has %d slots, %d streamed", p.Slots, len(p.Streamed()))
					}
					rep, err := Stream(context.Background(), d, m, p, 4, StreamOptions{Kernels: ks, Residency: residency.Options{Prefetch: pf}})
					if err != nil {
						t.Fatal(err)
					}
					steady := SteadyStep(p, pf, 8).Seconds()
					if math.Abs(rep.SecondsPerStep-steady)/steady > 0.02 {
						t.Errorf("step %.6fs, steady model %.6fs (cold %.6fs)", rep.SecondsPerStep, steady, p.StepTime.Seconds())
					}
				})
			}
		}
	}
}

// TestStreamFaults: a failed event record, allocation or pinned allocation
// at any point of a run ends it with the injected error, and every device
// and pinned byte is given back.
func TestStreamFaults(t *testing.T) {
	m := tinyModel(t, synth.Safetensors)
	failed := 0
	for n := uint64(1); n <= 120; n += 7 {
		for kind := range 3 {
			t.Run(fmt.Sprintf("%d/%d", kind, n), func(t *testing.T) {
				sd := simDevice(t, nil)
				var cfg fault.Config
				d := fault.Wrap(sd, &cfg)
				ks := loadKernels(t, d)
				wo := plan.WeightOptions{Tokens: 2}
				p := planFor(t, m, halfBudget(t, m, wo), wo)
				switch kind {
				case 0:
					cfg.Set(fault.Rules{EventRecord: fault.Nth(n)})
				case 1:
					cfg.Set(fault.Rules{CreatePhysical: fault.Nth(1 + n%5), Alloc: fault.Nth(1 + n%5)})
				case 2:
					cfg.Set(fault.Rules{HostAlloc: fault.Nth(1)})
				}
				_, err := Stream(context.Background(), d, m, p, 2, StreamOptions{Kernels: ks, Residency: residency.Options{Source: residency.Pinned}})
				if err != nil {
					if !errors.Is(err, fault.ErrInjected) {
						t.Fatalf("error %v is not the injected one", err)
					}
					failed++
				}
				if st := sd.Stats(); st.AllocatedBytes != 0 || st.PinnedHostBytes != 0 {
					t.Errorf("after %v: %d device bytes, %d pinned bytes still allocated", err, st.AllocatedBytes, st.PinnedHostBytes)
				}
			})
		}
	}
	if failed == 0 {
		t.Error("no injected fault ended a run")
	}
}
