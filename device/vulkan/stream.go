package vulkan

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/memwall/memwall/device"
)

// waitTimeout bounds every host wait on a semaphore: a GPU that has not
// finished queued work in this long is reported, never waited on forever.
const waitTimeout = 10 * time.Minute

// Staging for copies from and to pageable host memory: each stream has up
// to stagingSlots host-visible buffers of stagingBytes, used round robin so
// that copying into one overlaps the DMA from the others.
const (
	stagingSlots = 4
	stagingBytes = 4 << 20
)

type semWait struct{ sem, value uint64 }

type cbUse struct {
	cb     uintptr
	family uint32
	value  uint64
}

type stagingSlot struct {
	a     *allocation
	value uint64 // the stream value after which the slot is free
}

// stream is a timeline semaphore and the command buffers recorded for it.
// Operation k of the stream is one submission that waits for value k-1 and
// signals k.
type stream struct {
	id      device.Stream
	mu      sync.Mutex // serializes the stream's operations
	sem     uint64
	last    atomic.Uint64 // the value the last submission signals
	waits   []semWait     // StreamWaitEvent waits for the next submission
	cq, tq  *queue
	tqs     []*queue  // the copy queues a split copy uses, tq first
	aux     []semWait // per helper queue of a split copy: its semaphore and last value
	lastQ   *queue    // the queue of the last submission (nil: none yet)
	pools   map[uint32]uint64
	free    map[uint32][]uintptr
	flight  []cbUse
	staging [stagingSlots]stagingSlot
}

// event is a captured (semaphore, value); a timing event also owns a
// one-query timestamp pool written by its last record.
type event struct {
	id     device.Event
	timing bool
	mu     sync.Mutex
	sem    uint64
	value  uint64 // 0: never recorded, or recorded on an idle stream
	qpool  uint64
	stamps bool   // the last record wrote a timestamp
	bits   uint32 // the valid timestamp bits of the queue that wrote it
}

func (d *Device) newID() uint64 {
	id := d.nextID
	d.nextID++
	return id
}

// createTimeline makes a timeline semaphore, reusing one from a destroyed
// stream when there is one: its counter only grows, so events captured on
// the old stream stay complete.
func (d *Device) createTimeline() (sem, value uint64, err error) {
	d.mu.Lock()
	if n := len(d.spareSems); n > 0 {
		sem = d.spareSems[n-1]
		d.spareSems = d.spareSems[:n-1]
		d.mu.Unlock()
		return sem, d.counter(sem), nil
	}
	d.mu.Unlock()
	var pn pinned
	defer pn.release()
	ti := &semaphoreTypeCreateInfo{sType: stSemaphoreTypeCreateInfo, kind: semaphoreTimeline}
	ci := &semaphoreCreateInfo{sType: stSemaphoreCreateInfo, pNext: ref(&pn, ti)}
	if err := check("vkCreateSemaphore", call(d.vk.createSemaphore, d.dev, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&sem)))); err != nil {
		return 0, 0, fmt.Errorf("vulkan: %w", err)
	}
	return sem, 0, nil
}

func (d *Device) counter(sem uint64) uint64 {
	var v uint64
	call(d.vk.getSemaphoreCounterValue, d.dev, uintptr(sem), uintptr(unsafe.Pointer(&v)))
	return v
}

// waitValues blocks until every semaphore has reached its value.
func (d *Device) waitValues(ws []semWait) error {
	if len(ws) == 0 {
		return nil
	}
	sems := make([]uint64, len(ws))
	vals := make([]uint64, len(ws))
	for i, w := range ws {
		sems[i], vals[i] = w.sem, w.value
	}
	var pn pinned
	defer pn.release()
	wi := &semaphoreWaitInfo{sType: stSemaphoreWaitInfo, count: uint32(len(ws)), semaphores: refSlice(&pn, sems), values: refSlice(&pn, vals)}
	r := call(d.vk.waitSemaphores, d.dev, uintptr(unsafe.Pointer(wi)), uintptr(waitTimeout.Nanoseconds()))
	if r == vkTimeout {
		return fmt.Errorf("vulkan: vkWaitSemaphores: queued work still running after %v: %w", waitTimeout, &Error{Func: "vkWaitSemaphores", Code: int32(r)})
	}
	if err := check("vkWaitSemaphores", r); err != nil {
		return fmt.Errorf("vulkan: %w", err)
	}
	return nil
}

