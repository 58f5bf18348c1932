// Package pool sub-allocates device memory (or pinned host memory) from
// large arenas so that a request costs nanoseconds instead of a driver call,
// without fragmenting.
//
// A Pool obtains memory from its device in one of two ways (Growth):
//
//   - GrowVirtual: one range of device address space is reserved once and
//     physical pages are mapped into it on demand and unmapped when free
//     (the way PyTorch's expandable segments beat fragmentation): free space
//     never strands between separate segments.
//   - GrowChunks: separate device allocations ("chunks"), each managed by its
//     own offset allocator; large requests get a chunk of their own.
//
// Offsets inside the arenas come from package alloc (Options.Strategy),
// under the pool's lock; processors that find it taken by each other move
// to shards, sets of arenas under locks of their own (Options.Shards), so
// that concurrent goroutines do not queue on one lock. In front of it, each processor has a cache that
// its goroutines reach without any lock (pinned to the processor, as
// sync.Pool does): small blocks (≤ Options.CacheMax) rounded to size
// classes, and the last large blocks freed there, which serve a request of
// the same size. A pair of free and alloc through a cache costs one atomic
// instruction. Other large blocks freed on a processor wait in its cache
// for its next trip to the arenas, which gives them back before placing
// anything: one lock per free+alloc pair. Blocks are whole multiples of
// Options.Alignment. Page maps happen outside the lock. Blocks freed with FreeAsync are
// stream-ordered: reusable at once on the freeing stream and on other
// streams only after an event recorded on the freeing stream has completed.
// Every failure is a value: an
// *OOMError explains the numbers and carries a Snapshot of the pool's
// memory (trace.WriteSnapshot writes it for memwall replay --html), handle
// misuse returns ErrInvalidHandle and leaves the pool unchanged. Stats
// reads counters without stopping any goroutine; package telemetry
// exports them (telemetry.RegisterPool): the pool imports no metrics
// package.
//
// A Pool is safe for concurrent use.
//
// # Layers
//
// A Pool is the bottom of a stack of Resources (Alloc, Free, FreeAsync),
// the way RMM composes memory resources. Under it is its device memory,
// the device itself or any Upstream (Options.Upstream; Chunks makes a
// pool's chunks another pool's blocks). Over it, each layer takes any
// Resource: a Tenant holds its blocks to a quota and frees only its own
// (Pool.Tenant makes one listed in the pool's Stats; NewTenant over any
// Resource), a Counter counts what passes (in a Stats that
// telemetry.RegisterPool takes), and WithEvents reports what passes (as
// package trace's EventLog.Wrap does to write the log memwall replay
// reads):
//
//	p, _ := pool.New(d, pool.DefaultOptions(d))
//	model, _ := p.Tenant("llama", 20<<30)
//	r := pool.NewCounter(log.Wrap(model), "llama")
//	b, _ := r.Alloc(64<<20, pool.AllocOptions{Purpose: pool.KV})
//	_ = r.Free(b)
//
// The per-processor caches and the arenas they stand on are one layer,
// the Pool itself, as RMM's arena resource keeps its per-thread arenas
// inside one resource: a trip from a cache to the arenas gives back the
// blocks the cache held and places the new one under one lock, and an
// arena out of memory empties every processor's cache before it fails,
// which a layer below a cache could not reach.
//
// # The default configuration, and why
//
// DefaultOptions picks GrowVirtual with address-ordered best fit, small
// blocks (≤ SmallMax, 256 KiB) in a virtual range of their own (those up
// to CacheMax, 16 KiB, rounded to size classes and cached per processor),
// 2 MiB pages, TargetRatio 1.02 and Placement PlaceMapped:
//
//   - a block whose best-fit place would need pages mapped goes instead
//     to the free range that needs the fewest (none where a free range
//     over mapped pages holds it);
//   - each run of unmapped pages under a block is mapped as one physical
//     handle (one create and one map), which goes back to the device only
//     whole; under the target a handle stays within half the target's
//     slack (a single page below about 200 MiB of use), with pages kept
//     (TargetRatio NoTarget) it covers the whole run, up to a sixteenth of the
//     limit;
//   - while the pool holds 1.02 × its peak used bytes, the pages a block
//     needs come from free handles elsewhere, in either range (moved: one
//     unmap and one map each, or released to pay for a new one) instead
//     of new memory;
//   - except while the pool is hot (it places more than 50,000 blocks a
//     second in its arenas, where a page move would cost more than the
//     allocations around it): then free pages beyond the target stay
//     mapped for reuse (an allocation placed on them makes no driver
//     call), new pages are mapped instead of moved, and the pool's
//     reclaimer, a goroutine started then and stopped by Close, gives
//     back every HoldTime (100 ms) the pages no block has lain on for a
//     whole pass, off the allocating goroutine, and at once under the
//     limit's pressure, a device out of memory or low on free memory
//     (reclaim.go).
//
// The replays below place blocks at the pace they were recorded at
// (thousands a second), where the pool is never hot: their tables are
// those of the eager pool (HoldTime -1). memwall bench alloc's random mix
// places millions a second, and there the default runs as a pool that
// keeps its pages (BENCHMARKS.md).
//
// Replaying PyTorch traces through the pool (memwall replay, trace/replay;
// docs/pool-policy.md has the reasoning and every configuration), peak
// reserved over peak live bytes, driver calls per allocation, and driver
// time per 1,000 allocations at the H200's costs:
//
//	trace              PyTorch         default                keep every page
//	GPT-2 generate     1.26×   6 µs    1.015×  0.22%    94 µs  1.048× 0.04%  18 µs
//	GPT-2 batch/req    1.16×  10 µs    1.018×  0.73%   310 µs  1.074× 0.14%  63 µs
//	T5 generate        1.30×   3 µs    1.032×  0.33%   135 µs  1.102× 0.02%  11 µs
//	BERT varlen        2.33×  14 µs    1.055×  9.62% 3,700 µs  1.292× 0.09%  41 µs
//	encoder varlen     2.46×  21 µs    1.036× 25.8%  9,893 µs  1.283× 0.22% 101 µs
//	ViT varbatch       1.79× 116 µs    1.033×  8.25% 3,451 µs  1.411× 1.00% 456 µs
//	UNet, SD widths    1.82×  19 µs    1.044×  4.61% 1,810 µs  1.342× 0.20%  92 µs
//	MoE generate       1.73×   6 µs    1.072×  0.58%   243 µs  1.184× 0.04%  20 µs
//	Llama generate     1.32×   5 µs    1.146×  0.09%    40 µs  1.124× 0.04%  18 µs
//	UNet denoise       1.64×  10 µs    1.145×  1.13%   443 µs  1.431× 0.11%  48 µs
//
// The default beats PyTorch's memory on every trace above (not on the
// held-out llama_long: 1.22× against PyTorch's 1.13×) and meets both goals
// (≤ 1.05×, ≤ 1% calls) on the two GPT-2 traces and T5. Where shapes
// change from call to call (BERT, the encoder, ViT, the UNet at two
// resolutions), memory within 1.03–1.06× costs a page move on 4.6–26% of
// the allocations (best fit's own placement: 10–74%), and calls within 1%
// cost 1.28–1.41× memory; no configuration measured meets both. On the small
// traces (Llama 92.5 MiB, UNet 48.9 MiB of peak live) 2 MiB pages leave
// 1.10–1.15× even when every free page is unmapped; the MoE reaches 1.05×
// only so.
// The default takes the memory side, since running out of memory is what
// the pool exists to prevent; a workload that prefers fewer calls sets
// TargetRatio NoTarget (keep every page: no driver call in steady state, pages
// go back under the limit's pressure, on device OOM, or on Trim).
//
// Page moves run outside the lock, but the driver serializes them: while
// one goroutine moves a page, another that needs one takes new memory
// instead of queuing behind it, so under concurrent load the pool grows
// toward what the load needs rather than stalling on the driver (one
// goroutine alone, and so every replay, keeps the target exactly).
//
// For the lowest latency on sizes that do not repeat, Strategy "tlsf" with
// TargetRatio NoTarget measured best on the H200: a median of 0.068 of
// cuMemAllocAsync's time per free+alloc pair on a random size mix (the
// default: 0.077), p99 0.72 µs where the default's is a page move of tens
// of microseconds (BENCHMARKS.md, issue 3).
package pool

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/memwall/memwall/alloc"
	"github.com/memwall/memwall/device"
)

