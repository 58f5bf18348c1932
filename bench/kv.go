package bench

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/kvcache"
	"github.com/memwall/memwall/pool"
)

// KVOptions configure KV: the block manager's operations at several pool
// sizes, and swap bandwidth on a device.
type KVOptions struct {
	// Blocks are the pool sizes the operations are timed at (default 10^3,
	// 10^4, 10^5, 10^6), each at least MinKVBlocks.
	Blocks []int
	// Ops is the number of timed operations of each kind per size (default
	// 200,000).
	Ops int
	// BlockTokens is the tokens per block (default 16).
	BlockTokens int
	// Swap shape: a Llama-3-8B-like layer stack by default (32 layers, 8 KV
	// heads of 128, bf16: 2 MiB blocks of 16 tokens).
	Layers, KVHeads, HeadDim, ElemBytes int
	// SwapBytes is the K/V moved per swap (default 1 GiB); Reps the timed
	// swaps per direction and layout (default 3, the median reported).
	SwapBytes uint64
	Reps      int
	// Device, when set, runs the swap measurement on it.
	Device device.Device
	// PoolHistory is the allocations and frees each pool keeps for the
	// snapshot of an out-of-memory error (pool.Options.History; 0: none).
	PoolHistory int
	Progress    func(done, total int, name string)
}

// MinKVBlocks is the smallest pool KV times: its steady state frees a
// third of the blocks, which must hold the timed working set.
const MinKVBlocks = 1000

func (o KVOptions) withDefaults() KVOptions {
	if len(o.Blocks) == 0 {
		o.Blocks = []int{1_000, 10_000, 100_000, 1_000_000}
	}
	if o.Ops <= 0 {
		o.Ops = 200_000
	}
	if o.BlockTokens <= 0 {
		o.BlockTokens = 16
	}
	if o.Layers <= 0 {
		o.Layers, o.KVHeads, o.HeadDim, o.ElemBytes = 32, 8, 128, 2
	}
	if o.SwapBytes == 0 {
		o.SwapBytes = 1 << 30
	}
	if o.Reps <= 0 {
		o.Reps = 3
	}
	return o
}

// KVOpResult is the cost of the block manager's operations with Blocks
// blocks, two thirds of them held by 512 sequences and the rest free (each
// figure the cheapest of about 20 rounds). Alloc is ns per block appended
// (an Append of BlockTokens tokens that takes a block from the free list)
// without prefix caching; Free ns per block released by Free; Fork ns per
// Fork of an 8-block sequence. With prefix caching, where every free block
// is cached: Evict is ns per block appended when each one taken evicts the
// least recently used cached block (and the previous full block is hashed
// into the cache), the steady state of a full cache; Touch ns per block
// served from the prefix cache to Add (a hash lookup and the block's removal
// from the middle of the free list).
type KVOpResult struct {
	Blocks  int     `json:"blocks"`
	AllocNs float64 `json:"alloc_ns"`
	EvictNs float64 `json:"evict_ns"`
	FreeNs  float64 `json:"free_ns"`
	ForkNs  float64 `json:"fork_ns"`
	TouchNs float64 `json:"touch_ns"`
}

// KVSwapResult is one layout's swap bandwidth: "all-layers-per-block" (the
// cache's layout: a block is one contiguous copy) or "per-layer" (K and V of
// each layer apart, as in per-layer cache tensors: 2·Layers copies per
// block). Bytes moved over device time, GB/s (1e9 B/s), median of the
// reps; Verified when every byte read back after each round trip matched.
type KVSwapResult struct {
	Layout     string  `json:"layout"`
	BlockBytes uint64  `json:"block_bytes"`
	CopyBytes  uint64  `json:"copy_bytes"`
	Copies     int     `json:"copies_per_swap"`
	Bytes      uint64  `json:"bytes"`
	OutGBps    float64 `json:"out_GBps"` // device → host
	InGBps     float64 `json:"in_GBps"`  // host → device
	Verified   bool    `json:"verified"`
}

