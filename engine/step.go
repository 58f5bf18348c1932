package engine

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/residency"
)

// Activation buffers of one step, by id.
const (
	bIDs    = iota // int32 T: token ids
	bPos           // int32 T: positions
	bTable         // int32 blocks: the sequence's KV block table
	bX             // f32 T×H: the residual stream
	bH             // dt T×H: attention norm's output
	bQ             // f32 T×heads·hd
	bK             // f32 T×kv·hd
	bV             // f32 T×kv·hd
	bA             // dt T×heads·hd: attention's output
	bO             // f32 T×H: O product
	bH2            // dt T×H: MLP norm's output
	bG             // f32 T×I: gate product
	bU             // f32 T×I: up product
	bM             // dt T×I: SiLU(gate)·up
	bD             // f32 T×H: down product
	bHF            // dt T×H: final norm's output
	bLogits        // f32 V: the last token's logits
	bQRaw          // f32 T×heads·hd: Q in the file's row order (GGUF)
	bKRaw          // f32 T×kv·hd: K in the file's row order (GGUF)
	numBufs
)

var bufNames = [numBufs]string{"ids", "pos", "table", "x", "h", "q", "k", "v", "attn", "o", "h2", "gate", "up", "silu_up", "down", "final_norm", "logits", "q_raw", "k_raw"}

// op is one entry of the step's op list: the buffers it reads and writes.
type op struct {
	name          string
	reads, writes []int
}

// opList returns the forward pass of one step, top to bottom, and the
// range [layerStart, layerEnd) of ops that run once per block. permuted
// (GGUF) adds the op that puts Q and K rows back in HF order.
func opList(permuted bool) (ops []op, layerStart, layerEnd int) {
	ops = slices.Clone(allOps)
	if !permuted {
		ops[3].writes, ops[4].writes = []int{bQ}, []int{bK}
		ops = slices.Delete(ops, 6, 7)
	}
	return ops, 2, len(ops) - 3
}

var allOps = []op{
	{"upload ids, positions, block table", nil, []int{bIDs, bPos, bTable}},
	{"embed", []int{bIDs}, []int{bX}},
	{"attention norm", []int{bX}, []int{bH}},
	{"q = h·Wq", []int{bH}, []int{bQRaw}},
	{"k = h·Wk", []int{bH}, []int{bKRaw}},
	{"v = h·Wv", []int{bH}, []int{bV}},
	{"q, k to HF row order (GGUF)", []int{bQRaw, bKRaw}, []int{bQ, bK}},
	{"rope q, k", []int{bPos, bQ, bK}, []int{bQ, bK}},
	{"write k, v to the cache", []int{bK, bV, bTable}, nil},
	{"attention", []int{bQ, bTable}, []int{bA}},
	{"o = attn·Wo", []int{bA}, []int{bO}},
	{"x += o", []int{bX, bO}, []int{bX}},
	{"mlp norm", []int{bX}, []int{bH2}},
	{"gate = h2·Wgate", []int{bH2}, []int{bG}},
	{"up = h2·Wup", []int{bH2}, []int{bU}},
	{"m = silu(gate)·up", []int{bG, bU}, []int{bM}},
	{"down = m·Wdown", []int{bM}, []int{bD}},
	{"x += down", []int{bX, bD}, []int{bX}},
	{"final norm", []int{bX}, []int{bHF}},
	{"logits = last row·Whead", []int{bHF}, []int{bLogits}},
	{"download logits", []int{bLogits}, nil},
}

// buffers returns the step's buffers for T tokens with their lifetimes
// over the op list: from the first op that touches a buffer to one past
// the last. A buffer that exists before the blocks and is used inside them
// (the residual stream, positions, the block table) lives until the last
// block's last op, since every block reads it again.
func (e *Engine) buffers(T int) []plan.Buffer {
	c := e.cfg
	t, H, I := uint64(T), uint64(c.Hidden), uint64(c.Intermediate)
	qd, kvd := uint64(c.Heads*c.HeadDim), uint64(c.KVHeads*c.HeadDim)
	blocks := uint64((e.opt.MaxTokens + e.opt.BlockTokens - 1) / e.opt.BlockTokens)
	size := [numBufs]uint64{
		bIDs: 4 * t, bPos: 4 * t, bTable: 4 * blocks, bX: 4 * t * H, bH: e.elt * t * H,
		bQ: 4 * t * qd, bK: 4 * t * kvd, bV: 4 * t * kvd, bA: e.elt * t * qd, bO: 4 * t * H,
		bH2: e.elt * t * H, bG: 4 * t * I, bU: 4 * t * I, bM: e.elt * t * I, bD: 4 * t * H,
		bHF: e.elt * t * H, bLogits: 4 * uint64(c.Vocab), bQRaw: 256, bKRaw: 256,
	}
	if c.PermutedQK {
		size[bQRaw], size[bKRaw] = size[bQ], size[bK]
	}
	ops, opLayer, opLayerEnd := opList(c.PermutedQK)
	first, last := [numBufs]int{}, [numBufs]int{}
	inLayer := [numBufs]bool{}
	for i := range first {
		first[i] = -1
	}
	for i, o := range ops {
		for _, b := range append(append([]int(nil), o.reads...), o.writes...) {
			if first[b] < 0 {
				first[b] = i
			}
			last[b] = max(last[b], i)
			if i >= opLayer && i < opLayerEnd {
				inLayer[b] = true
			}
		}
	}
	out := make([]plan.Buffer, numBufs)
	for b := range out {
		if first[b] < 0 { // not in this model's op list: a token buffer the planner may put anywhere
			first[b], last[b] = 0, 0
		}
		end := last[b] + 1
		if inLayer[b] && first[b] < opLayer {
			end = max(end, opLayerEnd)
		}
		out[b] = plan.Buffer{ID: bufNames[b], Start: first[b], End: end, Size: size[b]}
	}
	return out
}