// Device is what a pool takes of a device: its description, memory
// (chunks, pinned host buffers, what is free), virtual memory (a GrowVirtual
// pool's range and pages) and streams and events (stream-ordered frees).
// Every device.Device is one; a pool neither copies nor launches.
type Device interface {
	Info() device.Info
	device.Memory
	device.VirtualMemory
	device.Streams
}

// Purpose labels what a block holds, for per-purpose accounting.
type Purpose uint8

// Purposes.
const (
	Other Purpose = iota
	Weights
	Activations
	KV
	Staging
	Scratch
	numPurposes
)

var purposeNames = [numPurposes]string{"other", "weights", "activations", "kv", "staging", "scratch"}

func (p Purpose) String() string {
	if p < numPurposes {
		return purposeNames[p]
	}
	return fmt.Sprintf("purpose(%d)", p)
}

// Growth says how a pool obtains device memory.
type Growth uint8

// Growth policies.
const (
	GrowVirtual Growth = iota
	GrowChunks
)

func (g Growth) String() string {
	if g == GrowVirtual {
		return "virtual"
	}
	return "chunks"
}

// Options configure a pool. DefaultOptions fills zero values.
type Options struct {
	// Name labels the pool in stats and metrics.
	Name string
	// Upstream is the memory the pool's chunks come from (nil: the
	// device). A pool over an Upstream grows by chunks (Growth is
	// GrowChunks whatever it says) and its Limit defaults to the
	// upstream's total. Host pools take memory from the device only.
	Upstream Upstream
	// Strategy is the alloc strategy for arena offsets (default "bestfit":
	// address-ordered best fit keeps live data low in the arena, so fewer
	// pages stay mapped).
	Strategy string
	// Growth policy; DefaultOptions picks GrowVirtual where the device
	// supports virtual memory.
	Growth Growth
	// PageBytes is the unit mapped at a time under GrowVirtual (a multiple
	// of the device granularity; default the granularity, 2 MiB on NVIDIA).
	PageBytes uint64
	// ReserveBytes is the address space reserved under GrowVirtual
	// (default: the device's total memory, rounded up to PageBytes).
	ReserveBytes uint64
	// KeepFreeBytes caps the bytes of fully free mapped pages a
	// GrowVirtual pool keeps mapped for reuse; above it the highest free
	// pages are unmapped. 0 (the default) keeps them all: pages go back
	// only under the limit's pressure, on device OOM, or on Trim, so a
	// steady workload makes no driver calls.
	KeepFreeBytes uint64
	// TargetRatio is a soft cap on a GrowVirtual pool's reserved bytes as
	// a multiple of its peak used bytes: at least 1, DefaultTargetRatio
	// when 0, NoTarget for none (every page the pool maps stays mapped;
	// New refuses a ratio below 1): a page that must be mapped while the
	// pool holds that much takes the physical memory of the highest free
	// mapped page instead of a new allocation (one unmap and one map).
	// Reserved memory then tracks the peak of use, at the price of driver
	// calls when placement wanders onto unmapped pages; see the package
	// documentation for the measurements behind the default, and HoldTime
	// for a pool that allocates faster than the driver can move pages.
	TargetRatio float64
	// HoldTime is how long free pages beyond the soft target stay mapped
	// for reuse, while the pool is hot (it places more than 50,000 blocks
	// a second), before the pool's reclaimer gives them back off the
	// allocating goroutine (default DefaultHoldTime; a negative value
	// turns holding off: an allocation that needs pages above the target
	// always moves free ones there, on the allocating path, the behaviour
	// before hold times). A page goes back between one and two hold times
	// after a block last lay on it, and at once under pressure (the
	// limit, the device out of memory or low on free memory); see
	// Reclaim. Only a GrowVirtual pool with a TargetRatio holds pages.
	HoldTime time.Duration
	// Reclaimer says who runs the reclaimer's passes: a goroutine of the
	// pool, every HoldTime from the first time the pool is hot
	// (ReclaimBackground, the default; Close stops it), or the caller,
	// with Reclaim (ReclaimByCaller: replays run passes at trace time).
	Reclaimer ReclaimMode
	// ChunkBytes is the smallest chunk under GrowChunks (default 32 MiB);
	// requests larger than ChunkBytes/2 get a chunk of their own, rounded
	// up to 2 MiB.
	ChunkBytes uint64
	// Limit caps the bytes the pool reserves from the device (0 = the
	// device's total memory), like ONNX Runtime's gpu_mem_limit.
	Limit uint64
	// Priority, in (0, 1], is the memory priority of the chunks a
	// GrowChunks pool allocates, on a device that implements
	// PriorityAllocator (Vulkan with VK_EXT_memory_priority); 0 leaves the
	// device's default. PurposePriority maps a purpose to one: a pool of
	// weights at 1.0 stays resident before pools of activations at 0.5.
	Priority float32
	// PriorityByPurpose gives the chunks that hold one block of their own
	// (a request above ChunkBytes/2: a model's weight groups, its KV
	// cache) the priority of that block's purpose (PurposePriority:
	// weights 1.0, the rest 0.5), so that one pool holding a whole model
	// tells the driver its weights come first; shared chunks keep
	// Priority.
	PriorityByPurpose bool
	// Warmup is reserved at New so the first requests need no driver call.
	Warmup uint64
	// Alignment is the default block alignment (default 256; a power of two).
	Alignment uint64
	// Cache selects the caches in front of the arenas: CachePerProcessor
	// (the default), CacheShared (one cache under a lock, so placement
	// depends only on the order of calls: replays reproduce exactly;
	// slower when goroutines allocate concurrently) or CacheOff (every
	// request goes to the arenas).
	Cache CacheMode
	// Shards is how many sets of arenas, each under a lock of its own,
	// the central path of a device pool with per-processor caches spreads
	// over (default 0: one per processor at New; 1: a single set). Every
	// processor allocates from the first set until it has found that
	// set's lock taken by another goroutine a few times; from then on it
	// allocates from a set of its own, made then. One goroutine alone
	// therefore never leaves the first set, and a pool that is not
	// allocated from concurrently behaves as with one set. A block freed
	// where its set's lock is held by another goroutine waits in that
	// set's queue for the set's next allocation; an allocation that fails
	// in one set drains every queue and tries every set before it fails.
	// Limit and TargetRatio count the memory of all sets together.
	// Processor i allocates from set i mod Shards, so sets beyond
	// GOMAXPROCS are made only by processors added later; at most
	// 256 count (maxShards). Each set reserves its
	// own address space, and its page table costs about 24 bytes of host
	// memory per page of the reservation (2 MB for 141 GB of 2 MiB pages).
	Shards int
	// CacheMax is the largest block served from the caches' small-block
	// classes (default 16 KiB, at most 1 MiB, the largest size class).
	// Blocks up to it are rounded to a size class.
	CacheMax uint64
	// SmallMax is the largest block a GrowVirtual pool places in a
	// separate virtual range for small blocks (default 256 KiB), so that
	// small and cached blocks pin no pages between large ones; Off places
	// small blocks among the large ones.
	SmallMax uint64
	// Placement is how a GrowVirtual pool over "bestfit" or "tlsf" places
	// a block whose strategy's choice lies on pages not mapped (default
	// PlaceMapped: a free range over mapped pages, when one holds it).
	Placement Placement
	// Logger receives debug logs of growth and trims; nil is silent.
	Logger *slog.Logger
	// OnEvent, when set, is called (under the pool's lock) for every
	// allocation and free, e.g. to record a replayable event log.
	OnEvent func(Event)
	// History keeps the last History allocations and frees for the
	// snapshot an OOMError carries (0 = none). Like OnEvent, it sends
	// every allocation and free through the pool's lock.
	History int
}

