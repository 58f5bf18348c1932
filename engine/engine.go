// Package engine runs Llama-family decoders on a device: the forward pass as
// a plain list of ops over weights placed by package residency, K and V in
// package kvcache's paged blocks, and one activation arena laid out by
// package plan, reused by every step. Kernels are kernels.Set methods (PTX
// on a GPU, their Go twins on the simulator). Logits are sampled on the
// host.
//
// Quick start:
//
//	m, _ := llama.Open(dir)
//	e, _ := engine.New(ctx, d, ks, devPool, hostPool, m, engine.Options{Budget: budget.PoolBytes, MaxTokens: 512})
//	defer e.Close()
//	res, _ := e.Generate(ctx, prompt, engine.Sampling{MaxNew: 32}, func(id int) error { fmt.Print(id, " "); return nil })
//
// GGUF files carry Q and K rows permuted as llama.cpp converts them; the
// engine multiplies each head of their products by a 0/1 permutation matrix
// (exact in float32) to put them back in Hugging Face order, so the same
// weights in GGUF and safetensors run the same arithmetic and give the same
// tokens.
//
// Rounding: with Options.Exact false (the default) the engine keeps
// activations at the model dtype's precision where transformers does in a
// bf16 or f16 model: the products Q, K, V, O, gate, up and down are rounded
// to the model dtype, the residual stream after each add, RMSNorm's
// normalized value and its product with the weight (kernel), SiLU(gate)
// and its product with up (kernel), RoPE in transformers' order (x, cos
// and sin rounded, each product and the sum rounded: kernels.Set.RoPEIn),
// attention's output (kernel; scores and softmax in float32), and the
// logits. On the simulator a bf16 model's logits are then bit-identical to
// a float32 reference of the HF forward that rounds where transformers
// does (engine/internal/reference). The KV
// cache holds the model dtype. Matmul inputs are the model dtype and
// accumulate in float32.
//
// Launches: a decode step is launch-bound on small models and close to it
// on a resident 7B one, so the products that share an input (Q, K, V; gate,
// up) run as one kernels.Set.MatmulGroup call (one kernel at T = 1), RoPE
// and the KV write do the rounding of Q, K and V themselves, RoPE turns Q
// and K in one launch, and one Round covers gate and up: 17 kernels per
// layer of a 7B model instead of 27, with the same results bit for bit
// (Options.Ungrouped turns the grouping off for comparison); the O residual
// and the MLP norm run as one kernel (kernels.Set.ResidualRMSNorm), and so
// do SiLU·up and the rounding of its inputs (SiluMulIn): 13 per layer.
// Options.Profile times decode steps on the device per op class.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/kvcache"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/plan/bind"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/residency"
)

