package kvcache

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
)

// Config is the shape of a device KV cache.
type Config struct {
	Layers, KVHeads, HeadDim int
	ElemBytes                int // 2 (bf16/f16) or 4 (f32)
	BlockTokens              int // default 16
	Blocks                   int // number of device blocks
}

// BlockBytes is Layers·2·BlockTokens·KVHeads·HeadDim·ElemBytes: one block's
// K and V for every layer (BlockTokens must be filled in).
func (c Config) BlockBytes() uint64 {
	return uint64(c.Layers) * 2 * uint64(c.BlockTokens) * uint64(c.KVHeads) * uint64(c.HeadDim) * uint64(c.ElemBytes)
}

// Offset is the byte offset from Base of the K (kv 0) or V (kv 1) vector of
// one head at one slot of one layer of a block:
//
//	block·BlockBytes + ((layer·2 + kv)·BlockTokens + slot)·KVHeads·HeadDim·ElemBytes + head·HeadDim·ElemBytes
//
// the layout docs/DESIGN.md fixes and the engine's kernels read. A block is
// contiguous, every layer's K and V inside it, so that it moves to and from
// the host in one copy.
func (c Config) Offset(block int32, layer, kv, slot, head int) uint64 {
	row := uint64(c.KVHeads) * uint64(c.HeadDim) * uint64(c.ElemBytes)
	return uint64(block)*c.BlockBytes() + (uint64(layer*2+kv)*uint64(c.BlockTokens)+uint64(slot))*row +
		uint64(head)*uint64(c.HeadDim)*uint64(c.ElemBytes)
}

func (c Config) validate() (Config, error) {
	if c.BlockTokens == 0 {
		c.BlockTokens = 16
	}
	for _, f := range []struct {
		name   string
		v, max int
	}{{"layers", c.Layers, 1 << 12}, {"kv heads", c.KVHeads, 1 << 12}, {"head dim", c.HeadDim, 1 << 14},
		{"block tokens", c.BlockTokens, 1 << 16}, {"blocks", c.Blocks, 1 << 30}} {
		if f.v < 1 || f.v > f.max {
			return c, fmt.Errorf("%w: %s = %d, want 1..%d", ErrInvalid, f.name, f.v, f.max)
		}
	}
	if c.ElemBytes != 2 && c.ElemBytes != 4 {
		return c, fmt.Errorf("%w: element of %d bytes, want 2 or 4", ErrInvalid, c.ElemBytes)
	}
	return c, nil
}

// Options configure a Cache. The zero value is usable.
type Options struct {
	// Stream is the engine's compute stream, the one whose work reads and
	// writes the cache. Copy-on-write copies are queued on it (so work
	// submitted after Append sees them), and it waits for every swap's
	// copies before running later work. 0: the cache makes its own stream
	// and Append waits for its copies before returning.
	Stream device.Stream
	// SwapOutStream and SwapInStream carry the swap copies (0: the cache
	// makes them).
	SwapOutStream, SwapInStream device.Stream
	// HostBlocks is the number of blocks of pinned host memory (from the
	// host pool) swapped sequences may occupy; 0 turns swap off.
	HostBlocks int
	// Window, NoPrefixCache and OnEvent are as in ManagerConfig.
	Window        int
	NoPrefixCache bool
	OnEvent       func(Event)
	// Logger receives debug logs of swaps; nil is silent.
	Logger *slog.Logger
}

// Cache is a paged KV cache in device memory: one pool block (purpose kv)
// cut into Config.Blocks blocks, managed by a Manager. Block b lives at
// Base() + b·BlockBytes(). Its methods may be called from one goroutine at
// a time; Stats (a metrics scrape) from any.
type Cache struct {
	mu        sync.Mutex // for Stats from a metrics scrape
	m         *Manager
	d         device.Device
	cfg       Config
	bb        uint64
	devPool   *pool.Pool
	hostPool  *pool.Pool
	mem, host pool.Block
	stream    device.Stream
	out, in   device.Stream
	owned     []device.Stream
	evCompute device.Event
	evOut     device.Event
	evIn      device.Event
	ownStream bool
	log       *slog.Logger
	closed    bool
	swapBytes [2]uint64 // out, in
}

