package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
)

// Config is one pool configuration to replay a trace through.
type Config struct {
	Name    string
	Options pool.Options
}

// Options tune Run.
type Options struct {
	// Limit caps the bytes the pool may reserve (pool.Options.Limit); 0
	// leaves the pool unlimited (the simulated device's TotalBytes).
	Limit uint64
	// TotalBytes is the simulated device's memory (default 1 TiB).
	TotalBytes uint64
	// ReserveBytes is the address space a virtual pool reserves (default
	// 4 × the trace's peak live bytes + 1 GiB, whatever the Limit, so that
	// a Limit caps physical memory and not address space).
	ReserveBytes uint64
	// Samples is the number of points in Result.Timeline (default 400; a
	// negative value records none).
	Samples int
	// AddressMap records Result.Map, the pool's address space at the
	// trace's peak of live bytes.
	AddressMap bool
	// OpTime is the trace time each alloc or free stands for (default
	// DefaultOpTime): the replay's clock, by which the pool's reclaimer
	// runs a pass (pool.Pool.Reclaim) every HoldTime, between ops, so
	// that a replay never depends on the machine's clock. The traces
	// replayed here carry no timestamps (CSV).
	OpTime time.Duration
}

// DefaultOpTime is the default Options.OpTime: the recorded traces took
// 23–165 µs per alloc or free on the H200, recording included (their
// JSON's record_seconds over their ops; 60 µs the median).
const DefaultOpTime = 60 * time.Microsecond

// Sample is one point of a replay's timeline, covering the ops up to and
// including Op since the previous sample.
type Sample struct {
	Op       int     // index into Trace.Ops
	Live     uint64  // the most requested bytes live in the interval
	Reserved uint64  // the most bytes the pool held in the interval
	Frag     float64 // the pool's fragmentation factor at Op (1 = free space in one range)
}

// Span is a range of the address space, relative to AddressMap.Base (after
// gaps between far-apart reservations are shortened).
type Span struct {
	Off, Size uint64
}

// AddressMap is the pool's address space at one moment: the reserved
// ranges (device memory held) and the live blocks in them. Offsets are from
// Base, the lowest reserved address; free reserved bytes are the holes.
type AddressMap struct {
	Op       int
	Base     device.Ptr
	Reserved []Span
	Blocks   []Span
}

// Result is one configuration's replay of a trace.
type Result struct {
	Config string
	// Strategy and Growth are the pool's effective options.
	Strategy string
	Growth   string
	Options  pool.Options
	// Ops is the number of ops replayed (all of them unless Err is set).
	Ops int
	// PeakLive is the trace's peak of requested bytes; PeakUsed the pool's
	// peak of block bytes (requests rounded to alignment and size
	// classes).
	PeakLive, PeakUsed uint64
	// PeakReserved is the most device memory the pool held.
	PeakReserved uint64
	// Ratio is PeakReserved / PeakLive; Utilization its inverse.
	Ratio, Utilization float64
	// DeviceCalls is the driver allocations, frees, maps and unmaps the
	// pool made during the replay (not counting closing the pool).
	DeviceCalls                             uint64
	DeviceAllocs, DeviceFrees, Maps, Unmaps uint64
	// DriverTime is the time those calls cost on the H200 (H200Costs);
	// ReclaimTime the part of it spent in the reclaimer's passes, off the
	// allocating goroutine.
	DriverTime, ReclaimTime time.Duration
	// Passes is the reclaimer passes run (every HoldTime of trace time).
	Passes int
	// FragMin and FragMean summarize the fragmentation factor over the
	// timeline (1 = all free reserved space is one range).
	FragMin, FragMean float64
	Timeline          []Sample
	Map               *AddressMap
	Elapsed           time.Duration
	// Err is why the replay stopped early: an *OpError, typically wrapping
	// pool.ErrOutOfMemory under a Limit.
	Err error
}

// Costs are the driver's time per call, for charging a replay's device
// calls (the simulator counts calls; these say what they would cost).
type Costs struct {
	// Alloc and Free: cuMemAlloc and cuMemFree (a chunk), or cuMemCreate
	// and cuMemRelease of one 2 MiB page's physical memory.
	Alloc, Free time.Duration
	// Map is mapping one 2 MiB page and setting its access (cuMemMap +
	// cuMemSetAccess); Unmap unmapping one (cuMemUnmap).
	Map, Unmap time.Duration
	// CreatePage, ReleasePage, MapPage and UnmapPage are what each 2 MiB
	// page past the first adds to one call on a multi-page handle
	// (cuMemCreate, cuMemRelease, cuMemMap + cuMemSetAccess, cuMemUnmap of
	// the whole handle).
	CreatePage, ReleasePage, MapPage, UnmapPage time.Duration
	// SegmentMap is PyTorch's expandable segments growing by one 2 MiB
	// page (segment_map events count pages' bytes, charged per page).
	SegmentMap time.Duration
}

