package sched

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"

	"github.com/memwall/memwall/kvcache"
)

// Options configure Simulate.
type Options struct {
	Model Model
	// VRAMBytes is the device memory; what the weights leave of it is the
	// KV budget.
	VRAMBytes uint64
	// BlockTokens is the tokens per block (default 16).
	BlockTokens int
	// TokenBudget is the most tokens one step computes (default 8192):
	// every running sequence's next token first, then prompt chunks.
	TokenBudget int
	// MaxSeqs caps the sequences running at once (default 256).
	MaxSeqs int
	// Preempt is "recompute" (default: the victim's blocks are freed and
	// its tokens prefilled again later, its cached prefix blocks reused if
	// still cached) or "swap" (its private blocks go to host memory and
	// come back before it runs again; recompute when the host is full).
	Preempt string
	// HostBytes is the swap space (default: the KV budget).
	HostBytes uint64
	Hardware  Hardware
	// NoPrefixCache turns the paged policy's prefix caching off.
	NoPrefixCache bool
	// Watermark is the fraction of blocks an admission leaves free
	// (default 0.01), so that running sequences can grow.
	Watermark float64
	// TimelinePoints bounds each policy's timeline (default 600).
	TimelinePoints int
	// Seed draws the token ids of prompts and outputs.
	Seed uint64
	// OnEvent, when set, receives the paged policy's KV events.
	OnEvent func(kvcache.Event)

	// check, in tests, runs the Manager's invariant checker after every step.
	check func(*kvcache.Manager) error
}

// PolicyResult is one policy's outcome.
type PolicyResult struct {
	Policy string `json:"policy"`
	// WasteRatio is bytes held that hold no token's K/V over bytes held,
	// both averaged over time.
	WasteRatio float64 `json:"waste_ratio"`
	// MeanBatch is the sequences computed per step, averaged over the time
	// anything runs; MaxBatch the most in one step.
	MeanBatch float64 `json:"mean_batch"`
	MaxBatch  int     `json:"max_batch"`
	// TokensPerS is output tokens over the time from the first arrival to
	// the last completion, on the Hardware time model.
	TokensPerS   float64 `json:"tokens_per_s"`
	Preemptions  int     `json:"preemptions"`
	SwappedBytes uint64  `json:"swapped_bytes"` // both directions
	// PrefixHitRate is full shareable blocks served from the prefix cache
	// over all full shareable blocks (0 for contiguous): the full blocks
	// inside each request's prefix_tokens, counted at its first admission.
	PrefixHitRate   float64 `json:"prefix_hit_rate"`
	ShareableBlocks uint64  `json:"shareable_blocks"`
	HitBlocks       uint64  `json:"hit_blocks"`
	// ReusableHitRate leaves out the compulsory misses: of each request's
	// shareable blocks, only those an earlier admitted request with the
	// same prefix_id also had (ReusableBlocks), and the hits among them.
	ReusableHitRate float64 `json:"prefix_hit_rate_reusable"`
	ReusableBlocks  uint64  `json:"reusable_blocks"`
	ReusableHits    uint64  `json:"reusable_hit_blocks"`
	Steps           int     `json:"steps"`
	SimSeconds      float64 `json:"sim_seconds"`
	OutputTokens    uint64  `json:"output_tokens"`
	Finished        int     `json:"finished"`
	// MeanHeldBytes is the K/V memory held, averaged over busy time;
	// PeakHeldBytes its maximum.
	MeanHeldBytes float64 `json:"mean_held_bytes"`
	PeakHeldBytes uint64  `json:"peak_held_bytes"`
	// Capacity is the sequences the policy could hold at most (contiguous:
	// budget over one full-context reservation; paged: MaxSeqs).
	Capacity int      `json:"capacity"`
	Note     string   `json:"note,omitempty"`
	Timeline []Sample `json:"-"`
}

// Sample is one point of a policy's timeline.
type Sample struct {
	T         float64 `json:"t_s"`
	HeldBytes uint64  `json:"held_bytes"`
	Batch     float64 `json:"batch"`
}

