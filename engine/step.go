package engine

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/kernels"
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
	bDeq           // a quantized model's prefill: one weight and its activations in bf16 (kernels.MatmulDequant)
	numBufs
)

var bufNames = [numBufs]string{"ids", "pos", "table", "x", "h", "q", "k", "v", "attn", "o", "h2", "gate", "up", "silu_up", "down", "final_norm", "logits", "q_raw", "k_raw", "dequant"}

// regions are buffers laid out back to back in one plan buffer, the
// first's, each as long as the step's T rows make it (a part starts 256-byte
// aligned after the one before): a layer's Q, K and V, its gate and up, and
// GGUF's raw Q and K. When the parts touch (the sizes are multiples of 256
// bytes, as in 7B-class models, or T = 1 in small ones), one launch rounds,
// rotates or permutes two of them: rope over Q and K at once (T = 1), one
// Round over gate and up, one permutation product over raw Q and K.
var regions = [][]int{{bQ, bK, bV}, {bG, bU}, {bQRaw, bKRaw}}

// op is one entry of the step's op list: the buffers it reads and writes.
type op struct {
	name          string
	reads, writes []int
}

// opList returns the forward pass of one step, top to bottom, and the
// range [layerStart, layerEnd) of ops that run once per block. permuted
// (GGUF): RoPE reads Q and K in GGUF's row order and writes them in HF's
// (one op, whether the kernels do it in one pass or permute first). The products
// that share an input are one op each (q, k, v; gate, up): MatmulGroup runs
// them in one launch when it can, and when they run one by one their
// outputs are written later than the op says, within their lifetimes.
// The residual add of O and the MLP norm after it are one op too (one
// launch where the kernels fuse them), and so are the residual add of down
// and the next block's attention norm: h then lives across blocks (T·H
// elements more arena than when it did not, for three launches fewer a
// block); the first block's attention norm comes before the blocks.
func opList(permuted, dequant bool) (ops []op, layerStart, layerEnd int) {
	qkv := op{"q, k, v = h·Wq, Wk, Wv", []int{bH}, []int{bQ, bK, bV}}
	if permuted {
		qkv.writes = []int{bQRaw, bKRaw, bV}
	}
	// (dequant: a quantized model's products at prefill write their weight
	// and input in bf16 to one scratch buffer, which lives from the first
	// product of a block to the last.)
	prod := func(o op) op {
		if dequant {
			o.writes = append(o.writes, bDeq)
		}
		return o
	}
	qkv = prod(qkv)
	ops = []op{
		{"upload ids, positions, block table", nil, []int{bIDs, bPos, bTable}},
		{"embed", []int{bIDs}, []int{bX}},
		{"attention norm", []int{bX}, []int{bH}},
		qkv,
	}
	rope := op{"rope q, k", []int{bPos, bQ, bK}, []int{bQ, bK}}
	if permuted {
		rope = op{"rope q, k from GGUF's row order into HF's", []int{bPos, bQRaw, bKRaw}, []int{bQ, bK}}
	}
	ops = append(ops, rope)
	ops = append(ops, []op{
		{"write k, v to the cache", []int{bK, bV, bTable}, nil},
		{"attention", []int{bQ, bTable}, []int{bA}},
		prod(op{"o = attn·Wo", []int{bA}, []int{bO}}),
		{"x += o; h2 = mlp norm(x)", []int{bX, bO}, []int{bX, bH2}},
		prod(op{"gate, up = h2·Wgate, Wup", []int{bH2}, []int{bG, bU}}),
		{"m = silu(gate)·up", []int{bG, bU}, []int{bM}},
		prod(op{"down = m·Wdown", []int{bM}, []int{bD}}),
		{"x += down; h = next block's attention norm(x)", []int{bX, bD}, []int{bX, bH}},
		{"final norm", []int{bX}, []int{bHF}},
		{"logits = last row·Whead", []int{bHF}, []int{bLogits}},
		{"download logits", []int{bLogits}, nil},
	}...)
	return ops, 3, len(ops) - 3
}

// sizes returns each buffer's bytes for a step of T tokens.
func (e *Engine) sizes(T int) [numBufs]uint64 {
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
	size[bDeq] = e.dequantBytes(T)
	return size
}

