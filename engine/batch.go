package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/kvcache"
	"github.com/memwall/memwall/pool"
)

// Work is one sequence's share of a batched step: Tokens at positions
// Start.. of sequence Seq, whose KV blocks (Batch.Add, Batch.Append) already
// cover Start+len(Tokens) positions and hold the K/V of every position
// before Start. With Logits the step returns the last token's logits.
type Work struct {
	Seq    kvcache.SeqID
	Start  int
	Tokens []int32
	Logits bool
}

// Batch runs the steps of many sequences through one Engine: each step
// advances every sequence it is given by its tokens (one while decoding, a
// prompt chunk while prefilling), with the matrix products running over all
// of the step's tokens at once, so that each weight byte, resident or
// streamed, is read once per step for the whole batch. RoPE turns each
// token at its own position, and each sequence's K/V is written and
// attended through its own block table in the engine's paged KV cache. A
// sequence's greedy tokens are those Generate gives for its prompt alone
// (on the simulator bit for bit: every kernel computes a row the same way
// whatever the other rows are, but for one exception: when a step's
// decoding sequences fill the device, a context longer than 128 positions
// is attended in fewer splits than alone, kernels.PlanAttentionRows, and
// its sums round in another order).
//
// A Batch owns the Engine's KV cache while it lives: call Generate on the
// Engine only after Close. Its methods must be called from one goroutine
// at a time (Stats from any).
type Batch struct {
	e       *Engine
	maxSeqs int
	perSeq  int // block table entries per sequence
	tables  pool.Block
	last    pool.Block // f32 maxSeqs×H: the rows whose logits are wanted
	logits  pool.Block // f32 maxSeqs×V
	stage   pool.Block // pinned: ids, positions, tables, logits
	closed  bool
}

// BatchBytes is the device memory NewBatch takes from the device pool for
// maxSeqs sequences of o's MaxTokens (0: the model's context) and
// BlockTokens: block tables, the gathered rows and the logits. Keep it out
// of the weight plan with Options.ReserveBytes.
func BatchBytes(c *llama.Config, o Options, maxSeqs int) uint64 {
	o = o.withDefaults(c)
	perSeq := uint64((o.MaxTokens + o.BlockTokens - 1) / o.BlockTokens)
	n := uint64(max(maxSeqs, 1))
	return align256(4*n*perSeq) + align256(4*n*uint64(c.Hidden)) + align256(4*n*uint64(c.Vocab)) + 3*256
}

// NewBatch prepares batched steps of up to maxSeqs sequences (at most the
// engine's PrefillChunk tokens per step). Engines with blocks on a host
// device (Options.HostLayers) do not batch yet: an error says so.
func (e *Engine) NewBatch(maxSeqs int) (_ *Batch, err error) {
	switch {
	case e.closed:
		return nil, fmt.Errorf("engine: closed")
	case e.sub != nil:
		return nil, errors.New("engine: batched steps with blocks on the host device (Options.HostLayers) are not supported")
	case maxSeqs < 1 || maxSeqs > e.opt.PrefillChunk:
		return nil, fmt.Errorf("engine: batch of %d sequences: want 1..%d (the prefill chunk, the most tokens a step holds)", maxSeqs, e.opt.PrefillChunk)
	}
	c := e.cfg
	b := &Batch{e: e, maxSeqs: maxSeqs, perSeq: (e.opt.MaxTokens + e.opt.BlockTokens - 1) / e.opt.BlockTokens}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.Close())
		}
	}()
	n := uint64(maxSeqs)
	for _, a := range []struct {
		blk  *pool.Block
		size uint64
		what string
	}{{&b.tables, 4 * n * uint64(b.perSeq), "block tables"}, {&b.last, 4 * n * uint64(c.Hidden), "last rows"},
		{&b.logits, 4 * n * uint64(c.Vocab), "logits"}} {
		if *a.blk, err = e.dev.Alloc(a.size, pool.AllocOptions{Purpose: pool.Activations}); err != nil {
			return nil, fmt.Errorf("engine: batch %s of %d bytes: %w", a.what, a.size, err)
		}
	}
	size := 8*uint64(e.opt.PrefillChunk) + 4*n*uint64(b.perSeq) + 4*n*uint64(c.Vocab)
	if b.stage, err = e.host.Alloc(size, pool.AllocOptions{Purpose: pool.Staging}); err != nil {
		return nil, fmt.Errorf("engine: batch staging of %d bytes: %w", size, err)
	}
	return b, nil
}