// NewStream creates a stream on the next queues in turn.
func (d *Device) NewStream() (device.Stream, error) {
	sem, base, err := d.createTimeline()
	if err != nil {
		return 0, err
	}
	s := &stream{sem: sem, pools: map[uint32]uint64{}, free: map[uint32][]uintptr{}}
	s.last.Store(base)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		d.spareSems = append(d.spareSems, sem)
		return 0, fmt.Errorf("vulkan: NewStream on a closed device: %w", device.ErrInvalid)
	}
	s.cq = d.compute.queues[d.queueRot%len(d.compute.queues)]
	for i := range d.copyQueues {
		s.tqs = append(s.tqs, d.transfer.queues[(d.queueRot+i)%len(d.transfer.queues)])
	}
	s.tq = s.tqs[0]
	d.queueRot++
	s.id = device.Stream(d.newID())
	d.streams[s.id] = s
	return s.id, nil
}

func (d *Device) stream(what string, id device.Stream) (*stream, error) {
	d.mu.Lock()
	s := d.streams[id]
	d.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("vulkan: %s: unknown stream %d: %w", what, uint64(id), device.ErrInvalid)
	}
	return s, nil
}

// DestroyStream lets the stream's queued work finish, then releases it.
func (d *Device) DestroyStream(id device.Stream) error {
	d.mu.Lock()
	s := d.streams[id]
	delete(d.streams, id)
	d.mu.Unlock()
	if s == nil {
		return fmt.Errorf("vulkan: DestroyStream: unknown stream %d: %w", uint64(id), device.ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	err := d.waitValues([]semWait{{s.sem, s.last.Load()}})
	d.releaseStream(s)
	d.mu.Lock()
	d.spareSems = append(d.spareSems, s.sem)
	for _, a := range s.aux {
		d.spareSems = append(d.spareSems, a.sem)
	}
	d.mu.Unlock()
	return err
}

func (d *Device) releaseStream(s *stream) {
	for _, p := range s.pools {
		callVoid(d.vk.destroyCommandPool, d.dev, uintptr(p), 0)
	}
	s.pools, s.free, s.flight = nil, nil, nil
	for i := range s.staging {
		if a := s.staging[i].a; a != nil {
			d.destroy(a)
			s.staging[i].a = nil
		}
	}
}

// StreamSynchronize waits for everything submitted to the stream.
func (d *Device) StreamSynchronize(id device.Stream) error {
	s, err := d.stream("StreamSynchronize", id)
	if err != nil {
		return err
	}
	return d.waitValues([]semWait{{s.sem, s.last.Load()}})
}

// StreamQuery reports whether everything submitted to the stream is done.
func (d *Device) StreamQuery(id device.Stream) (bool, error) {
	s, err := d.stream("StreamQuery", id)
	if err != nil {
		return false, err
	}
	return d.counter(s.sem) >= s.last.Load(), nil
}

// Synchronize waits for the work queued so far on every stream.
func (d *Device) Synchronize() error {
	d.mu.Lock()
	ws := make([]semWait, 0, len(d.streams))
	for _, s := range d.streams {
		if v := s.last.Load(); v > 0 {
			ws = append(ws, semWait{s.sem, v})
		}
	}
	d.mu.Unlock()
	return d.waitValues(ws)
}

// NewEvent creates an event; a timing event gets a timestamp query pool.
func (d *Device) NewEvent(timing bool) (device.Event, error) {
	e := &event{timing: timing}
	if timing {
		if d.compute.timestampBits == 0 {
			return 0, fmt.Errorf("vulkan: NewEvent(timing): the compute queue has no timestamps: %w", device.ErrUnsupported)
		}
		ci := &queryPoolCreateInfo{sType: stQueryPoolCreateInfo, queryType: queryTypeTimestamp, count: 1}
		if err := check("vkCreateQueryPool", call(d.vk.createQueryPool, d.dev, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&e.qpool)))); err != nil {
			return 0, fmt.Errorf("vulkan: %w", err)
		}
	}
	d.mu.Lock()
	e.id = device.Event(d.newID())
	d.events[e.id] = e
	d.mu.Unlock()
	return e.id, nil
}

func (d *Device) event(what string, id device.Event) (*event, error) {
	d.mu.Lock()
	e := d.events[id]
	d.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("vulkan: %s: unknown event %d: %w", what, uint64(id), device.ErrInvalid)
	}
	return e, nil
}

// DestroyEvent releases an event; work it captured is unaffected.
func (d *Device) DestroyEvent(id device.Event) error {
	d.mu.Lock()
	e := d.events[id]
	delete(d.events, id)
	d.mu.Unlock()
	if e == nil {
		return fmt.Errorf("vulkan: DestroyEvent: unknown event %d: %w", uint64(id), device.ErrInvalid)
	}
	if e.qpool != 0 {
		// A timestamp write may still be queued: wait for it first.
		e.mu.Lock()
		err := d.waitValues(e.pending())
		e.mu.Unlock()
		callVoid(d.vk.destroyQueryPool, d.dev, uintptr(e.qpool), 0)
		return err
	}
	return nil
}