// New allocates the cache's device memory from dev (one block, purpose
// pool.KV) and, when o.HostBlocks > 0, its swap space from the pinned host
// pool host. Errors leave nothing allocated.
func New(d device.Device, dev *pool.Pool, host *pool.Pool, cfg Config, o Options) (c *Cache, err error) {
	cfg, err = cfg.validate()
	if err != nil {
		return nil, err
	}
	if o.HostBlocks > 0 && host == nil {
		return nil, fmt.Errorf("%w: %d host blocks but no host pool", ErrInvalid, o.HostBlocks)
	}
	m, err := NewManager(ManagerConfig{Blocks: cfg.Blocks, BlockTokens: cfg.BlockTokens, HostBlocks: o.HostBlocks,
		Window: o.Window, NoPrefixCache: o.NoPrefixCache, OnEvent: o.OnEvent})
	if err != nil {
		return nil, err
	}
	c = &Cache{m: m, d: d, cfg: cfg, bb: cfg.BlockBytes(), devPool: dev, hostPool: host, log: o.Logger}
	built := c
	defer func() {
		if err != nil {
			built.Close()
		}
	}()
	size := c.bb * uint64(cfg.Blocks)
	if c.mem, err = dev.Alloc(size, pool.AllocOptions{Purpose: pool.KV}); err != nil {
		return nil, fmt.Errorf("kvcache: %d blocks of %d bytes: %w", cfg.Blocks, c.bb, err)
	}
	if o.HostBlocks > 0 {
		if c.host, err = host.Alloc(c.bb*uint64(o.HostBlocks), pool.AllocOptions{Purpose: pool.KV}); err != nil {
			return nil, fmt.Errorf("kvcache: %d host blocks of %d bytes: %w", o.HostBlocks, c.bb, err)
		}
	}
	stream := func(s device.Stream) (device.Stream, error) {
		if s != 0 {
			return s, nil
		}
		s, err := d.NewStream()
		if err == nil {
			c.owned = append(c.owned, s)
		}
		return s, err
	}
	c.ownStream = o.Stream == 0
	if c.stream, err = stream(o.Stream); err != nil {
		return nil, err
	}
	if c.out, err = stream(o.SwapOutStream); err != nil {
		return nil, err
	}
	if c.in, err = stream(o.SwapInStream); err != nil {
		return nil, err
	}
	for _, e := range []*device.Event{&c.evCompute, &c.evOut, &c.evIn} {
		if *e, err = d.NewEvent(false); err != nil {
			return nil, err
		}
	}
	m.SetCopy(c.copyBlock)
	return c, nil
}

// Base returns the device address of block 0.
func (c *Cache) Base() device.Ptr { return c.mem.Ptr }

// BlockBytes returns the bytes of one block.
func (c *Cache) BlockBytes() uint64 { return c.bb }

// Config returns the cache's shape with defaults filled in.
func (c *Cache) Config() Config { return c.cfg }

// BlockPtr returns block b's device address.
func (c *Cache) BlockPtr(b int32) device.Ptr { return c.mem.Ptr.Add(uint64(b) * c.bb) }

// HostBlock returns host block h's bytes (nil without swap space).
func (c *Cache) HostBlock(h int32) []byte {
	hb := c.host.Bytes()
	if hb == nil {
		return nil
	}
	return hb[uint64(h)*c.bb : uint64(h+1)*c.bb]
}

// Stream returns the compute stream the cache orders its copies against.
func (c *Cache) Stream() device.Stream { return c.stream }

func (c *Cache) copyBlock(src, dst int32) error {
	if err := c.d.CopyDtoD(c.BlockPtr(dst), c.BlockPtr(src), c.bb, c.stream); err != nil {
		return err
	}
	if c.ownStream {
		return c.d.StreamSynchronize(c.stream)
	}
	return nil
}

// Manager returns the block manager (for its Stats, Check and the *Needs
// queries a scheduler asks before acting). Calls on it bypass the cache's
// lock: make them from the goroutine that drives the cache, and change
// sequences only through the cache (its swaps and copies move the bytes).
func (c *Cache) Manager() *Manager { return c.m }

