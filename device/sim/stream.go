package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/memwall/memwall/device"
)

type opKind uint8

const (
	opHtoD opKind = iota
	opDtoH
	opDtoD
	opMemset8
	opMemset32
	opKernel
	opWait  // waits for another stream's progress
	opDelay // only takes time
)

// engine indexes the engines' free times.
type engine int

const (
	engNone engine = iota - 1
	engHtoD
	engDtoH
	engCompute
	numEngines
)

// op is one queued operation.
type op struct {
	kind       opKind
	gseq       uint64 // submission order across the device
	start, end time.Duration
	eng        engine
	dst, src   device.Ptr
	host       []byte
	n          uint64
	val        uint32
	launch     *launch
	wait       mark
}

// mark is a point in a stream's work: its first seq operations.
type mark struct {
	s   *stream
	seq uint64
}

func (m mark) done() bool { return m.s == nil || m.s.completed >= m.seq }

type stream struct {
	id                  device.Stream
	q                   []*op
	head                int
	submitted           uint64
	completed           uint64
	cursor              time.Duration // end of the latest submitted work
	err                 error         // first unreported error
	destroyed, inActive bool
}

func (s *stream) idle() bool { return s.head == len(s.q) }

type event struct {
	timing   bool
	recorded bool
	rec      mark
	time     time.Duration
}

// scheduler is the execution state, guarded by Device.mu.
type scheduler struct {
	streams   map[device.Stream]*stream
	events    map[device.Event]*event
	active    []*stream // streams with queued work, in creation order
	pending   int
	gseq      uint64
	hostClock time.Duration
	free      [numEngines]time.Duration
	rng       *rand.Rand
	orphans   []error   // errors of destroyed streams, for Synchronize
	ready     []*stream // scratch for Shuffle
}

func (x *scheduler) init(o Options) {
	x.streams = map[device.Stream]*stream{}
	x.events = map[device.Event]*event{}
	x.rng = rand.New(rand.NewPCG(o.Seed, o.Seed^0x9E3779B97F4A7C15))
}

// transfer returns the time to move n bytes at gbps GB/s (bytes per ns).
func transfer(n uint64, gbps float64) time.Duration {
	return time.Duration(math.Round(float64(n) / gbps))
}

func (d *Device) stream(s device.Stream) (*stream, error) {
	st := d.exec.streams[s]
	if st == nil {
		return nil, fmt.Errorf("sim: unknown stream %d: %w", uint64(s), device.ErrInvalid)
	}
	return st, nil
}

func (d *Device) event(e device.Event) (*event, error) {
	ev := d.exec.events[e]
	if ev == nil {
		return nil, fmt.Errorf("sim: unknown event %d: %w", uint64(e), device.ErrInvalid)
	}
	return ev, nil
}

// submit times o on st and queues it (see the package documentation for the
// time model), then runs work if too much is queued.
func (d *Device) submit(st *stream, o *op, eng engine, dur time.Duration) {
	x := &d.exec
	slot := eng
	if eng == engDtoH && d.o.CopyEngines < 2 {
		slot = engHtoD
	}
	start := max(st.cursor, x.hostClock)
	if slot != engNone {
		start = max(start, x.free[slot])
	}
	o.eng = eng
	o.start, o.end = start, start+dur
	st.cursor = o.end
	if slot != engNone {
		x.free[slot] = o.end
	}
	x.gseq++
	o.gseq = x.gseq
	st.q = append(st.q, o)
	st.submitted++
	x.pending++
	if !st.inActive {
		st.inActive = true
		x.active = append(x.active, st)
	}
	for x.pending > d.o.MaxPending && d.step() {
	}
}

// runnable reports whether st's next operation can run now.
func (st *stream) runnable() bool {
	if st.idle() {
		return false
	}
	o := st.q[st.head]
	return o.kind != opWait || o.wait.done()
}

