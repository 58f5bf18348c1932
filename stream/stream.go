// Package stream runs a model whose weights do not fit in device memory:
// the groups a plan.WeightPlan keeps resident are uploaded once, the others
// are copied layer by layer through a ring of device staging slots while the
// previous layers compute.
//
// Two streams do the work. The copy stream moves a streamed group into its
// slot after waiting on the event that marks the end of the compute that
// last used the slot; the compute stream waits on the copy's event before
// multiplying the group's weight matrices by the activation. Within a step
// the host only submits work: every dependency is an event on the device.
//
// The host side of a copy is, in order of preference, the model file's
// read-only mapping registered as pinned memory in place, a copy of the
// streamed bytes in pinned host memory (package pool's host pool), or, when
// host memory is short, pinned bounce buffers the host refills from the
// mapping (the only mode with the host in the loop).
//
// Each step multiplies every weight matrix of every group by a Tokens × K
// activation with package kernels (GEMV for decode-sized steps, GEMM for
// prefill-sized ones) and times every copy, product and wait with device
// events. The first step of Run is a warm-up whose products are checked
// against a float64 reference on sampled rows.
package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/pool"
)

// Source is where streamed bytes are copied from.
type Source int

// Sources. Auto picks Register when the device can register read-only host
// memory, else Pinned when the streamed bytes fit Options.HostBytes, else
// Bounce; a Register or Pinned that fails falls back to the next.
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
	return Auto, fmt.Errorf("stream: unknown source %q (want auto, registered-mmap, pinned-copy or bounce)", s)
}

// Options configure a Streamer. Kernels is required.
type Options struct {
	// Kernels runs the products (kernels.Load on the same device).
	Kernels *kernels.Set
	// Source selects the host side of the copies (default Auto).
	Source Source
	// HostBytes is the pinned host memory the Pinned source may take
	// (0: no limit). Auto streams through bounce buffers when the
	// streamed bytes exceed it.
	HostBytes uint64
	// BounceBytes is the size of one bounce buffer (default 64 MiB) and
	// Bounces their number (default 3).
	BounceBytes uint64
	Bounces     int
	// Seed makes the activation values (default 1).
	Seed uint64
	// NoVerify skips checking the warm-up step's products. Verification is
	// also skipped, with a reason in the report, on a simulated device
	// that keeps no data.
	NoVerify bool
	// VerifyRows is the number of activation rows checked at each end of
	// a product (default 4), VerifySamples the outputs checked per product
	// (default 256).
	VerifyRows, VerifySamples int
	// Logger receives debug logs (nil: silent).
	Logger *slog.Logger
	// Registerer gets the streamer's metrics (nil: none). They are
	// unregistered by Close.
	Registerer prometheus.Registerer
	// Progress, when set, is called after each step of Run with the steps
	// done and the total (warm-up included).
	Progress func(done, total int)

	// Test hooks: drop the compute stream's wait on the copy, or the copy
	// stream's wait on the slot's previous compute; verify every product.
	noComputeWait, noSlotWait, verifyAll bool
}

// ErrVerify is matched by a Run error when a checked product differs from
// its reference (the error also matches kernels.ErrMismatch).
var ErrVerify = errors.New("stream: product check failed")

// groupRun is a group's device state.
type groupRun struct {
	plan.GroupPlan
	base     device.Ptr   // resident region, or the slot while streaming
	host     [][]byte     // per extent: the pinned (registered or copied) source, nil in bounce mode
	copyBeg  device.Event // streamed only
	copyEnd  device.Event
	compWait device.Event // before the compute stream's wait
	compBeg  device.Event
	compEnd  device.Event
}

// Streamer streams one model on one device. Its methods must not be called
// concurrently.
type Streamer struct {
	d      device.Device
	m      *format.Model
	p      *plan.WeightPlan
	o      Options
	log    *slog.Logger
	source Source

	copyS, compS       device.Stream
	stepBeg, stepEnd   device.Event
	groups             []groupRun
	slots              []device.Ptr
	slotLast           []device.Event // compute-end event of the group that last used each slot
	x                  map[string]device.Ptr
	xHost              map[string][]byte
	y                  device.Ptr
	allocs             []device.Ptr
	registered         []*device.HostBuffer
	hostPool           *pool.Pool
	hostBlocks         []pool.Block
	bounce             []*device.HostBuffer
	bounceDone         []device.Event
	bounceNext         int
	events             []device.Event
	baseFree, peakUsed uint64
	uploadTime         time.Duration
	metrics            *metrics
	closed             bool
}