// Add creates sequence id with blocks for prompt, sharing its longest cached
// prefix, as Manager.Add: it returns how many leading tokens already have
// their K/V in the cache (the engine writes the prompt's K/V from position
// cachedTokens on). ErrOutOfBlocks leaves everything unchanged.
func (c *Cache) Add(id SeqID, prompt []int32, extraKey uint64) (cachedTokens int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Add(id, prompt, extraKey)
}

// Append makes room for tokens after id's last one, as Manager.Append: call
// it before writing their K/V, then read Table again. A copy-on-write copy
// of a shared partial block is queued on the compute stream
// (Options.Stream) before Append returns, so work submitted to that stream
// afterwards sees the private copy; with no Options.Stream, Append has
// waited for the copy. ErrOutOfBlocks leaves everything unchanged.
func (c *Cache) Append(id SeqID, tokens ...int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Append(id, tokens...)
}

// Computed says that the K/V of id's first n positions is written, so that
// its full blocks may serve prefix hits (Append says as much for every
// position before its tokens), as Manager.Computed.
func (c *Cache) Computed(id SeqID, n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Computed(id, n)
}

// Table returns id's block table (nil when unknown or swapped out): position
// p lives in block Table[p/BlockTokens] at slot p%BlockTokens, at
// Base + block·BlockBytes + Config.Offset's terms. The slice is the cache's:
// read (or upload) it before the next call that changes id.
func (c *Cache) Table(id SeqID) []int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Table(id)
}

// Len returns the tokens id holds (0 when unknown).
func (c *Cache) Len(id SeqID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Len(id)
}

// Fork makes child share parent's blocks (copy-on-write), as Manager.Fork.
func (c *Cache) Fork(parent, child SeqID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Fork(parent, child)
}

// Free drops id, tail first, as Manager.Free. Its blocks may be reused by
// the next Add or Append: the engine must have submitted (on the compute
// stream) all work reading them before it frees.
func (c *Cache) Free(id SeqID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.Free(id)
}

// SwapOut copies id's private blocks to pinned host memory on the swap-out
// stream, after the compute stream's work so far, and releases them; the
// compute stream then waits for the copies, so later work (which may reuse
// the released blocks) runs after them. It returns the event recorded after
// the copies (valid until the next SwapOut). Without swap space it fails
// with ErrOutOfHostBlocks; a device error leaves the sequence swapped out
// with its copies in doubt (free it).
func (c *Cache) SwapOut(id SeqID) (device.Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	moves, err := c.m.SwapOut(id)
	if err != nil {
		return 0, err
	}
	if err := c.swap(moves, true); err != nil {
		return 0, fmt.Errorf("kvcache: swap out sequence %d: %w", id, err)
	}
	return c.evOut, nil
}

// SwapIn takes device blocks for a swapped-out sequence and copies its host
// blocks into them on the swap-in stream, after the compute stream's work so
// far; the compute stream waits for the copies before later work, so the
// sequence may run in the next step submitted to it. It returns the event
// recorded after the copies (valid until the next SwapIn).
func (c *Cache) SwapIn(id SeqID) (device.Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	moves, err := c.m.SwapIn(id)
	if err != nil {
		return 0, err
	}
	if err := c.swap(moves, false); err != nil {
		return 0, fmt.Errorf("kvcache: swap in sequence %d: %w", id, err)
	}
	return c.evIn, nil
}

