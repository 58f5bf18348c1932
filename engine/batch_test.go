package engine_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/internal/longtest"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/kvcache"
)

// batchSeq is one sequence of the batch test: its prompt, when it joins,
// how many tokens it generates and those Generate gave alone.
type batchSeq struct {
	prompt []int32
	join   int // step at which it joins
	maxNew int
	want   []int
	logits [][]float32 // Generate's, for the near-tie check on a GPU

	id       kvcache.SeqID
	done     int // positions computed
	got      []int
	joined   bool
	finished bool
}

// batchMinimum is the smallest budget that runs m with o (KV and reserve
// included), plus one block's matrices, so that most of the weights stream.
func batchMinimum(t *testing.T, r *rig, m *llama.Model, o engine.Options) uint64 {
	t.Helper()
	o.Budget = 1
	_, err := engine.New(context.Background(), r.d, r.ks, r.dev, r.host, m, o)
	var be *engine.BudgetError
	if !errors.As(err, &be) {
		t.Fatalf("budget 1: %v", err)
	}
	b := m.Tensors.Blocks[0]
	return be.Minimum + b.Q.Bytes + b.K.Bytes + b.V.Bytes + b.O.Bytes + b.Gate.Bytes + b.Up.Bytes + b.Down.Bytes + 8<<10
}

// TestBatchMatchesGenerate runs random batches (prompts of different
// lengths joining at random steps, prefilled in random chunks mixed with
// the others' decode tokens, some leaving early) and checks that every
// sequence's greedy tokens are Generate's for its prompt alone.
//
// tiny-hd64's heads take the decode attention kernel, so its decoding
// sequences are attended in one launch per block (Batch.attention).
func TestBatchMatchesGenerate(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ preset, f, budget string }{
		{"tiny", synth.Safetensors, "resident"}, {"tiny", synth.Safetensors, "streaming"},
		{"tiny", synth.GGUF, "resident"}, {"tiny", synth.GGUF, "streaming"},
		{"tiny-hd64", synth.Safetensors, "resident"}, {"tiny-hd64", synth.GGUF, "streaming"},
	} {
		preset, f, budget := c.preset, c.f, c.budget
		{
			t.Run(preset+"/"+f+"/"+budget, func(t *testing.T) {
				if raceEnabled && testing.Short() && budget == "resident" {
					t.Skip("numerics only (streaming's copies are the concurrency)")
				}
				m := open(t, modelPath(t, preset, f))
				r := newRig(t, testDevice(t))
				const maxSeqs, maxTokens = 6, 64
				o := engine.Options{Budget: 256 << 20, MaxTokens: maxTokens, PrefillChunk: 16, KVBlocks: maxSeqs * maxTokens / 16, PrefixCache: true}
				o.ReserveBytes = engine.BatchBytes(m.Config, o, maxSeqs)
				if budget == "streaming" {
					o.Budget = batchMinimum(t, r, m, o)
				}
				e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, o)
				if err != nil {
					t.Fatal(err)
				}
				defer r.zero(t)
				defer e.Close()
				if budget == "streaming" && len(e.Plan().Streamed()) == 0 {
					t.Fatal("the streaming budget streams nothing")
				}
				rng := rand.New(rand.NewPCG(uint64(len(f)), uint64(len(budget))))
				rounds := 1
				if longtest.Enabled() {
					rounds = 4
				}
				for round := range rounds {
					seqs := randomSeqs(rng, m.Config.Vocab, 7, maxTokens, round%2 == 0)
					for _, s := range seqs {
						res, err := e.Generate(ctx, toInts(s.prompt), engine.Sampling{MaxNew: s.maxNew, IgnoreEOS: true, KeepLogits: onGPU()}, nil)
						if err != nil {
							t.Fatal(err)
						}
						s.want, s.logits = res.Tokens, res.Logits
					}
					if hits := runBatch(t, e, rng, seqs, maxSeqs); round%2 == 0 && hits == 0 {
						t.Error("prompts with a shared prefix of 40 tokens had no prefix cache hit")
					}
					for i, s := range seqs {
						checkBatchTokens(t, i, s, m.Config.DType)
					}
				}
			})
		}
	}
}

func toInts(p []int32) []int {
	out := make([]int, len(p))
	for i, v := range p {
		out[i] = int(v)
	}
	return out
}