// KVReport is what KV measured.
type KVReport struct {
	Device  string       `json:"device,omitempty"`
	Backend string       `json:"backend,omitempty"`
	Ops     []KVOpResult `json:"ops"`
	// Flatness is, per operation, its largest cost over its smallest across
	// the sizes (1 = perfectly flat).
	Flatness map[string]float64 `json:"flatness"`
	Swap     []KVSwapResult     `json:"swap,omitempty"`
	// LinkD2HGBps and LinkH2DGBps are one pinned copy of the swap's size in
	// each direction, measured in the same run: the link swaps compare to.
	LinkD2HGBps float64 `json:"link_d2h_GBps,omitempty"`
	LinkH2DGBps float64 `json:"link_h2d_GBps,omitempty"`
	// SwapOverLink is the cache layout's swap bandwidth over the link's, the
	// smaller of the two directions.
	SwapOverLink float64 `json:"swap_over_link,omitempty"`
}

// KV measures the block manager's operations at each size, then (with a
// device) swap bandwidth for both layouts against the pinned link.
func KV(ctx context.Context, o KVOptions) (KVReport, error) {
	o = o.withDefaults()
	var rep KVReport
	for _, n := range o.Blocks {
		if n < MinKVBlocks {
			return rep, fmt.Errorf("bench kv: a pool of %d blocks: the timed working set (8 sequences of 32 blocks, 64 cached prompts of 4) needs at least %d", n, MinKVBlocks)
		}
	}
	total := len(o.Blocks)
	if o.Device != nil {
		total++
	}
	for i, n := range o.Blocks {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		if o.Progress != nil {
			o.Progress(i, total, fmt.Sprintf("ops at %d blocks", n))
		}
		r, err := kvOps(ctx, n, o.Ops, o.BlockTokens)
		if err != nil {
			return rep, err
		}
		rep.Ops = append(rep.Ops, r)
	}
	rep.Flatness = map[string]float64{}
	for name, get := range map[string]func(KVOpResult) float64{
		"alloc": func(r KVOpResult) float64 { return r.AllocNs }, "free": func(r KVOpResult) float64 { return r.FreeNs },
		"fork": func(r KVOpResult) float64 { return r.ForkNs }, "touch": func(r KVOpResult) float64 { return r.TouchNs },
		"evict": func(r KVOpResult) float64 { return r.EvictNs },
	} {
		lo, hi := 0.0, 0.0
		for i, r := range rep.Ops {
			v := get(r)
			if i == 0 || v < lo {
				lo = v
			}
			hi = max(hi, v)
		}
		if lo > 0 {
			rep.Flatness[name] = hi / lo
		}
	}
	if o.Device != nil {
		if o.Progress != nil {
			o.Progress(total-1, total, "swap")
		}
		info := o.Device.Info()
		rep.Device, rep.Backend = info.Name, info.Backend
		if err := kvSwap(ctx, o, &rep); err != nil {
			return rep, err
		}
	}
	if o.Progress != nil {
		o.Progress(total, total, "done")
	}
	return rep, nil
}

// kvOps times the operations at n blocks: alloc, free and fork on a
// manager without prefix caching, evict and touch on one with it. Each
// loop looks at ctx between timed rounds and stops with its error, saying
// how many operations were done.
func kvOps(ctx context.Context, n, ops, B int) (KVOpResult, error) {
	r := KVOpResult{Blocks: n}
	round := max(ops/20, 64)
	wrap := func(what string, err error) error {
		return fmt.Errorf("bench kv: %d blocks: %s: %w", n, what, err)
	}
	plain, err := newKVBench(ctx, n, B, true)
	if err != nil {
		return r, wrap("filling the pool", err)
	}
	if r.AllocNs, r.FreeNs, err = plain.allocFree(ctx, ops, round); err != nil {
		return r, wrap("alloc and free", err)
	}
	if r.ForkNs, err = plain.fork(ctx, ops, round); err != nil {
		return r, wrap("fork", err)
	}
	cached, err := newKVBench(ctx, n, B, false)
	if err != nil {
		return r, wrap("filling the cached pool", err)
	}
	if r.EvictNs, _, err = cached.allocFree(ctx, ops, round); err != nil {
		return r, wrap("evict", err)
	}
	if r.TouchNs, err = cached.touch(ctx, ops, round); err != nil {
		return r, wrap("touch", err)
	}
	return r, nil
}

// stopped is ctx's error once ctx is done, saying how many of ops were
// done; nil before.
func stopped(ctx context.Context, done, ops int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%d of %d ops: %w", done, ops, err)
	}
	return nil
}

// kvBench is a manager in a serving cache's steady state.
type kvBench struct {
	m    *kvcache.Manager
	rng  *rand.Rand
	next kvcache.SeqID
	B    int
}

func (k *kvBench) tokens(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(k.rng.Uint32() >> 1)
	}
	return t
}

