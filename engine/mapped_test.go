package engine_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/synth"
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