// dequantBytes is the scratch kernels.MatmulDequant takes for the largest
// product of a block over T tokens in a block-quantized model, or 0 (other
// models, Options.QuantPrefill, and steps below kernels.DequantMinTokens,
// whose products run on the quantized kernels). It does not depend on the kernels' module, so
// that an estimate without one (fit) plans the arena run uses.
func (e *Engine) dequantBytes(T int) uint64 {
	c := e.cfg
	if !e.model.Tensors.Quantized || e.opt.QuantPrefill || T < kernels.DequantMinTokens {
		return 0
	}
	H, I, qd, kvd := uint32(c.Hidden), uint32(c.Intermediate), uint32(c.Heads*c.HeadDim), uint32(c.KVHeads*c.HeadDim)
	t := uint32(T)
	return max(kernels.DequantScratchBytes(qd, H, t), kernels.DequantScratchBytes(kvd, H, t),
		kernels.DequantScratchBytes(H, qd, t), kernels.DequantScratchBytes(I, H, t), kernels.DequantScratchBytes(H, I, t))
}

func align256(n uint64) uint64 { return (n + 255) &^ 255 }

// addrs returns every buffer's device address for a step of T tokens (at
// most the planned chunk): a region's parts follow its first.
func (e *Engine) addrs(T int) [numBufs]device.Ptr {
	var a [numBufs]device.Ptr
	copy(a[:], e.bufs)
	size := e.sizes(T)
	for _, r := range regions {
		off := uint64(0)
		for _, b := range r {
			a[b] = e.bufs[r[0]].Add(off)
			off += align256(size[b])
		}
	}
	return a
}