func (k *kvBench) id() kvcache.SeqID { k.next++; return k.next }

// newKVBench fills every block of a manager with 768 sequences grown a
// block at a time in random turns (so that a sequence's blocks lie
// scattered, as in a server that has run a while), then frees a third of
// them in random order: with prefix caching their blocks stay cached, so
// that every block taken evicts the least recently used one.
func newKVBench(ctx context.Context, n, B int, noPrefix bool) (*kvBench, error) {
	m, err := kvcache.NewManager(kvcache.ManagerConfig{Blocks: n, BlockTokens: B, NoPrefixCache: noPrefix})
	if err != nil {
		return nil, err
	}
	k := &kvBench{m: m, rng: rand.New(rand.NewPCG(uint64(n), 11)), B: B}
	const history = 768
	held := make([]kvcache.SeqID, history)
	for i := range held {
		held[i] = k.id()
		if _, err := m.Add(held[i], nil, 0); err != nil {
			return nil, err
		}
	}
	chunk := k.tokens(B)
	for i := 0; m.FreeBlocks() > 0; i++ {
		if i%checkEvery == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("%d of %d blocks: %w", i, n, ctx.Err())
		}
		id := held[k.rng.IntN(history)]
		chunk[0] = int32(m.FreeBlocks())
		if err := m.Append(id, chunk...); err != nil {
			return nil, err
		}
	}
	k.rng.Shuffle(len(held), func(i, j int) { held[i], held[j] = held[j], held[i] })
	for _, id := range held[:history/3] {
		_ = m.Computed(id, m.Len(id))
		_ = m.Free(id)
	}
	return k, nil
}

// allocFree grows 8 working sequences a block per Append up to 32 blocks,
// then frees them: ns per block appended, and per block freed.
func (k *kvBench) allocFree(ctx context.Context, ops, round int) (allocNs, freeNs float64, err error) {
	m := k.m
	ws := make([]kvcache.SeqID, 8)
	for i := range ws {
		ws[i] = k.id()
		if _, err := m.Add(ws[i], nil, 0); err != nil {
			return 0, 0, err
		}
	}
	chunk := k.tokens(k.B)
	allocT, freeT := bestOf{round: round}, bestOf{round: round}
	for i, allocs := 0, 0; allocs < ops; i++ {
		if i%(checkEvery/8) == 0 {
			if err := stopped(ctx, allocs, ops); err != nil {
				return 0, 0, err
			}
		}
		t0 := time.Now()
		for _, w := range ws {
			chunk[0] = int32(allocs)
			if err := m.Append(w, chunk...); err != nil {
				return 0, 0, fmt.Errorf("bench kv: append: %w", err)
			}
			allocs++
		}
		allocT.add(time.Since(t0), len(ws))
		if m.Len(ws[0]) < 32*k.B {
			continue
		}
		frees := 0
		for _, w := range ws {
			frees += m.Blocks(w)
		}
		t0 = time.Now()
		for _, w := range ws {
			if err := m.Free(w); err != nil {
				return 0, 0, err
			}
		}
		freeT.add(time.Since(t0), frees)
		for i := range ws {
			ws[i] = k.id()
			_, _ = m.Add(ws[i], nil, 0)
		}
	}
	for _, w := range ws {
		_ = m.Free(w)
	}
	return allocT.ns(), freeT.ns(), nil
}

// fork times batches of Forks of one 8-block sequence (children freed
// untimed): ns per Fork.
func (k *kvBench) fork(ctx context.Context, ops, round int) (float64, error) {
	m := k.m
	src := k.id()
	if _, err := m.Add(src, k.tokens(8*k.B), 0); err != nil {
		return 0, err
	}
	const batch = 256
	forkT := bestOf{round: round}
	kids := make([]kvcache.SeqID, batch)
	for forks := 0; forks < ops; forks += batch {
		if err := stopped(ctx, forks, ops); err != nil {
			return 0, err
		}
		for i := range kids {
			kids[i] = k.id()
		}
		t0 := time.Now()
		for _, c := range kids {
			if err := m.Fork(src, c); err != nil {
				return 0, err
			}
		}
		forkT.add(time.Since(t0), batch)
		for _, c := range kids {
			_ = m.Free(c)
		}
	}
	_ = m.Free(src)
	return forkT.ns(), nil
}

