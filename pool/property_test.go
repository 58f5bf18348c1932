package pool_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"

	"github.com/memwall/memwall/internal/longtest"
)

// -long runs the property test at 10^6 operations per configuration (or
// MEMWALL_POOL_OPS operations, when set).

// propertyOps is the operation count per configuration: 10^6 with -long,
// MEMWALL_POOL_OPS when set, a few thousand otherwise.
func propertyOps(t testing.TB) int {
	if s := os.Getenv("MEMWALL_POOL_OPS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("MEMWALL_POOL_OPS=%q: want a positive integer", s)
		}
		return n
	}
	switch {
	case longtest.Enabled():
		return 1_000_000
	case testing.Short() && raceOn:
		return 300
	case testing.Short():
		return 1_500
	}
	return 3_000
}

// propConfig is one point of the configuration space the property test
// covers: growth policy, strategy, cache setting, soft target, and the
// address space (or memory) taken on the device before the pool exists.
type propConfig struct {
	growth   pool.Growth
	strategy string
	cache    string // "per-processor", "single", "none"
	target   float64
	mixSmall bool
	// preReserve is address space reserved before the pool (virtual
	// growth), in granules; preAlloc a device allocation made before it
	// (chunk growth: the chunks' bases are then less aligned).
	preReserve int
	preAlloc   uint64
	// limit, when set, is the pool's Limit (and so its reservation):
	// requests are then drawn below it and running out is allowed.
	limit uint64
	// place is the pool's Placement; keepFree its KeepFreeBytes.
	place    pool.Placement
	keepFree uint64
	// hold is the pool's HoldTime (0: the default); caller runs the
	// reclaimer's passes from the test's operations (ReclaimByCaller)
	// instead of the pool's goroutine.
	hold   time.Duration
	caller bool
	// overPool: the pool takes its chunks from another pool on the same
	// device (Options.Upstream = Chunks(parent)), the parent of the
	// default configuration, which allocates blocks of its own between
	// the child's operations.
	overPool bool
}

func (c propConfig) String() string {
	s := fmt.Sprintf("%s-%s-%s", c.growth, c.strategy, c.cache)
	if c.target == pool.NoTarget {
		s += "-keep"
	} else if c.target > 0 {
		s += fmt.Sprintf("-target%.2f", c.target)
	}
	if c.place != pool.PlaceMapped {
		s += "-place-" + c.place.String()
	}
	if c.keepFree > 0 {
		s += fmt.Sprintf("-keepfree%dM", c.keepFree>>20)
	}
	switch {
	case c.hold < 0:
		s += "-eager"
	case c.hold > 0:
		s += "-hold" + c.hold.String()
	}
	if c.caller {
		s += "-caller"
	}
	if c.mixSmall {
		s += "-mixsmall"
	}
	if c.preReserve > 0 {
		s += fmt.Sprintf("-res%d", c.preReserve)
	}
	if c.preAlloc > 0 {
		s += fmt.Sprintf("-pre%d", c.preAlloc)
	}
	if c.limit > 0 {
		s += fmt.Sprintf("-limit%dM", c.limit>>20)
	}
	if c.overPool {
		s = "over-pool-" + s
	}
	return s
}

func (c propConfig) options() pool.Options {
	o := pool.Options{Name: c.String(), Growth: c.growth, Strategy: c.strategy, TargetRatio: c.target, Limit: c.limit,
		Placement: c.place, KeepFreeBytes: c.keepFree, HoldTime: c.hold}
	if c.caller {
		o.Reclaimer = pool.ReclaimByCaller
	}
	if c.mixSmall {
		o.SmallMax = pool.Off
	}
	switch c.cache {
	case "sharded":
		o.Shards = 4
	case "single":
		o.Cache = pool.CacheShared
	case "none":
		o.Cache = pool.CacheOff
	}
	return o
}