// Options configure New. Budget is required.
type Options struct {
	// Budget is the device bytes the engine's pools may use (weights,
	// staging slots, KV cache, activation arena): residency.Budget's
	// PoolBytes.
	Budget uint64
	// MaxTokens is the longest sequence (prompt plus generated tokens) the
	// KV cache holds; 0 means the model's context length.
	MaxTokens int
	// PrefillChunk is the most prompt tokens one step runs; the
	// activation arena is planned for it. 0 chooses it from the budget
	// (the automatic rule, see AutoChunkLimit): the largest chunk, up to
	// PromptTokens and AutoChunkLimit, whose plan fits the budget, since
	// every chunk streams the non-resident weights once. A chunk given
	// that does not fit is a *BudgetError like any other.
	PrefillChunk int
	// PromptTokens is the longest prompt the caller will run; it bounds
	// the automatic chunk (0: MaxTokens-1). It changes nothing when
	// PrefillChunk is given.
	PromptTokens int
	// BlockTokens is the KV block size in tokens (default 16).
	BlockTokens int
	// KVBlocks is the KV cache's size in blocks; 0: one sequence of
	// MaxTokens. A server (NewBatch) gives room for many sequences.
	KVBlocks int
	// PrefixCache keeps the K/V of full prompt blocks for later prompts
	// with the same prefix (kvcache's prefix cache). Only Batch uses the
	// hits; Generate computes every prompt token whatever is cached.
	PrefixCache bool
	// Slots is the number of staging slots when weights stream; 0 chooses
	// 2, or 3 when weights stream, the chunk is at least AutoSlotsChunk
	// tokens and the budget holds the third slot (a long chunk's products
	// take long enough that a copy two groups ahead keeps the link busy).
	// Prefetch is how many streamed groups are issued ahead (default
	// Slots-1).
	Slots, Prefetch int
	// Source is the host side of streamed copies (default Auto).
	Source residency.Source
	// LinkGBps is the host-to-device bandwidth the weight plan predicts
	// with (default 25); it changes predictions, not placement.
	LinkGBps float64
	// Stream is the compute stream; 0: the engine makes its own (and
	// destroys it at Close). A stream given is left to the caller, who
	// can then warm its GEMM library up on it first (WarmProducts).
	Stream device.Stream
	// ReserveBytes is kept out of the plan for device memory the process
	// takes outside the pools and the attention scratch (a GEMM library's
	// workspace, modules loaded later); default 0.
	ReserveBytes uint64
	// WholeLayers streams and keeps resident whole blocks (one weight
	// group per block) instead of one group per matrix.
	WholeLayers bool
	// Timing records device timing events around the streamed copies and
	// the prefill, for Result's PrefillCopySeconds and PrefillDeviceSeconds.
	Timing bool
	// Exact keeps every activation in float32 instead of rounding like
	// transformers (see the package documentation).
	Exact bool
	// KVDType is the K/V cache's dtype, "bf16", "f16" or "f32"; "" takes
	// the model's dtype for a bf16, f16 or f32 model and f16 for a
	// block-quantized one (as llama.cpp caches K and V): its activations
	// are float32, but the decode and flash prefill attention kernels read
	// 16-bit caches only, and a float32 cache is twice the bytes. K and V
	// are rounded to it once, when written.
	KVDType string
	// Ungrouped runs each of a layer's matrix products in a launch of its
	// own. By default the products that share an input (q, k and v; gate
	// and up) are one kernels.Set.MatmulGroup call, one launch in decode,
	// when their weights are resident or in one streamed group (never two
	// streamed groups held at once, so the staging ring's order and
	// pressure stay as they are). The results are the same bit for bit;
	// the option exists to measure the difference.
	Ungrouped bool
	// Profile times two decode steps of each Generate on the device (see
	// Result.DecodeStepDeviceSeconds and DecodeProfile), the second and
	// the third, each queued behind a spin kernel; they are left out of
	// DecodeSeconds and DecodeTokensPerS. A diagnostic: the events between
	// op classes keep kernels from overlapping, and the spins take time.
	Profile bool
	// NoGraph keeps decode steps on plain launches. By default a decode
	// step whose weights are all resident and whose blocks all run on the
	// device is captured once as a device graph and replayed per token
	// where the device can (device.Grapher) and the kernels have their
	// step-state forms; the tokens are the same either way
	// (GraphStatus says which applies).
	NoGraph bool
	// QuantPrefill keeps a block-quantized model's prefill products on the
	// quantized kernels (float32 activations, each weight read once per 8
	// tokens). By default steps of kernels.DequantMinTokens tokens and more
	// write each weight in bf16 to an arena buffer and multiply there
	// (kernels.MatmulDequant), with the activations rounded to bf16 as a
	// bf16 model's are: the prefill rate of the bf16 model, and logits
	// within a bf16 model's distance of the float32 reference.
	QuantPrefill bool
	// Logger receives debug logs; nil is silent.
	Logger *slog.Logger
	// NoMapEmbedding keeps the embedding table in device memory. By
	// default an untied table is read in place from the registered file
	// (plan.WeightGroup.Mapped: a step gathers its few rows over the link)
	// when weights stream and the plan predicts a faster step that way:
	// its bytes then keep other weights resident. The tokens are the same.
	NoMapEmbedding bool
	// Gather is the device's measured cost of reading a step's embedding
	// row from mapped host memory (MeasureGather), which decides whether
	// the table is mapped; without a measurement the plan charges
	// DefaultMappedGatherCost plus the row's bytes over the link.
	Gather GatherCost
	// Live lets SetBudget change the budget while the engine runs: every
	// weight keeps a host source (residency.Options.Live: the registered
	// file, or a pinned copy of the whole model when the device cannot
	// register it), so that weights demoted stream at once and weights
	// promoted upload at the link's rate.
	Live bool
	// HostLayers[l] true computes block l on the host device (Host) in
	// every step: its weights and its K/V live there, none of its bytes
	// take the budget, and the residual stream crosses to the host and
	// back around each run of such blocks. nil or all false: every block
	// runs on d. Its length must be the model's block count when set.
	// Estimate needs no Host; New does when a block is hosted.
	HostLayers []bool
	// Host is the device hosted blocks run on (device/cpu with
	// kernels.CPU(), or a second simulator in tests).
	Host *Host

	// part, set only on the engine New makes for the hosted blocks, keeps
	// just these blocks' weights in the plan (all resident).
	part []bool
}