// MaxSeqs is the most sequences one step holds.
func (b *Batch) MaxSeqs() int { return b.maxSeqs }

// MaxTokens is the most tokens one step holds (the engine's prefill chunk).
func (b *Batch) MaxTokens() int { return b.e.opt.PrefillChunk }

// Vocab is the model's vocabulary size.
func (b *Batch) Vocab() int { return b.e.cfg.Vocab }

// SeqTokens is the longest sequence (prompt and generated tokens).
func (b *Batch) SeqTokens() int { return b.e.opt.MaxTokens }

// Cache is the engine's KV cache (for its Stats and its Manager's *Needs
// queries; change sequences through the Batch).
func (b *Batch) Cache() *kvcache.Cache { return b.e.kv }

// Add creates a sequence with KV blocks for prompt and returns its id and
// how many leading tokens already have their K/V (prefix cache hits; 0
// without Options.PrefixCache): the first step's Start. A prompt that is
// empty, holds an id outside the vocabulary or leaves no room for a token
// within MaxTokens is an error; so are too few free blocks
// (kvcache.ErrOutOfBlocks, nothing changed).
func (b *Batch) Add(prompt []int32) (kvcache.SeqID, int, error) {
	e := b.e
	if len(prompt) == 0 {
		return 0, 0, fmt.Errorf("engine: empty prompt")
	}
	if len(prompt) >= e.opt.MaxTokens {
		return 0, 0, fmt.Errorf("engine: prompt of %d tokens leaves no room within the %d-token limit", len(prompt), e.opt.MaxTokens)
	}
	for i, id := range prompt {
		if id < 0 || int(id) >= e.cfg.Vocab {
			return 0, 0, fmt.Errorf("engine: prompt token %d at position %d outside the vocabulary of %d (vocab_size in %s)", id, i, e.cfg.Vocab, e.cfg.Source)
		}
	}
	e.seq++
	cached, err := e.kv.Add(e.seq, prompt, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("engine: KV blocks for a prompt of %d tokens: %w", len(prompt), err)
	}
	return e.seq, cached, nil
}

// Append makes room for tok after seq's last token (call it before the
// step that computes tok). kvcache.ErrOutOfBlocks leaves seq unchanged.
func (b *Batch) Append(seq kvcache.SeqID, tok int32) error {
	if tok < 0 || int(tok) >= b.e.cfg.Vocab {
		return fmt.Errorf("engine: token %d outside the vocabulary of %d", tok, b.e.cfg.Vocab)
	}
	return b.e.kv.Append(seq, tok)
}

// Computed says that seq's first n positions hold their K/V (after a
// prefill chunk), so that its full blocks may serve prefix hits.
func (b *Batch) Computed(seq kvcache.SeqID, n int) error { return b.e.kv.Computed(seq, n) }

// Free drops seq and gives its blocks back at once. Work already queued
// that reads them has been waited for (every Step synchronizes).
func (b *Batch) Free(seq kvcache.SeqID) error { return b.e.kv.Free(seq) }

// Step runs ws, at most MaxSeqs sequences of MaxTokens tokens in all, each
// sequence at most once, and returns the logits of the works that asked for
// them (nil for the others), each a fresh slice. After a device error the
// Engine must be closed.
func (b *Batch) Step(ctx context.Context, ws []Work) ([][]float32, error) {
	out, _, err := b.step(ctx, ws, false)
	return out, err
}

// BatchProfile is the device time of one profiled batched step
// (Batch.StepProfiled), from its uploads to its logits' download.
type BatchProfile struct {
	Seconds float64              `json:"seconds"`
	Classes map[string]float64   `json:"classes"` // device seconds by op class (ClassProducts, ...)
	Ops     map[string]ProfileOp `json:"ops"`     // by op
	// Segments is the number of timed segments: an event before every op,
	// each adding a little time of its own.
	Segments int `json:"segments"`
}

// StepProfiled is Step with an event before every op, the device kept
// busy meanwhile so that the step runs back to back: what one step costs
// on the device, and where.
func (b *Batch) StepProfiled(ctx context.Context, ws []Work) ([][]float32, *BatchProfile, error) {
	return b.step(ctx, ws, true)
}