// randomSeqs draws n sequences; shared gives half of them a common prefix
// (prefix cache hits).
func randomSeqs(rng *rand.Rand, vocab, n, maxTokens int, shared bool) []*batchSeq {
	prefix := make([]int32, 40)
	for i := range prefix {
		prefix[i] = int32(3 + rng.IntN(vocab-3))
	}
	var out []*batchSeq
	for i := range n {
		s := &batchSeq{join: rng.IntN(12), maxNew: 1 + rng.IntN(12)}
		plen := 1 + rng.IntN(maxTokens-s.maxNew-1)
		for j := range plen {
			id := int32(3 + rng.IntN(vocab-3))
			if shared && i%2 == 0 && j < len(prefix) {
				id = prefix[j]
			}
			s.prompt = append(s.prompt, id)
		}
		out = append(out, s)
	}
	return out
}

// runBatch steps the sequences through a Batch until all finish: a
// sequence joins at its step when a place is free, prefills in chunks of
// random size under the step's token budget, and decodes greedily; one in
// four leaves (is freed) after a random number of its tokens. It returns
// the prompt tokens found in the prefix cache.
func runBatch(t *testing.T, e *engine.Engine, rng *rand.Rand, seqs []*batchSeq, maxSeqs int) (hits int) {
	t.Helper()
	ctx := context.Background()
	b, err := e.NewBatch(maxSeqs)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	leaveAt := make([]int, len(seqs))
	for i := range seqs {
		leaveAt[i] = -1
		if rng.IntN(4) == 0 {
			leaveAt[i] = rng.IntN(seqs[i].maxNew + 1)
		}
	}
	var running []int
	for step := 0; ; step++ {
		if step > 2000 {
			t.Fatal("no end after 2000 steps")
		}
		for i, s := range seqs {
			if !s.joined && s.join <= step && len(running) < maxSeqs {
				id, cached, err := b.Add(s.prompt)
				if err != nil {
					t.Fatal(err)
				}
				s.id, s.done, s.joined = id, cached, true
				hits += cached
				running = append(running, i)
			}
		}
		if len(running) == 0 {
			if !slices.ContainsFunc(seqs, func(s *batchSeq) bool { return !s.joined }) {
				break
			}
			continue
		}
		var ws []engine.Work
		var who []int
		budget := b.MaxTokens()
		for _, i := range running {
			s := seqs[i]
			n := len(s.prompt) - s.done
			if n <= 0 { // decoding: its last token
				if budget == 0 {
					continue
				}
				last := int32(s.got[len(s.got)-1])
				if err := b.Append(s.id, last); err != nil {
					t.Fatal(err)
				}
				ws = append(ws, engine.Work{Seq: s.id, Start: len(s.prompt) + len(s.got) - 1, Tokens: []int32{last}, Logits: true})
				budget--
				who = append(who, i)
				continue
			}
			n = min(n, budget, 1+rng.IntN(16))
			if n == 0 {
				continue
			}
			ws = append(ws, engine.Work{Seq: s.id, Start: s.done, Tokens: s.prompt[s.done : s.done+n], Logits: s.done+n == len(s.prompt)})
			budget -= n
			who = append(who, i)
		}
		logits, err := b.Step(ctx, ws)
		if err != nil {
			t.Fatal(err)
		}
		for k, i := range who {
			s := seqs[i]
			if s.done < len(s.prompt) {
				s.done += len(ws[k].Tokens)
				if err := b.Computed(s.id, s.done); err != nil {
					t.Fatal(err)
				}
			}
			if logits[k] != nil {
				s.got = append(s.got, engine.NewSampler(engine.Sampling{}).Next(logits[k]))
			}
			if len(s.got) >= s.maxNew || len(s.got) == leaveAt[i] && leaveAt[i] >= 0 {
				s.finished = true
			}
		}
		kept := running[:0]
		for _, i := range running {
			if seqs[i].finished {
				if err := b.Free(seqs[i].id); err != nil {
					t.Fatal(err)
				}
				continue
			}
			kept = append(kept, i)
		}
		running = kept
	}
	if st := b.Cache().Stats(); st.UsedBlocks != 0 || st.Sequences != 0 {
		t.Errorf("after the batch: %d blocks in %d sequences still held", st.UsedBlocks, st.Sequences)
	}
	return hits
}