func (o Options) withDefaults(c *llama.Config) Options {
	if o.MaxTokens <= 0 || o.MaxTokens > c.Context {
		o.MaxTokens = c.Context
	}
	if o.PrefillChunk < 0 {
		o.PrefillChunk = 0
	}
	o.PrefillChunk = min(o.PrefillChunk, o.MaxTokens)
	if o.PromptTokens <= 0 || o.PromptTokens >= o.MaxTokens {
		o.PromptTokens = max(o.MaxTokens-1, 1)
	}
	if o.BlockTokens <= 0 {
		o.BlockTokens = 16
	}
	if o.Slots < 0 {
		o.Slots = 0
	}
	if o.LinkGBps <= 0 {
		o.LinkGBps = 25
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if !slices.Contains(o.HostLayers, true) {
		o.HostLayers = nil
	}
	return o
}

// ErrBudget matches a budget below the engine's minimum (*BudgetError).
var ErrBudget = errors.New("engine: budget below the minimum")

// BudgetError says the budget and the minimum that would run the model.
type BudgetError struct {
	Budget, Minimum uint64
	// Parts of the minimum.
	WeightsMinimum, KVBytes, ArenaBytes uint64
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("engine: budget %d bytes (%.2f MiB) is below the minimum %d bytes (%.2f MiB): weights %d (two staging slots and what must stay resident) + KV cache %d + activations %d",
		e.Budget, float64(e.Budget)/(1<<20), e.Minimum, float64(e.Minimum)/(1<<20), e.WeightsMinimum, e.KVBytes, e.ArenaBytes)
}

// Is makes errors.Is(err, ErrBudget) true.
func (e *BudgetError) Is(target error) bool { return target == ErrBudget }

// Engine is one model loaded on one device. Its methods must be called
// from one goroutine at a time.
type Engine struct {
	d     device.Device
	ks    *kernels.Set
	dev   *pool.Pool
	host  *pool.Pool
	model *llama.Model
	cfg   *llama.Config
	opt   Options

	dt      string // the kernels' name of the matrix dtype: "bf16", "f16", "f32"
	elt     uint64
	kvdt    string // the K/V cache's dtype (Options.KVDType)
	kvElt   uint64
	compute device.Stream
	plan    *plan.WeightPlan
	res     *residency.Residency
	kv      *kvcache.Cache
	layout  kernels.KVLayout
	arena   *bind.Arena
	bufs    []device.Ptr // by buffer id
	staging pool.Block   // pinned host: ids, positions, block table, logits
	invFreq pool.Block   // device copy of RoPE's inverse frequencies
	// unpermute is the head_dim × head_dim f32 permutation matrix that puts
	// a GGUF head's Q/K rows back in HF order (zero Size otherwise).
	unpermute pool.Block
	// ropeGGUF: RoPE reads GGUF's Q/K row order itself (the kernels have
	// RoPEGGUF when New ran), and unpermute is not needed.
	ropeGGUF bool
	events   []device.Event
	groups   []groupUse
	// where is the plan group holding each weight the pass reads.
	where map[roleKey]int
	// grouped says, per layer, which products run as one MatmulGroup.
	grouped []layerGroups
	// normed is the block whose attention norm the previous block's MLP
	// residual already queued, fused with it (mlpHalf), or -1.
	normed int
	// resNorm is the fused residual add and RMSNorm (ks.ResidualRMSNorm;
	// tests put the kernels it stands for in its place).
	resNorm residualNormFunc
	// siluIn is SiLU·up with its inputs' rounding (ks.SiluMulIn; likewise).
	siluIn siluInFunc
	// prof times the step being queued (Options.Profile), else nil.
	prof *profiler
	// at is the current step's buffer addresses (addrs).
	at      [numBufs]device.Ptr
	foot    *Footprint
	seq     kvcache.SeqID
	scratch uint64 // the attention kernel's scratch at the longest context
	// embedding is the embedding matrix's device address as of the last
	// step (the tied LM head; resident then).
	embedding device.Ptr
	// canMap: the device can read the embedding table in place from the
	// registered file (mapEmbedding).
	canMap bool
	// page is the device pool's page (its Options().PageBytes, or the
	// device's granularity in Estimate): what a live engine's weight
	// regions are rounded to.
	page      uint64
	ownStream bool
	closed    bool

	// kvLayer[l] is block l's layer in this engine's KV cache (-1: not
	// here), kvLayers how many it holds.
	kvLayer  []int
	kvLayers int
	// sub runs the hosted blocks (Options.HostLayers) on Options.Host;
	// hostX carries the residual stream between the devices.
	sub   *Engine
	hostX crossing

	// The decode step as a graph (graph.go): graphReason is "" when
	// decode steps replay one (captured at the first), else why not;
	// graphSteps counts replays; stepState is set while the captured pass
	// is queued (the KV write and attention read the position on the
	// device).
	graph       *decodeGraph
	graphReason string
	graphSteps  int
	stepState   bool
}

// groupUse says which weights a plan group holds, by position in its
// tensors, and how many of them the pass reads.
type groupUse struct {
	roles  []roleKey
	needed int
}

// Footprint is what the engine will take from the device for a model and
// options: the weight plan, the KV cache, the activation arena, the
// attention kernel's scratch, and the pools' predicted peak.
type Footprint struct {
	Plan *plan.WeightPlan `json:"-"`
	// PrefillChunk and Slots are the chunk and staging slots planned for:
	// Options' own, or what the automatic rule chose from the budget (the
	// weight plan keeps at least 2 slots and drops the others a tight
	// budget cannot hold).
	PrefillChunk int    `json:"prefill_chunk"`
	Slots        int    `json:"slots"`
	KVBytes      uint64 `json:"kv_bytes"`
	ArenaBytes   uint64 `json:"arena_bytes"`
	ScratchBytes uint64 `json:"kernel_scratch_bytes"` // allocated by the kernels, outside the pools
	// PoolPeakBytes predicts the device pool's peak reserved bytes: the
	// plan's resident groups and staging slots, the KV cache, the arena and
	// the small buffers, rounded up to the pool's pages.
	PoolPeakBytes uint64 `json:"pool_peak_bytes"`
	// DeviceBytes = PoolPeakBytes + ScratchBytes: the engine's share of
	// the process's device memory (the context's comes on top).
	DeviceBytes uint64 `json:"device_bytes"`

	layout plan.Layout
	bufs   []plan.Buffer
	kvCfg  kvcache.Config
	// reserve is what the weight plan leaves of the budget (KV cache,
	// arena, rounding, scratch, Options.ReserveBytes).
	reserve uint64
}

// Estimate plans m under o.Budget for a device described by info, without
// a device: New runs exactly this plan. A budget below the minimum fails
// with a *BudgetError stating the minimum.
func Estimate(ctx context.Context, m *llama.Model, o Options, info device.Info) (*Footprint, error) {
	e, err := newShell(m, o)
	if err != nil {
		return nil, err
	}
	return e.estimate(ctx, info)
}

// newShell is an Engine with its configuration and nothing on a device.
func newShell(m *llama.Model, o Options) (*Engine, error) {
	cfg := m.Config
	o = o.withDefaults(cfg)
	if o.Budget == 0 {
		return nil, errors.New("engine: budget is 0")
	}
	if o.HostLayers != nil && len(o.HostLayers) != cfg.Layers {
		return nil, fmt.Errorf("engine: %d host layer flags for a model of %d blocks", len(o.HostLayers), cfg.Layers)
	}
	e := &Engine{model: m, cfg: cfg, opt: o, normed: -1}
	e.kvLayer, e.kvLayers = kvLayers(cfg.Layers, e.runsHere)
	e.dt = plan.MatmulDType(m.Tensors.MatrixDType)
	if e.dt == "" {
		return nil, fmt.Errorf("engine: matrix dtype %s: not one the kernels multiply", m.Tensors.MatrixDType)
	}
	e.elt = 2
	if e.dt == kernels.F32 {
		e.elt = 4
	}
	switch e.kvdt = o.KVDType; e.kvdt {
	case "":
		e.kvdt = e.dt
		if m.Tensors.Quantized {
			e.kvdt = kernels.F16
		}
	case kernels.BF16, kernels.F16, kernels.F32:
	default:
		return nil, fmt.Errorf("engine: KV dtype %q: want bf16, f16 or f32", o.KVDType)
	}
	e.kvElt = 2
	if e.kvdt == kernels.F32 {
		e.kvElt = 4
	}
	return e, nil
}

// AutoChunkLimit is the longest prefill chunk the automatic rule
// (Options.PrefillChunk 0) chooses: a 2,048-token prompt prefills in one
// pass over the streamed weights when the budget holds its activations;
// longer prompts run in chunks of at most this many tokens, so that the
// arena, which stays allocated while decoding, takes no more of the budget
// than a 7B model's 2,048-token chunk (about 280 MB).
const AutoChunkLimit = 2048

// AutoSlotsChunk is the chunk length from which Options.Slots 0 gives
// three staging slots instead of two (when weights stream and the budget
// holds the third). On the simulator's H200-like time model a 2,048-token
// prefill of a 7B model in 8 GiB takes 1.11× its weight copies with two
// slots and 1.04× with three, while short chunks and decode steps gain
// nothing from a third slot and lose its bytes to streaming.
const AutoSlotsChunk = 1024

// estimate resolves the automatic chunk and slots (Options.PrefillChunk
// and Slots 0) and returns the plan for them.
func (e *Engine) estimate(ctx context.Context, info device.Info) (*Footprint, error) {
	o := e.opt
	e.page = info.Granularity
	if e.dev != nil {
		e.page = e.dev.Options().PageBytes
	}
	e.canMap = !o.NoMapEmbedding && info.ReadOnlyHostRegister && info.CanMapHostMemory && !info.HostMemory &&
		(o.Source == residency.Auto || o.Source == residency.Register)
	slots := o.Slots
	if slots == 0 {
		slots = 2
	}
	var f *Footprint
	var err error
	if o.PrefillChunk > 0 {
		f, err = e.estimateAt(ctx, info, o.PrefillChunk, slots)
	} else {
		f, err = e.autoChunk(ctx, info, slots)
	}
	if err != nil {
		return nil, err
	}
	if o.Slots == 0 && f.PrefillChunk >= AutoSlotsChunk && len(f.Plan.Streamed()) > 0 {
		if f3, err := e.estimateAt(ctx, info, f.PrefillChunk, 3); err == nil {
			f = f3
		} else if !errors.Is(err, ErrBudget) {
			return nil, err
		}
	}
	return f, nil
}

// autoChunk finds the largest chunk up to min(PromptTokens,
// AutoChunkLimit) whose plan fits the budget, by bisection over the
// chunk length (the footprint grows with it). When not even one token
// fits, the error is chunk 1's *BudgetError: its minimum is the least
// budget that runs.
func (e *Engine) autoChunk(ctx context.Context, info device.Info, slots int) (*Footprint, error) {
	hi := min(e.opt.PromptTokens, AutoChunkLimit, e.opt.MaxTokens)
	best, err := e.estimateAt(ctx, info, hi, slots)
	if err == nil {
		return best, nil
	}
	if !errors.Is(err, ErrBudget) || hi == 1 {
		return nil, err
	}
	if best, err = e.estimateAt(ctx, info, 1, slots); err != nil {
		return nil, err
	}
	lo := 1 // fits; hi does not
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		f, err := e.estimateAt(ctx, info, mid, slots)
		switch {
		case err == nil:
			lo, best = mid, f
		case errors.Is(err, ErrBudget):
			hi = mid
		default:
			return nil, err
		}
	}
	return best, nil
}

