package engine_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/synth"
)

// TestSetBudgetRandom: an engine whose budget moves at random between its
// minimum and more than it needs generates, after every move, the tokens
// a resident engine generates for the same prompt; the device pool never
// reserves more than the budget of the moment; the decode graph follows
// (on when everything is resident); a budget below the minimum changes
// nothing; Close gives every byte back.
func TestSetBudgetRandom(t *testing.T) {
	ctx := context.Background()
	for _, preset := range []string{"tiny", "tiny-hd64"} {
		for _, f := range []string{synth.Safetensors, synth.GGUF} {
			t.Run(preset+"/"+f, func(t *testing.T) {
				if raceEnabled && testing.Short() && (preset != "tiny" || f != synth.GGUF) {
					t.Skip("under the race detector one model of four: the moves are the same code")
				}
				m := open(t, modelPath(t, preset, f))
				d := testDevice(t)
				solo := newRig(t, d)
				o := engine.Options{Budget: 256 << 20, MaxTokens: 96, PrefillChunk: 16}
				ref, err := engine.New(ctx, d, solo.ks, solo.dev, solo.host, m, o)
				if err != nil {
					t.Fatal(err)
				}
				defer ref.Close()
				prompts := make([][]int, 4)
				want := make([][]int, len(prompts))
				for i := range prompts {
					prompts[i] = prompt(5+7*i, m.Config.Vocab, uint64(i)+40)
					res, err := ref.Generate(ctx, prompts[i], engine.Sampling{MaxNew: 12, IgnoreEOS: true}, nil)
					if err != nil {
						t.Fatal(err)
					}
					want[i] = res.Tokens
				}
				r := newLimitedRig(t, d, 256<<20)
				o.Live = true
				e, err := engine.New(ctx, d, r.ks, r.dev, r.host, m, o)
				if err != nil {
					t.Fatal(err)
				}
				lo, hi := e.MinimumBudget(), uint64(0)
				if hi, err = e.FullBudget(); err != nil {
					t.Fatal(err)
				}
				if lo >= hi {
					t.Fatalf("minimum budget %d, full %d", lo, hi)
				}
				if _, err := e.SetBudget(ctx, lo-1); !errors.Is(err, engine.ErrBudget) {
					t.Fatalf("SetBudget(minimum-1): %v, want ErrBudget", err)
				}
				rng := rand.New(rand.NewPCG(uint64(len(preset)), uint64(len(f))))
				budget := e.Budget()
				var moved, streamedRuns, residentRuns int
				for ev := range 30 {
					if rng.IntN(2) == 0 {
						switch k := rng.IntN(5); {
						case k == 0:
							budget = lo
						case k == 1:
							budget = hi
						case k == 2:
							budget = hi + rng.Uint64N(8<<20)
						default:
							budget = lo + rng.Uint64N(hi-lo)
						}
						ch, err := e.SetBudget(ctx, budget)
						if err != nil {
							t.Fatalf("event %d: SetBudget(%d) in [%d, %d]: %v", ev, budget, lo, hi, err)
						}
						moved += ch.Promoted + ch.Demoted
						streams := len(e.Plan().Streamed()) > 0
						if streams != (budget < hi) {
							t.Fatalf("event %d: budget %d (full %d) streams %d groups", ev, budget, hi, len(e.Plan().Streamed()))
						}
						if on, why := e.GraphStatus(); streams && on {
							t.Fatalf("event %d: graph on while streaming (%s)", ev, why)
						}
					} else {
						i := rng.IntN(len(prompts))
						res, err := e.Generate(ctx, prompts[i], engine.Sampling{MaxNew: 12, IgnoreEOS: true}, nil)
						if err != nil {
							t.Fatalf("event %d: %v", ev, err)
						}
						if !slices.Equal(res.Tokens, want[i]) {
							t.Fatalf("event %d: budget %d (%d of %d groups streamed): tokens %v, resident %v", ev, budget,
								len(e.Plan().Streamed()), len(e.Plan().Groups), res.Tokens, want[i])
						}
						if len(e.Plan().Streamed()) > 0 {
							streamedRuns++
						} else {
							residentRuns++
						}
					}
					if res := r.dev.ReservedBytes(); res > budget {
						t.Fatalf("event %d: pool reserves %d bytes, budget %d", ev, res, budget)
					}
					if l := r.dev.Options().Limit; l != budget {
						t.Fatalf("event %d: pool limit %d, budget %d", ev, l, budget)
					}
				}
				if moved == 0 || streamedRuns == 0 || residentRuns == 0 {
					t.Fatalf("%d groups moved, %d runs streamed, %d resident: want each", moved, streamedRuns, residentRuns)
				}
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				r.zero(t)
			})
		}
	}
}