// Result is a simulation of both policies on one request list.
type Result struct {
	Model         Model    `json:"model"`
	Hardware      Hardware `json:"hardware"`
	VRAMBytes     uint64   `json:"vram_bytes"`
	KVBudgetBytes uint64   `json:"kv_budget_bytes"`
	BytesPerToken uint64   `json:"kv_bytes_per_token"`
	BlockTokens   int      `json:"block_tokens"`
	BlockBytes    uint64   `json:"block_bytes"`
	Blocks        int      `json:"blocks"`
	Preempt       string   `json:"preempt"`
	Requests      int      `json:"requests"`
	// Clamped counts requests cut to the model's context.
	Clamped    int     `json:"clamped"`
	MeanPrompt float64 `json:"mean_prompt_tokens"`
	MeanOutput float64 `json:"mean_output_tokens"`

	Paged      PolicyResult `json:"paged"`
	Contiguous PolicyResult `json:"contiguous"`
	// PrefixHitRate is the paged policy's, with its counts.
	PrefixHitRate   float64 `json:"prefix_hit_rate"`
	ShareableBlocks uint64  `json:"shareable_blocks"`
	HitBlocks       uint64  `json:"hit_blocks"`
	ReusableHitRate float64 `json:"prefix_hit_rate_reusable"`
}

func (o Options) withDefaults() (Options, error) {
	if o.BlockTokens == 0 {
		o.BlockTokens = 16
	}
	if o.TokenBudget == 0 {
		o.TokenBudget = 8192
	}
	if o.MaxSeqs == 0 {
		o.MaxSeqs = 256
	}
	if o.Preempt == "" {
		o.Preempt = "recompute"
	}
	if o.Hardware.HBMGBps == 0 {
		o.Hardware = H200()
	}
	if o.Watermark == 0 {
		o.Watermark = 0.01
	}
	if o.TimelinePoints == 0 {
		o.TimelinePoints = 600
	}
	switch {
	case o.BlockTokens < 1 || o.BlockTokens > 1<<12:
		return o, fmt.Errorf("sched: %d tokens per block, want 1..4096", o.BlockTokens)
	case o.TokenBudget < 1 || o.MaxSeqs < 1:
		return o, fmt.Errorf("sched: token budget %d and max sequences %d must be positive", o.TokenBudget, o.MaxSeqs)
	case o.Preempt != "recompute" && o.Preempt != "swap":
		return o, fmt.Errorf("sched: preemption %q, want recompute or swap", o.Preempt)
	case !(o.Watermark >= 0 && o.Watermark < 0.5):
		return o, fmt.Errorf("sched: watermark %v, want 0..0.5", o.Watermark)
	case !(o.Hardware.HBMGBps > 0 && o.Hardware.FLOPS > 0 && o.Hardware.LinkGBps > 0):
		return o, fmt.Errorf("sched: hardware %+v: bandwidths and FLOPS must be positive", o.Hardware)
	}
	return o, o.Model.Validate()
}

// Simulate runs the requests through continuous batching twice: with paged
// blocks (the kvcache Manager: prefix caching, preemption when blocks run
// out) and with a contiguous reservation of the model's context per
// sequence (the pre-paging way, which never preempts), on the same budget,
// token budget and time model. When ctx is done the simulation stops with
// its error, wrapped with how far the policy got.
func Simulate(ctx context.Context, reqs []Request, o Options) (Result, error) {
	o, err := o.withDefaults()
	if err != nil {
		return Result{}, err
	}
	m := o.Model
	bpt := m.KVBytesPerToken()
	res := Result{Model: m, Hardware: o.Hardware, VRAMBytes: o.VRAMBytes, BytesPerToken: bpt,
		BlockTokens: o.BlockTokens, BlockBytes: bpt * uint64(o.BlockTokens), Preempt: o.Preempt, Requests: len(reqs)}
	if len(reqs) == 0 {
		return res, errors.New("sched: no requests")
	}
	if o.VRAMBytes <= m.WeightBytes {
		return res, fmt.Errorf("sched: --vram %d bytes leaves nothing for K/V after the weights' %d bytes", o.VRAMBytes, m.WeightBytes)
	}
	res.KVBudgetBytes = o.VRAMBytes - m.WeightBytes
	blocks := res.KVBudgetBytes / res.BlockBytes
	if blocks < 2 || blocks > 1<<30 {
		return res, fmt.Errorf("sched: a KV budget of %d bytes is %d blocks of %d bytes, want 2..2^30", res.KVBudgetBytes, blocks, res.BlockBytes)
	}
	res.Blocks = int(blocks)
	clamped := make([]Request, len(reqs))
	var sumP, sumO float64
	for i, r := range reqs {
		if i%checkEvery == 0 && ctx.Err() != nil {
			return res, fmt.Errorf("sched: %d of %d requests read: %w", i, len(reqs), ctx.Err())
		}
		if r.PromptTokens+r.OutputTokens > m.Context {
			res.Clamped++
			r.PromptTokens = min(r.PromptTokens, m.Context-1)
			r.OutputTokens = m.Context - r.PromptTokens
		}
		r.PrefixTokens = min(r.PrefixTokens, r.PromptTokens)
		need := (r.PromptTokens + r.OutputTokens + o.BlockTokens - 1) / o.BlockTokens
		if need > res.Blocks-watermarkBlocks(res.Blocks, o.Watermark) {
			return res, fmt.Errorf("sched: request %d (arrival %gs): %d tokens need %d blocks; the KV budget of %d bytes holds %d",
				i, r.ArrivalS, r.PromptTokens+r.OutputTokens, need, res.KVBudgetBytes, res.Blocks)
		}
		clamped[i] = r
		sumP += float64(r.PromptTokens)
		sumO += float64(r.OutputTokens)
	}
	res.MeanPrompt, res.MeanOutput = sumP/float64(len(reqs)), sumO/float64(len(reqs))
	if res.Paged, err = run(ctx, clamped, o, res, true); err != nil {
		return res, err
	}
	if res.Contiguous, err = run(ctx, clamped, o, res, false); err != nil {
		return res, err
	}
	res.PrefixHitRate, res.ShareableBlocks, res.HitBlocks = res.Paged.PrefixHitRate, res.Paged.ShareableBlocks, res.Paged.HitBlocks
	res.ReusableHitRate = res.Paged.ReusableHitRate
	return res, nil
}