// estimateAt plans the engine for prefill chunks of chunk tokens and the
// given staging slots.
func (e *Engine) estimateAt(ctx context.Context, info device.Info, chunk, slots int) (*Footprint, error) {
	o, cfg := e.opt, e.cfg
	f := &Footprint{PrefillChunk: chunk, Slots: slots, bufs: e.buffers(chunk)}
	var err error
	if f.layout, _, err = plan.Solve(ctx, f.bufs, plan.Options{Alignment: 256, TimeLimit: -1}); err != nil {
		return nil, fmt.Errorf("engine: activation plan: %w", err)
	}
	blocks := (o.MaxTokens + o.BlockTokens - 1) / o.BlockTokens
	if o.KVBlocks > 0 {
		blocks = o.KVBlocks
	}
	f.kvCfg = kvcache.Config{Layers: e.kvLayers, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, ElemBytes: int(e.kvElt),
		BlockTokens: o.BlockTokens, Blocks: blocks}
	f.KVBytes = f.kvCfg.BlockBytes() * uint64(blocks)
	f.ArenaBytes = f.layout.ArenaBytes
	f.ScratchBytes = e.attentionScratch(info, chunk)
	// Four pages of the pool's growth granule for rounding, holes and the small
	// buffers (RoPE frequencies, the Q/K permutation), and the attention
	// kernel's own scratch, which the kernels allocate outside the pool.
	gran := max(info.Granularity, 64<<10)
	f.reserve = f.KVBytes + f.ArenaBytes + 4*gran + f.ScratchBytes + o.ReserveBytes
	if f.Plan, err = e.planWeights(f.reserve, f.KVBytes, f.ArenaBytes, slots); err != nil {
		return nil, err
	}
	if f.Plan.Slots > 0 {
		f.Slots = f.Plan.Slots // the plan drops slots a tight budget cannot hold (to 2)
	}
	f.peak(info, cfg.HeadDim)
	return f, nil
}

// peak fills PoolPeakBytes and DeviceBytes from the plan and the rest.
func (f *Footprint) peak(info device.Info, headDim int) {
	gran := max(info.Granularity, 64<<10)
	small := uint64(64<<10) + 4*uint64(headDim*headDim)
	used := f.Plan.ResidentBytes + f.Plan.StagingBytes + f.KVBytes + f.ArenaBytes + small
	f.PoolPeakBytes = (used + gran - 1) / gran * gran
	f.DeviceBytes = f.PoolPeakBytes + f.ScratchBytes
}

