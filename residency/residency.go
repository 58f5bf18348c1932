// Package residency makes a plan.WeightPlan real on a device: the groups the
// plan keeps resident are uploaded once, the others are copied group by
// group into a ring of device staging slots while earlier groups compute.
// It moves and accounts bytes; it computes nothing.
//
// Every device byte comes from the device pool given to New (purpose
// Weights for resident groups, Staging for the ring); every pinned host
// byte it allocates comes from the pinned host pool (a copy of the streamed
// bytes, or bounce buffers). The host side of a streamed copy is, in order
// of preference, the model file's read-only mapping registered as pinned
// memory in place, a pinned copy of the streamed bytes, or bounce buffers
// the host refills from the mapping (the only mode with the host in the
// loop).
//
// # Acquire and Release
//
// Groups are numbered as in the plan (p.Groups). A caller that computes on
// its own stream does, for each group it needs:
//
//	views, ready, err := r.Acquire(g)   // device views, in p.Groups[g].Tensors order
//	d.StreamWaitEvent(compute, ready)   // ready is 0 for a resident group: no wait
//	... kernels reading views[i].Ptr on compute ...
//	d.EventRecord(done, compute)
//	r.Release(g, done)
//
// The copies run on the residency's own copy stream (CopyStream). A copy
// into a slot waits, on the copy stream, for the done event of the group
// that last occupied the slot: the GPU waits, the host does not.
//
// The ring's rule, which is why it never deadlocks: a slot is free once
// its occupant has been released (or when it holds a group that was copied
// ahead and not yet acquired, which may be dropped). A copy into a slot is
// issued only when the slot is free, so every event a copy waits on was
// recorded before the wait was queued. After every Acquire and Release the
// next Options.Prefetch streamed groups after the last acquired one, in
// cyclic order (decode steps walk the groups again and again, so the ring
// wraps into the next step), are issued into free slots. Acquire of a
// streamed group that is not in a slot issues its copy at once, taking a
// free slot or dropping a copied-ahead group; when every slot holds a group
// acquired and not released, Acquire fails with ErrRingFull instead of
// waiting for a Release that cannot come. Acquire and Release block the
// host only in bounce mode, where refilling a bounce buffer waits for its
// previous copy.
//
// A Residency is not safe for concurrent use: one goroutine drives it.
//
// # Budgets
//
// PlanBudget turns a --vram figure, the process's whole device footprint
// as nvidia-smi shows it, into what the pools may use: the CUDA context's
// own memory (device.ContextMemory) and what the process loaded since
// (kernel modules, library handles: device.FreeAfterContext) are
// subtracted, and a budget above the device's memory is refused. Without a
// figure the budget is the free memory less Margin.
package residency

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/pool"
)

// View is one tensor of an acquired group on the device: Ptr is the
// address of its first byte, Tensor says what it holds (name, dtype,
// shape, bytes; File and Offset are where the bytes came from).
type View struct {
	Ptr    device.Ptr
	Tensor format.Tensor
}

// Source is where streamed bytes are copied from.
type Source int

// Sources. Auto picks Register when the device can register read-only host
// memory, else Pinned when a host pool is given and the streamed bytes fit
// Options.HostBytes, else Bounce; under Auto a Register or Pinned that
// fails falls back to the next. Nothing streams: Auto stays.
const (
	Auto Source = iota
	Register
	Pinned
	Bounce
)

func (s Source) String() string {
	switch s {
	case Register:
		return "registered-mmap"
	case Pinned:
		return "pinned-copy"
	case Bounce:
		return "bounce"
	}
	return "auto"
}

// ParseSource reads a Source name as String writes it.
func ParseSource(s string) (Source, error) {
	for _, v := range []Source{Auto, Register, Pinned, Bounce} {
		if v.String() == s {
			return v, nil
		}
	}
	return Auto, fmt.Errorf("residency: unknown source %q (want auto, registered-mmap, pinned-copy or bounce)", s)
}

