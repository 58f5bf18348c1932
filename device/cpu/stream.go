package cpu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/memwall/memwall/device"
)

// stream is an ordered queue of work run by its own goroutine.
type stream struct {
	id   device.Stream
	mu   sync.Mutex
	cond sync.Cond // signals new work to the goroutine and completions to waiters
	// queue is the work not yet started; submitted and completed count
	// work items, so that a waiter knows when everything queued before it
	// has run.
	queue                []func() error
	submitted, completed uint64
	err                  error // first error since it was last reported
	stopping             bool  // destroyed or closed: drain, then exit
	exited               bool
}

func (d *Device) newStream(id device.Stream) *stream {
	st := &stream{id: id}
	st.cond.L = &st.mu
	d.live.Add(1)
	go st.loop(&d.live)
	return st
}

func (st *stream) loop(live *sync.WaitGroup) {
	defer live.Done()
	// A kernel that writes read-only memory faults; as a panic on this
	// goroutine it fails the launch instead of the process.
	debug.SetPanicOnFault(true)
	st.mu.Lock()
	defer st.mu.Unlock()
	for {
		for len(st.queue) == 0 && !st.stopping {
			st.cond.Wait()
		}
		if len(st.queue) == 0 {
			st.exited = true
			st.cond.Broadcast()
			return
		}
		f := st.queue[0]
		st.queue[0] = nil
		st.queue = st.queue[1:]
		st.mu.Unlock()
		err := safely(f)
		st.mu.Lock()
		if err != nil && st.err == nil {
			st.err = err
		}
		st.completed++
		st.cond.Broadcast()
	}
}

// safely runs f, turning a panic into its error.
func safely(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cpu: stream work panicked: %v: %w", r, device.ErrInvalid)
		}
	}()
	return f()
}

func (st *stream) submit(f func() error) {
	st.mu.Lock()
	st.queue = append(st.queue, f)
	st.submitted++
	st.mu.Unlock()
	st.cond.Broadcast()
}

// wait blocks until the work queued so far has run.
func (st *stream) wait() {
	st.mu.Lock()
	defer st.mu.Unlock()
	for n := st.submitted; st.completed < n; {
		st.cond.Wait()
	}
}

// takeErr returns and clears the stream's error.
func (st *stream) takeErr() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	err := st.err
	st.err = nil
	return err
}

// stop makes the goroutine exit once the queue is empty, and returns the
// error not yet reported.
func (st *stream) stop() error {
	st.mu.Lock()
	st.stopping = true
	st.mu.Unlock()
	st.cond.Broadcast()
	st.wait()
	return st.takeErr()
}

// stream returns the live stream s; the caller holds d.mu.
func (d *Device) stream(s device.Stream) (*stream, error) {
	st := d.streams[s]
	if st == nil {
		return nil, fmt.Errorf("cpu: unknown stream %d: %w", uint64(s), device.ErrInvalid)
	}
	return st, nil
}

// queue checks the device and stream, then queues f on it.
func (d *Device) queue(s device.Stream, f func() error) error {
	if err := d.enter(); err != nil {
		return err
	}
	st, err := d.stream(s)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	st.submit(f)
	return nil
}

// NewStream starts a stream.
func (d *Device) NewStream() (device.Stream, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	s := device.Stream(d.handle())
	d.streams[s] = d.newStream(s)
	return s, nil
}

// DestroyStream forgets s; the work queued on it still runs (Synchronize
// waits for it) and an error it raises is dropped.
func (d *Device) DestroyStream(s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	st, err := d.stream(s)
	if err == nil {
		delete(d.streams, s)
		d.retired = append(d.retired, st)
	}
	d.mu.Unlock()
	if err != nil {
		return err
	}
	st.mu.Lock()
	st.stopping = true
	st.mu.Unlock()
	st.cond.Broadcast()
	return nil
}

// StreamSynchronize waits for the work queued on s and returns the first
// error it raised since the last one reported.
func (d *Device) StreamSynchronize(s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	st, err := d.stream(s)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	st.wait()
	return st.takeErr()
}

// StreamQuery reports whether the work queued on s has run; when it has,
// it returns (and clears) the error it raised.
func (d *Device) StreamQuery(s device.Stream) (bool, error) {
	if err := d.enter(); err != nil {
		return false, err
	}
	st, err := d.stream(s)
	d.mu.Unlock()
	if err != nil {
		return false, err
	}
	st.mu.Lock()
	done := st.completed == st.submitted
	st.mu.Unlock()
	if !done {
		return false, nil
	}
	return true, st.takeErr()
}