// New places m's weights on d under o.Budget and prepares the KV cache and
// the activation arena. dev is the device pool (every device byte comes
// from it) and host the pinned host pool. A budget below the minimum fails
// with a *BudgetError stating the minimum. On failure nothing stays
// allocated.
func New(ctx context.Context, d device.Device, ks *kernels.Set, dev, host *pool.Pool, m *llama.Model, o Options) (e *Engine, err error) {
	e, err = newShell(m, o)
	if err != nil {
		return nil, err
	}
	e.d, e.ks, e.dev, e.host = d, ks, dev, host
	e.ropeGGUF = ks.HasRoPEGGUF()
	e.resNorm, e.siluIn = ks.ResidualRMSNorm, ks.SiluMulIn
	cfg := e.cfg
	defer func() {
		if err != nil {
			err = errors.Join(err, e.Close())
			e = nil
		}
	}()
	if e.foot, err = e.estimate(ctx, d.Info()); err != nil {
		return e, err
	}
	e.plan, e.scratch = e.foot.Plan, e.foot.ScratchBytes
	e.opt.PrefillChunk, e.opt.Slots = e.foot.PrefillChunk, e.foot.Slots
	o = e.opt
	e.compute, e.ownStream = o.Stream, o.Stream == 0
	if e.ownStream {
		if e.compute, err = d.NewStream(); err != nil {
			return e, fmt.Errorf("engine: compute stream: %w", err)
		}
	}
	// The KV cache and the arena, one large block each, are placed before
	// the many weight groups, so that the pool's pages pack without holes.
	if e.kv, err = kvcache.New(d, dev, host, e.foot.kvCfg, kvcache.Options{Stream: e.compute, NoPrefixCache: !o.PrefixCache}); err != nil {
		return e, fmt.Errorf("engine: KV cache: %w", err)
	}
	e.layout = kernels.KVLayout{BlockTokens: uint32(o.BlockTokens), KVHeads: uint32(cfg.KVHeads), HeadDim: uint32(cfg.HeadDim),
		Layers: uint32(e.kvLayers), DType: e.kvdt, BlockBytes: e.kv.BlockBytes()}
	if e.arena, err = bind.Bind(dev, e.foot.bufs, e.foot.layout); err != nil {
		return e, fmt.Errorf("engine: %w", err)
	}
	e.bufs = e.arena.Addr
	if err := e.prepareHost(e.foot.kvCfg.Blocks); err != nil {
		return e, err
	}
	if e.res, err = residency.New(ctx, d, dev, host, m.Weights, e.plan, residency.Options{Source: o.Source, Prefetch: o.Prefetch, Logger: o.Logger, Timing: o.Timing, Live: o.Live}); err != nil {
		return e, fmt.Errorf("engine: %w", err)
	}
	if err := e.mapGroups(); err != nil {
		return e, err
	}
	e.groupProducts()
	if err := e.openHost(ctx); err != nil {
		return e, err
	}
	for range e.plan.Groups {
		ev, err := d.NewEvent(false)
		if err != nil {
			return e, fmt.Errorf("engine: event: %w", err)
		}
		e.events = append(e.events, ev)
	}
	e.graphReason = e.graphWhy()
	return e, nil
}

// WarmProducts runs, on stream st, one matrix product of every shape the
// forward pass of m multiplies, for each token count in tokens, on scratch
// memory taken from the device and given back before it returns. A GEMM
// library loads its kernels lazily and allocates a workspace per stream on
// first use, outside any pool: warming it up on the engine's compute stream
// before the budget is measured (residency.PlanBudget's loaded bytes)
// counts that memory, and keeps the one-time cost out of the first step.
// A device whose memory is host memory (Info().HostMemory: the CPU) loads
// nothing lazily and has no workspace: WarmProducts returns nil at once.
func WarmProducts(d device.Device, ks *kernels.Set, m *llama.Model, st device.Stream, tokens []int) (err error) {
	if d.Info().HostMemory {
		return nil
	}
	c := m.Config
	dt := plan.MatmulDType(m.Tensors.MatrixDType)
	elt := uint64(2)
	if dt == kernels.F32 {
		elt = 4
	}
	H, I, hd := uint32(c.Hidden), uint32(c.Intermediate), uint32(c.HeadDim)
	q, kv := uint32(c.Heads)*hd, uint32(c.KVHeads)*hd
	shapes := [][2]uint32{{q, H}, {kv, H}, {H, q}, {I, H}, {H, I}}
	var maxT, maxMK, maxK, maxM uint64
	for _, T := range tokens {
		maxT = max(maxT, uint64(T))
	}
	for _, s := range shapes {
		maxMK = max(maxMK, uint64(s[0])*uint64(s[1]))
		maxM, maxK = max(maxM, uint64(s[0])), max(maxK, uint64(s[1]))
	}
	var bufs []device.Ptr
	defer func() {
		if serr := d.StreamSynchronize(st); serr != nil && err == nil {
			err = fmt.Errorf("engine: warm-up: %w", serr)
		}
		for _, b := range bufs {
			if ferr := d.Free(b); ferr != nil && err == nil {
				err = fmt.Errorf("engine: warm-up: %w", ferr)
			}
		}
	}()
	alloc := func(n uint64) (device.Ptr, error) {
		p, err := d.Alloc(n)
		if err != nil {
			return 0, fmt.Errorf("engine: warm-up buffer of %d bytes: %w", n, err)
		}
		bufs = append(bufs, p)
		if err := d.Memset8(p, 0, n, st); err != nil {
			return 0, fmt.Errorf("engine: warm-up: %w", err)
		}
		return p, nil
	}
	W, err := alloc(maxMK * elt)
	if err != nil {
		return err
	}
	X, err := alloc(maxT * maxK * elt)
	if err != nil {
		return err
	}
	Y, err := alloc(maxT * maxM * 4)
	if err != nil {
		return err
	}
	for _, T := range tokens {
		for _, s := range shapes {
			if err := ks.Matmul(dt, W, X, Y, s[0], s[1], uint32(T), st); err != nil {
				return fmt.Errorf("engine: warm-up product %dx%d, %d tokens: %w", s[0], s[1], T, err)
			}
		}
	}
	return nil
}