// step runs one queued operation and reports whether there was one.
func (d *Device) step() bool {
	x := &d.exec
	var pick *stream
	if d.o.Shuffle {
		x.ready = x.ready[:0]
		for _, st := range x.active {
			if st.runnable() {
				x.ready = append(x.ready, st)
			}
		}
		if len(x.ready) > 0 {
			pick = x.ready[x.rng.IntN(len(x.ready))]
		}
		clear(x.ready)
	} else {
		for _, st := range x.active {
			if !st.runnable() {
				continue
			}
			if pick == nil {
				pick = st
				continue
			}
			a, b := st.q[st.head], pick.q[pick.head]
			if a.start < b.start || a.start == b.start && a.gseq < b.gseq {
				pick = st
			}
		}
	}
	if pick == nil {
		return false // nothing queued (dependencies always point to earlier work, so never a deadlock)
	}
	o := pick.q[pick.head]
	pick.q[pick.head] = nil
	pick.head++
	if err := d.run(o); err != nil {
		if pick.destroyed {
			x.orphans = append(x.orphans, err)
		} else if pick.err == nil {
			pick.err = err
		}
	}
	pick.completed++
	x.pending--
	if o.end > d.stats.Now {
		d.stats.Now = o.end
	}
	switch {
	case pick.idle():
		pick.q, pick.head = pick.q[:0], 0
		pick.inActive = false
		for i, st := range x.active {
			if st == pick {
				x.active = append(x.active[:i], x.active[i+1:]...)
				break
			}
		}
	case pick.head >= 256 && pick.head*2 >= len(pick.q):
		n := copy(pick.q, pick.q[pick.head:])
		clear(pick.q[n:])
		pick.q, pick.head = pick.q[:n], 0
	}
	return true
}

// runUntil runs queued work until done reports true or nothing is queued.
func (d *Device) runUntil(done func() bool) {
	for !done() && d.step() {
	}
}

// drain runs all queued work and advances the host clock past it.
func (d *Device) drain() {
	d.runUntil(func() bool { return d.exec.pending == 0 })
	d.observe(d.stats.Now)
}

// observe advances the host clock: the host has seen work complete at t.
func (d *Device) observe(t time.Duration) {
	if t > d.exec.hostClock {
		d.exec.hostClock = t
	}
}

// NewStream creates an empty stream.
func (d *Device) NewStream() (device.Stream, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	s := device.Stream(d.handle())
	d.exec.streams[s] = &stream{id: s}
	return s, nil
}

// DestroyStream invalidates s at once; its queued work still runs, and its
// errors are reported by Synchronize. An unknown stream fails with ErrInvalid.
func (d *Device) DestroyStream(s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	st, err := d.stream(s)
	if err != nil {
		return err
	}
	delete(d.exec.streams, s)
	st.destroyed = true
	if st.err != nil {
		d.exec.orphans = append(d.exec.orphans, st.err)
		st.err = nil
	}
	return nil
}

// takeErr returns and clears st's unreported error.
func (st *stream) takeErr() error {
	err := st.err
	st.err = nil
	return err
}

// StreamSynchronize runs s's queued work (and what it depends on) and
// returns the first error raised on s since it was last reported.
func (d *Device) StreamSynchronize(s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	st, err := d.stream(s)
	if err != nil {
		return err
	}
	d.runUntil(st.idle)
	d.observe(st.cursor)
	return st.takeErr()
}

// StreamQuery reports whether s has no queued work, then runs one queued
// operation if it had. When it reports true it also returns (and clears)
// s's unreported error.
func (d *Device) StreamQuery(s device.Stream) (bool, error) {
	if err := d.enter(); err != nil {
		return false, err
	}
	defer d.mu.Unlock()
	st, err := d.stream(s)
	if err != nil {
		return false, err
	}
	if !st.idle() {
		d.step()
		return false, nil
	}
	d.observe(st.cursor)
	return true, st.takeErr()
}

// StreamWaitEvent makes later work on s wait for the work captured by e's
// latest record; a never-recorded e is a no-op. Unknown handles fail with
// ErrInvalid.
func (d *Device) StreamWaitEvent(s device.Stream, e device.Event) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	st, err := d.stream(s)
	if err != nil {
		return err
	}
	ev, err := d.event(e)
	if err != nil {
		return err
	}
	if !ev.recorded {
		return nil
	}
	st.cursor = max(st.cursor, ev.time)
	if ev.rec.done() || ev.rec.s == st {
		return nil // already satisfied, or implied by stream order
	}
	o := &op{kind: opWait, wait: ev.rec}
	d.submit(st, o, engNone, 0)
	return nil
}

