package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/kvcache"
)

// Result describes one Generate call.
type Result struct {
	PromptTokens int   `json:"prompt_tokens"`
	Tokens       []int `json:"tokens"` // generated ids, in order
	// Stop says why generation ended: "eos", "max_new" or "context" (the
	// KV cache's MaxTokens reached).
	Stop string `json:"stop"`
	// PrefillSeconds is the time from the call to the first token's
	// logits on the host; DecodeSeconds the rest.
	PrefillSeconds    float64 `json:"prefill_seconds"`
	DecodeSeconds     float64 `json:"decode_seconds"`
	PrefillTokensPerS float64 `json:"prefill_tokens_per_s"`
	// DecodeTokensPerS counts the tokens after the first over DecodeSeconds.
	DecodeTokensPerS float64 `json:"decode_tokens_per_s"`
	// With Options.Timing: PrefillCopySeconds is the device time of the
	// weight copies issued during the prefill (back to back it is the
	// link's share of the prefill), PrefillDeviceSeconds the compute
	// stream's time from the prefill's first op to its logits.
	PrefillCopySeconds   float64 `json:"prefill_copy_seconds,omitempty"`
	PrefillDeviceSeconds float64 `json:"prefill_device_seconds,omitempty"`
	// StreamedBytesPerToken is the weight bytes copied per decode step.
	StreamedBytesPerToken uint64 `json:"streamed_bytes_per_token"`
	// HostBytesPerToken is the weight bytes the host device's products
	// read per decode step (the hosted blocks, Options.HostLayers).
	HostBytesPerToken uint64 `json:"host_bytes_per_token"`
	// ProductWeightBytes is the weight bytes a decode step's matrix
	// products read (every block's seven matrices and the LM head).
	ProductWeightBytes uint64 `json:"product_weight_bytes"`
	// DecodeGraphSteps is how many decode steps replayed the captured
	// graph (Options.NoGraph, Engine.GraphStatus); the others ran plain
	// launches.
	DecodeGraphSteps int `json:"decode_graph_steps"`
	// With Options.Profile (and at least 4 new tokens):
	// DecodeStepDeviceSeconds is one decode step's device time, from its
	// first op to its last, queued behind a spin kernel so that the host's
	// launch overhead does not show. DecodeProfile is the device seconds
	// per op class (ClassProducts, ClassAttention, ClassNorms, ClassOther)
	// of another step with an event before every op, and DecodeProfileOps
	// per op (its name, e.g. "rmsnorm", "round", "q, k, v", "attention",
	// with how many ran). The events keep kernels from overlapping and take
	// time of their own, so the segments (DecodeProfileSegments of them)
	// sum to DecodeProfileSeconds, more than the unprofiled step: the
	// difference over the segments is the profile's cost per op.
	DecodeStepDeviceSeconds float64 `json:"decode_step_device_seconds,omitempty"`
	// DecodeGraphStepDeviceSeconds (with Options.Profile, when decode
	// replays a graph, at least 5 new tokens) is the device time of one
	// replay of the fourth step, queued behind a spin kernel like
	// DecodeStepDeviceSeconds, whose plain step it compares with: the
	// difference is what the graph saves between kernels on the device.
	DecodeGraphStepDeviceSeconds float64              `json:"decode_graph_step_device_seconds,omitempty"`
	DecodeProfile                map[string]float64   `json:"decode_profile_seconds,omitempty"`
	DecodeProfileOps             map[string]ProfileOp `json:"decode_profile_ops,omitempty"`
	DecodeProfileSeconds         float64              `json:"decode_profile_step_seconds,omitempty"`
	DecodeProfileSegments        int                  `json:"decode_profile_segments,omitempty"`
	// DecodeProfileQueueSeconds is the longer of the two profiled steps'
	// host time from the spin's launch to the step's last op queued: when
	// it is below the spin (30 ms) the device ran the steps back to back.
	DecodeProfileQueueSeconds float64 `json:"decode_profile_queue_seconds,omitempty"`
	// FirstLogits are the logits that chose the first token.
	FirstLogits []float32 `json:"-"`
	// Logits[i] chose Tokens[i] (with Sampling.KeepLogits).
	Logits [][]float32 `json:"-"`
}