// Options configure New. The zero value is usable.
type Options struct {
	// Source selects the host side of the streamed copies (default Auto).
	Source Source
	// Prefetch is how many streamed groups are kept issued ahead of the
	// last acquired one (default: the plan's slots less one, which is 1
	// for the default two slots). It needs Prefetch+1 slots; more than the
	// plan reserved is an error naming both.
	Prefetch int
	// HostBytes caps the pinned host memory a Pinned copy may take (0: no
	// cap beyond the host pool's own limit). Auto streams through bounce
	// buffers when the streamed bytes exceed it.
	HostBytes uint64
	// BounceBytes is the size of one bounce buffer (default 64 MiB) and
	// Bounces their number (default 3).
	BounceBytes uint64
	Bounces     int
	// Timing records device timing events around every streamed copy, for
	// CopyDuration.
	Timing bool
	// Logger receives debug logs (nil: silent).
	Logger *slog.Logger
	// Live prepares for Retarget: every group gets a host source, not
	// only the streamed ones (the registered mapping, a pinned copy of the
	// whole model, or bounce buffers), so that a group demoted later
	// streams at once and one promoted uploads from pinned memory at the
	// link's rate; the source is prepared even when nothing streams yet.
	Live bool

	// Test hook: drop the copy stream's wait for a slot's release, to show
	// that the tests catch a missing dependency.
	noSlotWait bool
}

// Errors; match with errors.Is.
var (
	// ErrRingFull: Acquire of a streamed group while every slot holds a
	// group that is acquired and not released.
	ErrRingFull = errors.New("residency: every staging slot holds an acquired group; release one first")
	// ErrState: Acquire of a group already acquired, Release of one that
	// is not, or a group number outside the plan.
	ErrState = errors.New("residency: bad group state")
	// ErrClosed: the Residency was closed.
	ErrClosed = errors.New("residency: closed")
)

type groupState int

const (
	idle     groupState = iota // streamed, in no slot
	issued                     // streamed, copied (or being copied) into a slot, not acquired
	acquired                   // in a slot (or resident) and handed out
)

// group is one plan group's state.
type group struct {
	plan     *plan.GroupPlan
	resident bool
	block    pool.Block // resident region
	devOff   []uint64   // per tensor: offset in the group's region
	views    []View     // per tensor, for the current placement
	host     [][]byte   // per extent: pinned source (registered or copied); nil in bounce mode
	state    groupState
	slot     int    // -1 when in no slot
	pos      int    // position among streamed groups, -1 when resident
	copies   uint64 // copies issued into slots
	timing   [2][2]device.Event
	acquires uint64 // resident: acquired and not released (resident groups may be held many times)
}

// slot is one staging slot of the ring.
type slot struct {
	block    pool.Block
	occupant int          // group, or -1
	released device.Event // done event of the last released occupant, not yet waited on (0: none)
	ready    device.Event // recorded after the latest copy into the slot
	freedAt  uint64       // release count when the slot was last freed (0: never used)
}

// Residency is a weight plan on a device. See the package documentation.
type Residency struct {
	d      device.Device
	dev    *pool.Pool
	host   *pool.Pool
	m      *format.Model
	p      *plan.WeightPlan
	o      Options
	log    *slog.Logger
	source Source

	copyS    device.Stream
	groups   []group
	streamed []int // group indexes of streamed groups, plan order
	slots    []slot
	events   []device.Event
	last     int // last acquired group, -1 before the first Acquire
	prefetch int

	registered []*device.HostBuffer
	inPlace    bool               // resident groups are views of the registered mapping
	regPtr     map[string]regBase // per file, where its registered range starts
	hostBlocks []pool.Block
	bounce     []pool.Block
	bounceDone []device.Event
	bounceNext int

	stats    Stats
	releases uint64 // Release calls of streamed groups, to order free slots
	failed   error  // a copy failed: the ring's state is unknown
	closed   bool
}