// Footprint returns the plan New ran, with its predictions.
func (e *Engine) Footprint() *Footprint { return e.foot }

// splitBlocks cuts each block's group into one group per matrix, in the
// order the ops read them (norm and Q, K, V, O, norm and gate, up, down;
// tensors the pass does not read go with the last), so that staging slots
// are the size of the largest matrix rather than of a block and residency
// packs the budget more tightly.
func splitBlocks(groups []plan.WeightGroup) ([]plan.WeightGroup, error) {
	order := map[llama.Role]int{llama.RoleAttnNorm: 0, llama.RoleQ: 0, llama.RoleK: 1, llama.RoleV: 2, llama.RoleO: 3,
		llama.RoleMLPNorm: 4, llama.RoleGate: 4, llama.RoleUp: 5, llama.RoleDown: 6}
	names := [7]string{"q", "k", "v", "o", "gate", "up", "down"}
	var out []plan.WeightGroup
	for _, g := range groups {
		if g.Layer < 0 {
			out = append(out, g)
			continue
		}
		var parts [7][]format.Tensor
		for _, t := range g.Tensors {
			_, role, ok := llama.RoleOf(t.Name)
			i, known := order[role]
			if !ok || !known {
				i = 6
			}
			parts[i] = append(parts[i], t)
		}
		for i, ts := range parts {
			if len(ts) == 0 {
				continue
			}
			sub, err := plan.GroupWeights(ts)
			if err != nil {
				return nil, fmt.Errorf("engine: %w", err)
			}
			for _, sg := range sub {
				sg.Name = g.Name + " " + names[i]
				out = append(out, sg)
			}
		}
	}
	return out, nil
}

// attentionScratch is the device memory kernels.Set.Attention allocates
// for split (flash-decoding) partials at the longest context, decode and
// prefill chunks alike: at least 1 MiB once any launch splits.
func (e *Engine) attentionScratch(info device.Info, chunk int) uint64 {
	c := e.cfg
	sms := uint32(info.Multiprocessors)
	if sms == 0 {
		sms = 128
	}
	var most uint64
	for _, T := range []int{1, chunk} {
		start := max(e.opt.MaxTokens-T, 0)
		p := kernels.PlanAttention(uint32(start), uint32(T), uint32(c.Heads), uint32(c.KVHeads), uint32(c.HeadDim), sms)
		if p.Splits > 1 {
			most = max(most, p.ScratchBytes, 1<<20)
		}
	}
	// The decode graph's attention holds the partials of the most splits
	// any context up to the longest takes (kernels.ReserveAttentionAt).
	if at := kernels.PlanAttentionAt(uint32(e.opt.MaxTokens), 1, uint32(c.Heads), uint32(c.KVHeads), uint32(c.HeadDim), sms); at.ScratchBytes > 0 {
		most = max(most, at.ScratchBytes, 1<<20)
	}
	return most
}

// ScratchBytes is the device memory the attention kernel takes outside the
// pools (already subtracted from Options.Budget).
func (e *Engine) ScratchBytes() uint64 { return e.scratch }

// planWeights plans the weights under the budget less reserve (KV cache
// and activations).
func (e *Engine) planWeights(reserve, kvBytes, arenaBytes uint64, slots int) (*plan.WeightPlan, error) {
	groups, err := plan.GroupWeights(e.model.Weights.Tensors)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if !e.opt.WholeLayers {
		if groups, err = splitBlocks(groups); err != nil {
			return nil, err
		}
	}
	groups = slices.DeleteFunc(groups, func(g plan.WeightGroup) bool {
		if e.opt.part != nil {
			return g.Layer < 0 || !e.opt.part[g.Layer]
		}
		return g.Layer >= 0 && !e.runsHere(g.Layer)
	})
	// Resident blocks spread over the depth, so that the copies of the
	// streamed ones overlap the resident ones' products (prefill).
	wo := plan.WeightOptions{Slots: slots, Tokens: 1, LinkGBps: e.opt.LinkGBps, Granule: 256, Spread: true}
	if e.opt.Live && e.page > 256 {
		// A live engine's regions are whole pages (residency.Options.Live).
		wo.Granule = e.page
	}
	if e.plan != nil {
		// A plan made again (SetBudget) maps what the first one mapped:
		// the residency moves between plans of the same groups.
		for i := range groups {
			groups[i].Mapped = e.plan.Groups[i].Mapped
		}
		return e.planUnder(groups, wo, reserve, kvBytes, arenaBytes)
	}
	p, err := e.planUnder(groups, wo, reserve, kvBytes, arenaBytes)
	if err != nil || len(p.Streamed()) == 0 {
		return p, err
	}
	return e.mapEmbedding(groups, wo, reserve, kvBytes, arenaBytes, p)
}

// mapEmbedding plans again with the embedding table mapped (read in place
// from the registered file, zero-copy: a step gathers a few rows over the
// link) and returns that plan when it predicts a faster step than p, which
// streams: the table's bytes then hold other weights resident. It applies
// to an untied table on a device that maps registered read-only memory,
// with the registered source, unless Options.NoMapEmbedding.
func (e *Engine) mapEmbedding(groups []plan.WeightGroup, wo plan.WeightOptions, reserve, kvBytes, arenaBytes uint64, p *plan.WeightPlan) (*plan.WeightPlan, error) {
	if !e.canMap || e.cfg.TiedEmbeddings || e.opt.part != nil {
		return p, nil
	}
	emb := -1
	for i, g := range groups {
		only := len(g.Tensors) > 0
		for _, t := range g.Tensors {
			if l, r, ok := llama.RoleOf(t.Name); !ok || l >= 0 || r != llama.RoleEmbedding {
				only = false
			}
		}
		if only {
			emb = i
		}
	}
	if emb < 0 {
		return p, nil
	}
	mg := slices.Clone(groups)
	mg[emb].Mapped = true
	pm, err := e.planUnder(mg, wo, reserve, kvBytes, arenaBytes)
	if err != nil {
		return p, nil
	}
	gather := e.gatherCost(groups[emb].Bytes)
	if pm.StepTime+gather < p.StepTime {
		e.debugLog("engine: embedding mapped", "step_s", pm.StepTime.Seconds(), "gather_s", gather.Seconds(), "measured", e.opt.Gather.Measured(), "streamed_step_s", p.StepTime.Seconds())
		return pm, nil
	}
	e.debugLog("engine: embedding not mapped", "streamed_step_s", p.StepTime.Seconds(), "mapped_step_s", pm.StepTime.Seconds(), "gather_s", gather.Seconds(), "measured", e.opt.Gather.Measured())
	return p, nil
}