// buffers returns the step's buffers for T tokens with their lifetimes
// over the op list: from the first op that touches a buffer to one past
// the last. A buffer that exists before the blocks and is used inside them
// (the residual stream, positions, the block table) lives until the last
// block's last op, since every block reads it again. A region's first
// buffer holds all its parts for their joint lifetime; the other parts
// have size 0 here (addrs places them).
func (e *Engine) buffers(T int) []plan.Buffer {
	size := e.sizes(T)
	ops, opLayer, opLayerEnd := opList(e.cfg.PermutedQK, e.dequantBytes(T) > 0)
	first, last := [numBufs]int{}, [numBufs]int{}
	inLayer := [numBufs]bool{}
	for i := range first {
		first[i] = -1
	}
	head := [numBufs]int{}
	for b := range head {
		head[b] = b
	}
	for _, r := range regions {
		total := uint64(0)
		for _, b := range r {
			head[b] = r[0]
			total += align256(size[b])
			size[b] = 0
		}
		size[r[0]] = total
	}
	for i, o := range ops {
		for _, b := range append(append([]int(nil), o.reads...), o.writes...) {
			b = head[b]
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
	if err := e.upload(ids, start, table); err != nil {
		return stepOut{}, err
	}
	cs := e.compute
	e.at = e.addrs(T)
	c := &cursor{e: e}
	var hc *cursor
	if e.sub != nil {
		if err := e.sub.upload(ids, start, table); err != nil {
			return stepOut{}, err
		}
		e.sub.at = e.sub.addrs(T)
		hc = &cursor{e: e.sub}
	}
	var out stepOut
	err := e.pass(c, hc, T, start, wantLogits)
	if err == nil {
		err = c.drain()
	}
	if err == nil && hc != nil {
		err = hc.drain()
	}
	if err == nil {
		err = e.endProfile()
	}
	if err != nil {
		return stepOut{}, err
	}
	if err := e.d.StreamSynchronize(cs); err != nil {
		return stepOut{}, fmt.Errorf("engine: step: %w", err)
	}
	if wantLogits {
		out.logits = e.readLogits()
	}
	return out, nil
}

// readLogits returns the logits a finished step left in the staging
// buffer.
func (e *Engine) readLogits() []float32 {
	st := e.staging.Bytes()
	lb := st[len(st)-4*e.cfg.Vocab:]
	logits := make([]float32, e.cfg.Vocab)
	decodeF32(logits, lb)
	return logits
}

// upload copies a step's token ids, positions and block table to the
// device on the compute stream, through the pinned staging buffer.
func (e *Engine) upload(ids []int32, start int, table []int32) error {
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
	for _, c := range []struct {
		dst device.Ptr
		src []byte
	}{{e.bufs[bIDs], idsB}, {e.bufs[bPos], posB}, {e.bufs[bTable], tabB}} {
		if err := e.d.CopyHtoD(c.dst, c.src, e.compute); err != nil {
			return fmt.Errorf("engine: upload step inputs: %w", err)
		}
	}
	return nil
}

// pass queues the forward pass over T tokens at positions start.., and
// the logits' download when wanted, in the op list's order. Blocks that
// run on the host device go there in runs (hc walks its weights).
func (e *Engine) pass(c, hc *cursor, T, start int, wantLogits bool) error {
	if err := e.embed(c, T); err != nil {
		return err
	}
	for l := 0; l < e.cfg.Layers; {
		if e.runsHere(l) {
			if err := e.block(c, l, T, start); err != nil {
				return err
			}
			l++
			continue
		}
		b := l + 1
		for b < e.cfg.Layers && !e.runsHere(b) {
			b++
		}
		if err := e.hostRun(hc, l, b, T, start); err != nil {
			return err
		}
		l = b
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
					return h.views[i].Ptr, weightDType(h.views[i].Tensor.DType), nil
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

// release tells residency that the ops reading group gi are queued. A
// streamed group's slot may be overwritten after them, so an event marks
// their end; a resident group's release only counts, and recording no event
// for it keeps the compute stream a chain of kernels (an event record
// between two kernels keeps the second from overlapping the first under
// programmatic dependent launch, and costs a driver call).
func (e *Engine) release(gi int) error {
	if e.plan.Groups[gi].Resident {
		if err := e.res.Release(gi, 0); err != nil {
			return fmt.Errorf("engine: release %s: %w", e.plan.Groups[gi].Name, err)
		}
		return nil
	}
	if err := e.d.EventRecord(e.events[gi], e.compute); err != nil {
		return fmt.Errorf("engine: record the end of %s: %w", e.plan.Groups[gi].Name, err)
	}
	if err := e.res.Release(gi, e.events[gi]); err != nil {
		return fmt.Errorf("engine: release %s: %w", e.plan.Groups[gi].Name, err)
	}
	return nil
}

func (e *Engine) embed(c *cursor, T int) error {
	e.normed = -1
	p, dt, err := c.use(-1, llama.RoleEmbedding)
	if err != nil {
		return err
	}
	e.embedding = p
	if err := e.mark(ClassOther, "embed"); err != nil {
		return err
	}
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

// round keeps n float32 values of buffer b (named in errors) at the model
// dtype's precision, like transformers (no-op with Options.Exact or an f32
// model).
func (e *Engine) round(b int, n int) error {
	if e.opt.Exact || e.dt == "f32" {
		return nil
	}
	if err := e.mark(ClassOther, "round"); err != nil {
		return err
	}
	if err := e.ks.Round(e.at[b], e.dt, uint64(n), e.compute); err != nil {
		return fmt.Errorf("engine: round %s: %w", bufNames[b], err)
	}
	return nil
}

// touching reports whether buffer b ends where buffer next begins in this
// step (parts of a region whose sizes are multiples of 256 bytes).
func (e *Engine) touching(b, next int, bytes uint64) bool {
	return e.at[b].Add(bytes) == e.at[next]
}

// product is one matrix product of a layer: role's weight times buffer x
// into y, M rows.
type product struct {
	role llama.Role
	y    int
	M    uint32
}

// products queues the products ps of layer l, which all read x (K
// columns, T rows): one MatmulGroup launch (one kernel for T = 1) when the
// layer's plan allows it (e.grouped), the weights share the model's dtype
// and Options.Ungrouped is off, else one Matmul each as the weights come.
// Both give the same bits. The weights' groups are acquired in plan order
// either way and released once the launch that reads them is queued.
func (e *Engine) products(c *cursor, l int, what string, x int, K, T uint32, group bool, ps ...product) error {
	fail := func(err error) error { return fmt.Errorf("engine: block %d: %s: %w", l, what, err) }
	if !group {
		for _, p := range ps {
			w, wdt, err := c.use(l, p.role)
			if err != nil {
				return err
			}
			if err := e.mark(ClassProducts, what); err != nil {
				return err
			}
			e.readsWeights(e.weightBytes(wdt, p.M, K))
			if err := e.matmul(e.productDType(wdt), w, e.at[x], e.at[p.y], p.M, K, T); err != nil {
				return fail(err)
			}
			if err := c.settle(); err != nil {
				return err
			}
		}
		return nil
	}
	ops := make([]kernels.MatmulOp, 0, len(ps))
	dts := make([]string, 0, len(ps))
	same := true
	for _, p := range ps {
		w, dt, err := c.use(l, p.role)
		if err != nil {
			return err
		}
		same = same && dt == e.dt
		ops = append(ops, kernels.MatmulOp{W: w, Y: e.at[p.y], M: p.M})
		dts = append(dts, e.productDType(dt))
	}
	if err := e.mark(ClassProducts, what); err != nil {
		return err
	}
	for i, o := range ops {
		e.readsWeights(e.weightBytes(dts[i], o.M, K))
	}
	var err error
	switch {
	case same:
		err = e.ks.MatmulGroup(e.dt, e.at[x], K, T, ops, e.compute)
	case e.model.Tensors.Quantized && e.dequantBytes(int(T)) == 0:
		// A quantized layer's products, one launch where the kernels have
		// it (T = 1 over Q4_K and Q6_K), else one Matmul each.
		qops := make([]kernels.QMatmulOp, len(ops))
		for i, o := range ops {
			qops[i] = kernels.QMatmulOp{DType: dts[i], W: o.W, Y: o.Y, M: o.M}
		}
		err = e.ks.QMatmulGroup(e.at[x], K, T, qops, e.compute)
	default: // a mixed-dtype file: one product each, in the model dtype as always
		for i, o := range ops {
			if err = e.matmul(dts[i], o.W, e.at[x], o.Y, o.M, K, T); err != nil {
				break
			}
		}
	}
	if err != nil {
		return fail(err)
	}
	return c.settle()
}

// matmul queues one product of a block on the compute stream: through
// the dequant scratch where the step planned one (a quantized model's
// prefill), else Matmul.
func (e *Engine) matmul(dt string, W, X, Y device.Ptr, M, K, T uint32) error {
	if n := e.dequantBytes(int(T)); n > 0 {
		return e.ks.MatmulDequant(dt, W, X, Y, M, K, T, e.at[bDeq], n, e.compute)
	}
	return e.ks.Matmul(dt, W, X, Y, M, K, T, e.compute)
}

// block runs transformer block l over T tokens at positions start.., in
// the op list's order (the activation arena's lifetimes assume it).
//
// Rounding as transformers does costs no launch of its own for Q, K and
// V: RoPEIn rounds its input and its output to the model dtype, and KVWrite
// stores K and V in it (round to nearest even, the same conversion as
// Round), so a Round before or after them would change no bit.
func (e *Engine) block(c *cursor, l, T, start int) error {
	if err := e.attentionHalf(c, l, T, start); err != nil {
		return err
	}
	return e.mlpHalf(c, l, T)
}

// blockErr names block l and the op in err.
func blockErr(l int, what string, err error) error {
	return fmt.Errorf("engine: block %d: %s: %w", l, what, err)
}

// norm queues RMSNorm of the residual stream with block l's weight of
// role r into buffer out.
func (e *Engine) norm(c *cursor, l int, what string, r llama.Role, out int, T int) error {
	w, dt, err := c.use(l, r)
	if err != nil {
		return err
	}
	if err := e.mark(ClassNorms, "rmsnorm"); err != nil {
		return err
	}
	if err := e.ks.RMSNorm(e.at[bX], w, dt, e.at[out], e.dt, uint32(T), uint32(e.cfg.Hidden), float32(e.cfg.RMSNormEps), e.compute); err != nil {
		return blockErr(l, what, err)
	}
	return c.settle()
}

// attentionHalf is block l up to and including the residual add of the O
// product.
func (e *Engine) attentionHalf(c *cursor, l, T, start int) error {
	cfg, ks, cs, B := e.cfg, e.ks, e.compute, &e.at
	t := uint32(T)
	nq, hd := uint32(cfg.Heads), uint32(cfg.HeadDim)
	if err := e.attentionIn(c, l, T); err != nil {
		return err
	}
	if err := e.mark(ClassAttention, "kv write"); err != nil {
		return err
	}
	layer := uint32(e.kvLayer[l])
	// In a captured step (e.stepState) the position comes from the
	// positions buffer, not the launch: the same bits (graph.go).
	var err error
	if e.stepState {
		err = ks.KVWriteAt(B[bK], B[bV], e.kv.Base(), B[bTable], B[bPos], t, e.layout, layer, cs)
	} else {
		err = ks.KVWrite(B[bK], B[bV], e.kv.Base(), B[bTable], uint32(start), t, e.layout, layer, cs)
	}
	if err != nil {
		return blockErr(l, "kv write", err)
	}
	scale := float32(1 / math.Sqrt(float64(hd)))
	if err := e.mark(ClassAttention, "attention"); err != nil {
		return err
	}
	if e.stepState {
		err = ks.AttentionAt(B[bQ], e.kv.Base(), B[bTable], B[bPos], uint32(e.opt.MaxTokens), t, nq, e.layout, layer, scale, B[bA], e.dt, cs)
	} else {
		err = ks.Attention(B[bQ], e.kv.Base(), B[bTable], uint32(start), t, nq, e.layout, layer, scale, B[bA], e.dt, cs)
	}
	if err != nil {
		return blockErr(l, "attention", err)
	}
	return e.attentionOut(c, l, T)
}

// attentionIn is block l's attention norm, Q, K and V products and RoPE
// over T tokens (at the positions in the pos buffer).
func (e *Engine) attentionIn(c *cursor, l, T int) error {
	cfg := e.cfg
	t, H := uint32(T), uint32(cfg.Hidden)
	nq, nkv, hd := uint32(cfg.Heads), uint32(cfg.KVHeads), uint32(cfg.HeadDim)
	qBytes := 4 * uint64(T) * uint64(nq*hd)
	// Q and K of a GGUF file come out in llama.cpp's row order and are put
	// back in HF's by RoPE reading them in that order (or, where the kernels
	// lack it, by an exact permutation product before RoPE), so that both
	// formats run the same arithmetic from there.
	qOut, kOut := bQ, bK
	if cfg.PermutedQK {
		qOut, kOut = bQRaw, bKRaw
	}
	if e.normed == l { // queued with the previous block's residual
		e.normed = -1
	} else if err := e.norm(c, l, "attention norm", llama.RoleAttnNorm, bH, T); err != nil {
		return err
	}
	if err := e.products(c, l, "q, k, v", bH, H, t, e.grouped[l].qkv,
		product{llama.RoleQ, qOut, nq * hd}, product{llama.RoleK, kOut, nkv * hd}, product{llama.RoleV, bV, nkv * hd}); err != nil {
		return err
	}
	if cfg.PermutedQK && e.ropeGGUF {
		if err := e.ropeFromGGUF(t, qBytes); err != nil {
			return blockErr(l, "rope from GGUF's row order", err)
		}
		return nil
	}
	if cfg.PermutedQK {
		if err := e.unpermuteQK(t, qBytes); err != nil {
			return blockErr(l, "q/k to HF row order", err)
		}
	}
	if err := e.rope(t, qBytes); err != nil {
		return blockErr(l, "rope", err)
	}
	return nil
}

// attentionOut is block l's O product over attention's output and the
// residual add and MLP norm after it.
func (e *Engine) attentionOut(c *cursor, l, T int) error {
	t, H, qd := uint32(T), uint32(e.cfg.Hidden), uint32(e.cfg.Heads*e.cfg.HeadDim)
	if err := e.products(c, l, "o", bA, qd, t, false, product{llama.RoleO, bO, H}); err != nil {
		return err
	}
	return e.residualNorm(c, l, bO, T, &normOp{l, llama.RoleMLPNorm, bH2, "mlp norm"})
}

// mlpHalf is block l's MLP and its residual add, fused with the next
// block's attention norm when that block runs on this device (one launch
// instead of the residual's round, add, round and the norm's: the same
// bits, kernels.Set.ResidualRMSNorm).
func (e *Engine) mlpHalf(c *cursor, l, T int) error {
	t, H, I := uint32(T), uint32(e.cfg.Hidden), uint32(e.cfg.Intermediate)
	if err := e.products(c, l, "gate, up", bH2, H, t, e.grouped[l].gateUp,
		product{llama.RoleGate, bG, I}, product{llama.RoleUp, bU, I}); err != nil {
		return err
	}
	if err := e.siluUp(l, T*int(I)); err != nil {
		return err
	}
	if err := e.products(c, l, "down", bM, I, t, false, product{llama.RoleDown, bD, H}); err != nil {
		return err
	}
	if l+1 < e.cfg.Layers && e.runsHere(l+1) {
		if err := e.residualNorm(c, l, bD, T, &normOp{l + 1, llama.RoleAttnNorm, bH, "next block's attention norm"}); err != nil {
			return err
		}
		e.normed = l + 1
		return nil
	}
	return e.residual(l, bD, T)
}

// siluUp queues m = SiLU(gate)·up over n values, gate and up rounded to the
// model dtype first, in one launch (e.siluIn).
func (e *Engine) siluUp(l, n int) error {
	B := &e.at
	if err := e.mark(ClassOther, "silu·up"); err != nil {
		return err
	}
	if err := e.siluIn(B[bG], B[bU], e.roundDType(), B[bM], e.dt, uint64(n), e.compute); err != nil {
		return blockErr(l, "silu", err)
	}
	return nil
}

// normOp is an RMSNorm of the residual stream: the weight of role in block
// layer, into buffer out.
type normOp struct {
	layer int
	role  llama.Role
	out   int
	what  string
}

// residualNorm adds product b of block l into the residual stream (both
// rounded, see residual) and then queues norm, in one launch (e.resNorm).
func (e *Engine) residualNorm(c *cursor, l, b, T int, norm *normOp) error {
	w, dt, err := c.use(norm.layer, norm.role)
	if err != nil {
		return err
	}
	if err := e.mark(ClassNorms, "add + rmsnorm"); err != nil {
		return err
	}
	if err := e.resNorm(e.at[bX], e.at[b], e.roundDType(), w, dt, e.at[norm.out], e.dt, uint32(T), uint32(e.cfg.Hidden),
		float32(e.cfg.RMSNormEps), e.compute); err != nil {
		return blockErr(l, "residual and "+norm.what, err)
	}
	return c.settle()
}

// unpermuteQK puts the raw Q and K rows of T tokens back in HF order:
// each head of hd rows is multiplied by the permutation matrix, in one
// product over both when the raw and the HF-order parts touch.
func (e *Engine) unpermuteQK(T uint32, qBytes uint64) error {
	hd, nq, nkv := uint32(e.cfg.HeadDim), uint32(e.cfg.Heads), uint32(e.cfg.KVHeads)
	P, B := e.unpermute.Ptr, &e.at
	if err := e.mark(ClassOther, "q/k permutation"); err != nil {
		return err
	}
	if e.touching(bQRaw, bKRaw, qBytes) && e.touching(bQ, bK, qBytes) {
		return e.ks.Matmul("f32", P, B[bQRaw], B[bQ], hd, hd, T*(nq+nkv), e.compute)
	}
	if err := e.ks.Matmul("f32", P, B[bQRaw], B[bQ], hd, hd, T*nq, e.compute); err != nil {
		return err
	}
	return e.ks.Matmul("f32", P, B[bKRaw], B[bK], hd, hd, T*nkv, e.compute)
}

// rope rotates Q and K of T tokens (in the rounding dtype): one launch
// over both when T = 1 and K follows Q (T rows of heads then read as one
// row of nq + nkv heads at one position).
func (e *Engine) rope(T uint32, qBytes uint64) error {
	hd, nq, nkv := uint32(e.cfg.HeadDim), uint32(e.cfg.Heads), uint32(e.cfg.KVHeads)
	B, rd := &e.at, e.roundDType()
	if err := e.mark(ClassOther, "rope"); err != nil {
		return err
	}
	if T == 1 && e.touching(bQ, bK, qBytes) {
		return e.ks.RoPEIn(B[bQ], B[bPos], 1, nq+nkv, hd, e.invFreq.Ptr, false, rd, e.compute)
	}
	if err := e.ks.RoPEIn(B[bQ], B[bPos], T, nq, hd, e.invFreq.Ptr, false, rd, e.compute); err != nil {
		return err
	}
	return e.ks.RoPEIn(B[bK], B[bPos], T, nkv, hd, e.invFreq.Ptr, false, rd, e.compute)
}

// ropeFromGGUF rotates the raw (GGUF row order) Q and K of T tokens into Q
// and K in HF's order (kernels.Set.RoPEGGUF: the bits of unpermuteQK and
// then rope): one launch over both when T = 1 and both the raw and the
// HF-order parts touch.
func (e *Engine) ropeFromGGUF(T uint32, qBytes uint64) error {
	hd, nq, nkv := uint32(e.cfg.HeadDim), uint32(e.cfg.Heads), uint32(e.cfg.KVHeads)
	B, rd := &e.at, e.roundDType()
	if err := e.mark(ClassOther, "rope"); err != nil {
		return err
	}
	if T == 1 && e.touching(bQRaw, bKRaw, qBytes) && e.touching(bQ, bK, qBytes) {
		return e.ks.RoPEGGUF(B[bQRaw], B[bQ], B[bPos], 1, nq+nkv, hd, e.invFreq.Ptr, rd, e.compute)
	}
	if err := e.ks.RoPEGGUF(B[bQRaw], B[bQ], B[bPos], T, nq, hd, e.invFreq.Ptr, rd, e.compute); err != nil {
		return err
	}
	return e.ks.RoPEGGUF(B[bKRaw], B[bK], B[bPos], T, nkv, hd, e.invFreq.Ptr, rd, e.compute)
}

// residual rounds product b of block l (T rows) to the model dtype, adds
// it into the residual stream and rounds that (no rounding with
// Options.Exact or an f32 model).
func (e *Engine) residual(l, b, T int) error {
	n := T * e.cfg.Hidden
	if err := e.round(b, n); err != nil {
		return err
	}
	if err := e.mark(ClassOther, "add"); err != nil {
		return err
	}
	if err := e.ks.Add(e.at[bX], e.at[b], uint64(n), e.compute); err != nil {
		return blockErr(l, "residual", err)
	}
	return e.round(bX, n)
}

// head runs the final norm and the LM head on the last token and queues
// the logits' download into the host staging buffer.
func (e *Engine) head(c *cursor, T int) error {
	cfg, cs, B := e.cfg, e.compute, &e.at
	H := uint32(cfg.Hidden)
	normP, normDT, err := c.use(-1, llama.RoleFinalNorm)
	if err != nil {
		return err
	}
	headP := e.embedding // tied: the embedding, resident (mapGroups checked)
	headDT := weightDType(e.model.Tensors.Embedding.DType)
	if !cfg.TiedEmbeddings {
		if headP, headDT, err = c.use(-1, llama.RoleLMHead); err != nil {
			return err
		}
	}
	if err := e.mark(ClassNorms, "rmsnorm"); err != nil {
		return err
	}
	if err := e.ks.RMSNorm(B[bX], normP, normDT, B[bHF], e.dt, uint32(T), H, float32(cfg.RMSNormEps), cs); err != nil {
		return fmt.Errorf("engine: final norm: %w", err)
	}
	if err := e.mark(ClassProducts, "lm head"); err != nil {
		return err
	}
	e.readsWeights(e.weightBytes(headDT, uint32(cfg.Vocab), H))
	last := B[bHF].Add(uint64(T-1) * uint64(H) * e.elt)
	if err := e.ks.Matmul(e.productDType(headDT), headP, last, B[bLogits], uint32(cfg.Vocab), H, 1, cs); err != nil {
		return fmt.Errorf("engine: lm head: %w", err)
	}
	if err := c.settle(); err != nil {
		return err
	}
	if err := e.round(bLogits, cfg.Vocab); err != nil {
		return err
	}
	if err := e.mark(ClassOther, "download"); err != nil {
		return err
	}
	st := e.staging.Bytes()
	if err := e.d.CopyDtoH(st[len(st)-4*cfg.Vocab:], B[bLogits], cs); err != nil {
		return fmt.Errorf("engine: download logits: %w", err)
	}
	return nil
}