func (e *event) pending() []semWait {
	if e.value == 0 {
		return nil
	}
	return []semWait{{e.sem, e.value}}
}

// EventRecord captures the work submitted to the stream so far; a timing
// event writes a timestamp after it.
func (d *Device) EventRecord(eid device.Event, sid device.Stream) error {
	e, err := d.event("EventRecord", eid)
	if err != nil {
		return err
	}
	s, err := d.stream("EventRecord", sid)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.timing {
		e.sem, e.value = s.sem, s.last.Load()
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// The timestamp goes on the queue that ran the stream's last work when
	// its family has timestamps: a copy timed between two events then
	// waits for no other queue, whose semaphore hand-offs would count in
	// the elapsed time (GPU timestamps share one clock across queues).
	q := s.cq
	if s.lastQ != nil && s.lastQ.stampBits > 0 {
		q = s.lastQ
	}
	v, err := d.submit(s, q, func(cb uintptr) {
		callVoid(d.vk.cmdResetQueryPool, cb, uintptr(e.qpool), 0, 1)
		callVoid(d.vk.cmdWriteTimestamp, cb, stageBottom, uintptr(e.qpool), 0)
	})
	if err != nil {
		return fmt.Errorf("vulkan: EventRecord: %w", err)
	}
	e.sem, e.value, e.stamps, e.bits = s.sem, v, true, q.stampBits
	return nil
}

// EventQuery reports whether the captured work has completed.
func (d *Device) EventQuery(id device.Event) (bool, error) {
	e, err := d.event("EventQuery", id)
	if err != nil {
		return false, err
	}
	e.mu.Lock()
	sem, v := e.sem, e.value
	e.mu.Unlock()
	return v == 0 || d.counter(sem) >= v, nil
}

// EventSynchronize waits for the captured work.
func (d *Device) EventSynchronize(id device.Event) error {
	e, err := d.event("EventSynchronize", id)
	if err != nil {
		return err
	}
	e.mu.Lock()
	ws := e.pending()
	e.mu.Unlock()
	return d.waitValues(ws)
}

// EventElapsed returns the time between the timestamps of two completed
// timing events.
func (d *Device) EventElapsed(start, end device.Event) (time.Duration, error) {
	var ts [2]uint64
	bits := uint32(64)
	for i, id := range []device.Event{start, end} {
		e, err := d.event("EventElapsed", id)
		if err != nil {
			return 0, err
		}
		if !e.timing {
			return 0, fmt.Errorf("vulkan: EventElapsed: event %d was created without timing: %w", uint64(id), device.ErrInvalid)
		}
		e.mu.Lock()
		stamped, sem, v := e.stamps, e.sem, e.value
		bits = min(bits, e.bits)
		e.mu.Unlock()
		if !stamped {
			return 0, fmt.Errorf("vulkan: EventElapsed: event %d never recorded: %w", uint64(id), device.ErrInvalid)
		}
		if d.counter(sem) < v {
			return 0, fmt.Errorf("vulkan: EventElapsed: event %d not complete: %w", uint64(id), device.ErrNotReady)
		}
		r := call(d.vk.getQueryPoolResults, d.dev, uintptr(e.qpool), 0, 1, 8, uintptr(unsafe.Pointer(&ts[i])), 8, queryResult64)
		if r == vkNotReady {
			return 0, fmt.Errorf("vulkan: EventElapsed: timestamp of event %d not available: %w", uint64(id), device.ErrNotReady)
		}
		if err := check("vkGetQueryPoolResults", r); err != nil {
			return 0, fmt.Errorf("vulkan: %w", err)
		}
	}
	mask := ^uint64(0)
	if bits < 64 {
		mask = 1<<bits - 1
	}
	ticks := (ts[1] - ts[0]) & mask
	return time.Duration(float64(ticks) * d.timestampNs), nil
}

// StreamWaitEvent makes the stream's next submission wait for the event's
// captured work, on the GPU.
func (d *Device) StreamWaitEvent(sid device.Stream, eid device.Event) error {
	s, err := d.stream("StreamWaitEvent", sid)
	if err != nil {
		return err
	}
	e, err := d.event("StreamWaitEvent", eid)
	if err != nil {
		return err
	}
	e.mu.Lock()
	w := e.pending()
	e.mu.Unlock()
	if len(w) == 0 {
		return nil
	}
	s.mu.Lock()
	s.waits = append(s.waits, w...)
	s.mu.Unlock()
	return nil
}

// commandBuffer returns a command buffer of the family, reusing one whose
// submission has completed. s.mu is held.
func (d *Device) commandBuffer(s *stream, fam uint32) (uintptr, error) {
	if len(s.flight) > 0 {
		done := d.counter(s.sem)
		keep := s.flight[:0]
		for _, u := range s.flight {
			if u.value <= done {
				s.free[u.family] = append(s.free[u.family], u.cb)
			} else {
				keep = append(keep, u)
			}
		}
		s.flight = keep
	}
	if f := s.free[fam]; len(f) > 0 {
		cb := f[len(f)-1]
		s.free[fam] = f[:len(f)-1]
		return cb, nil
	}
	pool, ok := s.pools[fam]
	if !ok {
		ci := &commandPoolCreateInfo{sType: stCommandPoolCreateInfo, flags: poolResetCommandBuf, family: fam}
		if err := check("vkCreateCommandPool", call(d.vk.createCommandPool, d.dev, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&pool)))); err != nil {
			return 0, err
		}
		s.pools[fam] = pool
	}
	ai := &commandBufferAllocateInfo{sType: stCommandBufferAllocateInfo, pool: pool, count: 1}
	var cb uintptr
	if err := check("vkAllocateCommandBuffers", call(d.vk.allocateCommandBuffers, d.dev, uintptr(unsafe.Pointer(ai)), uintptr(unsafe.Pointer(&cb)))); err != nil {
		return 0, err
	}
	return cb, nil
}