// CacheMode selects Options.Cache.
type CacheMode uint8

// Cache modes.
const (
	CachePerProcessor CacheMode = iota
	CacheShared
	CacheOff
)

func (c CacheMode) String() string {
	switch c {
	case CachePerProcessor:
		return "per-processor"
	case CacheShared:
		return "shared"
	case CacheOff:
		return "off"
	}
	return fmt.Sprintf("cache(%d)", uint8(c))
}

// Placement selects Options.Placement.
type Placement uint8

// Placements.
const (
	// PlaceMapped (the default): when the strategy's choice for a block
	// would need pages mapped, the block goes to the free range that
	// needs the fewest (none, where a free range over mapped pages holds
	// it), the strategy's choice among equals. The search walks the
	// arena's free ranges, and runs only where the pool would otherwise
	// call the driver.
	PlaceMapped Placement = iota
	// PlaceStrategy keeps the strategy's choice, mapping what it needs.
	PlaceStrategy
)

func (pl Placement) String() string {
	if pl == PlaceStrategy {
		return "strategy"
	}
	return "mapped"
}

// Off, as Options.SmallMax, turns the separate range of small blocks off.
const Off = ^uint64(0)

// DefaultTargetRatio is the default Options.TargetRatio.
const DefaultTargetRatio = 1.02

// NoTarget, as Options.TargetRatio, sets no soft target: a GrowVirtual
// pool keeps every page it has mapped until its limit, the device's
// memory or KeepFreeBytes asks for pages back (or Trim), so a steady
// workload makes no driver calls once warm; the latency end of the
// trade-off the package documentation measures. It is the largest ratio
// there is: no pool reserves more than NoTarget × its peak use.
const NoTarget = math.MaxFloat64

// hasTarget reports whether o sets a soft target (after withDefaults).
func (o *Options) hasTarget() bool { return o.TargetRatio < NoTarget }

// Event is an allocation or free, as reported to Options.OnEvent.
type Event struct {
	Time    time.Time
	Free    bool
	Ptr     device.Ptr
	Size    uint64
	Stream  device.Stream
	Purpose Purpose
	Tenant  string
}

// defaultName is the name a pool gets when Options.Name is empty.
const defaultName = "pool"

// poolLabel is how messages name a pool: "pool NAME", or "pool" alone for
// a pool with the default name (not "pool pool").
func poolLabel(name string) string {
	if name == "" || name == defaultName {
		return "pool"
	}
	return "pool " + name
}

// DefaultOptions returns options suited to d, with PriorityByPurpose (it
// acts on a device with memory priorities, Vulkan's, where pools grow in
// chunks).
func DefaultOptions(d Device) Options {
	return Options{PriorityByPurpose: true}.withDefaults(d.Info())
}

func (o Options) withDefaults(in device.Info) Options {
	if o.Name == "" {
		o.Name = defaultName
	}
	if o.Strategy == "" {
		o.Strategy = "bestfit"
	}
	if o.Growth == GrowVirtual && !in.VirtualMemory {
		o.Growth = GrowChunks
	}
	if o.PageBytes == 0 {
		o.PageBytes = in.Granularity
		if o.PageBytes == 0 {
			o.PageBytes = 2 << 20
		}
	}
	if in.Granularity > 0 && o.PageBytes%in.Granularity != 0 {
		o.PageBytes = roundUp(o.PageBytes, in.Granularity)
	}
	if o.ReserveBytes == 0 {
		o.ReserveBytes = in.TotalBytes
		if o.Limit != 0 && o.Limit < o.ReserveBytes {
			o.ReserveBytes = o.Limit
		}
	}
	o.ReserveBytes = roundUp(o.ReserveBytes, o.PageBytes)
	if o.ChunkBytes == 0 {
		o.ChunkBytes = 32 << 20
	}
	if o.Alignment == 0 {
		o.Alignment = 256
	}
	if o.CacheMax == 0 {
		o.CacheMax = 16 << 10
	}
	o.CacheMax = min(o.CacheMax, maxClassBytes)
	if o.TargetRatio == 0 {
		o.TargetRatio = DefaultTargetRatio
	}
	if o.HoldTime == 0 {
		o.HoldTime = DefaultHoldTime
	}
	if o.SmallMax == 0 {
		o.SmallMax = 256 << 10
	}
	if o.Growth != GrowVirtual {
		o.SmallMax = Off
	}
	return o
}