// stepOut is what a step leaves on the host.
type stepOut struct {
	logits []float32 // nil unless asked for
}

// step runs ids at positions start.. through the model on the compute
// stream; with wantLogits it returns the last token's logits. table is the
// sequence's block table (covering start+len(ids) positions).
func (e *Engine) step(ids []int32, start int, table []int32, wantLogits bool) (stepOut, error) {
	T := len(ids)
	st := e.staging.Bytes()
	idsB, posB := st[:4*T], st[4*T:8*T]
	tabB := st[8*T : 8*T+4*len(table)]
	for i, id := range ids {
		binary.LittleEndian.PutUint32(idsB[4*i:], uint32(id))
		binary.LittleEndian.PutUint32(posB[4*i:], uint32(start+i))
	}
	for i, b := range table {
		binary.LittleEndian.PutUint32(tabB[4*i:], uint32(b))
	}
	cs := e.compute
	for _, c := range []struct {
		dst device.Ptr
		src []byte
	}{{e.bufs[bIDs], idsB}, {e.bufs[bPos], posB}, {e.bufs[bTable], tabB}} {
		if err := e.d.CopyHtoD(c.dst, c.src, cs); err != nil {
			return stepOut{}, fmt.Errorf("engine: upload step inputs: %w", err)
		}
	}
	c := &cursor{e: e}
	var out stepOut
	err := e.pass(c, T, start, wantLogits)
	if err == nil {
		err = c.drain()
	}
	if err != nil {
		return stepOut{}, err
	}
	if err := e.d.StreamSynchronize(cs); err != nil {
		return stepOut{}, fmt.Errorf("engine: step: %w", err)
	}
	if wantLogits {
		lb := st[len(st)-4*e.cfg.Vocab:]
		out.logits = make([]float32, e.cfg.Vocab)
		for i := range out.logits {
			out.logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(lb[4*i:]))
		}
	}
	return out, nil
}

// pass queues the forward pass over T tokens at positions start.., and
// the logits' download when wanted, in the op list's order.
func (e *Engine) pass(c *cursor, T, start int, wantLogits bool) error {
	if err := e.embed(c, T); err != nil {
		return err
	}
	for l := range e.cfg.Layers {
		if err := e.block(c, l, T, start); err != nil {
			return err
		}
	}
	if !wantLogits {
		return nil
	}
	return e.head(c, T)
}

// cursor walks the plan's weight groups in order within one step: use
// acquires groups until the one holding a weight, settle releases the
// groups whose weights have all been read by ops already queued, drain
// acquires and releases the rest so that every group is used once per
// step (residency's ring runs in plan order, step after step).
type cursor struct {
	e    *Engine
	next int
	held []heldGroup
}

type heldGroup struct {
	gi    int
	views []residency.View
	used  []bool
	left  int
}

// use returns the device address and kernels dtype of weight k.
func (c *cursor) use(layer int, role llama.Role) (device.Ptr, string, error) {
	k := roleKey{layer, role}
	for {
		for hi := range c.held {
			h := &c.held[hi]
			for i, rk := range c.e.groups[h.gi].roles {
				if rk == k && !h.used[i] {
					h.used[i] = true
					h.left--
					return h.views[i].Ptr, plan.MatmulDType(h.views[i].Tensor.DType), nil
				}
			}
		}
		if c.next >= len(c.e.plan.Groups) {
			return 0, "", fmt.Errorf("engine: no weight group after %d holds the %s of block %d", c.next, role, layer)
		}
		gi := c.next
		c.next++
		views, err := c.e.acquire(gi)
		if err != nil {
			return 0, "", err
		}
		u := c.e.groups[gi]
		c.held = append(c.held, heldGroup{gi: gi, views: views, used: make([]bool, len(u.roles)), left: u.needed})
	}
}