// Synchronize waits for the work of every stream (destroyed ones
// included) and joins the errors of the live ones.
func (d *Device) Synchronize() error {
	if err := d.enter(); err != nil {
		return err
	}
	live := make([]*stream, 0, len(d.streams))
	for _, st := range d.streams {
		live = append(live, st)
	}
	retired := d.pruneRetired()
	d.mu.Unlock()
	var errs []error
	for _, st := range retired {
		st.wait()
	}
	for _, st := range live {
		st.wait()
		errs = append(errs, st.takeErr())
	}
	return errors.Join(errs...)
}

// idle waits for the work of every stream without taking their errors (a
// free waits for the work that may use the memory).
func (d *Device) idle() {
	d.mu.Lock()
	all := d.pruneRetired()
	for _, st := range d.streams {
		all = append(all, st)
	}
	d.mu.Unlock()
	for _, st := range all {
		st.wait()
	}
}

// pruneRetired drops destroyed streams whose goroutine exited and returns
// the others; the caller holds d.mu.
func (d *Device) pruneRetired() []*stream {
	keep := d.retired[:0]
	for _, st := range d.retired {
		st.mu.Lock()
		done := st.exited
		st.mu.Unlock()
		if !done {
			keep = append(keep, st)
		}
	}
	clear(d.retired[len(keep):])
	d.retired = keep
	return append([]*stream(nil), keep...)
}

// event is an event handle; mark is its latest record.
type event struct {
	timing bool
	mark   *marker
}

// marker is one EventRecord: done closes when the work before it has run,
// at says when (set before done closes).
type marker struct {
	done chan struct{}
	at   time.Time
}

func (m *marker) reached() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

func (d *Device) event(e device.Event) (*event, error) {
	ev := d.events[e]
	if ev == nil {
		return nil, fmt.Errorf("cpu: unknown event %d: %w", uint64(e), device.ErrInvalid)
	}
	return ev, nil
}

// NewEvent creates an event; with timing, EventElapsed measures between
// two of them (wall time when each was reached).
func (d *Device) NewEvent(timing bool) (device.Event, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	e := device.Event(d.handle())
	d.events[e] = &event{timing: timing}
	return e, nil
}

// DestroyEvent forgets e; streams already waiting on it keep waiting for
// its record.
func (d *Device) DestroyEvent(e device.Event) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	if _, err := d.event(e); err != nil {
		return err
	}
	delete(d.events, e)
	return nil
}

// EventRecord captures the work queued on s so far.
func (d *Device) EventRecord(e device.Event, s device.Stream) error {
	m := &marker{done: make(chan struct{})}
	st, _, err := d.eventOn(e, s, func(ev *event) { ev.mark = m })
	if err != nil {
		return err
	}
	st.submit(func() error {
		m.at = time.Now()
		close(m.done)
		return nil
	})
	return nil
}

// StreamWaitEvent makes later work on s wait for e's latest record at the
// time of the call; an event never recorded is no wait.
func (d *Device) StreamWaitEvent(s device.Stream, e device.Event) error {
	st, m, err := d.eventOn(e, s, nil)
	if err != nil || m == nil {
		return err
	}
	st.submit(func() error {
		<-m.done
		return nil
	})
	return nil
}

// eventOn looks up event e and stream s, calls set (when not nil) on the
// event under the device's lock, and returns the stream and the event's
// latest record then.
func (d *Device) eventOn(e device.Event, s device.Stream, set func(*event)) (*stream, *marker, error) {
	if err := d.enter(); err != nil {
		return nil, nil, err
	}
	defer d.mu.Unlock()
	ev, err := d.event(e)
	if err != nil {
		return nil, nil, err
	}
	st, err := d.stream(s)
	if err != nil {
		return nil, nil, err
	}
	if set != nil {
		set(ev)
	}
	return st, ev.mark, nil
}

// markOf returns e's latest record (nil when never recorded).
func (d *Device) markOf(e device.Event) (*marker, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	ev, err := d.event(e)
	if err != nil {
		return nil, err
	}
	return ev.mark, nil
}

// EventQuery reports whether the work e captured has run (true for an
// event never recorded).
func (d *Device) EventQuery(e device.Event) (bool, error) {
	m, err := d.markOf(e)
	if err != nil || m == nil {
		return err == nil, err
	}
	return m.reached(), nil
}

// EventSynchronize waits for the work e captured.
func (d *Device) EventSynchronize(e device.Event) error {
	m, err := d.markOf(e)
	if err != nil || m == nil {
		return err
	}
	<-m.done
	return nil
}