// Generate runs prompt through the model (in chunks of
// Options.PrefillChunk) and then generates up to s.MaxNew tokens, calling
// onToken (which may be nil) with each as soon as it is chosen; an error
// from onToken or ctx ends generation with that error. A prompt that is
// empty, holds an id outside the vocabulary, or does not leave room for
// one token within Options.MaxTokens is an error naming the limit. The KV
// blocks of the sequence are given back before Generate returns. After a
// device error the Engine must be closed.
func (e *Engine) Generate(ctx context.Context, prompt []int, s Sampling, onToken func(id int) error) (*Result, error) {
	if e.closed {
		return nil, fmt.Errorf("engine: closed")
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if s.MaxNew == 0 {
		s.MaxNew = 16
	}
	if len(prompt) == 0 {
		return nil, fmt.Errorf("engine: empty prompt")
	}
	if len(prompt) >= e.opt.MaxTokens {
		return nil, fmt.Errorf("engine: prompt of %d tokens leaves no room within the %d-token limit (max_position_embeddings %d in %s)",
			len(prompt), e.opt.MaxTokens, e.cfg.Context, e.cfg.Source)
	}
	ids := make([]int32, len(prompt))
	for i, id := range prompt {
		if id < 0 || id >= e.cfg.Vocab {
			return nil, fmt.Errorf("engine: prompt token %d at position %d outside the vocabulary of %d (vocab_size in %s)", id, i, e.cfg.Vocab, e.cfg.Source)
		}
		ids[i] = int32(id)
	}
	e.seq++
	seq := e.seq
	if _, err := e.kv.Add(seq, ids, 0); err != nil {
		return nil, fmt.Errorf("engine: KV blocks for the prompt: %w", err)
	}
	defer e.kv.Free(seq)

	res := &Result{PromptTokens: len(prompt), Stop: "max_new"}
	began := time.Now()
	logits, err := e.prefill(ctx, ids, seq, res)
	if err != nil {
		return res, err
	}
	res.FirstLogits = logits
	smp := newSampler(s)
	tok := smp.next(logits)
	res.PrefillSeconds = time.Since(began).Seconds()
	res.PrefillTokensPerS = float64(len(ids)) / max(res.PrefillSeconds, 1e-9)
	if s.KeepLogits {
		res.Logits = append(res.Logits, logits)
	}
	return res, e.decode(ctx, seq, len(ids), tok, s, smp, onToken, res)
}

// prefill runs the prompt ids of sequence seq in chunks and returns the
// last token's logits (with Options.Timing, the prefill's device times go
// into res).
func (e *Engine) prefill(ctx context.Context, ids []int32, seq kvcache.SeqID, res *Result) ([]float32, error) {
	var tm *prefillTiming
	if e.opt.Timing {
		var err error
		if tm, err = e.startTiming(); err != nil {
			return nil, err
		}
		defer tm.close(e)
	}
	var logits []float32
	for start := 0; start < len(ids); start += e.opt.PrefillChunk {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("engine: prefill: %d of %d prompt tokens: %w", start, len(ids), err)
		}
		end := min(start+e.opt.PrefillChunk, len(ids))
		out, err := e.step(ids[start:end], start, e.kv.Table(seq), end == len(ids))
		if err != nil {
			return nil, err
		}
		logits = out.logits
	}
	if tm != nil {
		if err := tm.finish(e, res); err != nil {
			return nil, err
		}
	}
	return logits, nil
}

// Profiled decode steps (Options.Profile): the second decode step is timed
// whole, the third per op class.
const (
	profileNone = iota
	profileWhole
	profileClasses
	profileGraph // the fourth step, when decode replays a graph: one replay timed
)

// decode generates from tok, the first token, at position pos of sequence
// seq until s or the context stops it, filling res.
func (e *Engine) decode(ctx context.Context, seq kvcache.SeqID, pos, tok int, s Sampling, smp *sampler, onToken func(id int) error, res *Result) error {
	decodeStart := time.Now()
	streamed0 := e.res.Stats().StreamedBytes
	res.ProductWeightBytes = e.productWeightBytes()
	res.HostBytesPerToken = e.HostWeightBytes()
	var profiled time.Duration // wall time of the profiled steps
	steps, profiledSteps := 0, 0
	graphSteps0 := e.graphSteps
	defer func() { res.DecodeGraphSteps += e.graphSteps - graphSteps0 }()
	for {
		res.Tokens = append(res.Tokens, tok)
		if onToken != nil {
			if err := onToken(tok); err != nil {
				return err
			}
		}
		if !s.IgnoreEOS && e.cfg.IsEOS(tok) {
			res.Stop = "eos"
			break
		}
		if len(res.Tokens) >= s.MaxNew {
			break
		}
		if pos >= e.opt.MaxTokens {
			res.Stop = "context"
			break
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("engine: %d of %d tokens generated: %w", len(res.Tokens), s.MaxNew, err)
		}
		if err := e.kv.Append(seq, int32(tok)); err != nil {
			return fmt.Errorf("engine: KV block for position %d: %w", pos, err)
		}
		kind := profileNone
		if e.opt.Profile && s.MaxNew >= 4 && (steps == 1 || steps == 2) {
			kind = steps // profileWhole, then profileClasses
		}
		if e.opt.Profile && s.MaxNew >= 5 && steps == 3 && e.graph != nil {
			kind = profileGraph
		}
		steps++
		t0 := time.Now()
		logits, err := e.decodeStep(res, int32(tok), pos, e.kv.Table(seq), kind)
		if err != nil {
			return err
		}
		if kind != profileNone {
			profiled += time.Since(t0)
			profiledSteps++
		}
		pos++
		tok = smp.next(logits)
		if s.KeepLogits {
			res.Logits = append(res.Logits, logits)
		}
	}
	res.DecodeSeconds = (time.Since(decodeStart) - profiled).Seconds()
	if n := len(res.Tokens) - 1; n > 0 {
		res.StreamedBytesPerToken = (e.res.Stats().StreamedBytes - streamed0) / uint64(n)
		if n -= profiledSteps; n > 0 {
			res.DecodeTokensPerS = float64(n) / max(res.DecodeSeconds, 1e-9)
		}
	}
	return nil
}