// submit records one command buffer with rec and submits it to q, waiting
// for the stream's previous value and pending event waits, signalling the
// next value, which it returns. s.mu is held.
func (d *Device) submit(s *stream, q *queue, rec func(cb uintptr)) (uint64, error) {
	cb, err := d.record(s, q, rec)
	if err != nil {
		return 0, err
	}
	prev := s.last.Load()
	ps := &pendingSubmit{s: s, q: q, cb: cb, value: prev + 1}
	if prev > 0 {
		ps.waits = append(ps.waits, semWait{s.sem, prev})
	}
	ps.waits = append(ps.waits, s.waits...)
	if d.deferring.Load() {
		d.deferMu.Lock()
		if d.deferring.Load() {
			d.deferred = append(d.deferred, ps)
			d.deferMu.Unlock()
			s.commit(ps)
			return ps.value, nil
		}
		d.deferMu.Unlock()
	}
	if err := d.queueSubmit(ps); err != nil {
		s.free[q.family] = append(s.free[q.family], cb)
		return 0, err
	}
	s.commit(ps)
	return ps.value, nil
}

// record returns a command buffer for q's family recorded with rec.
// s.mu is held.
func (d *Device) record(s *stream, q *queue, rec func(cb uintptr)) (uintptr, error) {
	cb, err := d.commandBuffer(s, q.family)
	if err != nil {
		return 0, err
	}
	bi := &commandBufferBeginInfo{sType: stCommandBufferBeginInfo, flags: oneTimeSubmit}
	if err := check("vkBeginCommandBuffer", call(d.vk.beginCommandBuffer, cb, uintptr(unsafe.Pointer(bi)))); err != nil {
		return 0, err
	}
	rec(cb)
	if err := check("vkEndCommandBuffer", call(d.vk.endCommandBuffer, cb)); err != nil {
		return 0, err
	}
	return cb, nil
}

// splitMinBytes is the smallest copy split over the stream's copy queues
// (below it the second submission costs more than the second engine
// saves).
const splitMinBytes = 32 << 20