// EventElapsed returns the wall time between two reached timing events;
// an event created without timing fails with ErrInvalid, one not yet
// reached (or never recorded) with ErrNotReady.
func (d *Device) EventElapsed(start, end device.Event) (time.Duration, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	a, err1 := d.event(start)
	b, err2 := d.event(end)
	if err := errors.Join(err1, err2); err != nil {
		d.mu.Unlock()
		return 0, err
	}
	timing, ma, mb := a.timing && b.timing, a.mark, b.mark
	d.mu.Unlock()
	if !timing {
		return 0, fmt.Errorf("cpu: elapsed time: an event created without timing: %w", device.ErrInvalid)
	}
	if ma == nil || mb == nil || !ma.reached() || !mb.reached() {
		return 0, fmt.Errorf("cpu: elapsed time: %w", device.ErrNotReady)
	}
	return mb.at.Sub(ma.at), nil
}

// CopyHtoD queues copying src to dst on s; src is read when the copy runs.
// A dst range the device cannot write fails at once with ErrInvalid.
func (d *Device) CopyHtoD(dst device.Ptr, src []byte, s device.Stream) error {
	return d.hostCopy("copy host to device", dst, src, true, s)
}

// CopyDtoH queues copying len(dst) bytes at src into dst on s.
func (d *Device) CopyDtoH(dst []byte, src device.Ptr, s device.Stream) error {
	return d.hostCopy("copy device to host", src, dst, false, s)
}

// hostCopy queues a copy between host slice h and the len(h) bytes at p:
// into p when toDevice, else out of it.
func (d *Device) hostCopy(what string, p device.Ptr, h []byte, toDevice bool, s device.Stream) error {
	n := uint64(len(h))
	if n == 0 {
		return d.checkStream(s)
	}
	if _, err := d.mem.bytes(p, n, toDevice); err != nil {
		return fmt.Errorf("cpu: %s: %w", what, err)
	}
	return d.queue(s, func() error {
		b, err := d.mem.bytes(p, n, toDevice)
		switch {
		case err != nil:
		case toDevice:
			copy(b, h)
		default:
			copy(h, b)
		}
		return err
	})
}

// CopyDtoD queues copying n bytes from src to dst on s (overlapping
// ranges move as memmove does).
func (d *Device) CopyDtoD(dst, src device.Ptr, n uint64, s device.Stream) error {
	if n == 0 {
		return d.checkStream(s)
	}
	if _, err := d.mem.bytes(src, n, false); err != nil {
		return fmt.Errorf("cpu: copy device to device (source): %w", err)
	}
	if _, err := d.mem.bytes(dst, n, true); err != nil {
		return fmt.Errorf("cpu: copy device to device (destination): %w", err)
	}
	return d.queue(s, func() error {
		from, err := d.mem.bytes(src, n, false)
		if err != nil {
			return err
		}
		to, err := d.mem.bytes(dst, n, true)
		if err == nil {
			copy(to, from)
		}
		return err
	})
}

// Memset8 queues setting n bytes at dst to v on s.
func (d *Device) Memset8(dst device.Ptr, v byte, n uint64, s device.Stream) error {
	return d.memset(dst, [4]byte{v, v, v, v}, n, s)
}

// Memset32 queues setting count 32-bit words at dst (4-byte aligned) to v
// on s.
func (d *Device) Memset32(dst device.Ptr, v uint32, count uint64, s device.Stream) error {
	if dst%4 != 0 {
		return fmt.Errorf("cpu: memset32 at %#x: address not 4-byte aligned: %w", uint64(dst), device.ErrInvalid)
	}
	if count > (1<<64-1)/4 {
		return fmt.Errorf("cpu: memset32 of %d words: too many: %w", count, device.ErrInvalid)
	}
	var w [4]byte
	binary.LittleEndian.PutUint32(w[:], v)
	return d.memset(dst, w, 4*count, s)
}

func (d *Device) memset(dst device.Ptr, w [4]byte, n uint64, s device.Stream) error {
	if n == 0 {
		return d.checkStream(s)
	}
	if _, err := d.mem.bytes(dst, n, true); err != nil {
		return fmt.Errorf("cpu: memset: %w", err)
	}
	return d.queue(s, func() error {
		b, err := d.mem.bytes(dst, n, true)
		if err != nil {
			return err
		}
		copy(b, w[:])
		for f := min(4, len(b)); f < len(b); f *= 2 {
			copy(b[f:], b[:f])
		}
		return nil
	})
}

// checkStream fails for an unknown stream (an empty copy is a no-op on a
// valid one).
func (d *Device) checkStream(s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	_, err := d.stream(s)
	return err
}