// AllocOptions qualify one allocation.
type AllocOptions struct {
	// Align overrides the pool's alignment (a power of two).
	Align uint64
	// Purpose is recorded for accounting.
	Purpose Purpose
	// Stream, when non-zero, is the stream that will use the block: blocks
	// freed on that same stream with FreeAsync may be reused at once.
	Stream device.Stream
	// tenant is the tenant the block is for, set by Tenant.Alloc: the
	// label of the pool's events and snapshots.
	tenant *Tenant
}

// Block is a live allocation. Ptr is its device address (for a host pool,
// the device-mapped address, or 0 when the device cannot map host memory)
// and Size its usable size (≥ requested); a host pool's block also has its
// bytes (Bytes). A Block is a handle: copies refer to the same allocation.
type Block struct {
	Ptr  device.Ptr
	Size uint64
	m    *meta
	// gen is the generation the block was handed out at; a tenant
	// passing a free down sets passed in it (see Tenant.Free). Four
	// words: a larger Block is no longer kept in registers, which cost
	// the fast path a third of its time.
	gen uint64
}

// passed, set in a handle's generation, says that the tenant that handed
// the block out passed its free down to the layers below.
const passed = 1 << 63

// Bytes returns a host pool's block as a byte slice of length Size; nil for
// a device pool's block, or once the block has been freed.
func (b Block) Bytes() []byte {
	if b.m == nil || !b.m.pool.host || b.m.state.Load() != b.gen {
		return nil
	}
	m := b.m
	lo := m.off + m.shift
	return m.arena.host[lo : m.off+m.size : m.off+m.size]
}

// Errors; match with errors.Is.
var (
	ErrOutOfMemory   = errors.New("pool out of memory")
	ErrInvalidHandle = errors.New("invalid block handle")
	ErrClosed        = errors.New("pool closed")
)

// meta is the host-side record of one block, reused across allocations.
// state is its generation: a handle carries the generation it was handed
// out at, and freeing moves the generation on (one compare-and-swap), so a
// second free, or a free through a stale copy, finds a different value.
// Allocation reads it and writes nothing.
type meta struct {
	state   atomic.Uint64
	pool    *Pool // set once: a meta serves one pool for its whole life
	arena   *arena
	off     uint64       // offset within the arena
	size    uint64       // allocator block size
	req     uint64       // requested bytes
	class   int          // size class + 1 when cacheable, else 0
	node    alloc.Handle // the allocator's handle, when it has them
	shift   uint64       // bytes from the allocator's offset to the handed-out address (alignment slack)
	purpose Purpose
	paged   bool    // placed by the search for mapped pages (preferMapped): never parked for the next request of its size
	tenant  *Tenant // the tenant it was handed out by (the outermost), nil for the pool's own
	home    *Pool   // the shard whose arenas hold the block (the pool itself without shards)
	next    *meta   // free-list / cache link
}

// assign records who asked for the block and what for.
func (m *meta) assign(req uint64, purpose Purpose, t *Tenant) {
	m.req, m.purpose, m.tenant = req, purpose, t
}

// ptr is the block's handed-out address.
func (m *meta) ptr() device.Ptr {
	if base := m.arena.base; base != 0 { // arena.ptr, with one test
		return base + device.Ptr(m.off+m.shift)
	}
	return 0
}

// Pool is a device (or pinned host) memory pool.
type Pool struct {
	// Read on every allocation and free by every processor, written only
	// by New and Close (revoked also while the caches are stopped): kept
	// apart from the fields the central path writes (below the padding),
	// so that a processor working under the lock does not take these
	// cache lines from all the others.
	dev  Device
	up   Upstream // Options.Upstream, or dev
	opts Options
	host bool
	info device.Info
	// procs are the per-processor caches (nil with CacheOff); revoked
	// sends fast paths to the central path while another goroutine has
	// the caches stopped, and for good once the pool is closed.
	procs  []procCache
	single bool // Options.Cache is CacheShared
	// cacheMax and smallMax are Options.CacheMax and SmallMax in effect:
	// 0 when the caches or the small range are off.
	cacheMax, smallMax uint64
	// plain: per-processor caches (CachePerProcessor) and no event hook,
	// so Alloc and Free may take their plain paths.
	plain   bool
	revoked atomic.Bool
	lat     []Histogram
	hist    *history // Options.History; guarded by mu
	// Pool-wide accounting, updated on the slow path, shared with the
	// pool's shards (shard.go).
	*ledger
	// root is the pool callers hold: the pool itself, or the pool a shard
	// belongs to. shards (root only; nil with one shard) are the sets of
	// arenas processors spread their central work over.
	root   *Pool
	shards *shardSet
	// direct is the main range of a virtual pool over a handle
	// allocator whose base is aligned to Options.Alignment: tryArenas
	// places large blocks there without the general loop. Nil otherwise.
	direct *arena
	// smallFit is the small-block range of a virtual pool over best fit
	// whose base is aligned to Options.Alignment: tryArenas places small
	// blocks there (placeFit) before the general loop. Nil otherwise.
	smallFit *arena
	// rec is the root's background reclaimer (nil until the pool is
	// first hot), started once (recStart) unless Close has begun
	// (recStopped); recMu (root only) serializes reclaimer passes with
	// each other, Trim and Close.
	rec        atomic.Pointer[reclaimer]
	recStart   sync.Once
	recStopped atomic.Bool
	recMu      sync.Mutex
	born       time.Time // when New made the root: the hot rule's clock

	_ [64]byte

	mu       sync.Mutex // guards everything below that is not atomic
	closed   bool
	arenas   []*arena // GrowChunks: chunks; GrowVirtual: exactly one
	metaFree *meta
	pending  map[device.Stream]*pendingList
	awaiting []awaitBatch
	tenants  map[string]*Tenant
	central  counters // slow-path accounting
	// held is the bytes of blocks taken out of this shard's arenas
	// (live, cached, parked or pending; takenNow sums every shard's);
	// cond (on mu) wakes goroutines waiting for pages in flight. The
	// bytes of pages in flight and the goroutines moving pages are
	// pool-wide: ledger.inflight and ledger.moving.
	held    uint64
	heldPub atomic.Uint64 // held, for readers without mu (takenNow)
	cond    *sync.Cond
	// remote holds this shard's blocks freed where its lock was not held.
	remote atomic.Pointer[meta]
	slowN  atomic.Uint32 // allocations that bypass the caches, for latency sampling
	// placements counts the blocks placed in this shard's arenas;
	// placedAtPass and passAt are that count and the time since the
	// root's birth at the reclaimer's last pass (see hotNow).
	placements, placedAtPass uint64
	passAt                   time.Duration

	_ [64]byte
}