// Stats are a Residency's byte and copy counts.
type Stats struct {
	// Source is the host side of the streamed copies ("none" when nothing
	// streams).
	Source         string `json:"source"`
	Groups         int    `json:"groups"`
	ResidentGroups int    `json:"resident_groups"`
	// ResidentBytes are the device bytes of resident groups (pool block
	// sizes); SlotBytes is one slot's, Slots their number.
	ResidentBytes uint64 `json:"resident_bytes"`
	Slots         int    `json:"slots"`
	SlotBytes     uint64 `json:"slot_bytes"`
	Prefetch      int    `json:"prefetch"`
	// HostBytes are the pinned host bytes taken from the host pool (a
	// pinned copy or bounce buffers); RegisteredBytes the bytes of the
	// mapping registered in place.
	HostBytes       uint64 `json:"host_bytes"`
	RegisteredBytes uint64 `json:"registered_bytes"`
	// InPlaceBytes are the resident groups' bytes read in place from the
	// registered mapping (a device whose memory is host memory): they take
	// no device memory (ResidentBytes excludes them) and count as the
	// file's page cache, not as memory the residency allocated.
	InPlaceBytes uint64 `json:"in_place_bytes"`
	// StreamedBytes are the bytes copied into slots so far, Copies the
	// group copies, Dropped the copied-ahead groups whose slot was taken
	// before they were acquired.
	StreamedBytes uint64 `json:"streamed_bytes"`
	Copies        uint64 `json:"copies"`
	Dropped       uint64 `json:"dropped"`
	// PassBytes are the bytes one pass over every group streams (the
	// plan's StreamedBytes): per decode step.
	PassBytes uint64 `json:"pass_bytes"`
	// UploadSeconds is the wall time of the resident upload in New.
	UploadSeconds float64 `json:"upload_seconds"`
	// MappedBytes are the mapped groups' bytes (plan.WeightGroup.Mapped),
	// read by the device in place from the registered file.
	MappedBytes uint64 `json:"mapped_bytes,omitempty"`
}

// New uploads p's resident groups of m, allocates the ring of staging
// slots and prepares the host side of the streamed copies. dev is the
// device pool every device byte comes from; host, the pinned host pool for
// a pinned copy and bounce buffers, may be nil when the source needs none
// (Register, or nothing streams). The plan must have been made from m's
// tensors. On failure everything taken so far is given back before New
// returns.
func New(ctx context.Context, d device.Device, dev *pool.Pool, host *pool.Pool, m *format.Model, p *plan.WeightPlan, o Options) (*Residency, error) {
	switch {
	case d == nil || dev == nil || m == nil:
		return nil, errors.New("residency: nil device, device pool or model")
	case p == nil || len(p.Groups) == 0:
		return nil, errors.New("residency: empty plan")
	}
	if o.BounceBytes == 0 {
		o.BounceBytes = 64 << 20
	}
	if o.Bounces <= 0 {
		o.Bounces = 3
	}
	lg := o.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	r := &Residency{d: d, dev: dev, host: host, m: m, p: p, o: o, log: lg, last: -1}
	if err := r.init(ctx); err != nil {
		return nil, errors.Join(err, r.release())
	}
	return r, nil
}

func (r *Residency) init(ctx context.Context) error {
	p := r.p
	r.groups = make([]group, len(p.Groups))
	for i := range p.Groups {
		g := &r.groups[i]
		g.plan = &p.Groups[i]
		g.resident = g.plan.Resident
		g.slot, g.pos = -1, -1
		off, err := tensorOffsets(g.plan)
		if err != nil {
			return err
		}
		g.devOff = off
		g.views = make([]View, len(off))
		for j, t := range g.plan.Tensors {
			g.views[j].Tensor = t
		}
		if !g.resident {
			if g.plan.Region > p.SlotBytes {
				return fmt.Errorf("residency: streamed group %s needs %d bytes, the plan's slots hold %d", g.plan.Name, g.plan.Region, p.SlotBytes)
			}
			g.pos = len(r.streamed)
			r.streamed = append(r.streamed, i)
		}
	}
	if len(r.streamed) > 0 {
		if p.Slots < 2 {
			return fmt.Errorf("residency: plan streams %d groups through %d slots, want at least 2", len(r.streamed), p.Slots)
		}
		r.prefetch = r.o.Prefetch
		if r.prefetch <= 0 {
			r.prefetch = p.Slots - 1
		}
		if r.prefetch+1 > p.Slots {
			return fmt.Errorf("residency: Prefetch %d needs %d slots, the plan reserved %d", r.prefetch, r.prefetch+1, p.Slots)
		}
	}
	var err error
	if r.copyS, err = r.d.NewStream(); err != nil {
		return fmt.Errorf("residency: copy stream: %w", err)
	}
	if err := r.placeInPlace(); err != nil {
		return err
	}
	if err := r.placeMapped(); err != nil {
		return err
	}
	if err := r.allocate(); err != nil {
		return err
	}
	if err := r.prepareSource(); err != nil {
		return err
	}
	t0 := time.Now()
	if err := r.uploadResident(ctx); err != nil {
		return err
	}
	r.stats.UploadSeconds = time.Since(t0).Seconds()
	return nil
}