func watermarkBlocks(blocks int, w float64) int { return int(math.Ceil(w * float64(blocks))) }

// seqState is one request in flight.
type seqState struct {
	req       int
	id        kvcache.SeqID
	tokens    []int32 // known tokens: prompt, then those sampled
	computed  int     // positions whose K/V is written
	generated int
	pending   bool // the last token is sampled but not yet in the cache
	admitted  bool // admitted once (prefix hits count then)
	rng       *rand.Rand
}

type runner struct {
	o        Options
	reqs     []Request
	paged    bool
	m        *kvcache.Manager
	slots    int
	bpt      uint64
	B        int
	clock    float64
	next     int
	waiting  []*seqState
	running  []*seqState
	swapped  []*seqState
	res      PolicyResult
	ids      kvcache.SeqID
	wm       int
	share    uint64
	hits     uint64
	reusable uint64
	reuseHit uint64
	seen     map[string]int // most prefix tokens admitted so far, per prefix id
	samples  []Sample
	held     float64 // ∫ held dt
	waste    float64 // ∫ waste dt
	batch    float64 // ∫ batch dt
	busy     float64
	prefixes map[string]uint64
}

func run(ctx context.Context, reqs []Request, o Options, res Result, paged bool) (PolicyResult, error) {
	r := &runner{o: o, reqs: reqs, paged: paged, bpt: res.BytesPerToken, B: o.BlockTokens, prefixes: map[string]uint64{}, seen: map[string]int{}}
	r.res.Policy = "contiguous"
	if paged {
		r.res.Policy = "paged"
		hostBlocks := 0
		if o.Preempt == "swap" {
			hb := o.HostBytes
			if hb == 0 {
				hb = res.KVBudgetBytes
			}
			hostBlocks = int(min(hb/res.BlockBytes, 1<<30))
		}
		m, err := kvcache.NewManager(kvcache.ManagerConfig{Blocks: res.Blocks, BlockTokens: o.BlockTokens,
			HostBlocks: hostBlocks, NoPrefixCache: o.NoPrefixCache, OnEvent: o.OnEvent})
		if err != nil {
			return r.res, err
		}
		r.m = m
		r.wm = watermarkBlocks(res.Blocks, o.Watermark)
		r.res.Capacity = o.MaxSeqs
	} else {
		r.slots = int(min(res.KVBudgetBytes/(uint64(o.Model.Context)*r.bpt), uint64(o.MaxSeqs)))
		r.res.Capacity = r.slots
		if r.slots == 0 {
			r.res.Note = fmt.Sprintf("the KV budget of %d bytes holds no reservation of the full context (%d tokens, %d bytes)",
				res.KVBudgetBytes, o.Model.Context, uint64(o.Model.Context)*r.bpt)
			return r.res, nil
		}
	}
	if err := r.loop(ctx); err != nil {
		return r.res, err
	}
	r.finish()
	return r.res, nil
}