// swap runs the copies of one swap: adjacent device blocks going to
// adjacent host blocks are one copy.
func (c *Cache) swap(moves []Move, out bool) error {
	d := c.d
	s, ev := c.in, c.evIn
	if out {
		s, ev = c.out, c.evOut
	}
	if err := d.EventRecord(c.evCompute, c.stream); err != nil {
		return err
	}
	if err := d.StreamWaitEvent(s, c.evCompute); err != nil {
		return err
	}
	if out {
		// Host blocks a swap-in released may still be being read.
		if err := d.StreamWaitEvent(s, c.evIn); err != nil {
			return err
		}
	}
	hb := c.host.Bytes()
	for i := 0; i < len(moves); {
		j := i + 1
		for j < len(moves) && moves[j].Block == moves[j-1].Block+1 && moves[j].Host == moves[j-1].Host+1 {
			j++
		}
		n := uint64(j-i) * c.bb
		h := hb[uint64(moves[i].Host)*c.bb:][:n]
		var err error
		if out {
			err = d.CopyDtoH(h, c.BlockPtr(moves[i].Block), s)
			c.swapBytes[0] += n
		} else {
			err = d.CopyHtoD(c.BlockPtr(moves[i].Block), h, s)
			c.swapBytes[1] += n
		}
		if err != nil {
			return err
		}
		i = j
	}
	if err := d.EventRecord(ev, s); err != nil {
		return err
	}
	if c.log != nil {
		c.log.Debug("kvcache swap", "out", out, "blocks", len(moves))
	}
	return d.StreamWaitEvent(c.stream, ev)
}

// SwappedBytes returns the bytes copied to the host and back so far.
func (c *Cache) SwappedBytes() (out, in uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.swapBytes[0], c.swapBytes[1]
}

// CacheStats is a snapshot of a Cache: its shape, what its sequences hold
// and its counters since New. Blocks are BlockBytes each. A metrics exporter
// (telemetry.RegisterKV) reads it; the cache knows nothing of metrics.
type CacheStats struct {
	BlockBytes       uint64 `json:"block_bytes"`
	Blocks           int    `json:"blocks"`
	UsedBlocks       int    `json:"used_blocks"`
	CachedFreeBlocks int    `json:"cached_free_blocks"`
	HostBlocks       int    `json:"host_blocks"`
	HostUsedBlocks   int    `json:"host_used_blocks"`
	Sequences        int    `json:"sequences"`
	// PrefixQueries and PrefixHits count full prompt blocks looked up in
	// the prefix cache and found there.
	PrefixQueries uint64 `json:"prefix_queries"`
	PrefixHits    uint64 `json:"prefix_hits"`
	Evictions     uint64 `json:"evictions"`
	CopyOnWrites  uint64 `json:"copy_on_writes"`
	SwapOutBytes  uint64 `json:"swap_out_bytes"`
	SwapInBytes   uint64 `json:"swap_in_bytes"`
}

// Usage is the fraction of blocks held by sequences (0 for no blocks).
func (s CacheStats) Usage() float64 {
	if s.Blocks == 0 {
		return 0
	}
	return float64(s.UsedBlocks) / float64(s.Blocks)
}

// Stats returns a snapshot of the cache. It is safe to call from any
// goroutine while the cache is in use (a metrics scrape), and after Close.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.m.Stats()
	return CacheStats{
		BlockBytes: c.bb, Blocks: s.Blocks, UsedBlocks: s.UsedBlocks, CachedFreeBlocks: s.CachedFree,
		HostBlocks: s.HostBlocks, HostUsedBlocks: s.HostUsed, Sequences: s.Seqs,
		PrefixQueries: s.PrefixQueries, PrefixHits: s.PrefixHits, Evictions: s.Evictions,
		CopyOnWrites: s.CopyOnWrites, SwapOutBytes: c.swapBytes[0], SwapInBytes: c.swapBytes[1],
	}
}

// Close waits for the cache's copies, frees its device and host memory,
// streams and events: the pools' stats go back
// to what they were before New. Sequences still held are dropped. Calling
// Close again does nothing.
func (c *Cache) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, s := range []device.Stream{c.stream, c.out, c.in} {
		if s != 0 {
			errs = append(errs, c.d.StreamSynchronize(s))
		}
	}
	for _, e := range []device.Event{c.evCompute, c.evOut, c.evIn} {
		if e != 0 {
			errs = append(errs, c.d.DestroyEvent(e))
		}
	}
	for _, s := range c.owned {
		errs = append(errs, c.d.DestroyStream(s))
	}
	if c.mem.Size > 0 {
		errs = append(errs, c.devPool.Free(c.mem))
	}
	if c.host.Size > 0 {
		errs = append(errs, c.hostPool.Free(c.host))
	}
	c.mem, c.host = pool.Block{}, pool.Block{}
	return errors.Join(errs...)
}