// tensorOffsets places each tensor of a group in its device region: at
// its extent's device offset plus its distance from the extent's start.
func tensorOffsets(g *plan.GroupPlan) ([]uint64, error) {
	off := make([]uint64, len(g.Tensors))
	for j, t := range g.Tensors {
		found := false
		for _, e := range g.Extents {
			if e.File == t.File && t.Offset >= e.Offset && t.Offset-e.Offset <= e.Bytes && t.Bytes <= e.Offset+e.Bytes-t.Offset {
				off[j] = e.DevOffset + (t.Offset - e.Offset)
				found = true
				break
			}
		}
		if !found || off[j]+t.Bytes > g.Region {
			return nil, fmt.Errorf("residency: group %s: tensor %q (%s bytes [%d, %d)) lies in none of the group's extents",
				g.Name, t.Name, t.File, t.Offset, t.Offset+t.Bytes)
		}
	}
	return off, nil
}

func (r *Residency) newEvent(timing bool) (device.Event, error) {
	e, err := r.d.NewEvent(timing)
	if err != nil {
		return 0, fmt.Errorf("residency: event: %w", err)
	}
	r.events = append(r.events, e)
	return e, nil
}

// allocate takes the staging slots and the resident regions from the
// device pool, and the events. The slots, the largest blocks of equal
// size, come first, so that the many resident regions of other sizes pack
// after them instead of leaving holes a slot cannot use.
func (r *Residency) allocate() error {
	if len(r.streamed) > 0 {
		for i := range r.p.Slots {
			b, err := r.devAlloc(r.p.SlotBytes, pool.AllocOptions{Purpose: pool.Staging, Stream: r.copyS})
			if err != nil {
				return fmt.Errorf("residency: staging slot %d of %d (%d bytes): %w", i+1, r.p.Slots, r.p.SlotBytes, err)
			}
			r.slots = append(r.slots, slot{block: b, occupant: -1})
			ev, err := r.newEvent(false)
			if err != nil {
				return err
			}
			r.slots[i].ready = ev
		}
	}
	for i := range r.groups {
		g := &r.groups[i]
		if !g.resident && r.o.Timing {
			for k := range 2 {
				for j := range 2 {
					e, err := r.newEvent(true)
					if err != nil {
						return err
					}
					g.timing[k][j] = e
				}
			}
		}
	}
	// The largest regions first: the small ones then fill what the page
	// rounding of the large ones leaves, where the last large one placed
	// could find only scattered free pages.
	order := make([]int, 0, len(r.groups))
	for i := range r.groups {
		if r.groups[i].resident && r.groups[i].plan.Region > 0 && !r.inPlace && !r.groups[i].plan.Mapped {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(r.groups[b].plan.Region, r.groups[a].plan.Region) })
	for _, i := range order {
		g := &r.groups[i]
		b, err := r.devAlloc(g.plan.Region, pool.AllocOptions{Purpose: pool.Weights})
		if err != nil {
			return fmt.Errorf("residency: resident group %s (%d bytes): %w", g.plan.Name, g.plan.Region, err)
		}
		g.block = b
		r.stats.ResidentBytes += b.Size
		g.place(b.Ptr)
	}
	return nil
}

// place points the group's views at a region starting at base.
func (g *group) place(base device.Ptr) {
	for j := range g.views {
		g.views[j].Ptr = base.Add(g.devOff[j])
	}
}

// extentBytes returns the mapped file bytes of an extent, or an error
// naming the file when they are not in the model's mappings.
func (r *Residency) extentBytes(e plan.Extent) ([]byte, error) {
	b := r.m.Data(format.Tensor{File: e.File, Offset: e.Offset, Bytes: e.Bytes})
	if b == nil || uint64(len(b)) != e.Bytes {
		return nil, fmt.Errorf("residency: %s: bytes [%d, %d) are not in the model's mappings", e.File, e.Offset, e.Offset+e.Bytes)
	}
	return b, nil
}