const maxSteps = 200_000_000

// checkEvery is how many requests are read, or arrive when all of them
// arrive at once, between two looks at the context.
const checkEvery = 1024

type chunk struct {
	s    *seqState
	from int
	n    int
}

func (r *runner) loop(ctx context.Context) error {
	first := r.reqs[0].ArrivalS
	var sched []chunk
	for steps := 0; ; steps++ {
		if steps > maxSteps {
			return fmt.Errorf("sched: %s: no end after %d steps", r.res.Policy, maxSteps)
		}
		// A step costs microseconds at least, and milliseconds when a
		// long queue waits; a look at ctx tens of nanoseconds.
		if ctx.Err() != nil {
			return fmt.Errorf("sched: %s: %d of %d requests finished in %d steps: %w", r.res.Policy, r.res.Finished, len(r.reqs), r.res.Steps, ctx.Err())
		}
		for r.next < len(r.reqs) && r.reqs[r.next].ArrivalS <= r.clock {
			if r.next%checkEvery == 0 && ctx.Err() != nil {
				return fmt.Errorf("sched: %s: %d of %d requests arrived: %w", r.res.Policy, r.next, len(r.reqs), ctx.Err())
			}
			r.waiting = append(r.waiting, &seqState{req: r.next})
			r.next++
		}
		if len(r.running)+len(r.swapped)+len(r.waiting) == 0 {
			if r.next == len(r.reqs) {
				break
			}
			r.clock = r.reqs[r.next].ArrivalS
			continue
		}
		budget := r.o.TokenBudget
		var preempted bool
		var err error
		if sched, budget, preempted, err = r.scheduleRunning(sched[:0], budget); err != nil {
			return err
		}
		if r.paged && !preempted {
			if err := r.swapIn(); err != nil {
				return err
			}
		}
		if len(r.swapped) == 0 && !preempted {
			if sched, err = r.admitWaiting(sched, budget); err != nil {
				return err
			}
		}
		if len(sched) == 0 {
			if !preempted && len(r.swapped) == 0 && len(r.running) == 0 && len(r.waiting) > 0 {
				return fmt.Errorf("sched: %s: request %d cannot be admitted into an idle cache", r.res.Policy, r.waiting[0].req)
			}
			continue
		}
		dt := r.stepTime(sched)
		r.clock += dt
		r.res.Steps++
		r.afterStep(sched)
		r.account(dt, len(sched))
		if r.o.check != nil && r.paged {
			if err := r.o.check(r.m); err != nil {
				return fmt.Errorf("sched: step %d: %w", r.res.Steps, err)
			}
		}
	}
	r.res.SimSeconds = r.clock - first
	return nil
}

// scheduleRunning gives the running sequences their next chunk, in
// admission order, while the token budget lasts: a decoding sequence first
// gets room for its pending token, preempting the latest admitted sequences
// (perhaps itself) when blocks run out.
func (r *runner) scheduleRunning(sched []chunk, budget int) ([]chunk, int, bool, error) {
	preempted := false
	for i := 0; i < len(r.running) && budget > 0; i++ {
		s := r.running[i]
		if s.pending && r.paged {
			for r.m.FreeBlocks() < mustNeed(r.m.AppendNeeds(s.id, 1)) {
				v := r.running[len(r.running)-1]
				r.running = r.running[:len(r.running)-1]
				if err := r.preempt(v); err != nil {
					return sched, budget, true, err
				}
				preempted = true
				if v == s {
					return sched, budget, true, nil
				}
			}
			if err := r.m.Append(s.id, s.tokens[len(s.tokens)-1]); err != nil {
				return sched, budget, preempted, fmt.Errorf("sched: append: %w", err)
			}
		}
		s.pending = false
		n := min(len(s.tokens)-s.computed, budget)
		budget -= n
		sched = append(sched, chunk{s, s.computed, n})
	}
	return sched, budget, preempted, nil
}

// swapIn brings swapped sequences back, oldest first, while their blocks
// fit above the watermark; they run from the next step.
func (r *runner) swapIn() error {
	for len(r.swapped) > 0 && len(r.running) < r.o.MaxSeqs {
		s := r.swapped[0]
		need, _ := r.m.SwapInNeeds(s.id)
		if need+r.wm > r.m.FreeBlocks() {
			return nil
		}
		moves, err := r.m.SwapIn(s.id)
		if err != nil {
			return fmt.Errorf("sched: swap in: %w", err)
		}
		r.swapCost(len(moves))
		r.swapped = r.swapped[1:]
		r.running = append(r.running, s)
	}
	return nil
}