// New prepares p's plan for m on d: allocates every plan allocation,
// registers or copies the host sources, uploads the resident groups and the
// activation. The plan must have been made from m's tensors. On failure
// everything allocated so far is released. Close releases it all.
func New(ctx context.Context, d device.Device, m *format.Model, p *plan.WeightPlan, o Options) (*Streamer, error) {
	if o.Kernels == nil {
		return nil, errors.New("stream: Options.Kernels is nil")
	}
	if p == nil || len(p.Groups) == 0 {
		return nil, errors.New("stream: empty plan")
	}
	if o.BounceBytes == 0 {
		o.BounceBytes = 64 << 20
	}
	if o.Bounces <= 0 {
		o.Bounces = 3
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.VerifyRows <= 0 {
		o.VerifyRows = 4
	}
	if o.VerifySamples <= 0 {
		o.VerifySamples = 256
	}
	lg := o.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	s := &Streamer{d: d, m: m, p: p, o: o, log: lg, x: map[string]device.Ptr{}, xHost: map[string][]byte{}}
	if err := s.init(ctx); err != nil {
		return nil, errors.Join(err, s.release())
	}
	return s, nil
}

func (s *Streamer) init(ctx context.Context) error {
	d := s.d
	free, _, err := d.MemInfo()
	if err != nil {
		return fmt.Errorf("stream: memory info: %w", err)
	}
	s.baseFree = free
	if s.copyS, err = d.NewStream(); err != nil {
		return fmt.Errorf("stream: copy stream: %w", err)
	}
	if s.compS, err = d.NewStream(); err != nil {
		return fmt.Errorf("stream: compute stream: %w", err)
	}
	ev := func() (device.Event, error) {
		e, err := d.NewEvent(true)
		if err != nil {
			return 0, fmt.Errorf("stream: event: %w", err)
		}
		s.events = append(s.events, e)
		return e, nil
	}
	if s.stepBeg, err = ev(); err != nil {
		return err
	}
	if s.stepEnd, err = ev(); err != nil {
		return err
	}
	// Every allocation of the plan, in its order.
	byName := map[string]device.Ptr{}
	for _, a := range s.p.Allocations {
		ptr, err := d.Alloc(a.Bytes)
		if err != nil {
			return fmt.Errorf("stream: allocate %s %s (%d bytes): %w", a.Purpose, a.Name, a.Bytes, err)
		}
		s.allocs = append(s.allocs, ptr)
		byName[a.Purpose+"/"+a.Name] = ptr
	}
	s.sampleMem()
	for dt := range s.p.XBytes {
		s.x[dt] = byName[plan.PurposeActivation+"/x."+dt]
	}
	s.y = byName[plan.PurposeActivation+"/y"]
	for i := range s.p.Slots {
		s.slots = append(s.slots, byName[fmt.Sprintf("%s/slot.%d", plan.PurposeStaging, i)])
		s.slotLast = append(s.slotLast, 0)
	}
	s.groups = make([]groupRun, len(s.p.Groups))
	for i, g := range s.p.Groups {
		r := &s.groups[i]
		r.GroupPlan = g
		if g.Resident {
			r.base = byName[plan.PurposeWeights+"/"+g.Name]
		} else {
			if r.copyBeg, err = ev(); err != nil {
				return err
			}
			if r.copyEnd, err = ev(); err != nil {
				return err
			}
		}
		for _, e := range []*device.Event{&r.compWait, &r.compBeg, &r.compEnd} {
			if *e, err = ev(); err != nil {
				return err
			}
		}
	}
	if err := s.prepareSource(); err != nil {
		return err
	}
	if err := s.uploadActivation(); err != nil {
		return err
	}
	t0 := time.Now()
	if err := s.uploadResident(ctx); err != nil {
		return err
	}
	s.uploadTime = time.Since(t0)
	if s.o.Registerer != nil {
		s.metrics = newMetrics()
		if err := s.metrics.register(s.o.Registerer); err != nil {
			s.metrics = nil
			return fmt.Errorf("stream: register metrics: %w", err)
		}
	}
	return nil
}

// sampleMem updates the peak of device memory in use since New began, as
// the device reports it.
func (s *Streamer) sampleMem() {
	free, _, err := s.d.MemInfo()
	if err != nil || free > s.baseFree {
		return
	}
	s.peakUsed = max(s.peakUsed, s.baseFree-free)
}

// extentBytes returns the mapped file bytes of an extent, or an error
// naming the file when they are not in the model's mappings.
func (s *Streamer) extentBytes(e plan.Extent) ([]byte, error) {
	b := s.m.Data(format.Tensor{File: e.File, Offset: e.Offset, Bytes: e.Bytes})
	if b == nil || uint64(len(b)) != e.Bytes {
		return nil, fmt.Errorf("stream: %s: bytes [%d, %d) are not in the model's mappings", e.File, e.Offset, e.Offset+e.Bytes)
	}
	return b, nil
}

// prepareSource chooses and sets up the host side of the streamed copies.
func (s *Streamer) prepareSource() error {
	var streamed []int
	for i := range s.groups {
		if !s.groups[i].Resident {
			streamed = append(streamed, i)
		}
	}
	if len(streamed) == 0 {
		s.source = Auto
		return nil
	}
	want := s.o.Source
	info := s.d.Info()
	if want == Auto {
		switch {
		case info.ReadOnlyHostRegister:
			want = Register
		case s.o.HostBytes == 0 || s.p.StreamedBytes <= s.o.HostBytes:
			want = Pinned
		default:
			want = Bounce
		}
	}
	if want == Register {
		err := s.register(streamed)
		if err == nil {
			s.source = Register
			return nil
		}
		if s.o.Source == Register {
			return err
		}
		s.log.Debug("stream: registering the mapped file failed, copying to pinned memory", "err", err)
		s.unregister()
		want = Pinned
		if s.o.HostBytes != 0 && s.p.StreamedBytes > s.o.HostBytes {
			want = Bounce
		}
	}
	if want == Pinned {
		err := s.copyPinned(streamed)
		if err == nil {
			s.source = Pinned
			return nil
		}
		if s.o.Source == Pinned {
			return err
		}
		s.log.Debug("stream: pinned copy failed, using bounce buffers", "err", err)
		s.freePinned()
	}
	s.source = Bounce
	return s.makeBounce()
}

// register page-locks, per file, the page-aligned range of the mapping
// that holds every extent, read-only, and points each streamed extent at
// it. The range covers the resident extents too: a copy whose source
// straddles the edge of a registered range (a resident tensor sharing a
// page with a streamed one) is refused by the driver (seen on the H200:
// CUDA_ERROR_INVALID_VALUE uploading model.norm.weight).
func (s *Streamer) register(streamed []int) error {
	type span struct{ lo, hi uint64 }
	spans := map[string]*span{}
	for i := range s.groups {
		for _, e := range s.groups[i].Extents {
			sp := spans[e.File]
			if sp == nil {
				sp = &span{lo: e.Offset, hi: e.Offset + e.Bytes}
				spans[e.File] = sp
			}
			sp.lo, sp.hi = min(sp.lo, e.Offset), max(sp.hi, e.Offset+e.Bytes)
		}
	}
	const page = 4096
	base := map[string][]byte{}
	baseOff := map[string]uint64{}
	for _, f := range slices.Sorted(maps.Keys(spans)) {
		sp := spans[f]
		// Whole pages where the mapping allows (the driver pins pages).
		lo := sp.lo / page * page
		b := s.m.Data(format.Tensor{File: f, Offset: lo, Bytes: wAlign(sp.hi, page) - lo})
		if b == nil {
			b = s.m.Data(format.Tensor{File: f, Offset: lo, Bytes: sp.hi - lo})
		}
		if b == nil {
			return fmt.Errorf("stream: %s: range [%d, %d) is not mapped", f, lo, sp.hi)
		}
		t0 := time.Now()
		// Read-only because the mapping is PROT_READ; device-mapped as
		// in the path measured on the H200 (the copies do not need it).
		hb, err := s.d.HostRegister(b, device.RegisterReadOnly|device.RegisterDeviceMap)
		if err != nil {
			return fmt.Errorf("stream: register %d bytes of %s read-only: %w", len(b), f, err)
		}
		s.log.Debug("stream: registered mapped file", "file", f, "bytes", len(b), "took", time.Since(t0))
		s.registered = append(s.registered, hb)
		base[f], baseOff[f] = hb.Bytes, lo
	}
	for _, i := range streamed {
		g := &s.groups[i]
		g.host = make([][]byte, len(g.Extents))
		for j, e := range g.Extents {
			off := e.Offset - baseOff[e.File]
			g.host[j] = base[e.File][off : off+e.Bytes : off+e.Bytes]
		}
	}
	return nil
}

func (s *Streamer) unregister() error {
	var errs []error
	for _, hb := range s.registered {
		if err := s.d.HostFree(hb); err != nil {
			errs = append(errs, fmt.Errorf("stream: unregister: %w", err))
		}
	}
	s.registered = nil
	for i := range s.groups {
		s.groups[i].host = nil
	}
	return errors.Join(errs...)
}

// copyPinned copies every streamed group into a pinned host block.
func (s *Streamer) copyPinned(streamed []int) error {
	var need uint64
	for _, i := range streamed {
		need += wAlign(s.groups[i].Copy, 2<<20)
	}
	hp, err := pool.NewHost(s.d, pool.Options{Name: "stream-host", NoCache: true, Limit: need + 4<<20, ChunkBytes: 2 << 20})
	if err != nil {
		return fmt.Errorf("stream: pinned host pool: %w", err)
	}
	s.hostPool = hp
	for _, i := range streamed {
		g := &s.groups[i]
		blk, err := hp.Alloc(g.Copy, pool.AllocOptions{Purpose: pool.Staging})
		if err != nil {
			return fmt.Errorf("stream: pinned copy of %s (%d bytes): %w", g.Name, g.Copy, err)
		}
		s.hostBlocks = append(s.hostBlocks, blk)
		blkBytes := blk.Bytes()
		g.host = make([][]byte, len(g.Extents))
		var off uint64
		for j, e := range g.Extents {
			src, err := s.extentBytes(e)
			if err != nil {
				return err
			}
			dst := blkBytes[off : off+e.Bytes : off+e.Bytes]
			parallelCopy(dst, src)
			g.host[j] = dst
			off += e.Bytes
		}
	}
	return nil
}

func (s *Streamer) freePinned() error {
	var errs []error
	for _, b := range s.hostBlocks {
		if err := s.hostPool.Free(b); err != nil {
			errs = append(errs, err)
		}
	}
	s.hostBlocks = nil
	if s.hostPool != nil {
		if err := s.hostPool.Close(); err != nil {
			errs = append(errs, err)
		}
		s.hostPool = nil
	}
	for i := range s.groups {
		s.groups[i].host = nil
	}
	return errors.Join(errs...)
}

func (s *Streamer) makeBounce() error {
	for range s.o.Bounces {
		hb, err := s.d.HostAlloc(s.o.BounceBytes)
		if err != nil {
			return fmt.Errorf("stream: bounce buffer of %d bytes: %w", s.o.BounceBytes, err)
		}
		s.bounce = append(s.bounce, hb)
		e, err := s.d.NewEvent(false)
		if err != nil {
			return fmt.Errorf("stream: bounce event: %w", err)
		}
		s.events = append(s.events, e)
		s.bounceDone = append(s.bounceDone, e)
	}
	return nil
}

// parallelCopy copies src into dst (same length) with a few goroutines:
// one core does not saturate memory bandwidth, and page faults on a fresh
// mapping are serialised per thread.
func parallelCopy(dst, src []byte) {
	const part = 32 << 20
	if len(src) <= part {
		copy(dst, src)
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for off := 0; off < len(src); off += part {
		end := min(off+part, len(src))
		sem <- struct{}{}
		wg.Go(func() {
			copy(dst[off:end], src[off:end])
			<-sem
		})
	}
	wg.Wait()
}

// uploadActivation fills each activation buffer with random values in
// [-1, 1) and keeps the host copy for verification.
func (s *Streamer) uploadActivation() error {
	r := rand.New(rand.NewPCG(s.o.Seed, s.o.Seed^0x5851F42D4C957F2D))
	for _, dt := range slices.Sorted(maps.Keys(s.p.XBytes)) {
		n := s.p.XBytes[dt] / uint64(dtSize(dt))
		vals := make([]float32, n)
		for i := range vals {
			vals[i] = r.Float32()*2 - 1
		}
		b, err := kernels.Encode(dt, vals)
		if err != nil {
			return fmt.Errorf("stream: activation: %w", err)
		}
		if err := s.d.CopyHtoD(s.x[dt], b, s.compS); err != nil {
			return fmt.Errorf("stream: upload activation %s: %w", dt, err)
		}
		s.xHost[dt] = b
	}
	if err := s.d.StreamSynchronize(s.compS); err != nil {
		return fmt.Errorf("stream: upload activation: %w", err)
	}
	return nil
}

func dtSize(dt string) int {
	n, _ := kernels.ElemSize(dt)
	return max(n, 1)
}

// uploadResident copies the resident groups into their regions, from the
// mapped file (pageable) on the copy stream.
func (s *Streamer) uploadResident(ctx context.Context) error {
	for i := range s.groups {
		g := &s.groups[i]
		if !g.Resident {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		for _, e := range g.Extents {
			src, err := s.extentBytes(e)
			if err != nil {
				return err
			}
			if err := s.d.CopyHtoD(g.base.Add(e.DevOffset), src, s.copyS); err != nil {
				return fmt.Errorf("stream: upload %s: %w", g.Name, err)
			}
		}
		// Pageable copies may be staged by the driver; bound what is
		// queued so host memory stays flat.
		if err := s.d.StreamSynchronize(s.copyS); err != nil {
			return fmt.Errorf("stream: upload %s: %w", g.Name, err)
		}
	}
	return nil
}

// SourceUsed returns the host source the streamer settled on (Auto when
// nothing streams).
func (s *Streamer) SourceUsed() Source { return s.source }

// check is one product whose result rows are read back for verification.
type check struct {
	group  int
	mm     plan.Matmul
	blocks []rowBlock
}

type rowBlock struct {
	t0, rows int
	raw      []byte
}

// enqueueStep submits one step. checks, when non-nil, receives the
// products read back for verification.
func (s *Streamer) enqueueStep(verify map[int]bool, checks *[]check) error {
	d := s.d
	T := uint32(s.p.Tokens)
	if err := d.EventRecord(s.stepBeg, s.compS); err != nil {
		return fmt.Errorf("stream: record: %w", err)
	}
	if err := d.StreamWaitEvent(s.copyS, s.stepBeg); err != nil {
		return fmt.Errorf("stream: wait: %w", err)
	}
	for i := range s.groups {
		g := &s.groups[i]
		if !g.Resident {
			slot := s.slots[g.Slot]
			g.base = slot
			if last := s.slotLast[g.Slot]; last != 0 && !s.o.noSlotWait {
				if err := d.StreamWaitEvent(s.copyS, last); err != nil {
					return fmt.Errorf("stream: %s: wait for slot %d: %w", g.Name, g.Slot, err)
				}
			}
			if err := d.EventRecord(g.copyBeg, s.copyS); err != nil {
				return fmt.Errorf("stream: record: %w", err)
			}
			for j, e := range g.Extents {
				if g.host != nil {
					if err := d.CopyHtoD(slot.Add(e.DevOffset), g.host[j], s.copyS); err != nil {
						return fmt.Errorf("stream: copy %s: %w", g.Name, err)
					}
					continue
				}
				if err := s.bounceCopy(slot.Add(e.DevOffset), e); err != nil {
					return fmt.Errorf("stream: copy %s: %w", g.Name, err)
				}
			}
			if err := d.EventRecord(g.copyEnd, s.copyS); err != nil {
				return fmt.Errorf("stream: record: %w", err)
			}
		}
		if err := d.EventRecord(g.compWait, s.compS); err != nil {
			return fmt.Errorf("stream: record: %w", err)
		}
		if !g.Resident && !s.o.noComputeWait {
			if err := d.StreamWaitEvent(s.compS, g.copyEnd); err != nil {
				return fmt.Errorf("stream: %s: wait for copy: %w", g.Name, err)
			}
		}
		if err := d.EventRecord(g.compBeg, s.compS); err != nil {
			return fmt.Errorf("stream: record: %w", err)
		}
		for _, mm := range g.Matmuls {
			if err := s.o.Kernels.Matmul(mm.DType, g.base.Add(mm.DevOffset), s.x[mm.DType], s.y,
				uint32(mm.M), uint32(mm.K), T, s.compS); err != nil {
				return fmt.Errorf("stream: %s: %s: %w", g.Name, mm.Tensor, err)
			}
			if checks != nil && (verify[i] || s.o.verifyAll) {
				c, err := s.readBack(i, mm)
				if err != nil {
					return err
				}
				*checks = append(*checks, c)
			}
		}
		if err := d.EventRecord(g.compEnd, s.compS); err != nil {
			return fmt.Errorf("stream: record: %w", err)
		}
		if !g.Resident {
			s.slotLast[g.Slot] = g.compEnd
		}
	}
	if err := d.EventRecord(s.stepEnd, s.compS); err != nil {
		return fmt.Errorf("stream: record: %w", err)
	}
	return nil
}

// bounceCopy stages one extent through the bounce buffers: for each chunk
// the host waits until the buffer's previous copy is done, refills it from
// the mapping and queues its copy.
func (s *Streamer) bounceCopy(dst device.Ptr, e plan.Extent) error {
	src, err := s.extentBytes(e)
	if err != nil {
		return err
	}
	for off := uint64(0); off < e.Bytes; off += s.o.BounceBytes {
		k := s.bounceNext % len(s.bounce)
		s.bounceNext++
		if err := s.d.EventSynchronize(s.bounceDone[k]); err != nil {
			return err
		}
		end := min(off+s.o.BounceBytes, e.Bytes)
		buf := s.bounce[k].Bytes[:end-off]
		parallelCopy(buf, src[off:end])
		if err := s.d.CopyHtoD(dst.Add(off), buf, s.copyS); err != nil {
			return err
		}
		if err := s.d.EventRecord(s.bounceDone[k], s.copyS); err != nil {
			return err
		}
	}
	return nil
}

// readBack queues copies of the first and last VerifyRows result rows of a
// product just queued on the compute stream.
func (s *Streamer) readBack(gi int, mm plan.Matmul) (check, error) {
	T := s.p.Tokens
	r := s.o.VerifyRows
	if s.o.verifyAll {
		r = T
	}
	var spans [][2]int
	if T <= 2*r {
		spans = [][2]int{{0, T}}
	} else {
		spans = [][2]int{{0, r}, {T - r, r}}
	}
	c := check{group: gi, mm: mm}
	M := int(mm.M)
	for _, sp := range spans {
		raw := make([]byte, sp[1]*M*4)
		src := s.y.Add(uint64(sp[0]) * uint64(M) * 4)
		if err := s.d.CopyDtoH(raw, src, s.compS); err != nil {
			return check{}, fmt.Errorf("stream: read back %s: %w", mm.Tensor, err)
		}
		c.blocks = append(c.blocks, rowBlock{t0: sp[0], rows: sp[1], raw: raw})
	}
	return c, nil
}

// verify checks the read-back products against the float64 reference.
func (s *Streamer) verify(checks []check) (int, error) {
	n := 0
	for _, c := range checks {
		t, ok := s.m.Tensor(c.mm.Tensor)
		if !ok {
			return n, fmt.Errorf("stream: verify: tensor %q not in the model", c.mm.Tensor)
		}
		w := s.m.Data(t)
		if w == nil {
			return n, fmt.Errorf("stream: verify: tensor %q: data not mapped", c.mm.Tensor)
		}
		elt := dtSize(c.mm.DType)
		K := int(c.mm.K)
		x := s.xHost[c.mm.DType]
		for _, b := range c.blocks {
			y := make([]float32, len(b.raw)/4)
			for i := range y {
				y[i] = math.Float32frombits(uint32(b.raw[4*i]) | uint32(b.raw[4*i+1])<<8 | uint32(b.raw[4*i+2])<<16 | uint32(b.raw[4*i+3])<<24)
			}
			xs := x[b.t0*K*elt : (b.t0+b.rows)*K*elt]
			if err := kernels.CheckMatmul(c.mm.DType, w, xs, y, int(c.mm.M), K, b.rows, s.o.VerifySamples, s.o.Seed+uint64(n)); err != nil {
				return n, fmt.Errorf("%w: group %s, tensor %q, rows %d..%d: %w", ErrVerify, s.groups[c.group].Name, c.mm.Tensor, b.t0, b.t0+b.rows-1, err)
			}
		}
		n++
	}
	return n, nil
}

// LayerTiming is one group's device times in a step.
type LayerTiming struct {
	Group    string  `json:"group"`
	Streamed bool    `json:"streamed"`
	Bytes    uint64  `json:"copy_bytes,omitempty"`
	Copy     float64 `json:"copy_seconds"`
	Compute  float64 `json:"compute_seconds"`
	// Stall is how long the compute stream waited for the group's copy.
	Stall float64 `json:"stall_seconds"`
}

// StepReport is one step's device times.
type StepReport struct {
	Seconds        float64 `json:"seconds"`
	CopySeconds    float64 `json:"copy_seconds"`
	ComputeSeconds float64 `json:"compute_seconds"`
	StallSeconds   float64 `json:"stall_seconds"`
	// GBps is streamed bytes over the step time; Overlap is max(copy,
	// compute) over the step time (1 is perfect overlap).
	GBps    float64       `json:"achieved_GBps"`
	Overlap float64       `json:"overlap_efficiency"`
	Layers  []LayerTiming `json:"layers,omitempty"`
}

// Step runs one step and returns its timings (after waiting for it).
func (s *Streamer) Step(ctx context.Context) (StepReport, error) {
	return s.step(ctx, nil, nil)
}

func (s *Streamer) step(ctx context.Context, verify map[int]bool, checks *[]check) (StepReport, error) {
	if s.closed {
		return StepReport{}, errors.New("stream: streamer closed")
	}
	if err := ctx.Err(); err != nil {
		return StepReport{}, err
	}
	if err := s.enqueueStep(verify, checks); err != nil {
		// Let queued work finish before the caller frees anything.
		return StepReport{}, errors.Join(err, s.d.Synchronize())
	}
	if err := s.d.StreamSynchronize(s.compS); err != nil {
		return StepReport{}, fmt.Errorf("stream: step: %w", err)
	}
	if err := s.d.StreamSynchronize(s.copyS); err != nil {
		return StepReport{}, fmt.Errorf("stream: step: %w", err)
	}
	s.sampleMem()
	el := func(a, b device.Event) (float64, error) {
		t, err := s.d.EventElapsed(a, b)
		if err != nil {
			return 0, fmt.Errorf("stream: event timing: %w", err)
		}
		return max(t.Seconds(), 0), nil
	}
	var rep StepReport
	var err error
	if rep.Seconds, err = el(s.stepBeg, s.stepEnd); err != nil {
		return rep, err
	}
	rep.Layers = make([]LayerTiming, len(s.groups))
	for i := range s.groups {
		g := &s.groups[i]
		lt := LayerTiming{Group: g.Name, Streamed: !g.Resident}
		if !g.Resident {
			lt.Bytes = g.Copy
			if lt.Copy, err = el(g.copyBeg, g.copyEnd); err != nil {
				return rep, err
			}
			if lt.Stall, err = el(g.compWait, g.compBeg); err != nil {
				return rep, err
			}
		}
		if lt.Compute, err = el(g.compBeg, g.compEnd); err != nil {
			return rep, err
		}
		rep.CopySeconds += lt.Copy
		rep.ComputeSeconds += lt.Compute
		rep.StallSeconds += lt.Stall
		rep.Layers[i] = lt
	}
	if rep.Seconds > 0 {
		rep.GBps = float64(s.p.StreamedBytes) / rep.Seconds / 1e9
		rep.Overlap = max(rep.CopySeconds, rep.ComputeSeconds) / rep.Seconds
	}
	if s.metrics != nil {
		s.metrics.observe(rep, s.p.StreamedBytes)
	}
	return rep, nil
}

// Report is the result of Run.
type Report struct {
	Source string `json:"source"`
	// UploadSeconds is the wall time of the resident upload in New.
	UploadSeconds float64 `json:"upload_seconds"`
	// PeakBytes is the most device memory in use since New began, as the
	// device reports it (free memory at New minus free memory after
	// allocation and after each step).
	PeakBytes uint64 `json:"peak_bytes"`
	// Medians over the timed steps (the warm-up excluded).
	SecondsPerStep        float64 `json:"seconds_per_step"`
	CopySecondsPerStep    float64 `json:"copy_seconds_per_step"`
	ComputeSecondsPerStep float64 `json:"compute_seconds_per_step"`
	StallSecondsPerStep   float64 `json:"stall_seconds_per_step"`
	AchievedGBps          float64 `json:"achieved_GBps"`
	OverlapEfficiency     float64 `json:"overlap_efficiency"`
	// Verified is true when the warm-up step's checked products matched
	// the reference; Checked counts them; VerifyNote says why nothing was
	// checked.
	Verified   bool   `json:"verified"`
	Checked    int    `json:"checked_products"`
	VerifyNote string `json:"verify_note,omitempty"`
	// Warmup is the warm-up step; Steps the timed ones; Layers the mean
	// per-group times over the timed steps.
	Warmup StepReport    `json:"warmup"`
	Steps  []StepReport  `json:"steps"`
	Layers []LayerTiming `json:"layers"`
}

// Run runs a warm-up step, whose products are verified, and then steps
// timed steps (at least 1). A product that fails its check ends the run
// with an error matching ErrVerify and kernels.ErrMismatch.
func (s *Streamer) Run(ctx context.Context, steps int) (*Report, error) {
	if steps < 1 {
		return nil, fmt.Errorf("stream: steps = %d, want at least 1", steps)
	}
	rep := &Report{Source: s.source.String(), UploadSeconds: s.uploadTime.Seconds()}
	if len(s.p.Streamed()) == 0 {
		rep.Source = "none (all resident)"
	}
	verify := map[int]bool{}
	note := s.verifyNote()
	if note == "" {
		// The first resident group with products, and the first and last
		// streamed ones (different slots when there are two).
		first := true
		var lastStreamed = -1
		for i, g := range s.groups {
			if len(g.Matmuls) == 0 {
				continue
			}
			if g.Resident && first {
				verify[i], first = true, false
			}
			if !g.Resident {
				if lastStreamed < 0 {
					verify[i] = true
				}
				lastStreamed = i
			}
		}
		if lastStreamed >= 0 {
			verify[lastStreamed] = true
		}
	}
	var checks []check
	var err error
	var cp *[]check
	if note == "" {
		cp = &checks
	}
	rep.Warmup, err = s.step(ctx, verify, cp)
	if err != nil {
		return nil, err
	}
	if s.o.Progress != nil {
		s.o.Progress(1, steps+1)
	}
	if note == "" {
		n, err := s.verify(checks)
		rep.Checked = n
		if err != nil {
			return rep, err
		}
		rep.Verified = n > 0
		if n == 0 {
			rep.VerifyNote = "no products to check (no bf16/f16/f32 matrices)"
		}
	} else {
		rep.VerifyNote = note
	}
	for k := range steps {
		st, err := s.step(ctx, nil, nil)
		if err != nil {
			return rep, err
		}
		rep.Steps = append(rep.Steps, st)
		if s.o.Progress != nil {
			s.o.Progress(k+2, steps+1)
		}
	}
	med := func(f func(StepReport) float64) float64 {
		v := make([]float64, len(rep.Steps))
		for i, st := range rep.Steps {
			v[i] = f(st)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	rep.SecondsPerStep = med(func(r StepReport) float64 { return r.Seconds })
	rep.CopySecondsPerStep = med(func(r StepReport) float64 { return r.CopySeconds })
	rep.ComputeSecondsPerStep = med(func(r StepReport) float64 { return r.ComputeSeconds })
	rep.StallSecondsPerStep = med(func(r StepReport) float64 { return r.StallSeconds })
	rep.OverlapEfficiency = med(func(r StepReport) float64 { return r.Overlap })
	if rep.SecondsPerStep > 0 {
		rep.AchievedGBps = float64(s.p.StreamedBytes) / rep.SecondsPerStep / 1e9
	}
	rep.Layers = make([]LayerTiming, len(s.groups))
	for i := range s.groups {
		lt := LayerTiming{Group: s.groups[i].Name, Streamed: !s.groups[i].Resident}
		for _, st := range rep.Steps {
			l := st.Layers[i]
			lt.Bytes = l.Bytes
			lt.Copy += l.Copy / float64(len(rep.Steps))
			lt.Compute += l.Compute / float64(len(rep.Steps))
			lt.Stall += l.Stall / float64(len(rep.Steps))
		}
		rep.Layers[i] = lt
	}
	for i := range rep.Steps {
		rep.Steps[i].Layers = nil // kept in Layers as means
	}
	rep.PeakBytes = s.peakUsed
	return rep, nil
}

// verifyNote says why products cannot be checked on this device, or "".
func (s *Streamer) verifyNote() string {
	if s.o.NoVerify {
		return "verification off"
	}
	if sd, ok := s.d.(*sim.Device); ok && !sd.Options().Backing {
		return "simulated device without backing bytes: products are timed, not computed"
	}
	return ""
}

// PeakBytes returns the most device memory in use since New began.
func (s *Streamer) PeakBytes() uint64 { return s.peakUsed }

// Close waits for queued work and releases every device and host resource.
// It returns the first errors met; calling it twice is a no-op.
func (s *Streamer) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	return s.release()
}

func (s *Streamer) release() error {
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if s.copyS != 0 {
		keep(s.d.StreamSynchronize(s.copyS))
	}
	if s.compS != 0 {
		keep(s.d.StreamSynchronize(s.compS))
	}
	if s.metrics != nil {
		s.metrics.unregister(s.o.Registerer)
		s.metrics = nil
	}
	for _, p := range s.allocs {
		keep(s.d.Free(p))
	}
	s.allocs = nil
	keep(s.unregister())
	keep(s.freePinned())
	for _, b := range s.bounce {
		keep(s.d.HostFree(b))
	}
	s.bounce = nil
	for _, e := range s.events {
		keep(s.d.DestroyEvent(e))
	}
	s.events = nil
	for _, st := range []*device.Stream{&s.copyS, &s.compS} {
		if *st != 0 {
			keep(s.d.DestroyStream(*st))
			*st = 0
		}
	}
	return errors.Join(errs...)
}

func wAlign(x, a uint64) uint64 { return (x + a - 1) / a * a }