// submitCopy submits a copy of n bytes between host memory and the device:
// one submission on the stream's copy queue, or, when the stream has
// several copy queues (Options.CopyQueues) and the copy is large, parts of
// it on each at once. A helper queue's part waits for what the stream's
// next submission would wait for and signals the helper's own timeline
// semaphore; the first part goes to the stream's queue, followed there by
// a batch without commands that waits for the helpers and signals the
// stream's next value, which therefore follows the whole copy (a signal
// covers the queue's earlier submissions). s.mu is held.
func (d *Device) submitCopy(s *stream, src, dst, so, do, n uint64) error {
	k := uint64(len(s.tqs))
	if k < 2 || n < d.splitMin || d.deferring.Load() {
		_, err := d.submit(s, s.tq, d.copyCmd(src, dst, so, do, n))
		return err
	}
	for len(s.aux) < int(k)-1 {
		sem, base, err := d.createTimeline()
		if err != nil {
			return err
		}
		s.aux = append(s.aux, semWait{sem, base})
	}
	prev := s.last.Load()
	var waits []semWait
	if prev > 0 {
		waits = append(waits, semWait{s.sem, prev})
	}
	waits = append(waits, s.waits...)
	part := (n/k + 0xFFFF) &^ 0xFFFF
	value := prev + 1
	var used []cbUse
	var joins []semWait
	fail := func(err error) error {
		s.flight = append(s.flight, used...) // submitted ones stay in flight
		return err
	}
	for i := uint64(1); i < k && part*i < n; i++ {
		off := part * i
		q := s.tqs[i]
		cb, err := d.record(s, q, d.copyCmd(src, dst, so+off, do+off, min(part, n-off)))
		if err != nil {
			return fail(err)
		}
		a := &s.aux[i-1]
		if err := d.submitBatches(q, []batch{{cb: cb, waits: waits, signals: []semWait{{a.sem, a.value + 1}}}}); err != nil {
			s.free[q.family] = append(s.free[q.family], cb)
			return fail(err)
		}
		a.value++
		used = append(used, cbUse{cb, q.family, value})
		joins = append(joins, *a)
	}
	cb, err := d.record(s, s.tq, d.copyCmd(src, dst, so, do, min(part, n)))
	if err != nil {
		return fail(err)
	}
	if err := d.submitBatches(s.tq, []batch{{cb: cb, waits: waits}, {waits: joins, signals: []semWait{{s.sem, value}}}}); err != nil {
		s.free[s.tq.family] = append(s.free[s.tq.family], cb)
		// The helpers' parts are queued and signal their semaphores:
		// the stream's value is not, so nothing waits on them forever.
		return fail(err)
	}
	used = append(used, cbUse{cb, s.tq.family, value})
	d.splits.Add(1)
	s.flight = append(s.flight, used...)
	s.waits = s.waits[:0]
	s.last.Store(value)
	s.lastQ = s.tq
	return nil
}

// pendingSubmit is one submission: a command buffer that waits for the
// semaphore values and then signals value on its stream's semaphore.
type pendingSubmit struct {
	s     *stream
	q     *queue
	cb    uintptr
	waits []semWait
	value uint64
}

// commit records a submission as the stream's last. s.mu is held.
func (s *stream) commit(ps *pendingSubmit) {
	s.waits = s.waits[:0]
	s.last.Store(ps.value)
	s.lastQ = ps.q
	s.flight = append(s.flight, cbUse{ps.cb, ps.q.family, ps.value})
}

// queueSubmit hands a submission to its queue.
func (d *Device) queueSubmit(ps *pendingSubmit) error {
	return d.submitBatches(ps.q, []batch{{cb: ps.cb, waits: ps.waits, signals: []semWait{{ps.s.sem, ps.value}}}})
}

// batch is one VkSubmitInfo: a command buffer (0: none) between timeline
// semaphore waits and signals.
type batch struct {
	cb             uintptr
	waits, signals []semWait
}

// submitBatches hands the batches to q in one vkQueueSubmit.
func (d *Device) submitBatches(q *queue, bs []batch) error {
	var pn pinned
	defer pn.release()
	infos := make([]submitInfo, len(bs))
	for i, b := range bs {
		sems := make([]uint64, len(b.waits))
		vals := make([]uint64, len(b.waits))
		stages := make([]uint32, len(b.waits))
		for j, w := range b.waits {
			sems[j], vals[j], stages[j] = w.sem, w.value, stageAllCommands
		}
		sig := make([]uint64, len(b.signals))
		sigVal := make([]uint64, len(b.signals))
		for j, w := range b.signals {
			sig[j], sigVal[j] = w.sem, w.value
		}
		ts := &timelineSemaphoreSubmitInfo{sType: stTimelineSemaphoreSubmitInfo,
			waitCount: uint32(len(vals)), waitValues: refSlice(&pn, vals), signalCount: uint32(len(sigVal)), signalValues: refSlice(&pn, sigVal)}
		infos[i] = submitInfo{sType: stSubmitInfo, pNext: ref(&pn, ts),
			waitCount: uint32(len(sems)), waitSemaphores: refSlice(&pn, sems), waitStages: refSlice(&pn, stages),
			signalCount: uint32(len(sig)), signalSemaphores: refSlice(&pn, sig)}
		if b.cb != 0 {
			infos[i].cmdCount, infos[i].cmds = 1, refSlice(&pn, []uintptr{b.cb})
		}
	}
	q.mu.Lock()
	r := call(d.vk.queueSubmit, q.h, uintptr(len(infos)), uintptr(unsafe.Pointer(&infos[0])), 0)
	q.mu.Unlock()
	return check("vkQueueSubmit", r)
}

// Defer starts holding every submission back on the host instead of
// handing it to a queue, until FlushShuffled. It exists to test ordering:
// what a program gets right only by the accident of submission order
// breaks when the deferred work is flushed in another order. While
// deferring, nothing may wait on the host for queued work (synchronize,
// query until true, copy into pageable memory): it would never complete.
func (d *Device) Defer() {
	d.deferMu.Lock()
	d.deferring.Store(true)
	d.deferMu.Unlock()
}