// TestSetBudgetNeedsLive: an engine made without Options.Live refuses.
func TestSetBudgetNeedsLive(t *testing.T) {
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	r := newRig(t, testDevice(t))
	e, err := engine.New(context.Background(), r.d, r.ks, r.dev, r.host, m, engine.Options{Budget: 256 << 20, MaxTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := e.SetBudget(context.Background(), 128<<20); err == nil {
		t.Fatal("SetBudget without Options.Live accepted")
	}
}

// TestSetBudgetFromMinimum loads as serve does after an unload: an engine
// made at its minimum budget (the pool's limit there too), promoted to its
// full budget and moved down and up at random. Every move succeeds, leaves
// the pool within the budget at the budget's limit, and the tokens stay
// the resident engine's. (On the H200 a model loaded so, promoted and
// demoted again, was refused its pool's lower limit: free space stranded
// in partly used chunks.)
func TestSetBudgetFromMinimum(t *testing.T) {
	ctx := context.Background()
	for _, preset := range []string{"tiny", "tiny-hd64"} {
		t.Run(preset, func(t *testing.T) {
			if raceEnabled && testing.Short() && preset != "tiny" {
				t.Skip("under the race detector one model of two")
			}
			m := open(t, modelPath(t, preset, synth.GGUF))
			d := testDevice(t)
			o := engine.Options{Budget: 1, MaxTokens: 96, PrefillChunk: 16, Live: true}
			_, err := engine.Estimate(ctx, m, o, d.Info())
			var be *engine.BudgetError
			if !errors.As(err, &be) {
				t.Fatalf("Estimate at 1 byte: %v, want a *BudgetError", err)
			}
			solo := newRig(t, d)
			ro := o
			ro.Budget, ro.Live = 256<<20, false
			ref, err := engine.New(ctx, d, solo.ks, solo.dev, solo.host, m, ro)
			if err != nil {
				t.Fatal(err)
			}
			defer ref.Close()
			p := prompt(11, m.Config.Vocab, 3)
			want, err := ref.Generate(ctx, p, engine.Sampling{MaxNew: 10, IgnoreEOS: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			r := newLimitedRig(t, d, be.Minimum)
			o.Budget = be.Minimum
			e, err := engine.New(ctx, d, r.ks, r.dev, r.host, m, o)
			if err != nil {
				t.Fatalf("New at the estimated minimum %d: %v", be.Minimum, err)
			}
			lo, hi := e.MinimumBudget(), uint64(0)
			if hi, err = e.FullBudget(); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(len(preset)), 9))
			for ev := range 24 {
				budget := hi
				if ev > 0 {
					budget = lo + rng.Uint64N(hi-lo+1)
				}
				if _, err := e.SetBudget(ctx, budget); err != nil {
					t.Fatalf("move %d: SetBudget(%d) in [%d, %d]: %v", ev, budget, lo, hi, err)
				}
				if res := r.dev.ReservedBytes(); res > budget {
					t.Fatalf("move %d: pool reserves %d bytes, budget %d", ev, res, budget)
				}
				if l := r.dev.Options().Limit; l != budget {
					t.Fatalf("move %d: pool limit %d, budget %d", ev, l, budget)
				}
				if ev%6 == 5 {
					res, err := e.Generate(ctx, p, engine.Sampling{MaxNew: 10, IgnoreEOS: true}, nil)
					if err != nil {
						t.Fatalf("move %d: %v", ev, err)
					}
					if !slices.Equal(res.Tokens, want.Tokens) {
						t.Fatalf("move %d: budget %d: tokens %v, resident %v", ev, budget, res.Tokens, want.Tokens)
					}
				}
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			r.zero(t)
		})
	}
}