// NewEvent creates an unrecorded event.
func (d *Device) NewEvent(timing bool) (device.Event, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	e := device.Event(d.handle())
	d.exec.events[e] = &event{timing: timing}
	return e, nil
}

// DestroyEvent invalidates e; waits already made on it are unaffected.
func (d *Device) DestroyEvent(e device.Event) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if _, err := d.event(e); err != nil {
		return err
	}
	delete(d.exec.events, e)
	return nil
}

// EventRecord captures the work submitted to s so far. The event's time is
// the end of that work (or the host clock, if later).
func (d *Device) EventRecord(e device.Event, s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	ev, err := d.event(e)
	if err != nil {
		return err
	}
	st, err := d.stream(s)
	if err != nil {
		return err
	}
	st.cursor = max(st.cursor, d.exec.hostClock)
	ev.recorded = true
	ev.rec = mark{s: st, seq: st.submitted}
	ev.time = st.cursor
	return nil
}

// EventQuery reports whether e's captured work has completed (true for a
// never-recorded event), then runs one queued operation if it had not.
func (d *Device) EventQuery(e device.Event) (bool, error) {
	if err := d.enter(); err != nil {
		return false, err
	}
	defer d.mu.Unlock()
	ev, err := d.event(e)
	if err != nil {
		return false, err
	}
	if !ev.rec.done() {
		d.step()
		return false, nil
	}
	if ev.recorded {
		d.observe(ev.time)
	}
	return true, nil
}

// EventSynchronize runs queued work until e's captured work has completed.
// It does not report errors raised by that work (StreamSynchronize does).
func (d *Device) EventSynchronize(e device.Event) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	ev, err := d.event(e)
	if err != nil {
		return err
	}
	d.runUntil(ev.rec.done)
	if ev.recorded {
		d.observe(ev.time)
	}
	return nil
}

// EventElapsed returns end's time minus start's. Both must be timing events
// (else ErrInvalid), recorded (else ErrInvalid) and completed (else
// ErrNotReady).
func (d *Device) EventElapsed(start, end device.Event) (time.Duration, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	var evs [2]*event
	for i, e := range [2]device.Event{start, end} {
		ev, err := d.event(e)
		if err != nil {
			return 0, err
		}
		switch {
		case !ev.timing:
			return 0, fmt.Errorf("sim: elapsed time: event %d was created without timing: %w", uint64(e), device.ErrInvalid)
		case !ev.recorded:
			return 0, fmt.Errorf("sim: elapsed time: event %d was never recorded: %w", uint64(e), device.ErrInvalid)
		case !ev.rec.done():
			return 0, fmt.Errorf("sim: elapsed time: event %d has not completed: %w", uint64(e), device.ErrNotReady)
		}
		evs[i] = ev
	}
	return evs[1].time - evs[0].time, nil
}

// Synchronize runs all queued work and returns the unreported errors of all
// streams (destroyed ones included), joined in stream order.
func (d *Device) Synchronize() error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	d.drain()
	errs := d.exec.orphans
	d.exec.orphans = nil
	ids := make([]device.Stream, 0, len(d.exec.streams))
	for id, st := range d.exec.streams {
		if st.err != nil {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		errs = append(errs, d.exec.streams[id].takeErr())
	}
	return errors.Join(errs...)
}

// Delay makes later work on s start at least dur of simulated time after the
// work already submitted to s ends, without occupying an engine. Fault
// injection uses it to slow copies down.
func (d *Device) Delay(s device.Stream, dur time.Duration) error {
	if dur < 0 {
		return fmt.Errorf("sim: delay of %v: %w", dur, device.ErrInvalid)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	st, err := d.stream(s)
	if err != nil {
		return err
	}
	d.submit(st, &op{kind: opDelay}, engNone, dur)
	return nil
}