// touch times Adds of 64 popular 4-block prompts whose blocks are free and
// cached (each block a hash lookup and a removal from the middle of the
// free list), freed untimed back to the cache's tail: ns per block.
func (k *kvBench) touch(ctx context.Context, ops, round int) (float64, error) {
	m := k.m
	const popular = 64
	prompts := make([][]int32, popular)
	for i := range prompts {
		prompts[i] = k.tokens(4 * k.B)
		id := k.id()
		_, _ = m.Add(id, prompts[i], 0)
		_ = m.Computed(id, len(prompts[i]))
		_ = m.Free(id)
	}
	touchT := bestOf{round: round}
	ids := make([]kvcache.SeqID, popular)
	for touches := 0; touches < ops; touches += popular * 4 {
		if err := stopped(ctx, touches, ops); err != nil {
			return 0, err
		}
		for i := range ids {
			ids[i] = k.id()
		}
		t0 := time.Now()
		for i, p := range prompts {
			if _, err := m.Add(ids[i], p, 0); err != nil {
				return 0, err
			}
		}
		touchT.add(time.Since(t0), popular*4)
		for _, id := range ids {
			_ = m.Free(id)
		}
	}
	if st := m.Stats(); st.PrefixHits == 0 {
		return 0, fmt.Errorf("bench kv: no prefix hits")
	}
	return touchT.ns(), nil
}

// kvSwap measures swap bandwidth for both layouts on o.Device and the pinned
// link in the same run.
func kvSwap(ctx context.Context, o KVOptions, rep *KVReport) error {
	sb, err := newSwapBench(o)
	if err != nil {
		return err
	}
	defer sb.close()
	cache, err := sb.cacheLayout(ctx)
	if err != nil {
		return err
	}
	per, err := sb.perLayer(ctx)
	if err != nil {
		return err
	}
	rep.Swap = []KVSwapResult{cache, per}
	if rep.LinkD2HGBps, rep.LinkH2DGBps, err = sb.link(); err != nil {
		return err
	}
	if rep.LinkD2HGBps > 0 && rep.LinkH2DGBps > 0 {
		rep.SwapOverLink = min(cache.OutGBps/rep.LinkD2HGBps, cache.InGBps/rep.LinkH2DGBps)
	}
	return nil
}

// swapBench is a cache of two sequences on a device whose blocks alternate,
// so that no two blocks of one are adjacent: a swap is one copy per block.
type swapBench struct {
	o                KVOptions
	d                device.Device
	c                *kvcache.Cache
	bb, total        uint64
	nb, blocks       int
	compute, out, in device.Stream
	e0, e1           device.Event
	pattern          *device.HostBuffer
	stage            *device.HostBuffer
	undo             []func()
}

func newSwapBench(o KVOptions) (sb *swapBench, err error) {
	d := o.Device
	sb = &swapBench{o: o, d: d}
	defer func() {
		if err != nil {
			sb.close()
		}
	}()
	cfg := kvcache.Config{Layers: o.Layers, KVHeads: o.KVHeads, HeadDim: o.HeadDim, ElemBytes: o.ElemBytes, BlockTokens: o.BlockTokens}
	sb.bb = cfg.BlockBytes()
	sb.nb = int(max(1, o.SwapBytes/sb.bb))
	sb.blocks = 2 * sb.nb
	cfg.Blocks = sb.blocks
	sb.total = uint64(sb.nb) * sb.bb
	dev, err := pool.New(d, pool.Options{Name: "bench-kv", History: o.PoolHistory})
	if err != nil {
		return sb, err
	}
	sb.undo = append(sb.undo, func() { dev.Close() })
	host, err := pool.NewHost(d, pool.Options{Name: "bench-kv-host", History: o.PoolHistory})
	if err != nil {
		return sb, err
	}
	sb.undo = append(sb.undo, func() { host.Close() })
	for _, s := range []*device.Stream{&sb.compute, &sb.out, &sb.in} {
		if *s, err = d.NewStream(); err != nil {
			return sb, err
		}
		st := *s
		sb.undo = append(sb.undo, func() { d.DestroyStream(st) })
	}
	for _, e := range []*device.Event{&sb.e0, &sb.e1} {
		if *e, err = d.NewEvent(true); err != nil {
			return sb, err
		}
		ev := *e
		sb.undo = append(sb.undo, func() { d.DestroyEvent(ev) })
	}
	if sb.c, err = kvcache.New(d, dev, host, cfg, kvcache.Options{Stream: sb.compute, SwapOutStream: sb.out, SwapInStream: sb.in,
		HostBlocks: sb.nb, NoPrefixCache: true}); err != nil {
		return sb, fmt.Errorf("bench kv: a cache of %d blocks of %d bytes: %w", cfg.Blocks, sb.bb, err)
	}
	sb.undo = append(sb.undo, func() { sb.c.Close() })
	if sb.pattern, err = d.HostAlloc(sb.bb); err != nil {
		return sb, err
	}
	sb.undo = append(sb.undo, func() { d.HostFree(sb.pattern) })
	if sb.stage, err = d.HostAlloc(sb.total); err != nil {
		return sb, fmt.Errorf("bench kv: pinned host buffer of %d bytes: %w", sb.total, err)
	}
	sb.undo = append(sb.undo, func() { d.HostFree(sb.stage) })
	B := o.BlockTokens
	for i := 0; i < sb.nb; i++ {
		for _, id := range []kvcache.SeqID{1, 2} {
			var err error
			if i == 0 {
				_, err = sb.c.Add(id, make([]int32, B), 0)
			} else {
				err = sb.c.Append(id, make([]int32, B)...)
			}
			if err != nil {
				return sb, err
			}
		}
	}
	return sb, nil
}