// settle releases the held groups none of whose weights are still to be
// read (the ops that read them are queued: the release event follows them).
func (c *cursor) settle() error {
	kept := c.held[:0]
	var err error
	for _, h := range c.held {
		if h.left > 0 || err != nil {
			kept = append(kept, h)
			continue
		}
		err = c.e.release(h.gi)
	}
	c.held = kept
	return err
}

// drain releases every held group and passes through the groups not
// reached (the final norm and head of a prefill chunk without logits).
func (c *cursor) drain() error {
	for _, h := range c.held {
		if err := c.e.release(h.gi); err != nil {
			return err
		}
	}
	c.held = nil
	for ; c.next < len(c.e.plan.Groups); c.next++ {
		if _, err := c.e.acquire(c.next); err != nil {
			return err
		}
		if err := c.e.release(c.next); err != nil {
			return err
		}
	}
	return nil
}

func (e *Engine) acquire(gi int) ([]residency.View, error) {
	views, ready, err := e.res.Acquire(gi)
	if err != nil {
		return nil, fmt.Errorf("engine: weights of %s: %w", e.plan.Groups[gi].Name, err)
	}
	if ready != 0 {
		if err := e.d.StreamWaitEvent(e.compute, ready); err != nil {
			return nil, fmt.Errorf("engine: wait for %s: %w", e.plan.Groups[gi].Name, err)
		}
	}
	return views, nil
}

func (e *Engine) release(gi int) error {
	if err := e.d.EventRecord(e.events[gi], e.compute); err != nil {
		return fmt.Errorf("engine: record the end of %s: %w", e.plan.Groups[gi].Name, err)
	}
	if err := e.res.Release(gi, e.events[gi]); err != nil {
		return fmt.Errorf("engine: release %s: %w", e.plan.Groups[gi].Name, err)
	}
	return nil
}

func (e *Engine) embed(c *cursor, T int) error {
	p, dt, err := c.use(-1, llama.RoleEmbedding)
	if err != nil {
		return err
	}
	e.embedding = p
	if err := e.ks.Embed(p, dt, e.bufs[bIDs], e.bufs[bX], uint32(T), uint32(e.cfg.Hidden), e.compute); err != nil {
		return fmt.Errorf("engine: embed: %w", err)
	}
	return c.settle()
}

// roundDType is the dtype activations are rounded to: the model's, or
// "f32" with Options.Exact or an f32 model.
func (e *Engine) roundDType() string {
	if e.opt.Exact {
		return "f32"
	}
	return e.dt
}

// round keeps n float32 values at the model dtype's precision, like
// transformers (no-op with Options.Exact or an f32 model).
func (e *Engine) round(b int, n int) error {
	if e.opt.Exact || e.dt == "f32" {
		return nil
	}
	if err := e.ks.Round(e.bufs[b], e.dt, uint64(n), e.compute); err != nil {
		return fmt.Errorf("engine: round %s: %w", bufNames[b], err)
	}
	return nil
}