func (b *Batch) step(ctx context.Context, ws []Work, profile bool) (_ [][]float32, _ *BatchProfile, err error) {
	e := b.e
	if b.closed || e.closed {
		return nil, nil, fmt.Errorf("engine: batch closed")
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("engine: batch step: %w", err)
	}
	T, want, err := b.check(ws)
	if err != nil {
		return nil, nil, err
	}
	if T == 0 {
		return make([][]float32, len(ws)), nil, nil
	}
	// The one-token works first, so that their rows (and block tables)
	// are the step's first: one launch attends them all (Batch.attention).
	order := decodeFirst(ws)
	ws = permute(ws, order)
	if profile {
		if err := e.startProfile(true); err != nil {
			return nil, nil, err
		}
		defer func() {
			if e.prof != nil { // the step failed before its end: free the events
				_, _ = e.finishProfile()
			}
		}()
	}
	if err := b.upload(ws, T); err != nil {
		return nil, nil, err
	}
	e.at = e.addrs(T)
	c := &cursor{e: e}
	err = e.embed(c, T)
	for l := 0; l < e.cfg.Layers && err == nil; l++ {
		if err = b.attention(c, l, ws, T); err == nil {
			err = e.mlpHalf(c, l, T)
		}
	}
	if err == nil && want > 0 {
		err = b.head(c, ws, T, want)
	}
	if err == nil {
		err = c.drain()
	}
	if err == nil && profile {
		err = e.endProfile()
	}
	if err != nil {
		return nil, nil, err
	}
	if err := e.d.StreamSynchronize(e.compute); err != nil {
		return nil, nil, fmt.Errorf("engine: batch step: %w", err)
	}
	var bp *BatchProfile
	if profile {
		sp, err := e.finishProfile()
		if err != nil {
			return nil, nil, err
		}
		bp = &BatchProfile{Seconds: sp.all, Classes: sp.classes, Ops: sp.ops, Segments: sp.segments}
	}
	got := b.read(ws)
	out := make([][]float32, len(ws))
	for i, j := range order {
		out[j] = got[i]
	}
	return out, bp, nil
}

// decodeFirst returns the order that puts ws's one-token works first, each
// part in its given order: order[i] is the index in ws of the i-th work.
func decodeFirst(ws []Work) []int {
	order := make([]int, 0, len(ws))
	for pass := range 2 {
		for i, w := range ws {
			if (len(w.Tokens) == 1) == (pass == 0) {
				order = append(order, i)
			}
		}
	}
	return order
}

func permute(ws []Work, order []int) []Work {
	out := make([]Work, len(ws))
	for i, j := range order {
		out[i] = ws[j]
	}
	return out
}

// check validates ws and returns the step's tokens and the logits rows
// wanted.
func (b *Batch) check(ws []Work) (T, want int, err error) {
	e := b.e
	if len(ws) > b.maxSeqs {
		return 0, 0, fmt.Errorf("engine: batch step of %d sequences, more than the %d it holds", len(ws), b.maxSeqs)
	}
	seen := make(map[kvcache.SeqID]bool, len(ws))
	for i, w := range ws {
		if seen[w.Seq] {
			return 0, 0, fmt.Errorf("engine: batch step: sequence %d given twice", w.Seq)
		}
		seen[w.Seq] = true
		n := len(w.Tokens)
		if n == 0 && w.Logits {
			return 0, 0, fmt.Errorf("engine: batch step: work %d asks for logits of no token", i)
		}
		if w.Start < 0 || w.Start+n > e.kv.Len(w.Seq) {
			return 0, 0, fmt.Errorf("engine: batch step: sequence %d positions %d..%d beyond its %d cached tokens", w.Seq, w.Start, w.Start+n, e.kv.Len(w.Seq))
		}
		for _, id := range w.Tokens {
			if id < 0 || int(id) >= e.cfg.Vocab {
				return 0, 0, fmt.Errorf("engine: batch step: token %d outside the vocabulary of %d", id, e.cfg.Vocab)
			}
		}
		T += n
		if w.Logits {
			want++
		}
	}
	if T > e.opt.PrefillChunk {
		return 0, 0, fmt.Errorf("engine: batch step of %d tokens, more than the %d a step holds (the prefill chunk)", T, e.opt.PrefillChunk)
	}
	return T, want, nil
}

