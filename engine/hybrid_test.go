package engine_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/memwall/memwall/device/cpu"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/engine/internal/reference"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/internal/longtest"
	"github.com/memwall/memwall/kernels"
)

// simHost is a second simulator as the host device: the same Go kernels as
// the "GPU", so a hosted block computes the same bits as on the GPU.
func simHost(t testing.TB) (*engine.Host, *rig) {
	t.Helper()
	o := sim.DefaultOptions()
	o.TotalBytes = 1 << 30
	o.Kernels = kernels.Sim()
	d := sim.New(o)
	t.Cleanup(func() { d.Close() })
	r := newRig(t, d)
	return &engine.Host{D: r.d, KS: r.ks, Pool: r.dev, Pinned: r.host}, r
}

// cpuHost is device/cpu with its own kernels as the host device.
func cpuHost(t testing.TB) (*engine.Host, *rig) {
	t.Helper()
	d, err := cpu.New(cpu.Options{TotalBytes: 1 << 30, Workers: 2, Kernels: kernels.CPU()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	r := newRig(t, d)
	return &engine.Host{D: r.d, KS: r.ks, Pool: r.dev, Pinned: r.host}, r
}

// generate runs p through a fresh engine with options o and closes it,
// checking that both rigs' pools are empty afterwards.
func generate(t *testing.T, r, hr *rig, o engine.Options, p []int, n int) *engine.Result {
	t.Helper()
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, o)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Generate(ctx, p, engine.Sampling{MaxNew: n, IgnoreEOS: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	r.zero(t)
	if hr != nil {
		hr.zero(t)
	}
	return res
}

// TestHybridTokens: with every other block computed on the host device (a
// second simulator), a budget that cannot hold the model reports host
// bytes per token and the same tokens and first logits as the all-resident
// run (bit for bit on the simulator, within the reference's tolerance on a
// GPU); the tokens agree with the Go reference.
func TestHybridTokens(t *testing.T) {
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	L := m.Config.Layers
	r := newRig(t, testDevice(t))
	p := prompt(21, m.Config.Vocab, 5)
	all := generate(t, r, nil, engine.Options{Budget: 256 << 20, MaxTokens: 96, PrefillChunk: 16}, p, 16)

	host, hr := simHost(t)
	hosted := make([]bool, L)
	for l := range hosted {
		hosted[l] = l%2 == 1
	}
	b := smallBudget(t, r, m, false)
	o := engine.Options{Budget: b, MaxTokens: 96, PrefillChunk: 16, HostLayers: hosted, Host: host}
	f, err := engine.Estimate(context.Background(), m, o, r.d.Info())
	if err != nil {
		t.Fatal(err)
	}
	res := generate(t, r, hr, o, p, 16)
	if res.HostBytesPerToken == 0 {
		t.Fatal("host_bytes_per_token 0 with hosted blocks")
	}
	if !slices.Equal(res.Tokens, all.Tokens) {
		t.Fatalf("hybrid tokens %v, resident %v", res.Tokens, all.Tokens)
	}
	// The simulators run the same Go kernels on both sides, so the bits
	// agree; a GPU computes the device blocks with its own summation order,
	// different bits from the host's Go kernels, held to the reference's
	// tolerance instead (as TestAgainstReference holds the GPU).
	if !onGPU() && !slices.Equal(res.FirstLogits, all.FirstLogits) {
		t.Fatal("hybrid first logits differ from the resident run's")
	}
	if diff, cos := compare(res.FirstLogits, all.FirstLogits); diff > logitsTol(m.Config.DType, all.FirstLogits) || cos < 0.999 {
		t.Fatalf("hybrid first logits differ from the resident run's by %g (cosine %g)", diff, cos)
	}
	for _, g := range f.Plan.Groups {
		if g.Layer >= 0 && hosted[g.Layer] {
			t.Fatalf("group %s of a hosted block in the device plan", g.Name)
		}
	}
	ref, err := reference.New(m, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	agree(t, ref, p, res.Tokens, tieMargin(m.Config.DType, 8))
}

// TestHybridCPU computes the last blocks on device/cpu: the tokens agree
// with the Go reference (the CPU kernels sum in another order than the
// simulator's, so near-ties may differ).
func TestHybridCPU(t *testing.T) {
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	r := newRig(t, testDevice(t))
	host, hr := cpuHost(t)
	hosted := make([]bool, m.Config.Layers)
	hosted[len(hosted)-1] = true
	p := prompt(19, m.Config.Vocab, 9)
	res := generate(t, r, hr, engine.Options{Budget: 256 << 20, MaxTokens: 64, PrefillChunk: 8, HostLayers: hosted, Host: host}, p, 12)
	if res.HostBytesPerToken == 0 {
		t.Fatal("host_bytes_per_token 0")
	}
	ref, err := reference.New(m, "BF16")
	if err != nil {
		t.Fatal(err)
	}
	if skipped := agree(t, ref, p, res.Tokens, tieMargin(m.Config.DType, 8)); skipped > len(res.Tokens)/4 {
		t.Errorf("%d of %d positions were near-ties", skipped, len(res.Tokens))
	}
}

// TestHybridRandomPlacements: random hosted blocks, random budgets
// (resident or streaming), prompt lengths and chunks give the tokens of the
// all-resident run.
func TestHybridRandomPlacements(t *testing.T) {
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	L := m.Config.Layers
	r := newRig(t, testDevice(t))
	host, hr := simHost(t)
	small := smallBudget(t, r, m, false)
	rng := rand.New(rand.NewPCG(26, 2))
	runs := 4
	if longtest.Enabled() {
		runs = 40
	}
	for i := range runs {
		p := prompt(1+rng.IntN(40), m.Config.Vocab, uint64(i))
		chunk := 1 + rng.IntN(24)
		want := generate(t, r, nil, engine.Options{Budget: 256 << 20, MaxTokens: 64, PrefillChunk: chunk}, p, 6)
		hosted := make([]bool, L)
		for l := range hosted {
			hosted[l] = rng.IntN(2) == 0
		}
		b := uint64(256 << 20)
		if rng.IntN(2) == 0 {
			b = small
		}
		got := generate(t, r, hr, engine.Options{Budget: b, MaxTokens: 64, PrefillChunk: chunk, HostLayers: hosted, Host: host}, p, 6)
		if !slices.Equal(got.Tokens, want.Tokens) {
			t.Fatalf("run %d (hosted %v, chunk %d, prompt %d, budget %d): tokens %v, resident %v", i, hosted, chunk, len(p), b, got.Tokens, want.Tokens)
		}
	}
}

// TestPlaceHost: a budget that holds the model hosts nothing; one that
// streams hosts blocks when the host reads faster than the link, none when
// it has no rate, and the plan it returns runs with those tokens.
func TestPlaceHost(t *testing.T) {
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	r := newRig(t, testDevice(t))
	small := smallBudget(t, r, m, false)
	rates := engine.Rates{LinkGBps: 55, HostGBps: 85, LinkBothGBps: 50, HostBothGBps: 75}
	for _, c := range []struct {
		name   string
		budget uint64
		rates  engine.Rates
		hosts  bool
	}{
		{"resident", 256 << 20, rates, false},
		{"small", small, rates, true},
		{"small, no host rate", small, engine.Rates{LinkGBps: 55}, false},
	} {
		o := engine.Options{Budget: c.budget, MaxTokens: 96, PrefillChunk: 16}
		p, err := engine.PlaceHost(ctx, m, o, r.d.Info(), c.rates)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := slices.Contains(p.HostLayers, true); got != c.hosts {
			t.Fatalf("%s: hosts blocks %v (%v), want %v", c.name, got, p.HostLayers, c.hosts)
		}
		if c.hosts && (p.HostBytes == 0 || p.DecodeSeconds <= 0) {
			t.Fatalf("%s: host bytes %d, decode %g s", c.name, p.HostBytes, p.DecodeSeconds)
		}
		if c.hosts {
			host, hr := simHost(t)
			o.HostLayers, o.Host = p.HostLayers, host
			res := generate(t, r, hr, o, prompt(9, m.Config.Vocab, 1), 4)
			if res.HostBytesPerToken != p.HostBytes {
				t.Fatalf("%s: run hosts %d bytes per token, placement said %d", c.name, res.HostBytesPerToken, p.HostBytes)
			}
		}
	}
}
