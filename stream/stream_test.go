package stream

import (
	"context"
	"errors"
	"math"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/format/weights"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/plan"
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

// planFor groups m's tensors and plans them so that about half the blocks
// stream.
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
	groups, err := plan.GroupWeights(m.Tensors)
	if err != nil {
		t.Fatal(err)
	}
	o.Budget = 1 << 40
	o.LinkGBps = 25
	full, err := plan.PlanWeights(groups, o)
	if err != nil {
		t.Fatal(err)
	}
	// One byte short of everything: two slots take two blocks' room, a
	// third block no longer fits whole.
	return full.PeakBytes - 1
}

func TestStreamSimTiny(t *testing.T) {
	for _, f := range []string{synth.Safetensors, synth.GGUF} {
		for _, tokens := range []int{1, 16} {
			t.Run(f+"/tokens="+itoa(tokens), func(t *testing.T) {
				m := tinyModel(t, f)
				d := simDevice(t, nil)
				ks := loadKernels(t, d)
				wo := plan.WeightOptions{Tokens: tokens, Cost: simCost(d), Ctx: 64}
				p := planFor(t, m, halfBudget(t, m, wo), wo)
				if len(p.Streamed()) == 0 || len(p.Streamed()) == len(p.Groups) {
					t.Fatalf("plan streams %d of %d groups; want some of each", len(p.Streamed()), len(p.Groups))
				}
				reg := prometheus.NewRegistry()
				s, err := New(context.Background(), d, m, p, Options{Kernels: ks, Registerer: reg})
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				rep, err := s.Run(context.Background(), 3)
				if err != nil {
					t.Fatal(err)
				}
				if !rep.Verified || rep.Checked == 0 {
					t.Errorf("verified %v, %d products checked (%s)", rep.Verified, rep.Checked, rep.VerifyNote)
				}
				if rep.Source != Register.String() {
					t.Errorf("source %s, want %s", rep.Source, Register)
				}
				if rep.PeakBytes != p.PeakBytes {
					t.Errorf("measured peak %d, predicted %d", rep.PeakBytes, p.PeakBytes)
				}
				pred := p.StepTime.Seconds()
				if math.Abs(rep.SecondsPerStep-pred)/pred > 0.02 {
					t.Errorf("step %.6fs, predicted %.6fs", rep.SecondsPerStep, pred)
				}
				t.Logf("streamed %d B/step: step %.3gs (pred %.3gs) copy %.3gs compute %.3gs stall %.3gs, %.1f GB/s, overlap %.3f",
					p.StreamedBytes, rep.SecondsPerStep, pred, rep.CopySecondsPerStep, rep.ComputeSecondsPerStep,
					rep.StallSecondsPerStep, rep.AchievedGBps, rep.OverlapEfficiency)
				mfs, err := reg.Gather()
				if err != nil || len(mfs) == 0 {
					t.Errorf("metrics: %d families, %v", len(mfs), err)
				}
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				if st := d.Stats(); st.AllocatedBytes != 0 || st.PinnedHostBytes != 0 {
					t.Errorf("after Close: %d device bytes, %d pinned host bytes still allocated", st.AllocatedBytes, st.PinnedHostBytes)
				}
			})
		}
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// runOnce streams the Tiny model once (three of four blocks streamed, or
// with all, every group) and returns the Run error.
func runOnce(t *testing.T, d device.Device, m *format.Model, o Options, all bool) (*Report, error) {
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
	s, err := New(context.Background(), d, m, p, o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}()
	return s.Run(context.Background(), 1)
}

// TestRingEventsNeeded runs the ring on a simulator that executes ready
// work in a random order: with both waits every seed verifies; with either
// wait removed some seeds read a slot before its copy landed or after the
// next copy overwrote it, and the check fails.
func TestRingEventsNeeded(t *testing.T) {
	m := tinyModel(t, synth.Safetensors)
	cases := []struct {
		name                  string
		noComputeWait, noSlot bool
		wantCorrupt           bool
	}{
		{"both waits", false, false, false},
		{"no compute wait on copy", true, false, true},
		{"no copy wait on slot", false, true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			corrupt := 0
			const seeds = 12
			for seed := uint64(1); seed <= seeds; seed++ {
				d := simDevice(t, func(o *sim.Options) { o.Shuffle, o.Seed = true, seed })
				_, err := runOnce(t, d, m, Options{Source: Register, noComputeWait: c.noComputeWait, noSlotWait: c.noSlot, verifyAll: true}, true)
				switch {
				case err == nil:
				case errors.Is(err, ErrVerify) && errors.Is(err, kernels.ErrMismatch):
					corrupt++
				default:
					t.Fatalf("seed %d: %v", seed, err)
				}
			}
			if c.wantCorrupt && corrupt == 0 {
				t.Errorf("no seed of %d saw corrupted data without the wait", seeds)
			}
			if !c.wantCorrupt && corrupt != 0 {
				t.Errorf("%d of %d seeds saw corrupted data with both waits", corrupt, seeds)
			}
			t.Logf("%d of %d seeds corrupted", corrupt, seeds)
		})
	}
}

// TestSources streams from each host source and checks the data.
func TestSources(t *testing.T) {
	m := tinyModel(t, synth.GGUF)
	cases := []struct {
		name string
		opt  func(*sim.Options)
		o    Options
		want Source
	}{
		{"auto registers", nil, Options{}, Register},
		{"auto without read-only register copies", func(o *sim.Options) { o.ReadOnlyHostRegister = false }, Options{}, Pinned},
		{"auto with little host memory bounces", func(o *sim.Options) { o.ReadOnlyHostRegister = false }, Options{HostBytes: 1 << 20, BounceBytes: 256 << 10}, Bounce},
		{"pinned", nil, Options{Source: Pinned}, Pinned},
		{"bounce, small buffers", nil, Options{Source: Bounce, BounceBytes: 100 << 10, Bounces: 2}, Bounce},
		{"bounce under shuffle", func(o *sim.Options) { o.Shuffle, o.Seed = true, 7 }, Options{Source: Bounce, BounceBytes: 64 << 10, Bounces: 2}, Bounce},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := simDevice(t, c.opt)
			c.o.verifyAll = true
			rep, err := runOnce(t, d, m, c.o, false)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Source != c.want.String() || !rep.Verified {
				t.Errorf("source %s verified %v; want %s verified", rep.Source, rep.Verified, c.want)
			}
			if st := d.Stats(); st.PinnedHostBytes != 0 {
				t.Errorf("%d pinned host bytes left after Close", st.PinnedHostBytes)
			}
		})
	}
	t.Run("register refused", func(t *testing.T) {
		d := simDevice(t, func(o *sim.Options) { o.ReadOnlyHostRegister = false })
		ks := loadKernels(t, d)
		wo := plan.WeightOptions{}
		p := planFor(t, m, halfBudget(t, m, wo), wo)
		_, err := New(context.Background(), d, m, p, Options{Kernels: ks, Source: Register})
		if !errors.Is(err, device.ErrUnsupported) {
			t.Fatalf("New with Source Register on a device without read-only register: %v, want ErrUnsupported", err)
		}
		if st := d.Stats(); st.AllocatedBytes != 0 {
			t.Errorf("failed New left %d device bytes allocated", st.AllocatedBytes)
		}
	})
}