// gatherCost is what a step pays for gathering its row of a mapped table
// of tableBytes: Options.Gather's measured extra, else
// DefaultMappedGatherCost plus the row's bytes over the link.
func (e *Engine) gatherCost(tableBytes uint64) time.Duration {
	if e.opt.Gather.Measured() {
		return e.opt.Gather.Extra()
	}
	rowBytes := float64(tableBytes) / float64(e.cfg.Vocab)
	return DefaultMappedGatherCost + time.Duration(rowBytes/e.opt.LinkGBps) // bytes / (GB/s) = ns
}

// debugLog logs at debug level to Options.Logger, if any.
func (e *Engine) debugLog(msg string, args ...any) {
	if l := e.opt.Logger; l != nil {
		l.Debug(msg, args...)
	}
}

// planUnder plans groups under the budget less reserve, turning the
// planner's refusal into the engine's *BudgetError.
func (e *Engine) planUnder(groups []plan.WeightGroup, wo plan.WeightOptions, reserve, kvBytes, arenaBytes uint64) (*plan.WeightPlan, error) {
	minimum := func() uint64 {
		wo.Budget = math.MaxUint64 / 4
		p, err := plan.PlanWeights(groups, wo)
		if err != nil {
			return 0
		}
		return p.MinimumBytes
	}
	if e.opt.Budget <= reserve {
		w := minimum()
		return nil, &BudgetError{Budget: e.opt.Budget, Minimum: w + reserve, WeightsMinimum: w, KVBytes: kvBytes, ArenaBytes: arenaBytes}
	}
	wo.Budget = e.opt.Budget - reserve
	p, err := plan.PlanWeights(groups, wo)
	var be *plan.BudgetError
	if errors.As(err, &be) {
		return nil, &BudgetError{Budget: e.opt.Budget, Minimum: be.Minimum + reserve, WeightsMinimum: be.Minimum, KVBytes: kvBytes, ArenaBytes: arenaBytes}
	}
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	return p, nil
}

// roleKey names one weight of the pass: a role in a block (layer ≥ 0) or
// outside the blocks (layer -1). RoleNone marks tensors the pass does not
// read.
type roleKey struct {
	layer int
	role  llama.Role
}

// rank is the position of the first op reading k: the weights must come
// from the plan's groups in this order (the final norm and the LM head
// share a rank: they are acquired together).
func (e *Engine) rank(k roleKey) int {
	switch {
	case k.role == llama.RoleEmbedding:
		return 0
	case k.layer >= 0:
		return 1 + k.layer*9 + int(k.role-llama.RoleAttnNorm)
	}
	return 1 + e.cfg.Layers*9
}

// mapGroups records which weights each plan group holds and checks that
// walking the groups in plan order meets the weights in the order the ops
// read them: the embedding, each block's norm, Q, K, V, O, norm, gate,
// up, down, then the final norm and the LM head.
func (e *Engine) mapGroups() error {
	prev := -1
	e.where = map[roleKey]int{}
	for gi, g := range e.plan.Groups {
		var u groupUse
		lo, hi := math.MaxInt, -1
		for _, t := range g.Tensors {
			layer, role, ok := llama.RoleOf(t.Name)
			if !ok {
				layer, role = -1, llama.RoleNone
			}
			k := roleKey{layer, role}
			u.roles = append(u.roles, k)
			if role != llama.RoleNone {
				e.where[k] = gi
				u.needed++
				lo, hi = min(lo, e.rank(k)), max(hi, e.rank(k))
			}
		}
		if u.needed > 0 {
			if lo < prev {
				return fmt.Errorf("engine: weight group %s comes after weights the pass reads later", g.Name)
			}
			prev = hi
		}
		e.groups = append(e.groups, u)
	}
	return e.checkTied(e.plan)
}

// checkTied refuses a plan that streams tied embeddings (the LM head reads
// them after the last block, when the ring has moved on).
func (e *Engine) checkTied(p *plan.WeightPlan) error {
	if !e.cfg.TiedEmbeddings {
		return nil
	}
	for gi, u := range e.groups {
		for _, k := range u.roles {
			if k.role == llama.RoleEmbedding && !p.Groups[gi].Resident {
				return fmt.Errorf("engine: tied embeddings %s must stay resident: raise the budget", p.Groups[gi].Name)
			}
		}
	}
	return nil
}

// residualNormFunc is kernels.Set.ResidualRMSNorm's signature: x = r(x +
// r(y)) row by row (r rounds to rdt; f32 does not round), written back to
// x, then out = RMSNorm(x), the same bits as Round(y), Add, Round(x) and
// RMSNorm.
type residualNormFunc func(x, y device.Ptr, rdt string, w device.Ptr, wdt string, out device.Ptr, odt string, T, H uint32, eps float32, st device.Stream) error

// siluInFunc is kernels.Set.SiluMulIn's signature: out[i] =
// odt(silu(r(g[i]))·r(u[i])), r rounding to rdt (f32: none), the same bits
// as Round(g), Round(u) and SiluMul.
type siluInFunc func(g, u device.Ptr, rdt string, out device.Ptr, odt string, n uint64, st device.Stream) error

