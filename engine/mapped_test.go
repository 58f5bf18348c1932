package engine_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
)

// TestMappedEmbedding: at budgets that stream, the engine reads the
// embedding table in place from the registered file; its tokens equal
// those of the engine that keeps the table on the device
// (NoMapEmbedding), in both formats, and the device holds fewer bytes of
// weights for more resident groups.
func TestMappedEmbedding(t *testing.T) {
	ctx := context.Background()
	for _, preset := range []string{"tiny", "tiny-hd64"} {
		for _, f := range []string{synth.Safetensors, synth.GGUF} {
			t.Run(preset+"/"+f, func(t *testing.T) {
				m := open(t, modelPath(t, preset, f))
				r := newRig(t, testDevice(t))
				// The minimum and the table's bytes: weights stream, copies
				// bound the step, and the table's room holds a matrix.
				_, err := engine.Estimate(ctx, m, engine.Options{Budget: 1, MaxTokens: 96, PrefillChunk: 16}, r.d.Info())
				var be *engine.BudgetError
				if !errors.As(err, &be) {
					t.Fatal(err)
				}
				b := be.Minimum + m.Tensors.Embedding.Bytes + 8<<10
				o := engine.Options{Budget: b, MaxTokens: 96, PrefillChunk: 16}
				run := func(o engine.Options) ([]int, int, bool) {
					e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, o)
					if err != nil {
						t.Fatal(err)
					}
					defer e.Close()
					mapped := false
					for _, g := range e.Plan().Groups {
						mapped = mapped || g.Mapped
					}
					res, err := e.Generate(ctx, prompt(19, m.Config.Vocab, 5), engine.Sampling{MaxNew: 16, IgnoreEOS: true}, nil)
					if err != nil {
						t.Fatal(err)
					}
					if st := e.Residency().Stats(); mapped != (st.MappedBytes > 0) {
						t.Fatalf("plan maps %v, residency %+v", mapped, st)
					}
					return res.Tokens, len(e.Plan().Streamed()), mapped
				}
				want, streamedOn, mappedOff := run(engine.Options{Budget: b, MaxTokens: 96, PrefillChunk: 16, NoMapEmbedding: true})
				got, streamed, mapped := run(o)
				if mappedOff || !mapped {
					t.Fatalf("NoMapEmbedding maps %v; the default maps %v at a budget that streams %d groups", mappedOff, mapped, streamedOn)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("mapped embedding: tokens %v, on the device %v", got, want)
				}
				if streamed > streamedOn {
					t.Errorf("%d groups stream with the table mapped, %d without", streamed, streamedOn)
				}
				r.zero(t)
			})
		}
	}
}

// TestMeasuredGather: MeasureGather times the row gather from mapped host
// memory and from device memory, frees what it took, and its figure
// decides whether the table is mapped: an extra cost above the streamed
// step's saving keeps it on the device, none maps it. (On the H200 the
// tiny model's 512-byte row costs the same from either, about 4 µs, the
// launch's; the 7B's 8 KiB row 20 µs from host memory, 4 µs from the
// device's.)
func TestMeasuredGather(t *testing.T) {
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.GGUF))
	d := testDevice(t)
	r := newRig(t, d)
	st, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(st)
	before, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	g, err := engine.MeasureGather(d, r.ks, m, st)
	if err != nil {
		t.Fatal(err)
	}
	after, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: a row of %d bytes: %v from host memory, %v from device memory", d.Info().Name, g.RowBytes, g.Host, g.Device)
	switch {
	case !g.Measured() || g.Host <= 0 || g.Device <= 0:
		t.Fatalf("measurement %+v", g)
	case g.RowBytes != m.Tensors.Embedding.Bytes/uint64(m.Config.Vocab):
		t.Fatalf("row bytes %d, want %d", g.RowBytes, m.Tensors.Embedding.Bytes/uint64(m.Config.Vocab))
	case after < before:
		t.Fatalf("free device memory %d before, %d after", before, after)
	}
	_, err = engine.Estimate(ctx, m, engine.Options{Budget: 1, MaxTokens: 96, PrefillChunk: 16}, d.Info())
	var be *engine.BudgetError
	if !errors.As(err, &be) {
		t.Fatal(err)
	}
	b := be.Minimum + m.Tensors.Embedding.Bytes + 8<<10
	for _, c := range []struct {
		gather engine.GatherCost
		mapped bool
	}{
		{engine.GatherCost{Host: time.Second, Device: time.Microsecond, Reps: 1}, false},
		{engine.GatherCost{Host: time.Microsecond, Device: time.Microsecond, Reps: 1}, true},
		{g, true}, // the tiny model's step saves more than any row read costs
	} {
		f, err := engine.Estimate(ctx, m, engine.Options{Budget: b, MaxTokens: 96, PrefillChunk: 16, Gather: c.gather}, d.Info())
		if err != nil {
			t.Fatal(err)
		}
		mapped := false
		for _, pg := range f.Plan.Groups {
			mapped = mapped || pg.Mapped
		}
		if mapped != c.mapped && (c.gather != g || !onGPU()) {
			t.Errorf("gather %+v: mapped %v, want %v", c.gather, mapped, c.mapped)
		}
	}
	r.zero(t)
}

// TestMeasureGatherUnsupported: a device that cannot read host memory in
// place has no gather to time.
func TestMeasureGatherUnsupported(t *testing.T) {
	o := sim.DefaultOptions()
	o.Kernels = kernels.Sim()
	o.CanMapHostMemory = false
	d := sim.New(o)
	defer d.Close()
	ks, err := kernels.Load(d, kernelsEnv())
	if err != nil {
		t.Fatal(err)
	}
	m := open(t, modelPath(t, "tiny", synth.GGUF))
	if _, err := engine.MeasureGather(d, ks, m, 0); !errors.Is(err, device.ErrUnsupported) {
		t.Fatalf("err %v, want ErrUnsupported", err)
	}
}
