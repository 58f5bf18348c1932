package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/kvcache"
	"github.com/memwall/memwall/telemetry"
	"github.com/memwall/memwall/tokenizer"
)

// Options configure a Server. ModelName is required.
type Options struct {
	// ModelName is the model's id in /v1/models, the name requests must
	// give, and the model_name label of every metric.
	ModelName string
	// MaxSeqs is the most sequences running at once (0 or above the
	// batch's: the batch's MaxSeqs).
	MaxSeqs int
	// MaxQueue is the most requests waiting for admission; one more gets
	// 429 (default 1024).
	MaxQueue int
	// APIKey, when set, is required as "Authorization: Bearer KEY" on
	// /v1/ (401 otherwise).
	APIKey string
	// Tokenizer encodes text prompts and decodes the output; nil: prompts
	// must be token ids and the output is ids only (return_token_ids).
	Tokenizer *tokenizer.Tokenizer
	// Chat renders /v1/chat/completions' messages; nil: they get a 400
	// saying the model has no chat template.
	Chat *ChatTemplate
	// IsEOS says which tokens end generation (nil: none).
	IsEOS func(id int) bool
	// Registry receives the metrics that /metrics serves; nil: the server
	// makes its own.
	Registry *prometheus.Registry
	// Pools are exported with telemetry.RegisterPool (none if empty).
	Pools []telemetry.PoolSource
	// Memory is where the weights live, for memwall's gauges.
	Memory Memory
	// MemoryNow, when set, is called for memwall's gauges instead of
	// Memory (a budget that changes at run time); it may be called from
	// any goroutine.
	MemoryNow func() Memory
	// Sharing, when set, is the budget this model shares with others
	// (package fleet): the scheduler calls Begin before it steps after
	// being idle and End when it goes idle again, and holds Lock around
	// every step, so that the model's weights move only between steps.
	Sharing Sharing
	// StreamedBytes returns the weight bytes streamed so far (called from
	// the scheduler between steps); nil: 0.
	StreamedBytes func() uint64
	// Unloader, with UnloadAfter above 0, takes the model off the device
	// and out of pinned host memory once it has had no request for
	// UnloadAfter, and loads it again when the next request comes (which
	// waits for the load). Nil or 0: the model stays loaded.
	Unloader    Unloader
	UnloadAfter time.Duration
	// Watermark is the fraction of KV blocks an admission leaves free so
	// that running sequences can grow (default 0.01, as kvcache/sched).
	Watermark float64
	// Logger receives one debug line per request; nil is silent.
	Logger *slog.Logger
}

// Sharing is what a server needs of a budget shared with other models
// (*fleet.Fleet has it).
type Sharing interface {
	Begin(ctx context.Context, name string) error
	End(ctx context.Context, name string) error
	Lock(name string) (*engine.Engine, func(), error)
}

// Unloader takes a model off and loads it again (Options.Unloader). The
// scheduler calls it between steps, after Sharing.End and before
// Sharing.Begin, one call at a time.
type Unloader interface {
	// Unload closes b and frees what the model holds on the device and in
	// pinned host memory; the model keeps no share of a shared budget.
	Unload(ctx context.Context, b *engine.Batch) error
	// Load makes the model's batch again, with the shape of the one the
	// server was made with (its vocabulary, sequence, step and KV sizes).
	Load(ctx context.Context) (*engine.Batch, error)
}

// Server is an OpenAI-compatible server over one engine.Batch: Handler
// serves HTTP, Run schedules. Requests join and leave the batch between
// steps (continuous batching).
type Server struct {
	o Options
	// The batch's shape, fixed at New (the batch may be unloaded).
	shape shape
	reg   *prometheus.Registry
	m     metrics
	wake  chan struct{}
	made  time.Time

	mu       sync.Mutex
	cond     *sync.Cond
	incoming []*request
	snap     snapshot
	inflight int // requests submitted whose handler has not returned
	draining bool
	stopped  bool

	// b is the batch, nil while unloaded: the scheduler goroutine writes
	// it (holding bmu) and reads it freely; others read it holding bmu.
	bmu sync.RWMutex
	b   *engine.Batch

	// The scheduler goroutine's own.
	running, waiting []*request
	watermark        int
	active           bool // between Sharing.Begin and End
}

// shape is what the handlers and the scheduler read of the batch.
type shape struct {
	vocab, seqTokens, maxTokens, maxSeqs, blocks int
}