// H200Costs are the driver's costs measured on the NVIDIA H200
// (BENCHMARKS.md): cuMemAlloc p50 34 µs, cuMemFree 30 µs; mapping a 2 MiB
// page and setting its access about 55 µs; unmapping and remapping a
// 32 MiB chunk 0.33 ms, which charges an unmap of a page 0.33 ms / 16
// ≈ 21 µs (its remap is a Map of its own). A physical handle's create and
// release are charged as cuMemAlloc and cuMemFree. A multi-page handle
// costs one call and a little per page: pool's TestMapCost on the H200
// (2026-12-01, median of 12 calls at 2 MiB-256 MiB) fitted each extra page
// at 0.39% of a one-page call for cuMemCreate, 0.54% for cuMemMap +
// cuMemSetAccess, 0.34% for cuMemUnmap and 6.4% for cuMemRelease (a
// 256 MiB handle: 1.5×, 1.6×, 1.4× and 9.0× a 2 MiB one), applied to the
// one-page costs above.
var H200Costs = Costs{Alloc: 34 * time.Microsecond, Free: 30 * time.Microsecond,
	Map: 55 * time.Microsecond, Unmap: 21 * time.Microsecond,
	CreatePage: 133 * time.Nanosecond, ReleasePage: 1930 * time.Nanosecond,
	MapPage: 297 * time.Nanosecond, UnmapPage: 71 * time.Nanosecond,
	SegmentMap: 55 * time.Microsecond}

// Pool is the driver time of a pool's device calls, each charged as one
// page (the replay itself charges multi-page calls by their size: meter).
func (c Costs) Pool(st pool.Stats) time.Duration {
	return time.Duration(st.DeviceAllocs)*c.Alloc + time.Duration(st.DeviceFrees)*c.Free +
		time.Duration(st.Maps)*c.Map + time.Duration(st.Unmaps)*c.Unmap
}

// meter is the replay's device: it charges every driver call the pool
// makes its cost at c, by the call's size (a multi-page handle costs a
// call plus its extra pages).
type meter struct {
	device.Device
	c     Costs
	total time.Duration
	sizes map[device.PhysMem]uint64
	// bg is set during the reclaimer's passes: their calls are charged
	// to background as well.
	bg         bool
	background time.Duration
}

// charge adds d to the driver time.
func (m *meter) charge(d time.Duration) {
	m.total += d
	if m.bg {
		m.background += d
	}
}

// extra is the pages of size bytes past the first.
func extra(size uint64) time.Duration {
	if size <= 2<<20 {
		return 0
	}
	return time.Duration((size+2<<20-1)/(2<<20) - 1)
}

func (m *meter) Alloc(size uint64) (device.Ptr, error) {
	m.charge(m.c.Alloc)
	return m.Device.Alloc(size)
}

func (m *meter) Free(p device.Ptr) error {
	m.charge(m.c.Free)
	return m.Device.Free(p)
}

func (m *meter) CreatePhysical(size uint64) (device.PhysMem, error) {
	m.charge(m.c.Alloc + extra(size)*m.c.CreatePage)
	h, err := m.Device.CreatePhysical(size)
	if err == nil {
		m.sizes[h] = size
	}
	return h, err
}

func (m *meter) ReleasePhysical(h device.PhysMem) error {
	m.charge(m.c.Free + extra(m.sizes[h])*m.c.ReleasePage)
	delete(m.sizes, h)
	return m.Device.ReleasePhysical(h)
}

func (m *meter) Map(va device.Ptr, size uint64, h device.PhysMem) error {
	m.charge(m.c.Map + extra(size)*m.c.MapPage)
	return m.Device.Map(va, size, h)
}

func (m *meter) Unmap(va device.Ptr, size uint64) error {
	m.charge(m.c.Unmap + extra(size)*m.c.UnmapPage)
	return m.Device.Unmap(va, size)
}

// OpError is a replay step the pool refused.
type OpError struct {
	Op  int // index into Trace.Ops
	Err error
}

func (e *OpError) Error() string { return fmt.Sprintf("op %d: %v", e.Op, e.Err) }

// Unwrap returns the pool's error.
func (e *OpError) Unwrap() error { return e.Err }

