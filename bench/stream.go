package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/residency"
)

// The streaming benchmark (memwall stream): a model whose weights do not
// fit in its budget runs over package residency, which uploads the
// resident groups and streams the others through its ring of slots, while
// this benchmark multiplies every weight matrix of every group by a Tokens
// × K activation of random values with package kernels (GEMV for
// decode-sized steps, GEMM for prefill-sized ones) on its own compute
// stream, and times every copy, product and wait with device events. The
// first step is a warm-up whose products are checked against a float64
// reference on sampled rows. Steps follow each other as decode steps do:
// the host waits for each step's products, while residency's copy stream
// already fills the ring with the next step's first groups.

// StreamOptions configure Stream. Kernels is required.
type StreamOptions struct {
	// Kernels runs the products (kernels.Load on the same device).
	Kernels *kernels.Set
	// Residency configures the weights' placement (source, prefetch,
	// bounce buffers). Timing is turned on.
	Residency residency.Options
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
	// ContextBytes is the device memory the process holds outside the
	// pools (the context's own and what was loaded since:
	// residency.Budget's ContextBytes + LoadedBytes), added to the
	// measured peak for the footprint figure.
	ContextBytes uint64
	// PoolHistory is the allocations and frees each pool keeps for the
	// snapshot of an out-of-memory error (pool.Options.History; 0: none).
	PoolHistory int
	// OnPoolEvent, when set, receives every allocation and free of the
	// device pool (pool.Options.OnEvent; a trace.EventLog's Record records
	// them for memwall replay).
	OnPoolEvent func(pool.Event)
	// Logger receives debug logs (nil: silent).
	Logger *slog.Logger
	// Progress, when set, is called after each step with the steps done
	// and the total (warm-up included).
	Progress func(done, total int)

	// Test hooks: drop the compute stream's wait on the copy; verify
	// every product.
	noComputeWait, verifyAll bool
}

// ErrVerify is matched by a Stream error when a checked product differs
// from its reference (the error also matches kernels.ErrMismatch).
var ErrVerify = errors.New("bench: stream: product check failed")

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
	// compute) over the step time (1 is perfect overlap; a step can show
	// a little more, since the ring fills with its first groups during the
	// step before).
	GBps    float64       `json:"achieved_GBps"`
	Overlap float64       `json:"overlap_efficiency"`
	Layers  []LayerTiming `json:"layers,omitempty"`
}