// checkBatchTokens compares s's tokens with Generate's: equal on the
// simulator; on a GPU (batched products round in another order) equal up
// to the first near-tie of Generate's logits.
func checkBatchTokens(t *testing.T, i int, s *batchSeq, dtype string) {
	t.Helper()
	want := s.want[:min(len(s.want), len(s.got))]
	for j, tok := range s.got {
		if j >= len(want) {
			break
		}
		if tok == want[j] {
			continue
		}
		if onGPU() {
			l := s.logits[j]
			if d := l[want[j]] - l[tok]; d < tieMargin(dtype, 8) {
				return
			}
		}
		t.Fatalf("sequence %d (prompt %d tokens, joined at step %d): token %d is %d, Generate gave %d\nbatch    %v\ngenerate %v",
			i, len(s.prompt), s.join, j, tok, want[j], s.got, s.want)
	}
}

// TestBatchErrors checks that a step the batch cannot run is refused,
// naming the limit, and changes nothing.
func TestBatchErrors(t *testing.T) {
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny", synth.Safetensors))
	r := newRig(t, testDevice(t))
	o := engine.Options{Budget: 256 << 20, MaxTokens: 64, PrefillChunk: 8, KVBlocks: 4}
	e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer r.zero(t)
	defer e.Close()
	if _, err := e.NewBatch(9); err == nil || !strings.Contains(err.Error(), "1..8") {
		t.Errorf("9 sequences in steps of 8 tokens: %v", err)
	}
	b, err := e.NewBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, p := range [][]int32{nil, make([]int32, 64), {5, 1024}} {
		if _, _, err := b.Add(p); err == nil {
			t.Errorf("Add(%d tokens, last %v): no error", len(p), p)
		}
	}
	a, _, err := b.Add([]int32{5, 6, 7})
	if err != nil {
		t.Fatal(err)
	}
	c, _, err := b.Add([]int32{8, 9, 10, 11, 12, 13})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Add(make([]int32, 40)); !errors.Is(err, kvcache.ErrOutOfBlocks) {
		t.Errorf("a prompt of 3 blocks with 2 free: %v", err)
	}
	for _, c := range []struct {
		name string
		ws   []engine.Work
		want string
	}{
		{"too many sequences", []engine.Work{{Seq: a, Tokens: []int32{5}}, {Seq: c, Tokens: []int32{8}}, {Seq: 99, Tokens: []int32{1}}}, "more than the 2"},
		{"too many tokens", []engine.Work{{Seq: a, Tokens: []int32{5, 6, 7}}, {Seq: c, Tokens: []int32{8, 9, 10, 11, 12, 13}}}, "more than the 8"},
		{"twice", []engine.Work{{Seq: a, Tokens: []int32{5}}, {Seq: a, Start: 1, Tokens: []int32{6}}}, "twice"},
		{"beyond its blocks", []engine.Work{{Seq: a, Start: 2, Tokens: []int32{7, 8}}}, "beyond its 3"},
		{"unknown", []engine.Work{{Seq: 99, Tokens: []int32{1}}}, "beyond its 0"},
		{"logits of nothing", []engine.Work{{Seq: a, Logits: true}}, "no token"},
		{"vocabulary", []engine.Work{{Seq: a, Tokens: []int32{1024}}}, "outside the vocabulary"},
	} {
		if _, err := b.Step(ctx, c.ws); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	logits, err := b.Step(ctx, []engine.Work{{Seq: a, Tokens: []int32{5, 6, 7}, Logits: true}, {Seq: c, Tokens: []int32{8, 9}}})
	if err != nil || len(logits[0]) != m.Config.Vocab || logits[1] != nil {
		t.Fatalf("step: %v", err)
	}
	for _, s := range []kvcache.SeqID{a, c} {
		if err := b.Free(s); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBatchRowsLaunches holds a batched step to one K/V write and one
// attention launch per block for all its decoding sequences (the row
// kernels), with a prefilling sequence beside them attended on its own,
// and the tokens to the per-sequence kernels' (same bits on the
// simulator).
func TestBatchRowsLaunches(t *testing.T) {
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny-hd64", synth.Safetensors))
	L := m.Config.Layers
	step := func(rows bool) (map[string]int, [][]float32) {
		d := newCounting(testDevice(t))
		r := newRig(t, d)
		if !rows {
			r.ks.SetRows(false)
		}
		o := engine.Options{Budget: 256 << 20, MaxTokens: 64, PrefillChunk: 16, KVBlocks: 32}
		o.ReserveBytes = engine.BatchBytes(m.Config, o, 6)
		e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, o)
		if err != nil {
			t.Fatal(err)
		}
		defer r.zero(t)
		defer e.Close()
		b, err := e.NewBatch(6)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		var ws []engine.Work
		for i := range 4 {
			p := prompt(3+i, m.Config.Vocab, uint64(i))
			ids := make([]int32, len(p))
			for j, v := range p {
				ids[j] = int32(v)
			}
			id, _, err := b.Add(ids)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Step(ctx, []engine.Work{{Seq: id, Tokens: ids}}); err != nil {
				t.Fatal(err)
			}
			tok := int32(10 + i)
			if err := b.Append(id, tok); err != nil {
				t.Fatal(err)
			}
			ws = append(ws, engine.Work{Seq: id, Start: len(ids), Tokens: []int32{tok}, Logits: true})
		}
		late, _, err := b.Add([]int32{5, 6, 7})
		if err != nil {
			t.Fatal(err)
		}
		// The prefilling sequence between the decoding ones: the step puts
		// the decoding ones first and hands the logits back in this order.
		ws = append(ws[:2], append([]engine.Work{{Seq: late, Tokens: []int32{5, 6, 7}, Logits: true}}, ws[2:]...)...)
		before := d.snapshot()
		logits, err := b.Step(ctx, ws)
		if err != nil {
			t.Fatal(err)
		}
		after := d.snapshot()
		for k, v := range before {
			after[k] -= v
		}
		return after, logits
	}
	got, logits := step(true)
	if got[kernels.NameKVWriteRows] != L || got[kernels.NameAttnDecodeRows] != L || got[kernels.NameKVWrite] != L {
		t.Errorf("a step of 4 decoding sequences and one prefilling, %d blocks: %d row K/V writes, %d row attentions, %d K/V writes; want %d each\n%v",
			L, got[kernels.NameKVWriteRows], got[kernels.NameAttnDecodeRows], got[kernels.NameKVWrite], L, got)
	}
	plain, want := step(false)
	if plain[kernels.NameKVWriteRows] != 0 || plain[kernels.NameKVWrite] != 5*L {
		t.Errorf("with the row kernels off: %v", plain)
	}
	for i := range want {
		if !slices.Equal(logits[i], want[i]) {
			t.Fatalf("work %d: logits differ from the per-sequence kernels'", i)
		}
	}
}

// TestBatchStepProfiled checks that a profiled batched step gives Step's
// logits and times every op: each block's row attention and K/V write
// once, its products, the head; the classes sum to the step.
func TestBatchStepProfiled(t *testing.T) {
	ctx := context.Background()
	m := open(t, modelPath(t, "tiny-hd64", synth.Safetensors))
	L := m.Config.Layers
	r := newRig(t, testDevice(t))
	o := engine.Options{Budget: 256 << 20, MaxTokens: 64, PrefillChunk: 16, KVBlocks: 32}
	o.ReserveBytes = engine.BatchBytes(m.Config, o, 4)
	e, err := engine.New(ctx, r.d, r.ks, r.dev, r.host, m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer r.zero(t)
	defer e.Close()
	b, err := e.NewBatch(4)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var ws []engine.Work
	for i := range 3 {
		ids := []int32{int32(3 + i), 9, 4}
		id, _, err := b.Add(ids)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Step(ctx, []engine.Work{{Seq: id, Tokens: ids}}); err != nil {
			t.Fatal(err)
		}
		if err := b.Append(id, 7); err != nil {
			t.Fatal(err)
		}
		ws = append(ws, engine.Work{Seq: id, Start: len(ids), Tokens: []int32{7}, Logits: true})
	}
	got, p, err := b.StepProfiled(ctx, ws)
	if err != nil {
		t.Fatal(err)
	}
	if p == nil || p.Seconds <= 0 || p.Segments < 7*L {
		t.Fatalf("profile %+v", p)
	}
	sum := 0.0
	for _, s := range p.Classes {
		sum += s
	}
	if math.Abs(sum-p.Seconds) > 1e-6*max(1, p.Seconds) {
		t.Errorf("classes sum to %g s, the step took %g s", sum, p.Seconds)
	}
	for op, want := range map[string]int{"attention": L, "kv write": L, "q, k, v": L, "down": L, "lm head": 1, "download": 1} {
		if p.Ops[op].Count != want {
			t.Errorf("op %q ran %d times, want %d (%v)", op, p.Ops[op].Count, want, p.Ops)
		}
	}
	// The same step again, unprofiled: it writes the same K/V again, so
	// its logits must be the profiled step's.
	again, err := b.Step(ctx, ws)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if !slices.Equal(got[i], again[i]) {
			t.Fatalf("work %d: the profiled step's logits differ from Step's", i)
		}
	}
}