// upload copies the step's ids, positions and block tables to the device
// through the pinned staging buffer.
func (b *Batch) upload(ws []Work, T int) error {
	e := b.e
	st := b.stage.Bytes()
	ids, pos, tabs := st[:4*T], st[4*T:8*T], st[8*e.opt.PrefillChunk:]
	r := 0
	for i, w := range ws {
		for j, id := range w.Tokens {
			binary.LittleEndian.PutUint32(ids[4*r:], uint32(id))
			binary.LittleEndian.PutUint32(pos[4*r:], uint32(w.Start+j))
			r++
		}
		tab := e.kv.Table(w.Seq)
		if len(tab) > b.perSeq {
			return fmt.Errorf("engine: sequence %d holds %d blocks, more than the %d of MaxTokens", w.Seq, len(tab), b.perSeq)
		}
		row := tabs[4*i*b.perSeq:]
		for k, blk := range tab {
			binary.LittleEndian.PutUint32(row[4*k:], uint32(blk))
		}
	}
	n := 4 * len(ws) * b.perSeq
	for _, c := range []struct {
		dst device.Ptr
		src []byte
	}{{e.bufs[bIDs], ids}, {e.bufs[bPos], pos}, {b.tables.Ptr, tabs[:n]}} {
		if err := e.d.CopyHtoD(c.dst, c.src, e.compute); err != nil {
			return fmt.Errorf("engine: upload batch inputs: %w", err)
		}
	}
	return nil
}

// attention is block l up to and including the residual add of the O
// product, as attentionHalf, with the K/V write and the attention of the
// leading one-token works (decodeFirst) in one launch each when there are
// two or more of them and the kernels take the shapes (kernels.Set.Rows),
// and per sequence over its rows, its positions and its block table for
// the rest.
func (b *Batch) attention(c *cursor, l int, ws []Work, T int) error {
	e := b.e
	cfg, ks, cs, B := e.cfg, e.ks, e.compute, &e.at
	nq, nkv, hd := uint32(cfg.Heads), uint32(cfg.KVHeads), uint32(cfg.HeadDim)
	if err := e.attentionIn(c, l, T); err != nil {
		return err
	}
	layer := uint32(e.kvLayer[l])
	scale := float32(1 / math.Sqrt(float64(hd)))
	qRow, kvRow, aRow := 4*uint64(nq*hd), 4*uint64(nkv*hd), e.elt*uint64(nq*hd)
	dec, maxCtx := 0, 0
	for dec < len(ws) && len(ws[dec].Tokens) == 1 {
		maxCtx = max(maxCtx, ws[dec].Start+1)
		dec++
	}
	if dec < 2 || !ks.Rows(nq, e.layout, e.kv.Base()) {
		dec = 0
	}
	if dec > 0 {
		n, per := uint32(dec), uint32(b.perSeq)
		if err := e.mark(ClassAttention, "kv write"); err != nil {
			return err
		}
		if err := ks.KVWriteRows(B[bK], B[bV], e.kv.Base(), b.tables.Ptr, e.bufs[bPos], per, n, e.layout, layer, cs); err != nil {
			return blockErr(l, "kv write", err)
		}
		if err := e.mark(ClassAttention, "attention"); err != nil {
			return err
		}
		if err := ks.AttentionRows(B[bQ], e.kv.Base(), b.tables.Ptr, e.bufs[bPos], per, uint32(maxCtx), n, nq, e.layout, layer, scale, B[bA], e.dt, cs); err != nil {
			return blockErr(l, "attention", err)
		}
	}
	r := uint64(dec)
	for i, w := range ws[dec:] {
		i += dec
		n := uint32(len(w.Tokens))
		if n == 0 {
			continue
		}
		tab := b.tables.Ptr.Add(4 * uint64(i*b.perSeq))
		if err := e.mark(ClassAttention, "kv write"); err != nil {
			return err
		}
		if err := ks.KVWrite(B[bK].Add(r*kvRow), B[bV].Add(r*kvRow), e.kv.Base(), tab, uint32(w.Start), n, e.layout, layer, cs); err != nil {
			return blockErr(l, "kv write", err)
		}
		if err := e.mark(ClassAttention, "attention"); err != nil {
			return err
		}
		if err := ks.Attention(B[bQ].Add(r*qRow), e.kv.Base(), tab, uint32(w.Start), n, nq, e.layout, layer, scale, B[bA].Add(r*aRow), e.dt, cs); err != nil {
			return blockErr(l, "attention", err)
		}
		r += uint64(n)
	}
	return e.attentionOut(c, l, T)
}