// StreamReport is the result of Stream.
type StreamReport struct {
	Source   string `json:"source"`
	Slots    int    `json:"slots"`
	Prefetch int    `json:"prefetch"`
	// UploadSeconds is the wall time of the resident upload.
	UploadSeconds float64 `json:"upload_seconds"`
	// PeakBytes is the most device memory taken since Stream began, as the
	// device reports it (free memory at the start minus free memory after
	// setting up and after each step): the pools' reserved bytes and the
	// driver's own for them. FootprintBytes adds the memory outside the
	// pools (StreamOptions.ContextBytes): the process's figure in
	// nvidia-smi.
	PeakBytes      uint64 `json:"peak_bytes"`
	ContextBytes   uint64 `json:"context_bytes"`
	FootprintBytes uint64 `json:"peak_footprint_bytes"`
	// DeviceFootprintBytes is the most residency.Footprint read after
	// setting up and after each step: the process's device memory as the
	// driver reports it, whatever took it (0 when the device cannot say).
	DeviceFootprintBytes uint64 `json:"device_footprint_bytes,omitempty"`
	// Residency's counts at the end.
	Residency residency.Stats `json:"residency"`
	// Medians over the timed steps (the warm-up excluded); the overlap is
	// max(copy, compute) over the step of these medians.
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

// streamRun is one run of Stream.
type streamRun struct {
	d     device.Device
	m     *format.Model
	p     *plan.WeightPlan
	o     StreamOptions
	dev   *pool.Pool
	host  *pool.Pool
	r     *residency.Residency
	compS device.Stream

	x      map[string]device.Ptr
	xHost  map[string][]byte
	y      device.Ptr
	blocks []pool.Block
	events []device.Event

	stepBeg, stepEnd          device.Event
	compWait, compBeg, compEn []device.Event
	copyNo                    []uint64 // per group: the copy number acquired in the current step
	viewOf                    [][]int  // per group, per matmul: the index of its tensor's view

	baseFree, peakUsed, peakFootprint uint64
}

// Stream runs p's plan for m on d over package residency for a warm-up
// step, whose products are verified, and steps timed steps (at least 1).
// It creates a device pool and a pinned host pool of its own (holding the
// plan's KV cache bytes, which no step uses, so that the peak is the
// plan's) and gives every byte back before it returns. The plan must have been made from m's
// tensors. A product that fails its check ends the run with an error
// matching ErrVerify and kernels.ErrMismatch.
func Stream(ctx context.Context, d device.Device, m *format.Model, p *plan.WeightPlan, steps int, o StreamOptions) (*StreamReport, error) {
	switch {
	case o.Kernels == nil:
		return nil, errors.New("bench: stream: StreamOptions.Kernels is nil")
	case p == nil || len(p.Groups) == 0:
		return nil, errors.New("bench: stream: empty plan")
	case steps < 1:
		return nil, fmt.Errorf("bench: stream: steps = %d, want at least 1", steps)
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
	o.Residency.Timing = true
	if o.Residency.Logger == nil {
		o.Residency.Logger = o.Logger
	}
	s := &streamRun{d: d, m: m, p: p, o: o, x: map[string]device.Ptr{}, xHost: map[string][]byte{}}
	rep, err := s.run(ctx, steps)
	if cerr := s.close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return rep, nil
}

func (s *streamRun) setup(ctx context.Context) error {
	d := s.d
	free, _, err := d.MemInfo()
	if err != nil {
		return fmt.Errorf("bench: stream: memory info: %w", err)
	}
	s.baseFree = free
	// Few blocks, most of them large: small ones among the large keep the
	// pages mapped close to the plan's bytes.
	// On a device without virtual memory the pool grows by chunks: chunks
	// of the plan's 2 MiB granule keep what it reserves to the plan's bytes
	// (the default 32 MiB chunk would reserve more than a small budget).
	if s.dev, err = pool.New(d, pool.Options{Name: "stream", SmallMax: pool.Off, ChunkBytes: 2 << 20, History: s.o.PoolHistory, OnEvent: s.o.OnPoolEvent}); err != nil {
		return fmt.Errorf("bench: stream: device pool: %w", err)
	}
	ro := s.o.Residency
	bounce := ro.BounceBytes
	if bounce == 0 {
		bounce = 64 << 20
	}
	hostLimit := s.p.StreamedBytes + uint64(max(ro.Bounces, 3))*bounce + 16<<20
	if s.host, err = pool.NewHost(d, pool.Options{Name: "stream-host", Cache: pool.CacheOff, Limit: hostLimit, ChunkBytes: 2 << 20, History: s.o.PoolHistory}); err != nil {
		return fmt.Errorf("bench: stream: pinned host pool: %w", err)
	}
	if s.compS, err = d.NewStream(); err != nil {
		return fmt.Errorf("bench: stream: compute stream: %w", err)
	}
	ev := func() (device.Event, error) {
		e, err := d.NewEvent(true)
		if err != nil {
			return 0, fmt.Errorf("bench: stream: event: %w", err)
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
	n := len(s.p.Groups)
	s.compWait, s.compBeg, s.compEn = make([]device.Event, n), make([]device.Event, n), make([]device.Event, n)
	s.copyNo = make([]uint64, n)
	s.viewOf = make([][]int, n)
	for i, g := range s.p.Groups {
		for _, e := range []*device.Event{&s.compWait[i], &s.compBeg[i], &s.compEn[i]} {
			if *e, err = ev(); err != nil {
				return err
			}
		}
		for _, mm := range g.Matmuls {
			k := slices.IndexFunc(g.Tensors, func(t format.Tensor) bool { return t.Name == mm.Tensor })
			if k < 0 {
				return fmt.Errorf("bench: stream: group %s: product tensor %q is not among its tensors", g.Name, mm.Tensor)
			}
			s.viewOf[i] = append(s.viewOf[i], k)
		}
	}
	for _, dt := range slices.Sorted(maps.Keys(s.p.XBytes)) {
		b, err := s.dev.Alloc(s.p.XBytes[dt], pool.AllocOptions{Purpose: pool.Activations})
		if err != nil {
			return fmt.Errorf("bench: stream: activation x.%s (%d bytes): %w", dt, s.p.XBytes[dt], err)
		}
		s.blocks = append(s.blocks, b)
		s.x[dt] = b.Ptr
	}
	if s.p.YBytes > 0 {
		b, err := s.dev.Alloc(s.p.YBytes, pool.AllocOptions{Purpose: pool.Activations})
		if err != nil {
			return fmt.Errorf("bench: stream: result y (%d bytes): %w", s.p.YBytes, err)
		}
		s.blocks = append(s.blocks, b)
		s.y = b.Ptr
	}
	if s.p.KVBytes > 0 {
		// The KV cache the plan reserves (its Ctx) is held, unused, so that
		// the peak measured is the plan's.
		b, err := s.dev.Alloc(s.p.KVBytes, pool.AllocOptions{Purpose: pool.KV})
		if err != nil {
			return fmt.Errorf("bench: stream: KV cache reservation (%d bytes): %w", s.p.KVBytes, err)
		}
		s.blocks = append(s.blocks, b)
	}
	if err := s.uploadActivation(); err != nil {
		return err
	}
	if s.r, err = residency.New(ctx, d, s.dev, s.host, s.m, s.p, s.o.Residency); err != nil {
		return err
	}
	s.sampleMem()
	return nil
}

// uploadActivation fills each activation buffer with random values in
// [-1, 1) and keeps the host copy for verification.
func (s *streamRun) uploadActivation() error {
	r := rand.New(rand.NewPCG(s.o.Seed, s.o.Seed^0x5851F42D4C957F2D))
	for _, dt := range slices.Sorted(maps.Keys(s.p.XBytes)) {
		n := s.p.XBytes[dt] / uint64(dtSize(dt))
		vals := make([]float32, n)
		for i := range vals {
			vals[i] = r.Float32()*2 - 1
		}
		b, err := kernels.Encode(dt, vals)
		if err != nil {
			return fmt.Errorf("bench: stream: activation: %w", err)
		}
		if err := s.d.CopyHtoD(s.x[dt], b, s.compS); err != nil {
			return fmt.Errorf("bench: stream: upload activation %s: %w", dt, err)
		}
		s.xHost[dt] = b
	}
	if err := s.d.StreamSynchronize(s.compS); err != nil {
		return fmt.Errorf("bench: stream: upload activation: %w", err)
	}
	return nil
}

func dtSize(dt string) int {
	n, _ := kernels.ElemSize(dt)
	return max(n, 1)
}

// sampleMem updates the peak of device memory taken since Stream began.
func (s *streamRun) sampleMem() {
	free, _, err := s.d.MemInfo()
	if err != nil || free > s.baseFree {
		return
	}
	s.peakUsed = max(s.peakUsed, s.baseFree-free)
	if fp, ok := residency.Footprint(s.d); ok {
		s.peakFootprint = max(s.peakFootprint, fp)
	}
}

// close waits for the compute stream and gives everything back.
func (s *streamRun) close() error {
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if s.compS != 0 {
		keep(s.d.StreamSynchronize(s.compS))
	}
	if s.r != nil {
		keep(s.r.Close())
		s.r = nil
	}
	for _, b := range s.blocks {
		keep(s.dev.Free(b))
	}
	s.blocks = nil
	for _, e := range s.events {
		keep(s.d.DestroyEvent(e))
	}
	s.events = nil
	if s.compS != 0 {
		keep(s.d.DestroyStream(s.compS))
		s.compS = 0
	}
	for _, p := range []*pool.Pool{s.dev, s.host} {
		if p == nil {
			continue
		}
		if st := p.Stats(); st.UsedBytes != 0 {
			keep(fmt.Errorf("bench: stream: pool %s still holds %d bytes", st.Name, st.UsedBytes))
		}
		keep(p.Close())
	}
	s.dev, s.host = nil, nil
	return errors.Join(errs...)
}

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

// enqueueStep submits one step: for each group, acquire it, wait for its
// copy, multiply its matrices, release it. checks, when non-nil, receives
// the products read back for verification.
func (s *streamRun) enqueueStep(verify map[int]bool, checks *[]check) error {
	d := s.d
	T := uint32(s.p.Tokens)
	if err := d.EventRecord(s.stepBeg, s.compS); err != nil {
		return fmt.Errorf("bench: stream: record: %w", err)
	}
	for i := range s.p.Groups {
		g := &s.p.Groups[i]
		views, ready, err := s.r.Acquire(i)
		if err != nil {
			return err
		}
		if !g.Resident {
			s.copyNo[i] = s.r.Copies(i) - 1
			if s.r.Plan().Groups[i].Resident || s.copyNo[i] > s.r.Copies(i) {
				return fmt.Errorf("bench: stream: group %s: no copy acquired", g.Name)
			}
		}
		if err := d.EventRecord(s.compWait[i], s.compS); err != nil {
			return fmt.Errorf("bench: stream: record: %w", err)
		}
		if ready != 0 && !s.o.noComputeWait {
			if err := d.StreamWaitEvent(s.compS, ready); err != nil {
				return fmt.Errorf("bench: stream: %s: wait for copy: %w", g.Name, err)
			}
		}
		if err := d.EventRecord(s.compBeg[i], s.compS); err != nil {
			return fmt.Errorf("bench: stream: record: %w", err)
		}
		for j, mm := range g.Matmuls {
			w := views[s.viewOf[i][j]].Ptr
			if err := s.o.Kernels.Matmul(mm.DType, w, s.x[mm.DType], s.y, uint32(mm.M), uint32(mm.K), T, s.compS); err != nil {
				return fmt.Errorf("bench: stream: %s: %s: %w", g.Name, mm.Tensor, err)
			}
			if checks != nil && (verify[i] || s.o.verifyAll) {
				c, err := s.readBack(i, mm)
				if err != nil {
					return err
				}
				*checks = append(*checks, c)
			}
		}
		if err := d.EventRecord(s.compEn[i], s.compS); err != nil {
			return fmt.Errorf("bench: stream: record: %w", err)
		}
		if err := s.r.Release(i, s.compEn[i]); err != nil {
			return err
		}
	}
	if err := d.EventRecord(s.stepEnd, s.compS); err != nil {
		return fmt.Errorf("bench: stream: record: %w", err)
	}
	return nil
}

// readBack queues copies of the first and last VerifyRows result rows of a
// product just queued on the compute stream.
func (s *streamRun) readBack(gi int, mm plan.Matmul) (check, error) {
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
			return check{}, fmt.Errorf("bench: stream: read back %s: %w", mm.Tensor, err)
		}
		c.blocks = append(c.blocks, rowBlock{t0: sp[0], rows: sp[1], raw: raw})
	}
	return c, nil
}

// verify checks the read-back products against the float64 reference.
func (s *streamRun) verify(checks []check) (int, error) {
	n := 0
	for _, c := range checks {
		t, ok := s.m.Tensor(c.mm.Tensor)
		if !ok {
			return n, fmt.Errorf("bench: stream: verify: tensor %q not in the model", c.mm.Tensor)
		}
		w := s.m.Data(t)
		if w == nil {
			return n, fmt.Errorf("bench: stream: verify: tensor %q: data not mapped", c.mm.Tensor)
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
				return n, fmt.Errorf("%w: group %s, tensor %q, rows %d..%d: %w", ErrVerify, s.p.Groups[c.group].Name, c.mm.Tensor, b.t0, b.t0+b.rows-1, err)
			}
		}
		n++
	}
	return n, nil
}

// step runs one step and returns its timings once its products are done.
// The copy stream is not waited for: it is already filling the ring with
// the next step's first groups.
func (s *streamRun) step(ctx context.Context, verify map[int]bool, checks *[]check) (StepReport, error) {
	if err := ctx.Err(); err != nil {
		return StepReport{}, err
	}
	if err := s.enqueueStep(verify, checks); err != nil {
		return StepReport{}, err
	}
	if err := s.d.StreamSynchronize(s.compS); err != nil {
		return StepReport{}, fmt.Errorf("bench: stream: step: %w", err)
	}
	s.sampleMem()
	el := func(a, b device.Event) (float64, error) {
		t, err := s.d.EventElapsed(a, b)
		if err != nil {
			return 0, fmt.Errorf("bench: stream: event timing: %w", err)
		}
		return max(t.Seconds(), 0), nil
	}
	var rep StepReport
	var err error
	if rep.Seconds, err = el(s.stepBeg, s.stepEnd); err != nil {
		return rep, err
	}
	rep.Layers = make([]LayerTiming, len(s.p.Groups))
	for i, g := range s.p.Groups {
		lt := LayerTiming{Group: g.Name, Streamed: !g.Resident}
		if !g.Resident {
			lt.Bytes = g.Copy
			cd, err := s.r.CopyDuration(i, s.copyNo[i])
			if err != nil {
				return rep, err
			}
			lt.Copy = max(cd.Seconds(), 0)
			if lt.Stall, err = el(s.compWait[i], s.compBeg[i]); err != nil {
				return rep, err
			}
		}
		if lt.Compute, err = el(s.compBeg[i], s.compEn[i]); err != nil {
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
	return rep, nil
}

// verifyPlan returns the groups whose products the warm-up checks: the
// first resident group with products, and the first and last streamed
// ones (different slots when there are two).
func (s *streamRun) verifyPlan() map[int]bool {
	verify := map[int]bool{}
	first, lastStreamed := true, -1
	for i, g := range s.p.Groups {
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
	return verify
}

func (s *streamRun) run(ctx context.Context, steps int) (*StreamReport, error) {
	if err := s.setup(ctx); err != nil {
		return nil, err
	}
	st := s.r.Stats()
	rep := &StreamReport{Source: st.Source, Slots: st.Slots, Prefetch: st.Prefetch, UploadSeconds: st.UploadSeconds}
	if len(s.p.Streamed()) == 0 {
		rep.Source = "none (all resident)"
	}
	note := s.verifyNote()
	var checks []check
	var cp *[]check
	if note == "" {
		cp = &checks
	}
	var err error
	if rep.Warmup, err = s.step(ctx, s.verifyPlan(), cp); err != nil {
		return nil, err
	}
	if s.o.Progress != nil {
		s.o.Progress(1, steps+1)
	}
	if note == "" {
		n, err := s.verify(checks)
		rep.Checked = n
		if err != nil {
			return nil, err
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
			return nil, err
		}
		rep.Steps = append(rep.Steps, st)
		if s.o.Progress != nil {
			s.o.Progress(k+2, steps+1)
		}
	}
	s.summarize(rep)
	rep.PeakBytes = s.peakUsed
	rep.ContextBytes = s.o.ContextBytes
	rep.FootprintBytes = s.peakUsed + s.o.ContextBytes
	rep.DeviceFootprintBytes = s.peakFootprint
	rep.Residency = s.r.Stats()
	return rep, nil
}

// summarize fills the medians and the per-group means.
func (s *streamRun) summarize(rep *StreamReport) {
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
	if rep.SecondsPerStep > 0 {
		rep.AchievedGBps = float64(s.p.StreamedBytes) / rep.SecondsPerStep / 1e9
		rep.OverlapEfficiency = max(rep.CopySecondsPerStep, rep.ComputeSecondsPerStep) / rep.SecondsPerStep
	}
	rep.Layers = make([]LayerTiming, len(s.p.Groups))
	for i, g := range s.p.Groups {
		lt := LayerTiming{Group: g.Name, Streamed: !g.Resident}
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
}

// verifyNote says why products cannot be checked on this device, or "".
func (s *streamRun) verifyNote() string {
	if s.o.NoVerify {
		return "verification off"
	}
	if sd, ok := s.d.(*sim.Device); ok && !sd.Options().Backing {
		return "simulated device without backing bytes: products are timed, not computed"
	}
	return ""
}

// SteadyStep predicts the device time of one decode step once steps follow
// each other, with the copy of each streamed group issued prefetch groups
// ahead into the ring's slot released longest ago (the plan's slots, at
// least prefetch+1; the ring wrapping into the next step) and the host
// waiting for each step's products: the time of the last of passes simulated steps, from the
// plan's per-group copy and compute times. With prefetch 0 the plan's
// slots less one is used.
func SteadyStep(p *plan.WeightPlan, prefetch, passes int) time.Duration {
	if prefetch <= 0 {
		prefetch = max(p.Slots-1, 1)
	}
	passes = max(passes, 2)
	slots := max(p.Slots, prefetch+1) // residency fills every slot of the ring, the free one released longest ago first
	streamed := p.Streamed()
	if len(streamed) == 0 {
		return p.ComputeTime
	}
	// Copy k goes into the slot of copy k-slots, released when that
	// copy's group has computed; a copy the host issues in a step starts
	// no earlier than the step (the host waited for the one before).
	var copyFree, compEnd, begin, stepTime time.Duration
	var computeEnds []time.Duration // per copy, the compute end of its group
	var readyAt []time.Duration     // per copy, when it ends
	issued := 0
	issue := func() {
		g := p.Groups[streamed[issued%len(streamed)]]
		start := max(copyFree, begin)
		if issued >= slots {
			start = max(start, computeEnds[issued-slots])
		}
		copyFree = start + g.CopyTime
		readyAt = append(readyAt, copyFree)
		computeEnds = append(computeEnds, 0)
		issued++
	}
	used := 0
	for range passes {
		begin = compEnd
		for _, g := range p.Groups {
			if g.Resident {
				compEnd += g.ComputeTime
				continue
			}
			for issued <= used {
				issue()
			}
			compEnd = max(compEnd, readyAt[used]) + g.ComputeTime
			computeEnds[used] = compEnd
			used++
			for issued < used+prefetch && (issued < slots || issued-slots < used) {
				issue()
			}
		}
		stepTime = compEnd - begin
	}
	return stepTime
}
