package serve

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/kvcache"
)

// request is one generation in the scheduler. The handler that submitted
// it reads out; the scheduler goroutine owns every other field once it is
// submitted.
type request struct {
	ctx       context.Context
	tokens    []int32 // the prompt, then the tokens generated
	prompt    int
	maxNew    int
	ignoreEOS bool
	sampler   *engine.Sampler
	out       chan event // room for every event it will get
	arrival   time.Time

	seq       kvcache.SeqID
	admitted  bool // holds KV blocks
	counted   bool // prompt and prefix figures counted (first admission)
	computed  int  // positions whose K/V is written
	pending   bool // the last token is sampled but not in the cache
	generated int
	cached    int    // prompt tokens found in the prefix cache at first admission
	finish    string // set when the last token is sampled
	first     time.Time
	last      time.Time
}

// event is a token (id ≥ 0) or the end of a request (finish or err set).
type event struct {
	id     int
	finish string // "stop" (EOS) or "length"
	err    error
	cached int // with the finish: prompt tokens found in the prefix cache
}

// errShutdown ends the requests still held when the scheduler stops.
var errShutdown = errors.New("serve: the server stopped")

// loop is the scheduler: it runs until ctx is done (then ends every
// request it holds with errShutdown) or the engine fails (then it ends
// them with that error and returns it).
func (s *Server) loop(ctx context.Context) (err error) {
	defer s.stopAll(errShutdown)
	defer func() {
		// A background context: the model must leave the active set even
		// when ctx ended the loop.
		if eerr := s.idle(context.Background()); err == nil {
			err = eerr
		}
	}()
	for steps := 0; ; steps++ {
		s.takeIncoming()
		s.dropCancelled()
		if len(s.running)+len(s.waiting) == 0 {
			if err := s.idle(ctx); err != nil {
				s.stopAll(err)
				return err
			}
			s.publish()
			if err := s.wait(ctx); err != nil {
				s.stopAll(err)
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		if !s.load(ctx) {
			continue
		}
		if err := s.busy(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.stopAll(err)
			return err
		}
		ws, who, err := s.schedule()
		if err != nil {
			s.stopAll(err)
			return err
		}
		s.publish()
		if len(ws) == 0 {
			if len(s.running) == 0 && len(s.waiting) > 0 {
				r := s.waiting[0]
				s.waiting = s.waiting[1:]
				s.end(r, "", fmt.Errorf("serve: a prompt of %d tokens needs more KV blocks than the cache holds (%d)", len(r.tokens), s.shape.blocks))
			}
			continue
		}
		t0 := time.Now()
		logits, err := s.step(ctx, ws)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			err = fmt.Errorf("serve: step: %w", err)
			s.stopAll(err)
			return err
		}
		s.m.stepSeconds.Observe(time.Since(t0).Seconds())
		if err := s.after(ws, who, logits); err != nil {
			s.stopAll(err)
			return err
		}
	}
}

// errLoad marks a load that failed (503: the request may be retried).
var errLoad = errors.New("serve: the model could not be loaded")

// wait sleeps until a request or ctx's end wakes the scheduler; with an
// Unloader, a model that stays idle UnloadAfter is unloaded meanwhile.
func (s *Server) wait(ctx context.Context) error {
	var unload <-chan time.Time
	if s.o.Unloader != nil && s.o.UnloadAfter > 0 && s.b != nil {
		t := time.NewTimer(s.o.UnloadAfter)
		defer t.Stop()
		unload = t.C
	}
	select {
	case <-ctx.Done():
	case <-s.wake:
	case <-unload:
		return s.unload(ctx)
	}
	return nil
}

// unload takes the idle model off (Unloader.Unload). A failure stops the
// server: what the model held is unknown.
func (s *Server) unload(ctx context.Context) error {
	b := s.b
	s.bmu.Lock()
	s.b = nil
	s.bmu.Unlock()
	t0 := time.Now()
	if err := s.o.Unloader.Unload(ctx, b); err != nil {
		return fmt.Errorf("serve: unload: %w", err)
	}
	s.m.unloads.Inc()
	s.o.Logger.Info("serve: unloaded", "model", s.o.ModelName, "idle_s", s.o.UnloadAfter.Seconds(), "took_s", time.Since(t0).Seconds())
	return nil
}

// load loads the unloaded model before its next step (Unloader.Load),
// and reports whether it is loaded. A failed load ends the requests
// waiting with errLoad (they may be retried: the budget may have no room
// now) and the server goes on.
func (s *Server) load(ctx context.Context) bool {
	if s.b != nil {
		return true
	}
	t0 := time.Now()
	b, err := s.o.Unloader.Load(ctx)
	if err == nil && shapeOf(b) != s.shape {
		b.Close()
		err = fmt.Errorf("the batch loaded again has the shape %+v, not %+v", shapeOf(b), s.shape)
	}
	if err != nil {
		if ctx.Err() != nil {
			return false
		}
		err = fmt.Errorf("%w: %w", errLoad, err)
		s.o.Logger.Warn("serve: load", "model", s.o.ModelName, "err", err)
		for _, r := range s.waiting {
			s.end(r, "", err)
		}
		s.waiting = nil
		s.publish()
		return false
	}
	s.bmu.Lock()
	s.b = b
	s.bmu.Unlock()
	s.m.loads.Inc()
	s.m.loadSeconds.Observe(time.Since(t0).Seconds())
	s.o.Logger.Info("serve: loaded", "model", s.o.ModelName, "took_s", time.Since(t0).Seconds())
	return true
}

// busy tells the shared budget that the model has work (Sharing.Begin:
// its weights may move in first), once per busy spell.
func (s *Server) busy(ctx context.Context) error {
	if s.o.Sharing == nil || s.active {
		return nil
	}
	if err := s.o.Sharing.Begin(ctx, s.o.ModelName); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	s.active = true
	return nil
}

// idle tells the shared budget that the model's work is done
// (Sharing.End).
func (s *Server) idle(ctx context.Context) error {
	if s.o.Sharing == nil || !s.active {
		return nil
	}
	s.active = false
	if err := s.o.Sharing.End(ctx, s.o.ModelName); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// step runs one batched step, holding the shared budget's lock on the
// model when there is one.
func (s *Server) step(ctx context.Context, ws []engine.Work) ([][]float32, error) {
	if s.o.Sharing != nil {
		_, unlock, err := s.o.Sharing.Lock(s.o.ModelName)
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	return s.b.Step(ctx, ws)
}

// takeIncoming moves submitted requests to the waiting queue.
func (s *Server) takeIncoming() {
	s.mu.Lock()
	s.waiting = append(s.waiting, s.incoming...)
	s.incoming = s.incoming[:0]
	s.mu.Unlock()
}

// dropCancelled ends the requests whose client went away (or whose handler
// stopped them): their blocks are freed before the next step.
func (s *Server) dropCancelled() {
	keep := func(q []*request) []*request {
		out := q[:0]
		for _, r := range q {
			if r.ctx.Err() != nil {
				s.end(r, "", r.ctx.Err())
				s.m.aborted.Inc()
				continue
			}
			out = append(out, r)
		}
		return out
	}
	s.running = keep(s.running)
	s.waiting = keep(s.waiting)
}

// schedule builds the next step with kvcache/sched's policy: the running
// sequences, in admission order, get their next chunk while the token
// budget lasts (a decoding one first gets a block for its pending token,
// preempting the latest admitted sequences, perhaps itself, by recompute
// when blocks run out); then, unless something was preempted, waiting
// requests are admitted first come first served while their blocks fit
// above the watermark, each with its first chunk.
func (s *Server) schedule() ([]engine.Work, []*request, error) {
	budget := s.shape.maxTokens
	var ws []engine.Work
	var who []*request
	m := s.b.Cache().Manager()
	preempted := false
	for i := 0; i < len(s.running) && budget > 0; i++ {
		r := s.running[i]
		if r.pending {
			for m.FreeBlocks() < mustNeed(m.AppendNeeds(r.seq, 1)) {
				v := s.running[len(s.running)-1]
				s.running = s.running[:len(s.running)-1]
				if err := s.preempt(v); err != nil {
					return nil, nil, err
				}
				preempted = true
				if v == r {
					break
				}
			}
			if !r.admitted {
				break
			}
			if err := s.b.Append(r.seq, r.tokens[len(r.tokens)-1]); err != nil {
				return nil, nil, fmt.Errorf("serve: append: %w", err)
			}
			r.pending = false
		}
		ws, who, budget = r.chunk(ws, who, budget)
	}
	if preempted {
		return ws, who, nil
	}
	for len(s.waiting) > 0 && budget > 0 && len(s.running) < s.o.MaxSeqs {
		r := s.waiting[0]
		ok, err := s.admit(r)
		if err != nil || !ok {
			return ws, who, err
		}
		s.waiting = s.waiting[1:]
		s.running = append(s.running, r)
		ws, who, budget = r.chunk(ws, who, budget)
	}
	return ws, who, nil
}

// chunk appends r's next chunk, at most budget tokens, to the step.
func (r *request) chunk(ws []engine.Work, who []*request, budget int) ([]engine.Work, []*request, int) {
	n := min(len(r.tokens)-r.computed, budget)
	if n <= 0 {
		return ws, who, budget
	}
	end := r.computed + n
	ws = append(ws, engine.Work{Seq: r.seq, Start: r.computed, Tokens: r.tokens[r.computed:end], Logits: end == len(r.tokens)})
	return ws, append(who, r), budget - n
}

func mustNeed(n int, err error) int {
	if err != nil {
		return math.MaxInt
	}
	return n
}

// admit gives r its blocks (sharing its cached prefix), or reports that
// they do not fit above the watermark now.
func (s *Server) admit(r *request) (bool, error) {
	m := s.b.Cache().Manager()
	if m.AddNeeds(r.tokens, 0)+s.watermark > m.FreeBlocks() {
		return false, nil
	}
	seq, cached, err := s.b.Add(r.tokens)
	if err != nil {
		return false, fmt.Errorf("serve: admit: %w", err)
	}
	r.seq, r.computed, r.admitted, r.pending = seq, cached, true, false
	if !r.counted {
		r.counted, r.cached = true, cached
		s.m.promptTokens.Add(float64(r.prompt))
		s.m.prefixQueries.Add(float64(len(r.tokens)))
		s.m.prefixHits.Add(float64(cached))
		s.m.queueSeconds.Observe(time.Since(r.arrival).Seconds())
	}
	return true, nil
}

// preempt frees r's blocks and puts it first in the queue, to be
// prefilled again with every token it knows (recompute).
func (s *Server) preempt(r *request) error {
	s.m.preemptions.Inc()
	if err := s.b.Free(r.seq); err != nil {
		return fmt.Errorf("serve: preempt: %w", err)
	}
	r.admitted, r.computed, r.pending = false, 0, false
	s.waiting = append([]*request{r}, s.waiting...)
	return nil
}

// after takes a step's logits: each sequence that finished its prompt or
// decoded samples its next token, which goes to its client; those that
// end give their blocks back.
func (s *Server) after(ws []engine.Work, who []*request, logits [][]float32) error {
	now := time.Now()
	for k, r := range who {
		r.computed += len(ws[k].Tokens)
		if logits[k] == nil {
			if err := s.b.Computed(r.seq, r.computed); err != nil {
				return fmt.Errorf("serve: %w", err)
			}
			continue
		}
		tok := r.sampler.Next(logits[k])
		r.tokens = append(r.tokens, int32(tok))
		r.pending = true
		r.generated++
		s.m.generationTokens.Inc()
		if r.generated == 1 {
			r.first = now
			s.m.ttft.Observe(now.Sub(r.arrival).Seconds())
		} else {
			s.m.itl.Observe(now.Sub(r.last).Seconds())
		}
		r.last = now
		r.out <- event{id: tok, cached: r.cached}
		switch {
		case !r.ignoreEOS && s.o.IsEOS != nil && s.o.IsEOS(tok):
			r.finish = "stop"
		case r.generated >= r.maxNew || len(r.tokens) >= s.shape.seqTokens:
			r.finish = "length"
		}
	}
	kept := s.running[:0]
	for _, r := range s.running {
		if r.finish != "" {
			s.end(r, r.finish, nil)
			continue
		}
		kept = append(kept, r)
	}
	s.running = kept
	return nil
}

// end frees r's blocks and sends its last event.
func (s *Server) end(r *request, finish string, err error) {
	if r.admitted {
		if ferr := s.b.Free(r.seq); ferr != nil && err == nil {
			err = fmt.Errorf("serve: free: %w", ferr)
		}
		r.admitted = false
	}
	if finish != "" {
		s.m.success.WithLabelValues(finish).Inc()
		s.m.e2e.Observe(time.Since(r.arrival).Seconds())
	}
	r.out <- event{finish: finish, err: err, cached: r.cached}
	close(r.out)
}

// stopAll ends every request held with err.
func (s *Server) stopAll(err error) {
	s.takeIncoming()
	for _, q := range [][]*request{s.running, s.waiting} {
		for _, r := range q {
			s.end(r, "", err)
		}
	}
	s.running, s.waiting = nil, nil
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.publish()
}