// counters is per-operation accounting. The pool keeps one set for the
// central path (under Pool.mu) and one per processor cache (touched only
// while pinned), so the fast path touches only its processor's. A block may be
// counted in one set when allocated and another when freed: sizes wrap, and
// only the sum over all sets is meaningful.
type counters struct {
	requested     uint64
	allocs, frees uint64
	byPurpose     [8]uint64 // block bytes by purpose (< numPurposes); their sum is the used bytes
}

func (c *counters) add(m *meta) {
	c.requested += m.req
	c.byPurpose[m.purpose&7] += m.size
	c.allocs++
}

func (c *counters) sub(m *meta) {
	c.requested -= m.req
	c.byPurpose[m.purpose&7] -= m.size
	c.frees++
}

func (c *counters) plus(o *counters) {
	c.requested += o.requested
	c.allocs += o.allocs
	c.frees += o.frees
	for i := range c.byPurpose {
		c.byPurpose[i] += o.byPurpose[i]
	}
}

// used is the bytes of live blocks.
func (c *counters) used() uint64 {
	var n uint64
	for _, v := range c.byPurpose {
		n += v
	}
	return n
}

// latencySample is the sampling period of the latency histogram: one
// allocation in 256 per processor (and the first on each) is timed, so the
// clock (up to 70 ns a read on some hosts) costs the fast path well under
// a nanosecond on average.
const latencySample = 256

// totals sums the central and per-processor counters and the cached
// bytes. It stops no goroutine: each cache's counters are written by the
// goroutine pinned to its processor only, and read here as whole words (a
// racy read of a word observes a value some write stored, by the Go memory
// model), so a sum may be a few operations stale while others run.
// Called with p.mu held.
func (p *Pool) totals() (c counters, cached uint64) {
	c = p.central
	defer p.lockShards(&c)()
	if len(p.procs) == 0 {
		return c, 0
	}
	p.readCaches(func(pc *procCache) {
		c.plus(&pc.c)
		cached += pc.bytes + pc.largeBytes
	})
	return c, cached
}

// New creates a device memory pool on d.
func New(d Device, o Options) (*Pool, error) {
	return newPool(d, o, false)
}

// NewHost creates a pool of pinned host memory (staging buffers), built from
// the same code with chunk growth.
func NewHost(d Device, o Options) (*Pool, error) {
	o.Growth = GrowChunks
	return newPool(d, o, true)
}

func newPool(d Device, o Options, host bool) (*Pool, error) {
	in := d.Info()
	var up Upstream = d
	if o.Upstream != nil {
		if host {
			return nil, fmt.Errorf("%s: a pinned host pool takes its memory from the device, not from Options.Upstream", poolLabel(o.Name))
		}
		up = o.Upstream
		o.Growth = GrowChunks
		if _, total, err := up.MemInfo(); err == nil && total > 0 {
			in.TotalBytes = total
		}
	}
	if host {
		// Host pools are never virtual; keep the requested growth fixed.
		in.VirtualMemory = false
	}
	o = o.withDefaults(in)
	if o.TargetRatio < 1 || math.IsNaN(o.TargetRatio) {
		return nil, fmt.Errorf("%s: TargetRatio %v is below 1 (a pool reserves at least what it uses; 0 = DefaultTargetRatio %v, pool.NoTarget = keep every page)", poolLabel(o.Name), o.TargetRatio, DefaultTargetRatio)
	}
	if o.Alignment&(o.Alignment-1) != 0 {
		return nil, fmt.Errorf("%s: alignment %d is not a power of two", poolLabel(o.Name), o.Alignment)
	}
	if _, err := alloc.New(o.Strategy, 1<<20); err != nil {
		return nil, fmt.Errorf("%s: strategy %q: %w", poolLabel(o.Name), o.Strategy, err)
	}
	if o.Limit == 0 {
		o.Limit = in.TotalBytes
	}
	nproc := runtime.GOMAXPROCS(0)
	if o.Shards < 0 {
		return nil, fmt.Errorf("%s: Shards %d is negative (0 = one per processor, 1 = none)", poolLabel(o.Name), o.Shards)
	}
	if o.Shards == 0 {
		o.Shards = nproc
	}
	o.Shards = min(o.Shards, maxShards)
	if o.Cache != CachePerProcessor || host {
		o.Shards = 1 // shards serve processors that would share a lock
	}
	p := &Pool{dev: d, up: up, opts: o, host: host, info: in,
		pending: map[device.Stream]*pendingList{},
		tenants: map[string]*Tenant{},
		ledger:  &ledger{},
	}
	p.root = p
	p.ledger.limit.Store(o.Limit)
	p.born = time.Now()
	if o.History > 0 {
		p.hist = &history{buf: make([]Event, o.History)}
		user := o.OnEvent
		o.OnEvent = func(ev Event) {
			p.hist.add(ev)
			if user != nil {
				user(ev)
			}
		}
		p.opts.OnEvent = o.OnEvent
	}
	p.single = o.Cache == CacheShared
	p.plain = o.Cache == CachePerProcessor && o.OnEvent == nil
	if o.Cache != CacheOff {
		p.cacheMax = o.CacheMax
	}
	if o.SmallMax != Off {
		p.smallMax = o.SmallMax
	}
	p.cond = sync.NewCond(&p.mu)
	p.lat = make([]Histogram, nproc)
	if o.Cache != CacheOff {
		p.procs = make([]procCache, nproc)
		if p.single {
			p.procs = p.procs[:1]
		}
		for i := range p.procs {
			p.procs[i].n = latencySample - 1 // time each processor's first allocation
		}
	}
	if err := p.reserveRanges(); err != nil {
		p.Close()
		return nil, fmt.Errorf("%s: %w", poolLabel(o.Name), err)
	}
	if o.Shards > 1 {
		p.shards = newShardSet(p, o.Shards, nproc)
	}
	if o.Warmup > 0 {
		p.mu.Lock()
		err := p.warmup(o.Warmup)
		p.mu.Unlock()
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("%s: warm-up of %d bytes: %w", poolLabel(o.Name), o.Warmup, err)
		}
	}
	return p, nil
}