// block runs transformer block l over T tokens at positions start.., in
// the op list's order (the activation arena's lifetimes assume it).
func (e *Engine) block(c *cursor, l, T, start int) error {
	cfg, ks, cs, B := e.cfg, e.ks, e.compute, e.bufs
	t, H, I := uint32(T), uint32(cfg.Hidden), uint32(cfg.Intermediate)
	nq, nkv, hd := uint32(cfg.Heads), uint32(cfg.KVHeads), uint32(cfg.HeadDim)
	layer := uint32(l)
	eps := float32(cfg.RMSNormEps)
	fail := func(what string, err error) error {
		return fmt.Errorf("engine: block %d: %s: %w", layer, what, err)
	}
	norm := func(what string, r llama.Role, out int) error {
		w, dt, err := c.use(l, r)
		if err != nil {
			return err
		}
		if err := ks.RMSNorm(B[bX], w, dt, B[out], e.dt, t, H, eps, cs); err != nil {
			return fail(what, err)
		}
		return c.settle()
	}
	mm := func(what string, r llama.Role, x, y int, M, K uint32) error {
		w, _, err := c.use(l, r)
		if err != nil {
			return err
		}
		if err := ks.Matmul(e.dt, w, B[x], B[y], M, K, t, cs); err != nil {
			return fail(what, err)
		}
		if err := c.settle(); err != nil {
			return err
		}
		if y == bQRaw || y == bKRaw {
			return nil // rounded once in HF order
		}
		return e.round(y, T*int(M))
	}
	// Q and K of a GGUF file come out in llama.cpp's row order and are put
	// back in HF's by an exact permutation product (after V, as the op
	// list says), so that both formats run the same arithmetic from there.
	qOut, kOut := bQ, bK
	if cfg.PermutedQK {
		qOut, kOut = bQRaw, bKRaw
	}
	unpermute := func(raw, y int, heads uint32) error {
		if err := ks.Matmul("f32", e.unpermute.Ptr, B[raw], B[y], hd, hd, t*heads, cs); err != nil {
			return fail("q/k to HF row order", err)
		}
		return e.round(y, T*int(heads*hd))
	}
	if err := norm("attention norm", llama.RoleAttnNorm, bH); err != nil {
		return err
	}
	if err := mm("q", llama.RoleQ, bH, qOut, nq*hd, H); err != nil {
		return err
	}
	if err := mm("k", llama.RoleK, bH, kOut, nkv*hd, H); err != nil {
		return err
	}
	if err := mm("v", llama.RoleV, bH, bV, nkv*hd, H); err != nil {
		return err
	}
	if cfg.PermutedQK {
		if err := unpermute(bQRaw, bQ, nq); err != nil {
			return err
		}
		if err := unpermute(bKRaw, bK, nkv); err != nil {
			return err
		}
	}
	for _, r := range []struct {
		b     int
		heads uint32
	}{{bQ, nq}, {bK, nkv}} {
		if err := ks.RoPEIn(B[r.b], B[bPos], t, r.heads, hd, e.invFreq.Ptr, false, e.roundDType(), cs); err != nil {
			return fail("rope", err)
		}
		if err := e.round(r.b, T*int(r.heads*hd)); err != nil {
			return err
		}
	}
	if err := ks.KVWrite(B[bK], B[bV], e.kv.Base(), B[bTable], uint32(start), t, e.layout, layer, cs); err != nil {
		return fail("kv write", err)
	}
	scale := float32(1 / math.Sqrt(float64(hd)))
	if err := ks.Attention(B[bQ], e.kv.Base(), B[bTable], uint32(start), t, nq, e.layout, layer, scale, B[bA], e.dt, cs); err != nil {
		return fail("attention", err)
	}
	if err := mm("o", llama.RoleO, bA, bO, H, nq*hd); err != nil {
		return err
	}
	if err := e.residual(bO, T); err != nil {
		return fail("residual", err)
	}
	if err := norm("mlp norm", llama.RoleMLPNorm, bH2); err != nil {
		return err
	}
	if err := mm("gate", llama.RoleGate, bH2, bG, I, H); err != nil {
		return err
	}
	if err := mm("up", llama.RoleUp, bH2, bU, I, H); err != nil {
		return err
	}
	if err := ks.SiluMul(B[bG], B[bU], B[bM], e.dt, uint64(T)*uint64(I), cs); err != nil {
		return fail("silu", err)
	}
	if err := mm("down", llama.RoleDown, bM, bD, H, I); err != nil {
		return err
	}
	if err := e.residual(bD, T); err != nil {
		return fail("residual", err)
	}
	return nil
}

// residual adds buffer b into the residual stream and rounds it.
func (e *Engine) residual(b, T int) error {
	n := T * e.cfg.Hidden
	if err := e.ks.Add(e.bufs[bX], e.bufs[b], uint64(n), e.compute); err != nil {
		return err
	}
	return e.round(bX, n)
}

// head runs the final norm and the LM head on the last token and queues
// the logits' download into the host staging buffer.
func (e *Engine) head(c *cursor, T int) error {
	cfg, cs, B := e.cfg, e.compute, e.bufs
	H := uint32(cfg.Hidden)
	normP, normDT, err := c.use(-1, llama.RoleFinalNorm)
	if err != nil {
		return err
	}
	headP := e.embedding // tied: the embedding, resident (mapGroups checked)
	if !cfg.TiedEmbeddings {
		if headP, _, err = c.use(-1, llama.RoleLMHead); err != nil {
			return err
		}
	}
	if err := e.ks.RMSNorm(B[bX], normP, normDT, B[bHF], e.dt, uint32(T), H, float32(cfg.RMSNormEps), cs); err != nil {
		return fmt.Errorf("engine: final norm: %w", err)
	}
	last := B[bHF].Add(uint64(T-1) * uint64(H) * e.elt)
	if err := e.ks.Matmul(e.dt, headP, last, B[bLogits], uint32(cfg.Vocab), H, 1, cs); err != nil {
		return fmt.Errorf("engine: lm head: %w", err)
	}
	if err := c.settle(); err != nil {
		return err
	}
	if err := e.round(bLogits, cfg.Vocab); err != nil {
		return err
	}
	st := e.staging.Bytes()
	if err := e.d.CopyDtoH(st[len(st)-4*cfg.Vocab:], B[bLogits], cs); err != nil {
		return fmt.Errorf("engine: download logits: %w", err)
	}
	return nil
}