// NewDevice returns the metadata-only simulated device replays run on:
// virtual memory with 2 MiB granularity, total bytes as given (1 TiB when
// 0), no host memory behind allocations.
func NewDevice(total uint64) device.Device {
	o := sim.DefaultOptions()
	o.Name = "memwall-sim (replay)"
	o.Backing = false
	o.VirtualMemory = true
	o.TotalBytes = total
	if total == 0 {
		o.TotalBytes = 1 << 40
	}
	return sim.New(o)
}

func (o Options) withDefaults(t *Trace) Options {
	if o.TotalBytes == 0 {
		o.TotalBytes = 1 << 40
	}
	if o.ReserveBytes == 0 {
		o.ReserveBytes = 4*t.PeakLive + 1<<30
	}
	if o.Samples == 0 {
		o.Samples = 400
	}
	if o.OpTime <= 0 {
		o.OpTime = DefaultOpTime
	}
	return o
}

// Run replays t through a fresh pool configured by c on a simulated device.
// The returned Result is never nil; when the pool refuses an op (out of
// memory under o.Limit, a strategy that cannot serve a size) Result.Err and
// the returned error are an *OpError and the figures cover the ops before
// it. Other errors (the pool cannot be built) return a Result with only
// the configuration filled in. When ctx is done the replay stops (it looks
// every checkEvery ops) and returns ctx's error, wrapped with the ops done;
// the figures cover those ops.
func Run(ctx context.Context, t *Trace, c Config, o Options) (*Result, error) {
	o = o.withDefaults(t)
	res := &Result{Config: c.Name, PeakLive: t.PeakLive}
	md := &meter{Device: NewDevice(o.TotalBytes), c: H200Costs, sizes: map[device.PhysMem]uint64{}}
	defer md.Close()
	var d device.Device = md
	po := c.Options
	if po.Name == "" {
		po.Name = c.Name
	}
	po.Limit = o.Limit
	if po.ReserveBytes == 0 {
		po.ReserveBytes = o.ReserveBytes
	}
	po.OnEvent, po.Logger = nil, nil
	po.Cache = pool.CacheShared         // one goroutine replays: placement must not depend on which processor ran it
	po.Reclaimer = pool.ReclaimByCaller // passes at trace time (pass below)
	p, err := pool.New(d, po)
	if err != nil {
		res.Err = err
		return res, fmt.Errorf("replay %s: %w", c.Name, err)
	}
	defer p.Close()
	eff := p.Options()
	res.Options, res.Strategy, res.Growth = eff, eff.Strategy, eff.Growth.String()

	blocks := make([]pool.Block, t.MaxID)
	every := len(t.Ops)
	if o.Samples > 0 {
		every = max(1, (len(t.Ops)+o.Samples-1)/o.Samples)
	}
	var live, bLive, bRes uint64
	var fragSum float64
	res.FragMin = 1
	sample := func(i int) {
		st := p.DetailedStats()
		res.Timeline = append(res.Timeline, Sample{Op: i, Live: bLive, Reserved: bRes, Frag: st.Fragmentation})
		fragSum += st.Fragmentation
		res.FragMin = min(res.FragMin, st.Fragmentation)
		bLive, bRes = live, p.ReservedBytes()
	}
	// The reclaimer's clock: op i happens at i × OpTime, and a pass runs
	// before it for every HoldTime elapsed since the last (two at most:
	// a third with no op between changes nothing).
	hold := eff.HoldTime
	var now, next time.Duration = 0, hold
	pass := func() {
		if hold <= 0 {
			return
		}
		if now < next {
			return
		}
		due := (now-next)/hold + 1
		for range min(due, 2) {
			md.bg = true
			p.Reclaim()
			md.bg = false
			res.Passes++
		}
		next += due * hold
	}
	start := time.Now()
	var stopped error
	for i, op := range t.Ops {
		if i%checkEvery == 0 && ctx.Err() != nil {
			stopped = fmt.Errorf("replay %s of %s: %d of %d ops: %w", c.Name, t.Name, i, len(t.Ops), ctx.Err())
			break
		}
		now = time.Duration(i) * o.OpTime
		pass()
		if op.Free {
			if err := p.Free(blocks[op.ID]); err != nil {
				res.Err = &OpError{Op: i, Err: err}
				break
			}
			blocks[op.ID] = pool.Block{}
			live -= op.Size
		} else {
			b, err := p.Alloc(op.Size, pool.AllocOptions{})
			if err != nil {
				res.Err = &OpError{Op: i, Err: err}
				break
			}
			blocks[op.ID] = b
			live += op.Size
			bLive = max(bLive, live)
			bRes = max(bRes, p.ReservedBytes())
		}
		res.Ops = i + 1
		if o.AddressMap && i == t.PeakOp {
			res.Map = addressMap(p, blocks, i)
		}
		if o.Samples > 0 && (i+1)%every == 0 {
			sample(i)
		}
	}
	if o.Samples > 0 && res.Ops%every != 0 && res.Ops > 0 {
		sample(res.Ops - 1)
	}
	res.Elapsed = time.Since(start)
	st := p.Stats()
	res.PeakUsed = st.PeakUsedBytes
	res.PeakReserved = st.PeakReservedBytes
	res.DeviceAllocs, res.DeviceFrees, res.Maps, res.Unmaps = st.DeviceAllocs, st.DeviceFrees, st.Maps, st.Unmaps
	res.DeviceCalls = st.DeviceCalls()
	res.DriverTime, res.ReclaimTime = md.total, md.background
	if res.PeakLive > 0 {
		res.Ratio = float64(res.PeakReserved) / float64(res.PeakLive)
	}
	if res.PeakReserved > 0 {
		res.Utilization = float64(res.PeakLive) / float64(res.PeakReserved)
	}
	if n := len(res.Timeline); n > 0 {
		res.FragMean = fragSum / float64(n)
	}
	if res.Err != nil {
		return res, fmt.Errorf("replay %s of %s: %w", c.Name, t.Name, res.Err)
	}
	return res, stopped
}