// FlushShuffled stops deferring and submits the deferred work in a random
// order (seeded) that keeps each stream's order and every event wait: of
// the submissions whose waits are all submitted, one is picked at random,
// repeatedly. Queues run submissions in the order they get them, so the
// GPU executes this order, which a missing event wait turns into a data
// race that shows.
func (d *Device) FlushShuffled(seed uint64) error {
	d.deferMu.Lock()
	d.deferring.Store(false)
	list := d.deferred
	d.deferred = nil
	d.deferMu.Unlock()
	heads := map[*stream][]*pendingSubmit{}
	var order []*stream            // streams in first-submission order, for determinism
	pending := map[uint64]uint64{} // semaphore → lowest deferred value
	for _, ps := range list {
		if _, ok := heads[ps.s]; !ok {
			order = append(order, ps.s)
			pending[ps.s.sem] = ps.value
		}
		heads[ps.s] = append(heads[ps.s], ps)
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9E3779B97F4A7C15))
	for left := len(list); left > 0; left-- {
		var ready []*stream
		for _, s := range order {
			q := heads[s]
			if len(q) == 0 {
				continue
			}
			ok := true
			for _, w := range q[0].waits {
				if low, deferred := pending[w.sem]; deferred && w.value >= low {
					ok = false
					break
				}
			}
			if ok {
				ready = append(ready, s)
			}
		}
		if len(ready) == 0 {
			return fmt.Errorf("vulkan: FlushShuffled: %d deferred submissions wait on each other: %w", left, device.ErrInvalid)
		}
		s := ready[r.IntN(len(ready))]
		ps := heads[s][0]
		heads[s] = heads[s][1:]
		if len(heads[s]) > 0 {
			pending[s.sem] = heads[s][0].value
		} else {
			delete(pending, s.sem)
		}
		if err := d.queueSubmit(ps); err != nil {
			return fmt.Errorf("vulkan: FlushShuffled: %w", err)
		}
	}
	return nil
}