// propConfigs is every growth × strategy × cache setting, with and without
// the soft target, each over a device with address space or memory taken
// before the pool.
func propConfigs() []propConfig {
	var cs []propConfig
	i := 0
	for _, g := range []pool.Growth{pool.GrowVirtual, pool.GrowChunks} {
		for _, s := range []string{"bestfit", "tlsf", "buddy"} {
			for _, cache := range []string{"per-processor", "sharded", "single", "none"} {
				for _, target := range []float64{0, pool.NoTarget} {
					c := propConfig{growth: g, strategy: s, cache: cache, target: target}
					// 1, 3 or 0 granules reserved (or 512 B, 1 MiB + 256 B
					// or nothing allocated) before the pool, in turn.
					if g == pool.GrowVirtual {
						c.preReserve = []int{1, 3, 0}[i%3]
						c.mixSmall = i%4 == 3
					} else {
						c.preAlloc = []uint64{512, 1<<20 + 256, 0}[i%3]
					}
					cs = append(cs, c)
					i++
				}
			}
		}
		// Small limits: a reservation of a few pages, a small-block
		// range of one.
		for j, limit := range []uint64{2 << 20, 6 << 20, 16 << 20, 64 << 20} {
			cs = append(cs, propConfig{growth: g, strategy: []string{"bestfit", "tlsf", "buddy", "bestfit"}[j], cache: "per-processor", limit: limit})
			// The same over shards: a shard's failure tries the others.
			cs = append(cs, propConfig{growth: g, strategy: []string{"tlsf", "bestfit", "bestfit", "buddy"}[j], cache: "sharded", limit: limit})
		}
		if g == pool.GrowVirtual {
			// Placement and handle lengths: the strategy's own placement;
			// loose targets, whose slack lets a handle span pages (moved
			// and released whole above the target); kept pages capped by
			// KeepFreeBytes; kept pages under limits (handles up to a
			// sixteenth of the limit).
			cs = append(cs,
				propConfig{growth: g, strategy: "bestfit", cache: "single", place: pool.PlaceStrategy},
				propConfig{growth: g, strategy: "tlsf", cache: "none", target: pool.NoTarget, place: pool.PlaceStrategy, preReserve: 1},
				propConfig{growth: g, strategy: "bestfit", cache: "none", target: 1.2},
				propConfig{growth: g, strategy: "tlsf", cache: "per-processor", target: 1.5, preReserve: 3},
				propConfig{growth: g, strategy: "bestfit", cache: "sharded", target: 2},
				propConfig{growth: g, strategy: "bestfit", cache: "single", target: pool.NoTarget, keepFree: 4 << 20},
				propConfig{growth: g, strategy: "bestfit", cache: "none", target: pool.NoTarget, limit: 64 << 20},
				propConfig{growth: g, strategy: "tlsf", cache: "sharded", target: pool.NoTarget, limit: 256 << 20},
				propConfig{growth: g, strategy: "bestfit", cache: "per-processor", target: 1.5, limit: 128 << 20},
			)
			// Hold times: none (eager), small ones with the pool's
			// reclaimer running beside the operations (hot after a few
			// placements: pages beyond the target queued, moved only when
			// idle, given back by passes or under the limit's pressure),
			// and passes run by the operations themselves. The default
			// (100 ms) is every other configuration's.
			cs = append(cs,
				propConfig{growth: g, strategy: "bestfit", cache: "per-processor", hold: -1, preReserve: 1},
				propConfig{growth: g, strategy: "bestfit", cache: "sharded", hold: 200 * time.Microsecond},
				propConfig{growth: g, strategy: "tlsf", cache: "per-processor", hold: time.Millisecond, preReserve: 3},
				propConfig{growth: g, strategy: "buddy", cache: "none", hold: 200 * time.Microsecond},
				propConfig{growth: g, strategy: "bestfit", cache: "single", hold: hotHold, caller: true, preReserve: 1},
				propConfig{growth: g, strategy: "bestfit", cache: "per-processor", hold: 200 * time.Microsecond, limit: 64 << 20},
				propConfig{growth: g, strategy: "tlsf", cache: "sharded", hold: hotHold, caller: true, limit: 16 << 20},
			)
		} else {
			// Pools over a pool: chunks from a parent pool's blocks, whose
			// addresses are only as aligned as the parent's blocks.
			cs = append(cs,
				propConfig{growth: g, strategy: "bestfit", cache: "per-processor", overPool: true},
				propConfig{growth: g, strategy: "tlsf", cache: "sharded", overPool: true},
				propConfig{growth: g, strategy: "buddy", cache: "none", overPool: true},
				propConfig{growth: g, strategy: "bestfit", cache: "single", overPool: true, limit: 64 << 20},
			)
		}
	}
	return cs
}