// layerGroups says which of a layer's products run as one MatmulGroup.
type layerGroups struct{ qkv, gateUp bool }

// groupProducts decides, per layer, whether q, k, v and gate, up run as
// one MatmulGroup: when Options.Ungrouped is off and at most one of the
// plan groups holding the roles streams. The cursor then holds that
// streamed group together with resident ones only, as it holds one
// streamed group at a time when the products run one by one.
func (e *Engine) groupProducts() {
	e.grouped = make([]layerGroups, e.cfg.Layers)
	if e.opt.Ungrouped {
		return
	}
	ok := func(l int, roles ...llama.Role) bool {
		streamed := map[int]bool{}
		for _, r := range roles {
			gi, found := e.where[roleKey{l, r}]
			if !found {
				return false
			}
			if !e.plan.Groups[gi].Resident {
				streamed[gi] = true
			}
		}
		return len(streamed) <= 1
	}
	for l := range e.grouped {
		e.grouped[l] = layerGroups{qkv: ok(l, llama.RoleQ, llama.RoleK, llama.RoleV), gateUp: ok(l, llama.RoleGate, llama.RoleUp)}
	}
}

// prepareHost allocates the pinned staging buffer and uploads RoPE's
// inverse frequencies.
func (e *Engine) prepareHost(blocks int) error {
	T := e.opt.PrefillChunk
	size := uint64(8*T+4*blocks) + 4*uint64(e.cfg.Vocab) + 64
	var err error
	if e.staging, err = e.host.Alloc(size, pool.AllocOptions{Purpose: pool.Staging}); err != nil {
		return fmt.Errorf("engine: host staging of %d bytes: %w", size, err)
	}
	inv := e.cfg.InvFreq()
	if e.invFreq, err = e.dev.Alloc(uint64(4*len(inv)), pool.AllocOptions{Purpose: pool.Activations}); err != nil {
		return fmt.Errorf("engine: RoPE frequencies: %w", err)
	}
	b := make([]byte, 4*len(inv))
	for i, f := range inv {
		putF32(b[4*i:], f)
	}
	if err := e.d.CopyHtoD(e.invFreq.Ptr, b, e.compute); err != nil {
		return fmt.Errorf("engine: upload RoPE frequencies: %w", err)
	}
	if e.cfg.PermutedQK && !e.ropeGGUF {
		if err := e.uploadUnpermute(); err != nil {
			return err
		}
	}
	if err := e.d.StreamSynchronize(e.compute); err != nil {
		return fmt.Errorf("engine: upload RoPE frequencies: %w", err)
	}
	return nil
}

// uploadUnpermute builds P with P[m][g(m)] = 1, g(m) the GGUF row of HF
// row m within a head (HF m = s·d/2 + i is GGUF 2i + s), so that
// Matmul(P, x) gathers a head into HF order exactly (products by 1 and 0).
func (e *Engine) uploadUnpermute() error {
	d := e.cfg.HeadDim
	var err error
	if e.unpermute, err = e.dev.Alloc(uint64(4*d*d), pool.AllocOptions{Purpose: pool.Activations}); err != nil {
		return fmt.Errorf("engine: Q/K permutation: %w", err)
	}
	b := make([]byte, 4*d*d)
	for m := range d {
		g := 2*(m%(d/2)) + m/(d/2)
		putF32(b[4*(m*d+g):], 1)
	}
	if err := e.d.CopyHtoD(e.unpermute.Ptr, b, e.compute); err != nil {
		return fmt.Errorf("engine: upload the Q/K permutation: %w", err)
	}
	return e.d.StreamSynchronize(e.compute)
}

// Close frees everything New took: afterwards the pools hold nothing of
// the engine's. It is safe to call twice and after a failed step.
func (e *Engine) Close() error {
	if e == nil || e.closed {
		return nil
	}
	e.closed = true
	var errs []error
	if e.compute != 0 {
		errs = append(errs, e.d.StreamSynchronize(e.compute))
	}
	if e.sub != nil {
		errs = append(errs, e.sub.Close(), e.hostX.close())
	}
	errs = append(errs, e.dropGraph())
	if e.arena != nil {
		errs = append(errs, e.arena.Release())
	}
	if e.kv != nil {
		errs = append(errs, e.kv.Close())
	}
	if e.res != nil {
		errs = append(errs, e.res.Close())
	}
	if e.staging.Size > 0 {
		errs = append(errs, e.host.Free(e.staging))
	}
	if e.invFreq.Size > 0 {
		errs = append(errs, e.dev.Free(e.invFreq))
	}
	if e.unpermute.Size > 0 {
		errs = append(errs, e.dev.Free(e.unpermute))
	}
	for _, ev := range e.events {
		errs = append(errs, e.d.DestroyEvent(ev))
	}
	if e.compute != 0 && e.ownStream {
		errs = append(errs, e.d.DestroyStream(e.compute))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("engine: close: %w", err)
	}
	return nil
}

// Plan returns the weight plan the engine runs.
func (e *Engine) Plan() *plan.WeightPlan { return e.plan }

// ArenaBytes is the activation arena's size.
func (e *Engine) ArenaBytes() uint64 { return e.arena.Block.Size }

// KVBytes is the KV cache's device size.
func (e *Engine) KVBytes() uint64 { return e.kv.BlockBytes() * uint64(e.kv.Config().Blocks) }

// Residency returns the weights' placement, for its stats.
func (e *Engine) Residency() *residency.Residency { return e.res }

// GemmLibrary names what runs prefill's matrix products: "cublaslt" or
// "memwall".
func (e *Engine) GemmLibrary() string {
	if g, ok := any(e.ks).(interface{ GemmLibrary() string }); ok {
		return g.GemmLibrary()
	}
	return "memwall"
}

func putF32(b []byte, f float32) {
	u := math.Float32bits(f)
	b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
}