// reserveRanges reserves the address space of a virtual pool (or shard):
// the main range and, unless SmallMax is Off, the range of small blocks.
// Chunk pools reserve nothing ahead.
func (p *Pool) reserveRanges() error {
	o := p.opts
	if o.Growth != GrowVirtual {
		return nil
	}
	a, err := p.newVirtualArena()
	if err != nil {
		return err
	}
	p.arenas = []*arena{a}
	if a.lean && uint64(a.base)%o.Alignment == 0 {
		p.direct = a
	}
	if p.smallMax > 0 {
		small, err := p.newVirtualArenaSized(max(o.PageBytes, roundUp(o.ReserveBytes/8, o.PageBytes)))
		if err != nil {
			return fmt.Errorf("small-block range: %w", err)
		}
		p.arenas = append(p.arenas, small)
		if small.bf != nil && small.lean && uint64(small.base)%o.Alignment == 0 {
			p.smallFit = small
		}
	}
	return nil
}

// Options returns the pool's effective options.
func (p *Pool) Options() Options {
	o := p.opts
	o.Limit = p.limitBytes()
	return o
}

// limitBytes is the pool's limit now (Options.Limit, or SetLimit's).
func (p *Pool) limitBytes() uint64 { return p.ledger.limit.Load() }

// ErrLimitBelowReserved matches SetLimit's refusal of a limit below the
// bytes the pool must keep reserved (*LimitError).
var ErrLimitBelowReserved = errors.New("pool: limit below the reserved bytes")

// LimitError is SetLimit's refusal: after Trim the pool still reserves
// Reserved bytes (Used of them in live blocks), more than Limit.
type LimitError struct {
	Pool                  string
	Limit, Reserved, Used uint64
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s: limit %d bytes (%.2f MiB) is below the %d bytes (%.2f MiB) it reserves after trimming (%d in live blocks): free blocks first",
		poolLabel(e.Pool), e.Limit, float64(e.Limit)/(1<<20), e.Reserved, float64(e.Reserved)/(1<<20), e.Used)
}

// Is makes errors.Is(err, ErrLimitBelowReserved) true.
func (e *LimitError) Is(target error) bool { return target == ErrLimitBelowReserved }

// SetLimit changes the limit on the bytes the pool reserves from the
// device (Options.Limit) while it runs: a budget that shrinks or grows.
// Raising it takes effect at once. Lowering it first gives back what the
// pool holds and does not use (Trim) when the reserved bytes exceed the
// new limit; if they still do, the limit is left as it was and a
// *LimitError says by how much. Once it returns nil the pool's reserved
// bytes are at most n and stay so. Allocations racing a lowering may fail
// against either limit. n must be positive; the address space reserved
// at New (Options.ReserveBytes) does not grow, so a pool that will be
// raised is made with ReserveBytes for its largest limit.
func (p *Pool) SetLimit(n uint64) error {
	if n == 0 {
		return fmt.Errorf("%s: limit 0: give the bytes the pool may reserve", poolLabel(p.opts.Name))
	}
	r := p.root
	for {
		old := r.limitBytes()
		if n >= old {
			if r.ledger.limit.CompareAndSwap(old, n) {
				return nil
			}
			continue
		}
		// Lower first, so that nothing new maps above n, then trim what
		// was reserved before.
		if !r.ledger.limit.CompareAndSwap(old, n) {
			continue
		}
		if r.ledger.reserved.Load()+r.ledger.inflight.Load() <= n {
			return nil
		}
		r.Trim()
		if res := r.ledger.reserved.Load() + r.ledger.inflight.Load(); res > n {
			r.ledger.limit.CompareAndSwap(n, old)
			return &LimitError{Pool: p.opts.Name, Limit: n, Reserved: res, Used: r.Stats().UsedBytes}
		}
		return nil
	}
}

// AllocLatency returns a histogram of Alloc latencies, sampled (the first
// allocation on each processor and one in 256 after it are timed) so that
// reading the clock does not slow the fast path.
func (p *Pool) AllocLatency() *Histogram {
	var h Histogram
	for i := range p.lat {
		h.Merge(&p.lat[i])
	}
	return &h
}

func roundUp(x, a uint64) uint64 {
	if a == 0 {
		return x
	}
	return (x + a - 1) / a * a
}

// Alloc returns a block of at least size bytes. On failure it returns an
// *OOMError (errors.Is(err, ErrOutOfMemory)) saying why, after trying to
// release cached, pending and free memory and to grow.
func (p *Pool) Alloc(size uint64, o AllocOptions) (Block, error) {
	if o.Align != 0 || o.Stream != 0 || o.tenant != nil || !p.plain {
		return p.alloc(o.tenant, size, o)
	}
	// The common request (the pool's alignment, no stream, no tenant) of
	// a pool with per-processor caches and no event hook: alloc's steps
	// with less to carry, here rather than in a function of its own (a
	// call less on every allocation). Anything unusual (an invalid
	// request, caches stopped, an allocation timed for the latency
	// histogram) takes alloc.
	purpose := o.Purpose
	pid := procPin()
	if pid >= len(p.procs) || size == 0 || purpose >= numPurposes || p.revoked.Load() {
		procUnpin()
		return p.alloc(nil, size, AllocOptions{Purpose: purpose})
	}
	c := &p.procs[pid]
	if !c.g.enter() {
		procUnpin()
		return p.alloc(nil, size, AllocOptions{Purpose: purpose})
	}
	if (c.n+1)%latencySample == 0 {
		c.g.exit()
		procUnpin()
		return p.alloc(nil, size, AllocOptions{Purpose: purpose})
	}
	c.n++
	var m *meta
	var err error
	if size <= p.cacheMax {
		cls := classOf(size)
		if m = c.pop(cls); m != nil {
			m.assign(size, purpose, nil)
			c.c.add(m)
			c.g.exit()
			procUnpin()
			return Block{Ptr: m.ptr(), Size: m.size - m.shift, m: m, gen: m.state.Load()}, nil
		}
		batch, parked := c.batchSize(cls), c.takeDeferred()
		c.g.exit()
		procUnpin()
		m, err = p.cacheAlloc(cls, size, purpose, nil, true, batch, parked)
	} else {
		c.lastLarge = size
		if m = c.takeLarge(size, p.opts.Alignment); m != nil {
			m.assign(size, purpose, nil)
			c.c.add(m)
			c.g.exit()
			procUnpin()
			return Block{Ptr: m.ptr(), Size: m.size - m.shift, m: m, gen: m.state.Load()}, nil
		}
		var parked *meta
		if c.largeBytes > 0 {
			if c.large[0] == nil { // unparkAll with none parked, without its call
				parked = c.takeDeferred()
			} else {
				parked = c.unparkAll()
			}
		}
		c.g.exit()
		procUnpin()
		s := p.lockShardOf(pid)
		if m, err = p.largeIn(s, size, purpose, parked); err != nil {
			m, err = p.rescueLarge(s, size, purpose, err)
		}
	}
	if err != nil {
		p.ooms.Add(1)
		return Block{}, err
	}
	return Block{Ptr: m.ptr(), Size: m.size - m.shift, m: m, gen: m.state.Load()}, nil
}