// propBlock is a live block and the tag its sampled words hold.
type propBlock struct {
	b      pool.Block
	size   uint64 // requested
	align  uint64
	tag    uint64
	tenant bool
	parent bool // a block of the parent pool (overPool), not the pool's
}

// propSpots are the offsets of b's sampled words: its first and last
// eight bytes and one word in every MiB, so that every page of the block
// holds one (a page mapped twice, or two blocks on one byte, shows).
func propSpots(size uint64, tag uint64, spots []uint64) []uint64 {
	spots = append(spots[:0], 0)
	if size >= 16 {
		spots = append(spots, (size-8)&^7)
	}
	const mib = 1 << 20
	for off := uint64(mib); off+8 <= size; off += mib {
		spot := off + (tag>>8)%(mib/8)*8
		if spot+8 > size {
			spot = (size - 8) &^ 7
		}
		spots = append(spots, spot)
	}
	return spots
}

// propState is the model the property test checks the pool against.
type propState struct {
	t       testing.TB
	d       device.Device
	p       *pool.Pool
	tn      *pool.Tenant
	parent  *pool.Pool // overPool: the pool p takes its chunks from
	own     int        // live blocks of p (live also holds parent's)
	s       device.Stream
	backing bool
	// shadow, when set, holds the pattern instead of the device's bytes.
	shadow *shadowDevice
	live   []*propBlock // sorted by address
	bytes  uint64       // bytes of live blocks (their sizes)
	slack  uint64       // their alignments beyond the pool's
	spots  []uint64
	word   [8]byte
	ooms   int
	// firstOOM is the first refusal, for the report.
	firstOOM string
}

// find returns the index of the first live block at or above ptr.
func (st *propState) find(ptr device.Ptr) int {
	i, _ := slices.BinarySearchFunc(st.live, ptr, func(b *propBlock, p device.Ptr) int {
		switch {
		case b.b.Ptr < p:
			return -1
		case b.b.Ptr > p:
			return 1
		}
		return 0
	})
	return i
}

// add checks a block just allocated against the request and against every
// live block (by device address), records it and writes its pattern.
func (st *propState) add(op int, b pool.Block, size, align uint64, tenant bool) {
	pb := st.place(op, b, size, align)
	pb.tenant = tenant
	st.own++
	st.bytes += b.Size
	st.slack += pb.slack()
}

// place checks block b against the request and every live block, records
// it and writes its pattern.
func (st *propState) place(op int, b pool.Block, size, align uint64) *propBlock {
	t := st.t
	if b.Size < size {
		t.Fatalf("op %d: %d-byte block for a request of %d bytes (align %d)", op, b.Size, size, align)
	}
	if uint64(b.Ptr)%align != 0 {
		t.Fatalf("op %d: block %#x for %d bytes is not aligned to %d", op, uint64(b.Ptr), size, align)
	}
	if uint64(b.Ptr)+b.Size < uint64(b.Ptr) {
		t.Fatalf("op %d: block %#x+%d wraps the address space", op, uint64(b.Ptr), b.Size)
	}
	i := st.find(b.Ptr)
	if i > 0 {
		prev := st.live[i-1].b
		if prev.Ptr+device.Ptr(prev.Size) > b.Ptr {
			t.Fatalf("op %d: block [%#x,+%d) (for %d bytes aligned %d) overlaps live block [%#x,+%d)",
				op, uint64(b.Ptr), b.Size, size, align, uint64(prev.Ptr), prev.Size)
		}
	}
	if i < len(st.live) {
		next := st.live[i].b
		if b.Ptr+device.Ptr(b.Size) > next.Ptr {
			t.Fatalf("op %d: block [%#x,+%d) (for %d bytes aligned %d) overlaps live block [%#x,+%d)",
				op, uint64(b.Ptr), b.Size, size, align, uint64(next.Ptr), next.Size)
		}
	}
	pb := &propBlock{b: b, size: size, align: align, tag: uint64(op)*0x9e3779b97f4a7c15 | 1}
	st.live = slices.Insert(st.live, i, pb)
	if st.backing {
		st.pattern(pb, false)
	}
	return pb
}