// head runs the final norm and the LM head over the last row of each work
// that wants logits (want of them), gathered into one matrix so that the
// head's weights are read once, and queues the logits' download.
func (b *Batch) head(c *cursor, ws []Work, T, want int) error {
	e := b.e
	cfg, cs, B := e.cfg, e.compute, &e.at
	H := uint32(cfg.Hidden)
	rowBytes := 4 * uint64(H)
	src := B[bX]
	if want != T { // gather the rows (a decode-only batch has them in place)
		if err := e.mark(ClassOther, "gather"); err != nil {
			return err
		}
		r, j := 0, uint64(0)
		for _, w := range ws {
			r += len(w.Tokens)
			if !w.Logits {
				continue
			}
			if err := e.d.CopyDtoD(b.last.Ptr.Add(j*rowBytes), B[bX].Add(uint64(r-1)*rowBytes), rowBytes, cs); err != nil {
				return fmt.Errorf("engine: gather the rows for the lm head: %w", err)
			}
			j++
		}
		src = b.last.Ptr
	}
	normP, normDT, err := c.use(-1, llama.RoleFinalNorm)
	if err != nil {
		return err
	}
	headP := e.embedding
	headDT := weightDType(e.model.Tensors.Embedding.DType)
	if !cfg.TiedEmbeddings {
		if headP, headDT, err = c.use(-1, llama.RoleLMHead); err != nil {
			return err
		}
	}
	n := uint32(want)
	if err := e.mark(ClassNorms, "rmsnorm"); err != nil {
		return err
	}
	if err := e.ks.RMSNorm(src, normP, normDT, B[bHF], e.dt, n, H, float32(cfg.RMSNormEps), cs); err != nil {
		return fmt.Errorf("engine: final norm: %w", err)
	}
	if err := e.mark(ClassProducts, "lm head"); err != nil {
		return err
	}
	e.readsWeights(e.weightBytes(headDT, uint32(cfg.Vocab), H))
	if err := e.ks.Matmul(e.productDType(headDT), headP, B[bHF], b.logits.Ptr, uint32(cfg.Vocab), H, n, cs); err != nil {
		return fmt.Errorf("engine: lm head: %w", err)
	}
	if err := c.settle(); err != nil {
		return err
	}
	size := uint64(want) * uint64(cfg.Vocab)
	if !e.opt.Exact && e.dt != "f32" {
		if err := e.ks.Round(b.logits.Ptr, e.dt, size, cs); err != nil {
			return fmt.Errorf("engine: round logits: %w", err)
		}
	}
	if err := e.mark(ClassOther, "download"); err != nil {
		return err
	}
	if err := e.d.CopyDtoH(b.logitsHost()[:4*size], b.logits.Ptr, cs); err != nil {
		return fmt.Errorf("engine: download logits: %w", err)
	}
	return nil
}

func (b *Batch) logitsHost() []byte {
	st := b.stage.Bytes()
	return st[8*b.e.opt.PrefillChunk+4*b.maxSeqs*b.perSeq:]
}

// read returns the downloaded logits, one slice per work that asked.
func (b *Batch) read(ws []Work) [][]float32 {
	V := b.e.cfg.Vocab
	lb := b.logitsHost()
	out := make([][]float32, len(ws))
	j := 0
	for i, w := range ws {
		if !w.Logits {
			continue
		}
		l := make([]float32, V)
		decodeF32(l, lb[4*j*V:][:4*V])
		out[i] = l
		j++
	}
	return out
}

// littleEndian: the host stores a float32 as the device does, so the
// logits copy as they are.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// decodeF32 fills dst with the little-endian float32s of src (4·len(dst)
// bytes): one copy where the host is little-endian and src 4-byte
// aligned.
func decodeF32(dst []float32, src []byte) {
	if littleEndian && len(dst) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(src)))%4 == 0 {
		copy(dst, unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(src))), len(dst)))
		return
	}
	for k := range dst {
		dst[k] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*k:]))
	}
}

// Close frees the batch's buffers; the sequences it added stay in the
// cache until freed. It is safe to call twice.
func (b *Batch) Close() error {
	if b == nil || b.closed {
		return nil
	}
	b.closed = true
	var errs []error
	for _, blk := range []pool.Block{b.tables, b.last, b.logits} {
		if blk.Size > 0 {
			errs = append(errs, b.e.dev.Free(blk))
		}
	}
	if b.stage.Size > 0 {
		errs = append(errs, b.e.host.Free(b.stage))
	}
	return errors.Join(errs...)
}

// Sampler draws tokens from logits as Generate does: the same settings and
// seed give the same tokens from the same logits.
type Sampler struct{ s *sampler }

// NewSampler returns a sampler for s (Validate it first).
func NewSampler(s Sampling) *Sampler { return &Sampler{newSampler(s)} }

// Next picks a token from logits (which it does not modify).
func (s *Sampler) Next(logits []float32) int { return s.s.next(logits) }