// checkEvery is how many ops a replay runs between two looks at its
// context: an op costs tens of nanoseconds, a look about as much.
const checkEvery = 1024

// addressMap captures the pool's reserved ranges and the live blocks.
func addressMap(p *pool.Pool, blocks []pool.Block, op int) *AddressMap {
	rs := p.Reservations()
	m := &AddressMap{Op: op}
	if len(rs) == 0 {
		return m
	}
	base := rs[0].Ptr
	for _, r := range rs {
		base = min(base, r.Ptr)
	}
	m.Base = base
	slices.SortFunc(rs, func(a, b pool.Range) int { return cmp.Compare(a.Ptr, b.Ptr) })
	var total uint64
	for _, r := range rs {
		total += r.Size
	}
	// Separate reservations (chunks, the small-block range) may lie far
	// apart: a gap wider than all reserved memory is drawn as 2 MiB.
	// shift[i] is what to subtract from addresses at or above rs[i].
	shift := make([]uint64, len(rs))
	for i := 1; i < len(rs); i++ {
		shift[i] = shift[i-1]
		prevEnd := rs[i-1].Ptr + device.Ptr(rs[i-1].Size)
		if gap := uint64(rs[i].Ptr - prevEnd); rs[i].Ptr > prevEnd && gap > total {
			shift[i] += gap - 2<<20
		}
	}
	rel := func(p device.Ptr) uint64 {
		i := sort.Search(len(rs), func(i int) bool { return rs[i].Ptr > p }) - 1
		return uint64(p-base) - shift[max(i, 0)]
	}
	for _, r := range rs {
		m.Reserved = append(m.Reserved, Span{Off: rel(r.Ptr), Size: r.Size})
	}
	for _, b := range blocks {
		if b.Size > 0 && b.Ptr >= base {
			m.Blocks = append(m.Blocks, Span{Off: rel(b.Ptr), Size: b.Size})
		}
	}
	return m
}

// MinCapacity returns the smallest pool Limit, a multiple of step (default
// 2 MiB), with which c replays t to the end, by bisection between the
// trace's peak live bytes (no pool can do with less) and hi, a Limit known
// to succeed (0: replay unlimited first and use its peak reserved). It
// returns the number of replays it ran. A pool is not strictly monotone
// in its Limit, so the answer is the smallest success the bisection found.
func MinCapacity(ctx context.Context, t *Trace, c Config, o Options, hi, step uint64) (uint64, int, error) {
	if step == 0 {
		step = 2 << 20
	}
	o.Samples, o.AddressMap = -1, false
	runs := 0
	if hi == 0 {
		o.Limit = 0
		r, err := Run(ctx, t, c, o)
		runs++
		if err != nil {
			return 0, runs, err
		}
		hi = r.PeakReserved
	}
	hi = (hi + step - 1) / step * step
	lo := t.PeakLive / step * step // fails unless the peak is a multiple of step...
	if lo == 0 || lo >= hi {
		return hi, runs, nil
	}
	// Invariant: hi succeeds; lo is below anything that can succeed or has
	// failed.
	if t.PeakLive%step == 0 {
		lo -= step
	}
	for hi-lo > step {
		mid := lo + (hi-lo)/2/step*step
		o.Limit = mid
		_, err := Run(ctx, t, c, o)
		runs++
		switch {
		case err == nil:
			hi = mid
		case errors.Is(err, pool.ErrOutOfMemory):
			lo = mid
		default:
			return 0, runs, err
		}
	}
	return hi, runs, nil
}