// pattern writes (check false) or checks (check true) the words of pb's
// sampled spots: each holds the block's tag plus its offset.
func (st *propState) pattern(pb *propBlock, check bool) {
	st.spots = propSpots(pb.b.Size, pb.tag, st.spots)
	if st.shadow != nil {
		for _, off := range st.spots {
			want, at := pb.tag+off, pb.b.Ptr+device.Ptr(off)
			if !check {
				if err := st.shadow.store(at, want); err != nil {
					st.t.Fatalf("write block %#x+%d (%d bytes for %d aligned %d): %v", uint64(pb.b.Ptr), off, pb.b.Size, pb.size, pb.align, err)
				}
				continue
			}
			got, err := st.shadow.load(at)
			if err != nil || got != want {
				st.t.Fatalf("block %#x (%d bytes for %d aligned %d): word at +%d is %#x (%v), want %#x: another block or page wrote it",
					uint64(pb.b.Ptr), pb.b.Size, pb.size, pb.align, off, got, err, want)
			}
		}
		return
	}
	for _, off := range st.spots {
		n := min(uint64(8), pb.b.Size-off)
		want := pb.tag + off
		if !check {
			binary.LittleEndian.PutUint64(st.word[:], want)
			if err := st.d.CopyHtoD(pb.b.Ptr+device.Ptr(off), st.word[:n], st.s); err != nil {
				st.t.Fatalf("write block %#x+%d (%d bytes for %d aligned %d, tenant %v): %v", uint64(pb.b.Ptr), off, pb.b.Size, pb.size, pb.align, pb.tenant, err)
			}
			// The copy reads its source when it runs.
			if err := st.d.StreamSynchronize(st.s); err != nil {
				st.t.Fatal(err)
			}
			continue
		}
		st.word = [8]byte{}
		if err := st.d.CopyDtoH(st.word[:n], pb.b.Ptr+device.Ptr(off), st.s); err != nil {
			st.t.Fatalf("read block %#x+%d: %v", uint64(pb.b.Ptr), off, err)
		}
		if err := st.d.StreamSynchronize(st.s); err != nil {
			st.t.Fatal(err)
		}
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], want)
		if string(st.word[:n]) != string(w[:n]) {
			st.t.Fatalf("block %#x (%d bytes for %d aligned %d): word at +%d is %x, want %x: another block or page wrote it",
				uint64(pb.b.Ptr), pb.b.Size, pb.size, pb.align, off, st.word[:n], w[:n])
		}
	}
}

// free frees the live block at index i, checking its pattern first.
func (st *propState) free(i int, async bool) {
	pb := st.live[i]
	if st.backing {
		st.pattern(pb, true)
	}
	if st.shadow != nil {
		for _, off := range st.spots { // the spots pattern just checked
			st.shadow.drop(pb.b.Ptr + device.Ptr(off))
		}
	}
	var err error
	switch {
	case pb.tenant:
		err = st.tn.Free(pb.b)
	case pb.parent:
		err = st.parent.Free(pb.b)
	case async:
		err = st.p.FreeAsync(pb.b, st.s)
	default:
		err = st.p.Free(pb.b)
	}
	if err != nil {
		st.t.Fatalf("free %#x: %v", uint64(pb.b.Ptr), err)
	}
	st.live = slices.Delete(st.live, i, i+1)
	if pb.parent {
		return
	}
	st.own--
	st.bytes -= pb.b.Size
	st.slack -= pb.slack()
}

// slack is the most alignment padding the pool may count for pb.
func (pb *propBlock) slack() uint64 {
	if pb.align <= 256 {
		return 0
	}
	return pb.align
}

// propRequest draws a request: sizes log-uniform from 1 B to 256 MiB (one
// in fifty up to 1 GiB), alignments the pool's own half the time, else a
// power of two from 256 B to 1 GiB.
func propRequest(r *rand.Rand) (size, align uint64) {
	e := r.IntN(29)
	if r.IntN(50) == 0 {
		e = 26 + r.IntN(5)
	}
	size = 1<<e + r.Uint64N(1<<e)
	if r.IntN(2) == 0 {
		return size, 0
	}
	return size, 1 << (8 + r.IntN(23))
}