// uploadResident copies the resident groups on the copy stream and waits
// for them (uploads).
func (r *Residency) uploadResident(ctx context.Context) error {
	return r.uploads(ctx, func(yield func(int) bool) {
		for i := range r.groups {
			if !yield(i) {
				return
			}
		}
	})
}

// uploads copies the resident groups among those of seq into their
// regions (nothing for a streamed group or one read in place) and waits
// for the copies. A group with a pinned host source (Options.Live, or a
// streamed-then-promoted one) is queued behind the others without a wait,
// so the link stays busy; one read from the pageable mapping waits for
// its own copy first, so that what the driver stages for pageable copies
// stays small.
func (r *Residency) uploads(ctx context.Context, seq func(yield func(int) bool)) error {
	queued := ""
	for i := range seq {
		g := &r.groups[i]
		if !g.resident || g.block.Ptr == 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return errors.Join(err, r.d.StreamSynchronize(r.copyS))
		}
		for j, e := range g.plan.Extents {
			src := []byte(nil)
			if g.host != nil {
				src = g.host[j]
			} else {
				var err error
				if src, err = r.extentBytes(e); err != nil {
					return errors.Join(err, r.d.StreamSynchronize(r.copyS))
				}
			}
			if err := r.d.CopyHtoD(g.block.Ptr.Add(e.DevOffset), src, r.copyS); err != nil {
				return errors.Join(fmt.Errorf("residency: upload %s: %w", g.plan.Name, err), r.d.StreamSynchronize(r.copyS))
			}
		}
		queued = g.plan.Name
		if g.host == nil {
			if err := r.d.StreamSynchronize(r.copyS); err != nil {
				return fmt.Errorf("residency: upload %s: %w", g.plan.Name, err)
			}
		}
	}
	if err := r.d.StreamSynchronize(r.copyS); err != nil {
		return fmt.Errorf("residency: uploads up to %s: %w", queued, err)
	}
	return nil
}

// SourceUsed returns the host source settled on (Auto when nothing
// streams).
func (r *Residency) SourceUsed() Source { return r.source }

// CopyStream returns the stream the residency copies on. Callers may wait
// on it through the events Acquire returns; they must not submit work to it.
func (r *Residency) CopyStream() device.Stream { return r.copyS }

// Plan returns the plan the residency was built from.
func (r *Residency) Plan() *plan.WeightPlan { return r.p }

// Stats returns the byte and copy counts.
func (r *Residency) Stats() Stats {
	s := r.stats
	s.Source = r.source.String()
	if len(r.streamed) == 0 && !r.o.Live {
		s.Source = "none"
	}
	s.Groups = len(r.groups)
	s.ResidentGroups = len(r.groups) - len(r.streamed)
	s.Slots = len(r.slots)
	if len(r.slots) > 0 {
		s.SlotBytes = r.slots[0].block.Size
	}
	s.Prefetch = r.prefetch
	s.PassBytes = r.p.StreamedBytes
	return s
}

// Close waits for the copy stream and gives back every byte: the device
// pool's blocks, the host pool's blocks, the registration of the mapping,
// events and the stream. The caller must have finished (or synchronized)
// the compute that reads acquired groups. It returns the errors met;
// calling it twice is a no-op.
func (r *Residency) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	return r.release()
}

func (r *Residency) release() error {
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if r.copyS != 0 {
		keep(r.d.StreamSynchronize(r.copyS))
	}
	for i := range r.groups {
		g := &r.groups[i]
		if g.block.Ptr != 0 || g.block.Size != 0 {
			keep(r.dev.Free(g.block))
			g.block = pool.Block{}
		}
	}
	for i := range r.slots {
		keep(r.dev.Free(r.slots[i].block))
	}
	r.slots = nil
	keep(r.unregister())
	keep(r.freeHost())
	for _, e := range r.events {
		keep(r.d.DestroyEvent(e))
	}
	r.events = nil
	if r.copyS != 0 {
		keep(r.d.DestroyStream(r.copyS))
		r.copyS = 0
	}
	return errors.Join(errs...)
}