func shapeOf(b *engine.Batch) shape {
	return shape{vocab: b.Vocab(), seqTokens: b.SeqTokens(), maxTokens: b.MaxTokens(), maxSeqs: b.MaxSeqs(), blocks: b.Cache().Config().Blocks}
}

// New returns a server over b, which it drives from Run; the batch stays
// the caller's to close after Run returns: Batch returns it (another one
// if the model was unloaded and loaded again, nil if Run left it
// unloaded).
func New(b *engine.Batch, o Options) (*Server, error) {
	if o.ModelName == "" {
		return nil, errors.New("serve: no model name")
	}
	if o.MaxSeqs <= 0 || o.MaxSeqs > b.MaxSeqs() {
		o.MaxSeqs = b.MaxSeqs()
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = 1024
	}
	if !(o.Watermark >= 0 && o.Watermark < 1) {
		return nil, fmt.Errorf("serve: watermark %v, want 0 <= w < 1", o.Watermark)
	}
	if o.Watermark == 0 {
		o.Watermark = 0.01
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.UnloadAfter < 0 {
		return nil, fmt.Errorf("serve: UnloadAfter %v is negative", o.UnloadAfter)
	}
	s := &Server{b: b, shape: shapeOf(b), o: o, reg: o.Registry, wake: make(chan struct{}, 1), made: time.Now()}
	s.cond = sync.NewCond(&s.mu)
	s.watermark = int(math.Ceil(o.Watermark * float64(s.shape.blocks)))
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
	}
	if err := s.register(s.reg); err != nil {
		return nil, err
	}
	return s, nil
}

// Batch returns the model's batch, nil while it is unloaded
// (Options.Unloader). Close it after Run returns.
func (s *Server) Batch() *engine.Batch {
	s.bmu.RLock()
	defer s.bmu.RUnlock()
	return s.b
}

// Loaded reports whether the model is loaded (Options.Unloader).
func (s *Server) Loaded() bool { return s.Batch() != nil }

// kvStats are the KV cache's figures, zero while the model is unloaded.
func (s *Server) kvStats() kvcache.CacheStats {
	s.bmu.RLock()
	defer s.bmu.RUnlock()
	if s.b == nil {
		return kvcache.CacheStats{}
	}
	return s.b.Cache().Stats()
}

// Registry returns the registry the server's metrics are in
// (Options.Registry, or the one it made): give it to the other servers of
// a Group.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Run schedules until ctx is done, then ends the requests still held
// (drain first to let them finish) and returns nil; an engine error ends
// them with it and is returned. Call it once.
func (s *Server) Run(ctx context.Context) error { return s.loop(ctx) }

// Errors submit returns.
var (
	errDraining  = errors.New("serve: the server is shutting down")
	errQueueFull = errors.New("serve: the queue is full")
)

// submit queues r for the scheduler. The caller must call done once it
// has read r's last event.
func (s *Server) submit(r *request) error {
	s.mu.Lock()
	switch {
	case s.draining || s.stopped:
		s.mu.Unlock()
		return errDraining
	case s.snap.waiting >= s.o.MaxQueue:
		s.mu.Unlock()
		return errQueueFull
	}
	s.incoming = append(s.incoming, r)
	s.snap.waiting++
	s.inflight++
	s.mu.Unlock()
	s.poke()
	context.AfterFunc(r.ctx, s.poke)
	return nil
}

// poke wakes the scheduler if it sleeps.
func (s *Server) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// done says that a submitted request's handler has returned.
func (s *Server) done() {
	s.mu.Lock()
	s.inflight--
	s.mu.Unlock()
	s.cond.Broadcast()
}

// Drain refuses new requests (503) and waits until every request taken
// has ended and its handler returned, or ctx is done (its error).
func (s *Server) Drain(ctx context.Context) error {
	stop := context.AfterFunc(ctx, s.cond.Broadcast)
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draining = true
	for s.inflight > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("serve: drain: %d requests still running: %w", s.inflight, err)
		}
		s.cond.Wait()
	}
	return nil
}

// Counts is what the scheduler holds: requests running (holding KV
// blocks), waiting, and the KV cache's usage (0..1).
type Counts struct {
	Running, Waiting int
	KVUsage          float64
}

// Counts returns the scheduler's last published counts.
func (s *Server) Counts() Counts {
	s.mu.Lock()
	c := Counts{Running: s.snap.running, Waiting: s.snap.waiting}
	s.mu.Unlock()
	c.KVUsage = s.kvStats().Usage()
	return c
}