// runProperty runs ops random operations on a pool of configuration c over
// d and checks every block against the request and every live block.
func runProperty(t testing.TB, d device.Device, c propConfig, ops int, seed uint64, backing bool) {
	runPropertyFrom(t, d, c, ops, rand.NewPCG(seed, 0x5eed), backing)
}

// runPropertyFrom is runProperty with the operations drawn from src.
func runPropertyFrom(t testing.TB, d device.Device, c propConfig, ops int, src rand.Source, backing bool) {
	shadow, _ := d.(*shadowDevice)
	gran := d.Info().Granularity
	if c.preReserve > 0 && d.Info().VirtualMemory {
		n := uint64(c.preReserve) * gran
		va, err := d.Reserve(n)
		if err != nil {
			t.Fatalf("reserve %d bytes before the pool: %v", n, err)
		}
		defer d.Unreserve(va, n)
	}
	if c.preAlloc > 0 {
		ptr, err := d.Alloc(c.preAlloc)
		if err != nil {
			t.Fatalf("alloc %d bytes before the pool: %v", c.preAlloc, err)
		}
		defer d.Free(ptr)
	}
	_, total, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	o := c.options()
	var parent *pool.Pool
	if c.overPool {
		if parent, err = pool.New(d, pool.Options{Name: "parent"}); err != nil {
			t.Fatal(err)
		}
		defer parent.Close()
		o.Upstream = pool.Chunks(parent, pool.AllocOptions{Purpose: pool.Scratch})
	}
	p, err := pool.New(d, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if c.cache == "sharded" {
		pool.SpreadShards(p)
	}
	tn, err := p.Tenant("t", 2<<30)
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(s)
	st := &propState{t: t, d: d, p: p, tn: tn, s: s, backing: backing || shadow != nil, shadow: shadow, parent: parent}
	// Live bytes stay under an eighth of the device, so that running out
	// of memory is rare and every refusal can be checked for a reason.
	budget := total / 8
	if c.limit > 0 {
		budget = c.limit / 2
	}
	r := rand.New(src)
	start := time.Now()
	for op := 0; op < ops; op++ {
		k := r.IntN(100)
		switch {
		case len(st.live) > 0 && (k < 45 || len(st.live) >= 48 || st.bytes > budget):
			st.free(r.IntN(len(st.live)), k%9 == 0)
		case k == 99:
			p.Trim()
		case k == 98:
			p.Reclaim()
		case parent != nil && k%7 == 3:
			// The parent's own block, between the pool's chunks.
			size, align := propRequest(r)
			size = 1 + size%(64<<20)
			b, err := parent.Alloc(size, pool.AllocOptions{Align: min(align, 1<<20)})
			if err != nil {
				t.Fatalf("op %d: parent alloc of %d bytes: %v", op, size, err)
			}
			st.place(op, b, size, max(min(align, 1<<20), 256)).parent = true
		default:
			size, align := propRequest(r)
			if c.limit > 0 {
				size = 1 + size%(c.limit/4)
				for align > c.limit/8 {
					align /= 2 // still a power of two
				}
			}
			o := pool.AllocOptions{Align: align, Purpose: pool.Purpose(r.IntN(6))}
			if k%11 == 0 {
				o.Stream = s
			}
			tenant := k%13 == 0
			var b pool.Block
			var err error
			if tenant {
				b, err = tn.Alloc(size, o)
			} else {
				b, err = p.Alloc(size, o)
			}
			if align == 0 {
				align = 256
			}
			if err != nil {
				st.refused(op, err, size, align, tenant)
				continue
			}
			st.add(op, b, size, align, tenant)
		}
		if op%4096 == 4095 {
			st.check(op)
		}
	}
	st.check(ops)
	if el := time.Since(start); ops >= 10000 {
		t.Logf("%d ops in %v (%.0f ops/s), %d refused", ops, el.Round(time.Millisecond), float64(ops)/el.Seconds(), st.ooms)
	}
	if c.cache == "sharded" && ops >= 100 && pool.ShardsMade(p) < 2 {
		t.Fatalf("%d operations spread over shards made %d shard", ops, pool.ShardsMade(p))
	}
	for len(st.live) > 0 {
		st.free(len(st.live)-1, false)
	}
	if err := d.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	p.Trim()
	if s := p.Stats(); s.UsedBytes != 0 || s.LiveBlocks != 0 || s.ReservedBytes != 0 {
		t.Fatalf("after freeing everything and Trim: used %d in %d blocks, %d reserved", s.UsedBytes, s.LiveBlocks, s.ReservedBytes)
	}
	if parent != nil {
		if s := parent.Stats(); s.UsedBytes != 0 || s.LiveBlocks != 0 {
			t.Fatalf("parent after the pool gave its chunks back: used %d in %d blocks", s.UsedBytes, s.LiveBlocks)
		}
	}
	if ops > 0 && st.ooms > ops/100 && c.limit == 0 {
		t.Fatalf("%d of %d operations ran out of memory with live bytes under %d; the first: %s", st.ooms, ops, budget, st.firstOOM)
	}
}

// refused checks an allocation's failure: out of memory (with a reason)
// or a tenant over its quota, nothing else.
func (st *propState) refused(op int, err error, size, align uint64, tenant bool) {
	var oom *pool.OOMError
	if !errors.As(err, &oom) || !errors.Is(err, pool.ErrOutOfMemory) {
		st.t.Fatalf("op %d: alloc of %d bytes aligned %d: %v", op, size, align, err)
	}
	if oom.Cause == pool.CauseQuota && tenant {
		return
	}
	st.ooms++
	if st.ooms == 1 {
		st.firstOOM = fmt.Sprintf("op %d: %v", op, err)
	}
}

// check compares the pool's accounting with the model and verifies its
// page bookkeeping.
func (st *propState) check(op int) {
	s := st.p.Stats()
	// A block's used bytes include the alignment slack before its
	// handed-out address: at most its alignment.
	if s.UsedBytes < st.bytes || s.UsedBytes > st.bytes+st.slack || s.LiveBlocks != st.own {
		st.t.Fatalf("op %d: pool counts %d bytes in %d blocks, the test holds %d (+ up to %d of slack) in %d", op, s.UsedBytes, s.LiveBlocks, st.bytes, st.slack, st.own)
	}
	if err := pool.CheckPages(st.p); err != nil {
		st.t.Fatalf("op %d: %v", op, err)
	}
	if err := pool.CheckHandles(st.p); err != nil {
		st.t.Fatalf("op %d: %v", op, err)
	}
}

// TestPropertyBlocks: over every growth policy, strategy, cache setting and
// soft target, with address space or memory taken on the device before the
// pool, random sizes and alignments (256 B to 1 GiB), every block is at
// least the size asked, aligned as asked at its device address, shares no
// byte with another live block, and keeps its bytes (a pattern written at
// allocation is checked at free; the device holds real bytes). Run with
// -long for 10^6 operations per configuration.
func TestPropertyBlocks(t *testing.T) {
	ops := propertyOps(t)
	cuda := os.Getenv("MEMWALL_TEST_DEVICE") == "cuda"
	for i, c := range propConfigs() {
		t.Run(c.String(), func(t *testing.T) {
			if cuda {
				// The GPU's own memory holds the pattern: one
				// configuration at a time.
				runProperty(t, newSim(t, true, 0), c, ops, uint64(i)+1, true)
				return
			}
			// Each configuration has a simulated device of its own (a
			// few MB of host memory): they spread over the cores.
			t.Parallel()
			runProperty(t, newShadow(newSim(t, false, 64<<30)), c, ops, uint64(i)+1, false)
		})
	}
}

// TestPropertyBlocksBacked is TestPropertyBlocks with the pattern in the
// simulator's real bytes (copies through streams) instead of the shadow,
// on a few configurations: the shadow's model of memory is checked
// against the device's.
func TestPropertyBlocksBacked(t *testing.T) {
	if os.Getenv("MEMWALL_TEST_DEVICE") == "cuda" {
		t.Skip("TestPropertyBlocks runs on the GPU's memory")
	}
	if testing.Short() && raceOn {
		t.Skip("the simulator's copies under the race detector: TestPropertyBlocks covers the pool")
	}
	ops := min(propertyOps(t), 400)
	for i, c := range propConfigs() {
		if i%7 != 0 {
			continue
		}
		t.Run(c.String(), func(t *testing.T) {
			runProperty(t, newSim(t, true, 16<<30), c, ops, uint64(i)+100, true)
		})
	}
}

// TestWrongBlockAfterGrowth is issue 13's case: with 2 MiB of address
// space reserved before the pool, 9 MiB aligned to 8 MiB must be a 9 MiB
// block, and the next 1 MiB must land outside it.
func TestWrongBlockAfterGrowth(t *testing.T) {
	for _, cache := range []bool{false, true} {
		d := newSim(t, false, 1<<30)
		gran := d.Info().Granularity
		if !d.Info().VirtualMemory {
			t.Skip("needs virtual memory")
		}
		va, err := d.Reserve(gran)
		if err != nil {
			t.Fatal(err)
		}
		o := pool.Options{}
		if !cache {
			o.Cache = pool.CacheOff
		}
		p, err := pool.New(d, o)
		if err != nil {
			t.Fatal(err)
		}
		big, err := p.Alloc(9<<20, pool.AllocOptions{Align: 8 << 20})
		if err != nil {
			t.Fatal(err)
		}
		small, err := p.Alloc(1<<20, pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if big.Size < 9<<20 || uint64(big.Ptr)%(8<<20) != 0 {
			t.Errorf("cache %v: 9 MiB aligned to 8 MiB gave %d bytes at %#x", cache, big.Size, uint64(big.Ptr))
		}
		if small.Ptr < big.Ptr+device.Ptr(big.Size) && big.Ptr < small.Ptr+device.Ptr(small.Size) {
			t.Errorf("cache %v: 1 MiB block [%#x,+%d) inside the 9 MiB block [%#x,+%d)", cache, uint64(small.Ptr), small.Size, uint64(big.Ptr), big.Size)
		}
		p.Close()
		_ = d.Unreserve(va, gran)
	}
}

// byteSource is a rand.Source that reads the fuzzer's bytes, two per draw
// (spread over the word, so that the small ranges of IntN see them), then
// a generator seeded with the input's length (IntN rejects some words and
// draws again, so a constant would never end).
type byteSource struct {
	data []byte
	rest *rand.PCG
}

func (b *byteSource) Uint64() uint64 {
	if len(b.data) < 2 {
		if b.rest == nil {
			b.rest = rand.NewPCG(uint64(len(b.data)), 1)
		}
		return b.rest.Uint64()
	}
	v := uint64(b.data[0])<<56 | uint64(b.data[1])<<48
	b.data = b.data[2:]
	return v | v>>16 | v>>32 | v>>48
}

// FuzzPoolBlocks is TestPropertyBlocks with the configuration (the first
// byte) and the operations (sizes, alignments 256 B to 1 GiB, frees,
// stream-ordered frees, tenant allocations, trims, reclaimer passes) read
// from the input.
func FuzzPoolBlocks(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{1, 200, 17, 255, 255, 90, 3, 255, 0, 0, 1, 250, 250, 250})
	f.Add([]byte{18, 128, 0, 200, 200, 255, 255, 60, 60, 128, 128, 255, 255, 1, 2})
	f.Add([]byte{35, 100, 100, 255, 10, 255, 255, 90, 0, 0, 0, 255, 255, 255, 255})
	// The hold-time configurations: the reclaimer beside the operations,
	// and passes among them (caller).
	for _, c := range []byte{42, 44, 45, 47} {
		f.Add(append([]byte{c}, []byte("\xfa\x10\xfb\x20\x90\x00\x40\xff\xf9\x99\x30\x30\xfa\xee\x80\x01\xf9\x70\x11\xfb\x05\x60\xff\xff\x20\x02")...))
	}
	cs := propConfigs()
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > 4096 {
			return
		}
		c := cs[int(data[0])%len(cs)]
		d := newShadow(newSim(t, false, 64<<30))
		runPropertyFrom(t, d, c, len(data)/4, &byteSource{data: data[1:]}, false)
	})
}