func (sb *swapBench) close() {
	for i := len(sb.undo) - 1; i >= 0; i-- {
		sb.undo[i]()
	}
	sb.undo = nil
}

// timed runs f between two timing events on s and returns the swap's bytes
// over the device time between them, GB/s.
func (sb *swapBench) timed(s device.Stream, f func() error) (float64, error) {
	d := sb.d
	if err := d.EventRecord(sb.e0, s); err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	if err := d.EventRecord(sb.e1, s); err != nil {
		return 0, err
	}
	if err := d.EventSynchronize(sb.e1); err != nil {
		return 0, err
	}
	el, err := d.EventElapsed(sb.e0, sb.e1)
	if err != nil {
		return 0, err
	}
	return float64(sb.total) / el.Seconds() / 1e9, nil
}

// blockPattern fills b with block j's bytes for seed.
func blockPattern(b []byte, seed uint64, j int) {
	rng := rand.New(rand.NewPCG(seed, uint64(j)))
	for i := 0; i < len(b); i += 8 {
		v := rng.Uint64()
		for k := 0; k < 8 && i+k < len(b); k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
}

// fill writes seed's pattern into every block of sequence 1.
func (sb *swapBench) fill(ctx context.Context, seed uint64) error {
	for j, b := range sb.c.Table(1) {
		if err := ctx.Err(); err != nil {
			return err
		}
		blockPattern(sb.pattern.Bytes, seed, j)
		if err := sb.d.CopyHtoD(sb.c.BlockPtr(b), sb.pattern.Bytes, sb.compute); err != nil {
			return err
		}
		if err := sb.d.StreamSynchronize(sb.compute); err != nil {
			return err
		}
	}
	return nil
}

// verify reads every block of sequence 1 back and compares it with seed's
// pattern.
func (sb *swapBench) verify(ctx context.Context, seed uint64, what string) error {
	want, back := make([]byte, sb.bb), make([]byte, sb.bb)
	for j, b := range sb.c.Table(1) {
		if err := ctx.Err(); err != nil {
			return err
		}
		blockPattern(want, seed, j)
		if err := sb.d.CopyDtoH(back, sb.c.BlockPtr(b), sb.compute); err != nil {
			return err
		}
		if err := sb.d.StreamSynchronize(sb.compute); err != nil {
			return err
		}
		if !bytes.Equal(back, want) {
			return fmt.Errorf("bench kv: %s: block %d of the sequence differs after a swap round trip", what, j)
		}
	}
	return nil
}

// cacheLayout swaps sequence 1 out and in through the cache, one copy per
// block, overwriting the released blocks in between.
func (sb *swapBench) cacheLayout(ctx context.Context) (KVSwapResult, error) {
	r := KVSwapResult{Layout: "all-layers-per-block", BlockBytes: sb.bb, CopyBytes: sb.bb, Copies: sb.nb, Bytes: sb.total, Verified: true}
	var outs, ins []float64
	for rep := 0; rep < sb.o.Reps; rep++ {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		seed := uint64(rep + 1)
		if err := sb.fill(ctx, seed); err != nil {
			return r, err
		}
		g, err := sb.timed(sb.out, func() error { _, err := sb.c.SwapOut(1); return err })
		if err != nil {
			return r, fmt.Errorf("bench kv: swap out: %w", err)
		}
		outs = append(outs, g)
		// The swap-in must bring the bytes back over this.
		if err := sb.d.Memset8(sb.c.Base(), 0xa5, uint64(sb.blocks)*sb.bb, sb.compute); err != nil {
			return r, err
		}
		if err := sb.d.StreamSynchronize(sb.compute); err != nil {
			return r, err
		}
		g, err = sb.timed(sb.in, func() error { _, err := sb.c.SwapIn(1); return err })
		if err != nil {
			return r, fmt.Errorf("bench kv: swap in: %w", err)
		}
		ins = append(ins, g)
		if err := sb.verify(ctx, seed, r.Layout); err != nil {
			return r, err
		}
	}
	r.OutGBps, r.InGBps = median(outs), median(ins)
	return r, nil
}

// perLayer moves the same bytes as 2·Layers pieces per block, each its own
// copy, as per-layer cache tensors would.
func (sb *swapBench) perLayer(ctx context.Context) (KVSwapResult, error) {
	pieces := uint64(2 * sb.o.Layers)
	piece := sb.bb / pieces
	r := KVSwapResult{Layout: "per-layer", BlockBytes: sb.bb, CopyBytes: piece, Copies: sb.nb * int(pieces), Bytes: sb.total, Verified: true}
	tab := append([]int32(nil), sb.c.Table(1)...)
	copies := func(toHost bool) error {
		for j, b := range tab {
			for p := range pieces {
				h := sb.stage.Bytes[uint64(j)*sb.bb+p*piece:][:piece]
				dp := sb.c.BlockPtr(b).Add(p * piece)
				var err error
				if toHost {
					err = sb.d.CopyDtoH(h, dp, sb.out)
				} else {
					err = sb.d.CopyHtoD(dp, h, sb.in)
				}
				if err != nil {
					return err
				}
			}
		}
		return nil
	}
	var outs, ins []float64
	for rep := 0; rep < sb.o.Reps; rep++ {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		seed := uint64(100 + rep)
		if err := sb.fill(ctx, seed); err != nil {
			return r, err
		}
		g, err := sb.timed(sb.out, func() error { return copies(true) })
		if err != nil {
			return r, err
		}
		outs = append(outs, g)
		if err := sb.d.Memset8(sb.c.Base(), 0x5a, uint64(sb.blocks)*sb.bb, sb.in); err != nil {
			return r, err
		}
		if err := sb.d.StreamSynchronize(sb.in); err != nil {
			return r, err
		}
		g, err = sb.timed(sb.in, func() error { return copies(false) })
		if err != nil {
			return r, err
		}
		ins = append(ins, g)
		if err := sb.verify(ctx, seed, r.Layout); err != nil {
			return r, err
		}
	}
	r.OutGBps, r.InGBps = median(outs), median(ins)
	return r, nil
}

// link times one pinned copy of the swap's size each way.
func (sb *swapBench) link() (d2hGBps, h2dGBps float64, err error) {
	var d2h, h2d []float64
	base := sb.c.Base()
	for r := 0; r < sb.o.Reps; r++ {
		g, err := sb.timed(sb.out, func() error { return sb.d.CopyDtoH(sb.stage.Bytes, base, sb.out) })
		if err != nil {
			return 0, 0, err
		}
		d2h = append(d2h, g)
		g, err = sb.timed(sb.in, func() error { return sb.d.CopyHtoD(base, sb.stage.Bytes, sb.in) })
		if err != nil {
			return 0, 0, err
		}
		h2d = append(h2d, g)
	}
	return median(d2h), median(h2d), nil
}

// bestOf keeps the cheapest round of an operation: rounds of at least
// round operations, the lowest ns per operation among them (the usual
// best-of-N that filters out the host's other load).
type bestOf struct {
	round int
	t     time.Duration
	n     int
	best  float64
}

func (b *bestOf) add(t time.Duration, n int) {
	b.t += t
	b.n += n
	if b.n >= b.round {
		if v := float64(b.t.Nanoseconds()) / float64(b.n); b.best == 0 || v < b.best {
			b.best = v
		}
		b.t, b.n = 0, 0
	}
}

func (b *bestOf) ns() float64 {
	if b.best == 0 && b.n > 0 {
		return float64(b.t.Nanoseconds()) / float64(b.n)
	}
	return b.best
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