func (p *Pool) alloc(t *Tenant, size uint64, o AllocOptions) (Block, error) {
	align := o.Align
	if align == 0 {
		align = p.opts.Alignment
	}
	if size == 0 || align&(align-1) != 0 || o.Purpose >= numPurposes {
		return Block{}, fmt.Errorf("%s: alloc of %d bytes with alignment %d, purpose %v: %w", poolLabel(p.opts.Name), size, align, o.Purpose, alloc.ErrInvalidArgument)
	}
	// Blocks with the pool's alignment and no stream may come from this
	// processor's cache: small ones rounded to a size class, large ones
	// parked by an earlier free.
	cached := align <= p.opts.Alignment && o.Stream == 0 && p.procs != nil
	cls := -1
	if cached && size <= p.cacheMax {
		cls = classOf(size)
	}
	timed, lat := false, 0
	// A miss on the fast path leaves what the central path needs from
	// the cache: the refill batch of a small class, or the parked large
	// blocks to give back, so that it need not pin again.
	tried, batch := false, 1
	var parked *meta
	if !cached {
		if n := p.slowN.Add(1); n%latencySample == 1 {
			timed = true
		}
		// Blocks this processor freed and held back go to the arenas
		// before this allocation is placed (see keepFree).
		if c := p.pinIf(p.procs != nil); c != nil {
			parked = c.takeDeferred()
			p.unpin(c)
		}
	} else {
		// The fast path: one pin, a pop, the counters.
		if c, pid := p.pin(); c != nil {
			if c.n++; c.n%latencySample != 0 {
				var m *meta
				if cls >= 0 {
					m = c.pop(cls)
				} else {
					c.lastLarge = size
					m = c.takeLarge(size, p.opts.Alignment)
				}
				if m != nil {
					m.assign(size, o.Purpose, t)
					c.c.add(m)
					p.unpin(c)
					if p.opts.OnEvent == nil {
						// handout, inline: the call and the copy of its
						// result were a fifth of the fast path.
						return Block{Ptr: m.ptr(), Size: m.size - m.shift, m: m, gen: m.state.Load()}, nil
					}
					return p.handout(m, size, o.Stream), nil
				}
				tried = true
				if cls >= 0 {
					batch = c.batchSize(cls)
					parked = c.takeDeferred()
				} else if c.largeBytes > 0 {
					parked = c.unparkAll()
				}
			} else {
				timed, lat = true, pid
			}
			p.unpin(c)
		}
	}
	var start time.Time
	if timed {
		start = time.Now()
	}
	var m *meta
	var err error
	switch {
	case cls >= 0:
		m, err = p.cacheAlloc(cls, size, o.Purpose, t, tried, batch, parked)
	case tried:
		// A large block the cache did not hold: parked is what this
		// processor's cache gave up to go back first.
		m, err = p.slowAlloc(size, align, 0, o.Purpose, t, parked)
	case cached:
		m, err = p.largeAlloc(size, align, o.Purpose, t)
	default:
		m, err = p.slowAlloc(size, align, o.Stream, o.Purpose, t, parked)
	}
	if err != nil {
		p.ooms.Add(1)
		return Block{}, err
	}
	b := p.handout(m, size, o.Stream)
	if timed {
		p.lat[lat%len(p.lat)].Observe(time.Since(start))
	}
	return b, nil
}

// largeAlloc serves a large block the fast path did not try (an
// allocation timed for the latency histogram): one parked on this
// processor that fits, else from the arenas, after giving this processor's
// parked blocks back.
func (p *Pool) largeAlloc(size, align uint64, purpose Purpose, t *Tenant) (*meta, error) {
	c, _ := p.pin()
	if c == nil {
		return p.slowAlloc(size, align, 0, purpose, t, nil)
	}
	c.lastLarge = size
	m := c.takeLarge(size, p.opts.Alignment)
	if m != nil {
		m.assign(size, purpose, t)
		c.c.add(m)
		p.unpin(c)
		return m, nil
	}
	var parked *meta
	if c.largeBytes > 0 {
		parked = c.unparkAll()
	}
	p.unpin(c)
	return p.slowAlloc(size, align, 0, purpose, t, parked)
}

// handout makes the handle for a block just allocated.
func (p *Pool) handout(m *meta, size uint64, s device.Stream) Block {
	b := Block{Ptr: m.ptr(), Size: m.size - m.shift, m: m, gen: m.state.Load()}
	if p.opts.OnEvent != nil {
		p.allocEvent(b, size, s)
	}
	return b
}

// allocEvent reports an allocation to Options.OnEvent.
func (p *Pool) allocEvent(b Block, size uint64, s device.Stream) {
	m := b.m
	p.mu.Lock()
	p.opts.OnEvent(Event{Time: time.Now(), Ptr: b.Ptr, Size: size, Stream: s, Purpose: m.purpose, Tenant: m.tenant.name()})
	p.mu.Unlock()
}

func updateMax(a *atomic.Uint64, v uint64) {
	for {
		cur := a.Load()
		if v <= cur || a.CompareAndSwap(cur, v) {
			return
		}
	}
}

// validate checks that b is a live block of this pool, freed through the
// layer that handed it out (the pool, or a tenant that passed the free
// down), and marks it dead. It changes nothing on error. One
// compare-and-swap moves the generation on; refuseHandle diagnoses the
// rest.
func (p *Pool) validate(b Block) (*meta, error) {
	gen := b.gen &^ passed
	if m := b.m; m != nil && m.pool == p && (m.tenant != nil) == (b.gen&passed != 0) && m.state.CompareAndSwap(gen, gen+1) {
		return m, nil
	}
	return nil, p.refuseHandle(b)
}

// refuseHandle says why validate refused b.
func (p *Pool) refuseHandle(b Block) error {
	if m := b.m; m != nil && m.pool == p && m.tenant != nil && b.gen&passed == 0 && m.state.Load() == b.gen {
		return fmt.Errorf("%s: block %#x belongs to tenant %q: free it through the tenant: %w", poolLabel(p.opts.Name), uint64(b.Ptr), m.tenant.nm, ErrInvalidHandle)
	}
	b.gen &^= passed
	if b.m == nil || b.m.pool != p {
		return fmt.Errorf("%s: block %#x does not belong to this pool: %w", poolLabel(p.opts.Name), uint64(b.Ptr), ErrInvalidHandle)
	}
	m := b.m
	// The generation only moves on: the compare-and-swap failed on one
	// that differs (the block was freed meanwhile).
	if cur := m.state.Load(); cur == b.gen+1 {
		return fmt.Errorf("%s: %#x was already freed (double free, or a copy of a freed handle): %w", poolLabel(p.opts.Name), uint64(b.Ptr), ErrInvalidHandle)
	}
	return fmt.Errorf("%s: stale handle for %#x (block was freed and reused): %w", poolLabel(p.opts.Name), uint64(b.Ptr), ErrInvalidHandle)
}