// admitWaiting admits waiting requests first come, first served, while
// they fit (blocks, sequences, token budget), each with its first chunk.
func (r *runner) admitWaiting(sched []chunk, budget int) ([]chunk, error) {
	for len(r.waiting) > 0 && budget > 0 && len(r.running) < r.capacity() {
		s := r.waiting[0]
		ok, err := r.admit(s)
		if err != nil || !ok {
			return sched, err
		}
		r.waiting = r.waiting[1:]
		r.running = append(r.running, s)
		n := min(len(s.tokens)-s.computed, budget)
		budget -= n
		sched = append(sched, chunk{s, s.computed, n})
	}
	return sched, nil
}

func mustNeed(n int, err error) int {
	if err != nil {
		return math.MaxInt
	}
	return n
}

func (r *runner) capacity() int {
	if r.paged {
		return r.o.MaxSeqs
	}
	return r.slots
}

// tokensOf builds a request's prompt: the shared prefix's tokens (a
// function of the prefix id and the position), then tokens of its own.
func (r *runner) tokensOf(s *seqState) []int32 {
	q := r.reqs[s.req]
	s.rng = rand.New(rand.NewPCG(r.o.Seed, uint64(s.req)+1))
	t := make([]int32, q.PromptTokens, q.PromptTokens+q.OutputTokens)
	seed, ok := r.prefixes[q.PrefixID]
	if !ok && q.PrefixID != "" {
		h := fnv.New64a()
		h.Write([]byte(q.PrefixID))
		seed = h.Sum64()
		r.prefixes[q.PrefixID] = seed
	}
	for i := range t {
		if i < q.PrefixTokens {
			t[i] = int32(splitmix(seed+uint64(i)) >> 33)
		} else {
			t[i] = int32(s.rng.Uint32() >> 1)
		}
	}
	return t
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// admit gives s its memory, or reports that it does not fit now.
func (r *runner) admit(s *seqState) (bool, error) {
	if s.tokens == nil {
		s.tokens = r.tokensOf(s)
	}
	if !r.paged {
		s.computed = 0
		return true, nil
	}
	if r.m.AddNeeds(s.tokens, 0)+r.wm > r.m.FreeBlocks() {
		return false, nil
	}
	r.ids++
	s.id = r.ids
	cached, err := r.m.Add(s.id, s.tokens, 0)
	if err != nil {
		return false, fmt.Errorf("sched: admit request %d: %w", s.req, err)
	}
	s.computed = cached
	if !s.admitted {
		s.admitted = true
		q := r.reqs[s.req]
		if q.PrefixID != "" {
			share := uint64(q.PrefixTokens / r.B)
			hit := min(uint64((cached+r.B-1)/r.B), share)
			reusable := uint64(min(q.PrefixTokens, r.seen[q.PrefixID]) / r.B)
			r.share += share
			r.hits += hit
			r.reusable += reusable
			r.reuseHit += min(hit, reusable)
			r.seen[q.PrefixID] = max(r.seen[q.PrefixID], q.PrefixTokens)
		}
	}
	return true, nil
}

// preempt takes s off the device: to the host (swap) or back to the front of
// the queue to be prefilled again (recompute).
func (r *runner) preempt(s *seqState) error {
	r.res.Preemptions++
	if r.o.Preempt == "swap" {
		moves, err := r.m.SwapOut(s.id)
		if err == nil {
			r.swapCost(len(moves))
			r.swapped = append(r.swapped, s)
			return nil
		}
		if !errors.Is(err, kvcache.ErrOutOfHostBlocks) {
			return fmt.Errorf("sched: swap out: %w", err)
		}
	}
	if err := r.m.Free(s.id); err != nil {
		return fmt.Errorf("sched: preempt: %w", err)
	}
	s.computed, s.pending = 0, false
	r.waiting = append([]*seqState{s}, r.waiting...)
	return nil
}

func (r *runner) swapCost(blocks int) {
	b := uint64(blocks) * r.bpt * uint64(r.B)
	r.res.SwappedBytes += b
	r.clock += float64(b) / (r.o.Hardware.LinkGBps * 1e9)
}

// stepTime is the Hardware model's time for one step.
func (r *runner) stepTime(sched []chunk) float64 {
	m := r.o.Model
	var tokens, attended float64
	kvBytes := 0.0
	for _, c := range sched {
		n, p := float64(c.n), float64(c.from)
		tokens += n
		attended += n*p + n*(n+1)/2
		kvBytes += (p + n) * float64(r.bpt)
	}
	flops := 2*float64(m.Params)*tokens + 4*float64(m.Layers)*float64(m.Heads)*float64(m.HeadDim)*attended
	bytes := float64(m.WeightBytes) + kvBytes
	return math.Max(bytes/(r.o.Hardware.HBMGBps*1e9), flops/r.o.Hardware.FLOPS)
}

func (r *runner) afterStep(sched []chunk) {
	keep := r.running[:0]
	done := map[*seqState]bool{}
	for _, c := range sched {
		s := c.s
		s.computed += c.n
		if r.paged {
			_ = r.m.Computed(s.id, s.computed)
		}
		if s.computed < len(s.tokens) {
			continue
		}
		if r.reqs[s.req].OutputTokens > 0 {
			s.generated++
			r.res.OutputTokens++
		}
		if s.generated >= r.reqs[s.req].OutputTokens {
			done[s] = true
			r.res.Finished++
			if r.paged {
				_ = r.m.Free(s.id)
			}
			s.tokens = nil
			continue
		}
		s.tokens = append(s.tokens, int32(s.rng.Uint32()>>1))
		s.pending = true
	}
	for _, s := range r.running {
		if !done[s] {
			keep = append(keep, s)
		}
	}
	r.running = keep
}

// account adds one step of duration dt to the time averages.
func (r *runner) account(dt float64, batch int) {
	var held, waste uint64
	if r.paged {
		held = uint64(r.m.Config().Blocks-r.m.FreeBlocks()) * r.bpt * uint64(r.B)
		for _, s := range r.running {
			waste += uint64(r.m.Blocks(s.id)*r.B-min(s.computed, r.m.Len(s.id))) * r.bpt
		}
		waste = min(waste, held)
	} else {
		ctx := uint64(r.o.Model.Context)
		held = uint64(len(r.running)) * ctx * r.bpt
		for _, s := range r.running {
			waste += (ctx - uint64(s.computed)) * r.bpt
		}
	}
	r.held += float64(held) * dt
	r.waste += float64(waste) * dt
	r.batch += float64(batch) * dt
	r.busy += dt
	r.res.MaxBatch = max(r.res.MaxBatch, batch)
	r.res.PeakHeldBytes = max(r.res.PeakHeldBytes, held)
	r.samples = append(r.samples, Sample{T: r.clock, HeldBytes: held, Batch: float64(batch)})
}

func (r *runner) finish() {
	if r.held > 0 {
		r.res.WasteRatio = r.waste / r.held
	}
	if r.busy > 0 {
		r.res.MeanBatch = r.batch / r.busy
		r.res.MeanHeldBytes = r.held / r.busy
	}
	if r.res.SimSeconds > 0 {
		r.res.TokensPerS = float64(r.res.OutputTokens) / r.res.SimSeconds
	}
	r.res.ShareableBlocks, r.res.HitBlocks = r.share, r.hits
	r.res.ReusableBlocks, r.res.ReusableHits = r.reusable, r.reuseHit
	if r.reusable > 0 {
		r.res.ReusableHitRate = float64(r.reuseHit) / float64(r.reusable)
	}
	if r.share > 0 {
		r.res.PrefixHitRate = float64(r.hits) / float64(r.share)
	}
	r.res.Timeline = downsample(r.samples, r.o.TimelinePoints)
}

// downsample keeps at most n points: per bucket of consecutive samples, the
// last time, the most held bytes and the mean batch.
func downsample(s []Sample, n int) []Sample {
	if len(s) <= n {
		return s
	}
	out := make([]Sample, 0, n)
	per := (len(s) + n - 1) / n
	for i := 0; i < len(s); i += per {
		j := min(i+per, len(s))
		p := Sample{T: s[j-1].T}
		for _, x := range s[i:j] {
			p.HeldBytes = max(p.HeldBytes, x.HeldBytes)
			p.Batch += x.Batch
		}
		p.Batch /= float64(j - i)
		out = append(out, p)
	}
	return out
}