// op runs one stream operation with the stream locked.
func (d *Device) op(what string, id device.Stream, fn func(s *stream) error) error {
	s, err := d.stream(what, id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := fn(s); err != nil {
		return fmt.Errorf("vulkan: %s: %w", what, err)
	}
	return nil
}

func (d *Device) copyCmd(src, dst uint64, so, do, n uint64) func(cb uintptr) {
	region := &bufferCopy{srcOffset: so, dstOffset: do, size: n}
	return func(cb uintptr) {
		callVoid(d.vk.cmdCopyBuffer, cb, uintptr(src), uintptr(dst), 1, uintptr(unsafe.Pointer(region)))
	}
}

// copyParallel copies src to dst (of equal length) in up to four pieces
// of at least 1 MiB on as many goroutines: the host side of a staged copy
// runs at one core's memcpy rate otherwise, half of what the DMA does.
func copyParallel(dst, src []byte) {
	const piece = 1 << 20
	k := min(runtime.GOMAXPROCS(0), 4, len(src)/piece)
	if k < 2 {
		copy(dst, src)
		return
	}
	part := (len(src) + k - 1) / k
	var wg sync.WaitGroup
	for lo := part; lo < len(src); lo += part {
		hi := min(lo+part, len(src))
		wg.Go(func() { copy(dst[lo:hi], src[lo:hi]) })
	}
	copy(dst[:part], src[:part])
	wg.Wait()
}

// slot returns staging slot i of the stream, free for reuse. s.mu is held.
func (d *Device) slot(s *stream, i int) (*stagingSlot, error) {
	sl := &s.staging[i]
	if sl.a == nil {
		a, err := d.newAllocation(stagingBytes, kindInternal, 0.5, nil)
		if err != nil {
			return nil, err
		}
		sl.a = a
	}
	if d.counter(s.sem) < sl.value {
		if err := d.waitValues([]semWait{{s.sem, sl.value}}); err != nil {
			return nil, err
		}
	}
	return sl, nil
}

// CopyHtoD copies src to dst: directly from HostAlloc or HostRegister
// memory, otherwise through staging buffers filled before the call returns
// (so src may be reused at once, as with CUDA's pageable copies).
func (d *Device) CopyHtoD(dst device.Ptr, src []byte, sid device.Stream) error {
	n := uint64(len(src))
	return d.op("CopyHtoD", sid, func(s *stream) error {
		if n == 0 {
			return nil
		}
		to, err := d.resolve("CopyHtoD", dst, n)
		if err != nil {
			return err
		}
		if from, ok := d.hostSpan(src); ok {
			return d.submitCopy(s, from.buf, to.buf, from.off, to.off, n)
		}
		for off, k := uint64(0), 0; off < n; off, k = off+stagingBytes, k+1 {
			m := min(stagingBytes, n-off)
			sl, err := d.slot(s, k%stagingSlots)
			if err != nil {
				return err
			}
			copyParallel(unsafe.Slice((*byte)(sl.a.host), m), src[off:off+m])
			v, err := d.submit(s, s.tq, d.copyCmd(sl.a.buf, to.buf, 0, to.off+off, m))
			if err != nil {
				return err
			}
			sl.value = v
		}
		return nil
	})
}

// CopyDtoH copies src to dst: asynchronously into HostAlloc or
// HostRegister memory; into pageable memory through staging, returning
// once the bytes are in dst (as CUDA does for pageable destinations).
func (d *Device) CopyDtoH(dst []byte, src device.Ptr, sid device.Stream) error {
	n := uint64(len(dst))
	return d.op("CopyDtoH", sid, func(s *stream) error {
		if n == 0 {
			return nil
		}
		from, err := d.resolve("CopyDtoH", src, n)
		if err != nil {
			return err
		}
		if to, ok := d.hostSpan(dst); ok {
			return d.submitCopy(s, from.buf, to.buf, from.off, to.off, n)
		}
		type piece struct {
			sl     *stagingSlot
			off, m uint64
		}
		var queued []piece
		drain := func(p piece) error {
			if err := d.waitValues([]semWait{{s.sem, p.sl.value}}); err != nil {
				return err
			}
			copyParallel(dst[p.off:p.off+p.m], unsafe.Slice((*byte)(p.sl.a.host), p.m))
			return nil
		}
		for off, k := uint64(0), 0; off < n; off, k = off+stagingBytes, k+1 {
			if len(queued) == stagingSlots {
				if err := drain(queued[0]); err != nil {
					return err
				}
				queued = queued[1:]
			}
			m := min(stagingBytes, n-off)
			sl, err := d.slot(s, k%stagingSlots)
			if err != nil {
				return err
			}
			v, err := d.submit(s, s.tq, d.copyCmd(from.buf, sl.a.buf, from.off+off, 0, m))
			if err != nil {
				return err
			}
			sl.value = v
			queued = append(queued, piece{sl, off, m})
		}
		for _, p := range queued {
			if err := drain(p); err != nil {
				return err
			}
		}
		return nil
	})
}

// CopyDtoD copies n bytes between device (or host-mapped) ranges.
//
// Between device allocations on a GPU with buffer device addresses, a
// copy of 64 KiB or more with 16-byte aligned ends runs as a shader (the
// SMs stream at memory bandwidth; vkCmdCopyBuffer's copy engine does not).
// MEMWALL_VULKAN_SHADER_COPY=0 turns that off, =1 on for CPU devices too.
func (d *Device) CopyDtoD(dst, src device.Ptr, n uint64, sid device.Stream) error {
	k := d.copyKernel()
	return d.op("CopyDtoD", sid, func(s *stream) error {
		if n == 0 {
			return nil
		}
		from, err := d.resolve("CopyDtoD source", src, n)
		if err != nil {
			return err
		}
		to, err := d.resolve("CopyDtoD destination", dst, n)
		if err != nil {
			return err
		}
		// Device to device runs on the compute queue: NVIDIA's copy-only
		// family is its DMA engines (PCIe rate, 89 GB/s on an H200), while
		// a compute queue copies with the SMs at memory bandwidth. Copies
		// touching host memory stay on the copy queue.
		q := s.tq
		if from.a.kind == kindDevice && to.a.kind == kindDevice || from.a.kind == kindReserve || to.a.kind == kindReserve {
			q = s.cq
		}
		rec := d.copyCmd(from.buf, to.buf, from.off, to.off, n)
		if k != nil && q == s.cq && from.a.kind == kindDevice && to.a.kind == kindDevice {
			rec = k.record(from.a.bda+from.off, to.a.bda+to.off, n, rec)
		}
		_, err = d.submit(s, q, rec)
		return err
	})
}

// copyKernel is memwall_copy_u32x4 bound for CopyDtoD.
type copyKernel struct {
	d      *Device
	layout uint64
	pipe   uint64
}

// Shader copies: at least this many bytes (smaller ones go to
// vkCmdCopyBuffer), at most copyGroups workgroups of copyBlock invocations
// (65535 is every device's least maxComputeWorkGroupCount; on an H200 one
// 16-byte vector per invocation copied 256 MiB at 1839 GB/s, 4224 groups
// looping at 1742).
const (
	copyMinBytes = 64 << 10
	copyGroups   = 65535
	copyBlock    = 256
)

// record returns the recorder of a shader copy of n bytes from device
// address src to dst where both are 16-byte aligned, n a multiple of 16
// and large enough, else fallback.
func (k *copyKernel) record(src, dst, n uint64, fallback func(cb uintptr)) func(cb uintptr) {
	if src == 0 || dst == 0 || src%16 != 0 || dst%16 != 0 || n%16 != 0 || n < copyMinBytes || n/16 >= 1<<32 {
		return fallback
	}
	var push [24]byte
	*(*uint64)(unsafe.Pointer(&push[0])) = dst
	*(*uint64)(unsafe.Pointer(&push[8])) = src
	*(*uint64)(unsafe.Pointer(&push[16])) = n / 16
	groups := min((n/16+copyBlock-1)/copyBlock, copyGroups)
	return func(cb uintptr) {
		callVoid(k.d.vk.cmdBindPipeline, cb, bindPointCompute, uintptr(k.pipe))
		callVoid(k.d.vk.cmdPushConstants, cb, uintptr(k.layout), shaderStageCompute, 0, 24, uintptr(unsafe.Pointer(&push[0])))
		callVoid(k.d.vk.cmdDispatch, cb, uintptr(groups), 1, 1)
	}
}

// copyKernel loads the device-to-device copy shader once; nil when the
// device cannot run it (no buffer device addresses, or it fails to load).
func (d *Device) copyKernel() *copyKernel {
	d.copyOnce.Do(func() {
		if !d.hasBDA || d.noShaderCopy {
			return
		}
		m, err := d.LoadModule(copyModule)
		if err != nil {
			return
		}
		fid, err := d.Function(m, copyEntry)
		if err != nil {
			return
		}
		d.mu.Lock()
		f := d.funcs[fid]
		d.mu.Unlock()
		pipe, err := d.pipeline(f, device.Dim3{X: copyBlock, Y: 1, Z: 1})
		if err != nil {
			return
		}
		d.copyK = &copyKernel{d: d, layout: f.layout, pipe: pipe}
	})
	return d.copyK
}

// Memset8 sets n bytes at dst to v: vkCmdFillBuffer over the 4-byte
// aligned middle, copies from a byte table for the unaligned ends.
func (d *Device) Memset8(dst device.Ptr, v byte, n uint64, sid device.Stream) error {
	return d.op("Memset8", sid, func(s *stream) error {
		if n == 0 {
			return nil
		}
		to, err := d.resolve("Memset8", dst, n)
		if err != nil {
			return err
		}
		head := min((4-to.off%4)%4, n)
		mid := (n - head) &^ 3
		tail := n - head - mid
		tab := d.byteTable.buf
		word := uint32(v) * 0x01010101
		var regions []*bufferCopy
		if head > 0 {
			regions = append(regions, &bufferCopy{srcOffset: 4 * uint64(v), dstOffset: to.off, size: head})
		}
		if tail > 0 {
			regions = append(regions, &bufferCopy{srcOffset: 4 * uint64(v), dstOffset: to.off + head + mid, size: tail})
		}
		_, err = d.submit(s, s.cq, func(cb uintptr) { // fills at memory bandwidth, as CopyDtoD
			for _, r := range regions {
				callVoid(d.vk.cmdCopyBuffer, cb, uintptr(tab), uintptr(to.buf), 1, uintptr(unsafe.Pointer(r)))
			}
			if mid > 0 {
				callVoid(d.vk.cmdFillBuffer, cb, uintptr(to.buf), uintptr(to.off+head), uintptr(mid), uintptr(word))
			}
		})
		return err
	})
}

// Memset32 sets count 32-bit words at dst, which must be 4-byte aligned.
func (d *Device) Memset32(dst device.Ptr, v uint32, count uint64, sid device.Stream) error {
	return d.op("Memset32", sid, func(s *stream) error {
		if count == 0 {
			return nil
		}
		if dst%4 != 0 {
			return fmt.Errorf("address %#x is not 4-byte aligned: %w", uint64(dst), device.ErrInvalid)
		}
		to, err := d.resolve("Memset32", dst, 4*count)
		if err != nil {
			return err
		}
		if to.off%4 != 0 {
			return fmt.Errorf("address %#x is not 4-byte aligned in its buffer: %w", uint64(dst), device.ErrInvalid)
		}
		_, err = d.submit(s, s.cq, func(cb uintptr) {
			callVoid(d.vk.cmdFillBuffer, cb, uintptr(to.buf), uintptr(to.off), uintptr(4*count), uintptr(v))
		})
		return err
	})
}