// freed does what every free does besides accounting: the event hook.
func (p *Pool) freed(m *meta) {
	if p.opts.OnEvent != nil {
		p.mu.Lock()
		p.opts.OnEvent(Event{Time: time.Now(), Free: true, Ptr: m.ptr(), Size: m.req, Purpose: m.purpose, Tenant: m.tenant.name()})
		p.mu.Unlock()
	}
}

// Free returns b to the pool for reuse at once: the caller guarantees no
// device work still uses it (use FreeAsync otherwise). A block freed into
// this processor's cache (small, parked or held back, see keepFree) serves
// the next allocations made here; allocations elsewhere get its memory
// after this processor's next trip to the arenas, or before any of them
// would fail for want of it (the out-of-memory path and Trim empty every
// cache). Freeing a block twice,
// a stale copy of a handle, or another pool's or tenant's block returns an
// error wrapping ErrInvalidHandle and changes nothing.
func (p *Pool) Free(b Block) error {
	m := b.m
	if m == nil || m.pool != p || m.tenant != nil || !p.plain || !m.state.CompareAndSwap(b.gen, b.gen+1) {
		return p.free(b)
	}
	// The block is valid and dead now. What follows is free for a pool
	// where Alloc takes its plain path, here rather than in a function
	// of its own (a call less on every free): into this processor's
	// cache when it can be used, as free does.
	pid := procPin()
	if pid >= len(p.procs) || p.revoked.Load() || !p.procs[pid].g.enter() {
		procUnpin()
		p.freeValid(m)
		return nil
	}
	c := &p.procs[pid]
	c.c.sub(m)
	var chain *meta
	switch {
	case m.class > 0:
		cls := int(m.class - 1)
		c.push(m, cls)
		c.misses[cls] = 0
		if c.bytes > procMaxBytes {
			chain = appendChain(c.takeDeferred(), c.drain(cls, procMaxBytes/2))
		}
	case m.size <= p.limitBytes()/64:
		if m.req == c.lastLarge && m.shift < p.opts.Alignment && !m.paged { // as keepFree
			m = c.park(m)
		}
		if m != nil && c.deferFree(m) {
			chain = c.takeDeferred()
		}
	default:
		m.next, chain = nil, m // too large to hold back: it goes back now
	}
	c.g.exit()
	procUnpin()
	if chain != nil { // releaseChain, on the processor just pinned
		s := p.lockShardOf(pid)
		s.releaseList(chain)
		s.mu.Unlock()
	}
	return nil
}

func (p *Pool) free(b Block) error {
	m, err := p.validate(b)
	if err != nil {
		return err
	}
	p.freeValid(m)
	return nil
}

// freeValid frees m, which validate has just accepted.
func (p *Pool) freeValid(m *meta) {
	p.freed(m)
	if m.class > 0 {
		p.cacheFree(m)
		return
	}
	if p.parkable(m) && p.keepFree(m) {
		return
	}
	p.centralFree(m)
}

// centralFree gives m back to its arena and counts the free centrally,
// under the processor's shard's lock.
func (p *Pool) centralFree(m *meta) {
	s := p.lockShard()
	s.central.sub(m)
	s.release(m)
	s.mu.Unlock()
}

// FreeAsync returns b once the work already submitted to s is done: the
// block is reusable at once by allocations on s and by other streams only
// after an event recorded on s has completed. No device-wide
// synchronization happens.
func (p *Pool) FreeAsync(b Block, s device.Stream) error {
	if s == 0 {
		return fmt.Errorf("%s: FreeAsync on stream 0: %w", poolLabel(p.opts.Name), device.ErrInvalid)
	}
	m, err := p.validate(b)
	if err != nil {
		return err
	}
	p.freed(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.central.sub(m)
	pl := p.pending[s]
	if pl == nil {
		pl = &pendingList{}
		p.pending[s] = pl
	}
	pl.add(m)
	p.pendingBytes.Add(m.size)
	if pl.bytes >= pendingBatchBytes || pl.n >= pendingBatchBlocks {
		p.sealPending(s, pl)
	}
	return nil
}

// release frees m's range in its arena (and unmaps or returns memory per
// policy). Called with p.mu held.
func (p *Pool) release(m *meta) {
	if m.home != p {
		m.home.releaseRemote(m)
		return
	}
	a := m.arena
	var err error
	if a.bf != nil { // placeFree for best fit, the default, inline (placeFree is past the inliner's budget)
		err = a.bf.FreeByHandle(m.node, m.off)
		if a.lean {
			a.stale = true
		}
	} else {
		err = a.placeFree(m.off, m.node)
	}
	if err != nil {
		// The handle was validated, so this is a bookkeeping bug.
		panic(fmt.Sprintf("%s: arena free of a validated block at offset %d: %v", poolLabel(p.opts.Name), m.off, err))
	}
	a.live--
	a.held -= m.size
	p.held -= m.size
	// A lean virtual arena keeping all its free pages, the default, has
	// nothing more to do.
	if a.virtual && (!a.lean || a.keepBytes(p) != math.MaxUint64) {
		a.releasedPages(p, m.off, m.size)
	}
	p.noteHeldFell()
	p.putMeta(m)
}

// newMeta returns a meta for a block placed in p's arenas: class 0 and
// home p (putMeta takes only those of p: release calls it on m.home).
func (p *Pool) newMeta() *meta {
	if m := p.metaFree; m != nil {
		p.metaFree = m.next
		m.next = nil
		return m
	}
	return &meta{pool: p.root, home: p}
}

func (p *Pool) putMeta(m *meta) {
	m.arena, m.tenant, m.class, m.shift = nil, nil, 0, 0 // its generation already moved on when it was freed
	m.next = p.metaFree
	p.metaFree = m
}

// Close frees all device memory the pool holds. Blocks still live become
// invalid. Close stops the pool's reclaimer and waits for its pass in
// progress, if any; it waits for nothing else: the caller must have
// synchronized.
func (p *Pool) Close() error {
	p.stopReclaimer()
	p.recMu.Lock()
	defer p.recMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	// Empty the caches and keep them stopped: fast paths take the central
	// path from now on, which reports the pool closed.
	if len(p.procs) > 0 {
		p.stopCaches()
		for i := range p.procs {
			c := &p.procs[i]
			c.drain(0, 0)
			c.unparkAll()
		}
	}
	var first error
	for _, b := range p.awaiting {
		_ = p.dev.DestroyEvent(b.ev)
	}
	p.awaiting = nil
	if err := p.destroyArenas(); err != nil && first == nil {
		first = err
	}
	if err := p.closeShards(); err != nil && first == nil {
		first = err
	}
	return first
}