// TestBadInput: a plan that does not belong to the model, a device that
// runs out of memory, bad options.
func TestBadInput(t *testing.T) {
	m := tinyModel(t, synth.Safetensors)
	d := simDevice(t, nil)
	ks := loadKernels(t, d)
	wo := plan.WeightOptions{}
	p := planFor(t, m, halfBudget(t, m, wo), wo)
	if _, err := New(context.Background(), d, m, p, Options{}); err == nil {
		t.Error("New without kernels succeeded")
	}
	// A plan for the GGUF file applied to the safetensors file names a file
	// the model does not map.
	other := tinyModel(t, synth.GGUF)
	po := planFor(t, other, halfBudget(t, other, wo), wo)
	if _, err := New(context.Background(), d, m, po, Options{Kernels: ks}); err == nil {
		t.Error("New with another model's plan succeeded")
	}
	small := simDevice(t, func(o *sim.Options) { o.TotalBytes = p.PeakBytes / 2 })
	ks2 := loadKernels(t, small)
	_, err := New(context.Background(), small, m, p, Options{Kernels: ks2})
	if !errors.Is(err, device.ErrOutOfMemory) {
		t.Errorf("New on a device smaller than the plan: %v, want ErrOutOfMemory", err)
	}
	if st := small.Stats(); st.AllocatedBytes != 0 {
		t.Errorf("failed New left %d bytes allocated", st.AllocatedBytes)
	}
	s, err := New(context.Background(), d, m, p, Options{Kernels: ks})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Run(context.Background(), 0); err == nil {
		t.Error("Run(0) succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Run(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Run with a cancelled context: %v", err)
	}
	s.Close()
	if _, err := s.Step(context.Background()); err == nil {
		t.Error("Step after Close succeeded")
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
			for _, src := range []Source{Register, Pinned, Bounce} {
				t.Run(f+"/"+src.String()+"/tokens="+itoa(tokens), func(t *testing.T) {
					groups, _ := plan.GroupWeights(m.Tensors)
					_, cost, err := MeasureMatmuls(context.Background(), d, ks, groups, tokens, 3)
					if err != nil {
						t.Fatal(err)
					}
					wo := plan.WeightOptions{Tokens: tokens, LinkGBps: 50, Cost: cost, Granule: 2 << 20}
					full, err := plan.PlanWeights(groups, plan.WeightOptions{Budget: 1 << 40, LinkGBps: 50, Tokens: tokens, Granule: 2 << 20})
					if err != nil {
						t.Fatal(err)
					}
					p := planFor(t, m, full.PeakBytes/2, wo)
					s, err := New(context.Background(), d, m, p, Options{Kernels: ks, Source: src})
					if err != nil {
						t.Fatal(err)
					}
					defer s.Close()
					rep, err := s.Run(context.Background(), 3)
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
					if src != Bounce && ratio > 1.10 {
						t.Errorf("step %.4fs is %.2f× max(copy, compute)", rep.SecondsPerStep, ratio)
					}
				})
			}
		}
		m.Close()
	}
}