// decodeStep runs one decode step of tok at pos and returns its logits; a
// profiled one (kind) leaves its figures in res.
func (e *Engine) decodeStep(res *Result, tok int32, pos int, table []int32, kind int) ([]float32, error) {
	plainProfile := kind == profileWhole || kind == profileClasses
	if plainProfile {
		if err := e.startProfile(kind == profileClasses); err != nil {
			return nil, err
		}
	}
	if !plainProfile && e.graphReason == "" {
		var timed *float64
		if kind == profileGraph {
			timed = &res.DecodeGraphStepDeviceSeconds
		}
		logits, ok, err := e.graphStep(tok, pos, table, timed)
		if err != nil || ok {
			return logits, err
		}
	}
	out, err := e.step([]int32{tok}, pos, table, true)
	if plainProfile {
		err = errors.Join(err, e.profiled(res, kind == profileClasses))
	}
	if err != nil {
		return nil, err
	}
	return out.logits, nil
}

// profiled ends a profiled decode step: its figures go into res (the
// classes when classes, else the whole step's device time).
func (e *Engine) profiled(res *Result, classes bool) error {
	if e.prof == nil {
		return nil
	}
	queued := e.prof.queued.Sub(e.prof.began).Seconds()
	sp, err := e.finishProfile()
	if err != nil {
		return err
	}
	res.DecodeProfileQueueSeconds = max(res.DecodeProfileQueueSeconds, queued)
	if classes {
		res.DecodeProfile, res.DecodeProfileOps, res.DecodeProfileSeconds = sp.classes, sp.ops, sp.all
		res.DecodeProfileSegments = sp.segments
	} else {
		res.DecodeStepDeviceSeconds = sp.all
	}
	return nil
}

// prefillTiming measures a prefill on the device.
type prefillTiming struct {
	start, end device.Event
	copies     []uint64 // each group's copy count before the prefill
}

func (e *Engine) startTiming() (*prefillTiming, error) {
	tm := &prefillTiming{}
	var err error
	if tm.start, err = e.d.NewEvent(true); err != nil {
		return nil, fmt.Errorf("engine: timing event: %w", err)
	}
	if tm.end, err = e.d.NewEvent(true); err != nil {
		e.d.DestroyEvent(tm.start)
		return nil, fmt.Errorf("engine: timing event: %w", err)
	}
	for gi := range e.plan.Groups {
		tm.copies = append(tm.copies, e.res.Copies(gi))
	}
	if err := e.d.EventRecord(tm.start, e.compute); err != nil {
		tm.close(e)
		return nil, fmt.Errorf("engine: timing: %w", err)
	}
	return tm, nil
}

// finish sums the device time of the copies issued since start (a
// group's last two are kept) and the compute stream's elapsed time.
func (tm *prefillTiming) finish(e *Engine, res *Result) error {
	if err := e.d.EventRecord(tm.end, e.compute); err != nil {
		return fmt.Errorf("engine: timing: %w", err)
	}
	if err := e.d.EventSynchronize(tm.end); err != nil {
		return fmt.Errorf("engine: timing: %w", err)
	}
	d, err := e.d.EventElapsed(tm.start, tm.end)
	if err != nil {
		return fmt.Errorf("engine: timing: %w", err)
	}
	res.PrefillDeviceSeconds = d.Seconds()
	for gi, c0 := range tm.copies {
		c1 := e.res.Copies(gi)
		for n := max(c0, c1-min(c1, 2)); n < c1; n++ {
			cd, err := e.res.CopyDuration(gi, n)
			if err != nil {
				return fmt.Errorf("engine: timing: %w", err)
			}
			res.PrefillCopySeconds += cd.Seconds()
		}
	}
	return nil
}

func (tm *prefillTiming) close(e *Engine) {
	e.d.DestroyEvent(tm.start)
	e.d.DestroyEvent(tm.end)
}
