// Package fault wraps a device.Device to inject failures for tests: fail the
// Nth allocation, fail copies (by kind, stream, call number or bytes moved),
// slow copies down, report less free memory, drop events, fail mappings. It also counts calls per method, so tests can assert how
// often code above reaches the driver.
//
// The rules live in a Config that is safe to change while the device is in
// use. A zero Config injects nothing and only counts.
package fault

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/memwall/memwall/device"
)

// ErrInjected is wrapped by every failure the wrapper makes up, next to the
// device error it imitates (device.ErrOutOfMemory for allocations and maps),
// so tests can tell injected failures from real ones.
var ErrInjected = errors.New("fault injected")

// ErrCopy is wrapped by a copy that Rules.FailCopies failed, next to
// ErrInjected.
var ErrCopy = errors.New("copy failed")

// CopyKind selects copies by direction; kinds combine with |.
type CopyKind uint8

// Copy directions.
const (
	HtoD CopyKind = 1 << iota
	DtoH
	DtoD
)

func (k CopyKind) String() string {
	switch k {
	case HtoD:
		return "host-to-device"
	case DtoH:
		return "device-to-host"
	case DtoD:
		return "device-to-device"
	}
	return fmt.Sprintf("copy kinds %#x", uint8(k))
}

// CopyRule fails copies. A copy matches when its kind is in Kinds (0: any
// kind) and it runs on Stream (0: any stream). Matching copies are counted
// from 1, and their bytes summed, since the rules were last Set; a
// failed copy counts as a call and moves no bytes. A matching copy fails
// when Call fires for its number, or, with Bytes nonzero, when the bytes
// of the matching copies before it that moved plus its own exceed Bytes
// (the first such copy; with AfterBytes every matching copy after it
// too). The zero CopyRule fails nothing.
type CopyRule struct {
	Kinds  CopyKind
	Stream device.Stream
	Call   Trigger
	Bytes  uint64
	// AfterBytes keeps failing matching copies once Bytes has fired.
	AfterBytes bool
}

// copyState counts the matching copies of a CopyRule since Set.
type copyState struct {
	calls, bytes uint64
	fired        bool
}

func (r *CopyRule) match(k CopyKind, s device.Stream) bool {
	return (r.Kinds == 0 || r.Kinds&k != 0) && (r.Stream == 0 || r.Stream == s)
}

// fires counts a matching copy of n bytes and says whether it fails.
func (r *CopyRule) fires(st *copyState, n uint64) bool {
	st.calls++
	fail := r.Call.fires(st.calls)
	if r.Bytes != 0 && (!st.fired && st.bytes+n > r.Bytes || st.fired && r.AfterBytes) {
		st.fired, fail = true, true
	}
	if !fail {
		st.bytes += n
	}
	return fail
}

// Trigger selects calls of one method by their number, counted from 1 since
// the rules were last Set. The zero Trigger never fires.
type Trigger struct {
	// Nth is the first call that fires; 0 means never.
	Nth uint64
	// AndAfter makes every later call fire too.
	AndAfter bool
}

// Nth fires on the nth call only.
func Nth(n uint64) Trigger { return Trigger{Nth: n} }

// From fires on the nth call and every call after it.
func From(n uint64) Trigger { return Trigger{Nth: n, AndAfter: true} }

// Always fires on every call.
func Always() Trigger { return From(1) }

func (tr Trigger) fires(n uint64) bool {
	return tr.Nth != 0 && (n == tr.Nth || tr.AndAfter && n > tr.Nth)
}

// Rules say what to inject. Failures imitate the driver: allocation and map
// failures wrap device.ErrOutOfMemory; dropped events (EventRecord,
// StreamWaitEvent) fail without recording or waiting. All wrap ErrInjected;
// a failed call does not reach the wrapped device.
type Rules struct {
	Alloc          Trigger
	HostAlloc      Trigger
	CreatePhysical Trigger
	Map            Trigger
	EventRecord    Trigger
	// StreamWaitEvent failing "drops" the dependency: the caller gets an
	// error and the stream does not wait.
	StreamWaitEvent Trigger

	// SlowCopies selects the copies (CopyHtoD, CopyDtoH and CopyDtoD,
	// counted together) that are delayed by CopyDelay. On a device with a
	// Delay method (the simulator) the copy's stream is stalled for
	// CopyDelay of simulated time before the copy, so the copy and all later
	// work on the stream complete CopyDelay later; on any other device the
	// calling goroutine sleeps CopyDelay before submitting the copy.
	SlowCopies Trigger
	CopyDelay  time.Duration

	// FailCopies fails the copies it selects (see CopyRule): the call
	// returns an error wrapping ErrInjected and ErrCopy, and the copy is
	// not submitted.
	FailCopies CopyRule

	// FreeLimit, when nonzero, caps the free memory MemInfo reports;
	// HideBytes is subtracted from it (down to 0) before the cap. The total
	// is unchanged, and allocations are not limited by either.
	FreeLimit uint64
	HideBytes uint64
}

// Counts are calls per method (failed and injected ones included), plus the
// number of faults injected.
type Counts struct {
	MemInfo, Alloc, Free, HostAlloc, HostFree, HostRegister                   uint64
	NewStream, DestroyStream, StreamSynchronize, StreamQuery, StreamWaitEvent uint64
	NewEvent, DestroyEvent, EventRecord, EventQuery, EventSynchronize         uint64
	EventElapsed, Synchronize                                                 uint64
	CopyHtoD, CopyDtoH, CopyDtoD, Memset8, Memset32                           uint64
	Reserve, Unreserve, CreatePhysical, ReleasePhysical, Map, Unmap           uint64
	LoadModule, UnloadModule, Function, Launch, Close                         uint64
	// Copies counts CopyHtoD, CopyDtoH and CopyDtoD together (what
	// Rules.SlowCopies counts).
	Copies uint64
	// Injected counts failures made up and copies slowed.
	Injected uint64
}

// Config holds the rules and the counters. Its methods are safe for
// concurrent use, also while a wrapped device is in use.
type Config struct {
	mu     sync.Mutex
	rules  Rules
	counts Counts
	since  Counts // counts when the rules were last Set
	copies copyState
}

// Set replaces the rules. Triggers count calls made from now on.
func (c *Config) Set(r Rules) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rules = r
	c.since = c.counts
	c.copies = copyState{}
}

// Rules returns the rules in force.
func (c *Config) Rules() Rules {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rules
}

// Counts returns the calls counted since the device was wrapped.
func (c *Config) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts
}

// call counts one call of the method field selects and reports whether tr
// (chosen from the rules in force) fires for it; a firing call is counted as
// injected.
func (c *Config) call(field func(*Counts) *uint64, trigger func(*Rules) *Trigger) (Rules, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := field(&c.counts)
	*f++
	if trigger == nil {
		return c.rules, false
	}
	fire := trigger(&c.rules).fires(*f - *field(&c.since))
	if fire {
		c.counts.Injected++
	}
	return c.rules, fire
}

// Delayer is implemented by devices that can stall a stream for simulated
// time (sim.Device); SlowCopies uses it when present.
type Delayer interface {
	Delay(s device.Stream, d time.Duration) error
}

type wrapped struct {
	d   device.Device
	cfg *Config
}

// Wrap returns d with the faults cfg describes injected. A nil cfg counts
// calls in a Config nobody can read or change. Closing the wrapper closes d.
func Wrap(d device.Device, cfg *Config) device.Device {
	if cfg == nil {
		cfg = &Config{}
	}
	return &wrapped{d: d, cfg: cfg}
}

func injected(method string, kind error) error {
	if kind == nil {
		return fmt.Errorf("fault: %s: %w", method, ErrInjected)
	}
	return fmt.Errorf("fault: %s: %w: %w", method, ErrInjected, kind)
}

func (w *wrapped) Info() device.Info { return w.d.Info() }

func (w *wrapped) Close() error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.Close }, nil)
	return w.d.Close()
}

func (w *wrapped) MemInfo() (free, total uint64, err error) {
	r, _ := w.cfg.call(func(c *Counts) *uint64 { return &c.MemInfo }, nil)
	free, total, err = w.d.MemInfo()
	if err != nil {
		return free, total, err
	}
	free -= min(free, r.HideBytes)
	if r.FreeLimit != 0 && free > r.FreeLimit {
		free = r.FreeLimit
	}
	return free, total, err
}

func (w *wrapped) Alloc(size uint64) (device.Ptr, error) {
	if _, fire := w.cfg.call(func(c *Counts) *uint64 { return &c.Alloc }, func(r *Rules) *Trigger { return &r.Alloc }); fire {
		return 0, injected(fmt.Sprintf("alloc %d bytes", size), device.ErrOutOfMemory)
	}
	return w.d.Alloc(size)
}

func (w *wrapped) Free(p device.Ptr) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.Free }, nil)
	return w.d.Free(p)
}

func (w *wrapped) HostAlloc(size uint64) (*device.HostBuffer, error) {
	if _, fire := w.cfg.call(func(c *Counts) *uint64 { return &c.HostAlloc }, func(r *Rules) *Trigger { return &r.HostAlloc }); fire {
		return nil, injected(fmt.Sprintf("pinned host alloc %d bytes", size), device.ErrOutOfMemory)
	}
	return w.d.HostAlloc(size)
}

func (w *wrapped) HostFree(b *device.HostBuffer) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.HostFree }, nil)
	return w.d.HostFree(b)
}

func (w *wrapped) HostRegister(b []byte, flags device.RegisterFlags) (*device.HostBuffer, error) {
	w.cfg.call(func(c *Counts) *uint64 { return &c.HostRegister }, nil)
	return w.d.HostRegister(b, flags)
}

func (w *wrapped) NewStream() (device.Stream, error) {
	w.cfg.call(func(c *Counts) *uint64 { return &c.NewStream }, nil)
	return w.d.NewStream()
}

func (w *wrapped) DestroyStream(s device.Stream) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.DestroyStream }, nil)
	return w.d.DestroyStream(s)
}

func (w *wrapped) StreamSynchronize(s device.Stream) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.StreamSynchronize }, nil)
	return w.d.StreamSynchronize(s)
}

func (w *wrapped) StreamQuery(s device.Stream) (bool, error) {
	w.cfg.call(func(c *Counts) *uint64 { return &c.StreamQuery }, nil)
	return w.d.StreamQuery(s)
}

func (w *wrapped) StreamWaitEvent(s device.Stream, e device.Event) error {
	if _, fire := w.cfg.call(func(c *Counts) *uint64 { return &c.StreamWaitEvent }, func(r *Rules) *Trigger { return &r.StreamWaitEvent }); fire {
		return injected("stream wait event (dropped)", nil)
	}
	return w.d.StreamWaitEvent(s, e)
}

func (w *wrapped) NewEvent(timing bool) (device.Event, error) {
	w.cfg.call(func(c *Counts) *uint64 { return &c.NewEvent }, nil)
	return w.d.NewEvent(timing)
}

func (w *wrapped) DestroyEvent(e device.Event) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.DestroyEvent }, nil)
	return w.d.DestroyEvent(e)
}

func (w *wrapped) EventRecord(e device.Event, s device.Stream) error {
	if _, fire := w.cfg.call(func(c *Counts) *uint64 { return &c.EventRecord }, func(r *Rules) *Trigger { return &r.EventRecord }); fire {
		return injected("event record (dropped)", nil)
	}
	return w.d.EventRecord(e, s)
}

func (w *wrapped) EventQuery(e device.Event) (bool, error) {
	w.cfg.call(func(c *Counts) *uint64 { return &c.EventQuery }, nil)
	return w.d.EventQuery(e)
}

func (w *wrapped) EventSynchronize(e device.Event) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.EventSynchronize }, nil)
	return w.d.EventSynchronize(e)
}

func (w *wrapped) EventElapsed(start, end device.Event) (time.Duration, error) {
	w.cfg.call(func(c *Counts) *uint64 { return &c.EventElapsed }, nil)
	return w.d.EventElapsed(start, end)
}

func (w *wrapped) Synchronize() error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.Synchronize }, nil)
	return w.d.Synchronize()
}

// copyCall counts a copy of one kind and n bytes, fails it when
// FailCopies selects it, and applies SlowCopies to it.
func (w *wrapped) copyCall(field func(*Counts) *uint64, k CopyKind, n uint64, s device.Stream) error {
	w.cfg.call(field, nil)
	if w.cfg.failCopy(k, n, s) {
		return injected(fmt.Sprintf("%s copy of %d bytes on stream %d", k, n, s), ErrCopy)
	}
	r, fire := w.cfg.call(func(c *Counts) *uint64 { return &c.Copies }, func(r *Rules) *Trigger { return &r.SlowCopies })
	if !fire || r.CopyDelay <= 0 {
		return nil
	}
	if dl, ok := w.d.(Delayer); ok {
		if err := dl.Delay(s, r.CopyDelay); err != nil {
			return fmt.Errorf("fault: slow copy: %w", err)
		}
		return nil
	}
	time.Sleep(r.CopyDelay)
	return nil
}

// failCopy applies Rules.FailCopies to a copy (counting it as injected
// when it fails; a failed copy still counts in Counts.Copies).
func (c *Config) failCopy(k CopyKind, n uint64, s device.Stream) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := &c.rules.FailCopies
	if !r.match(k, s) || !r.fires(&c.copies, n) {
		return false
	}
	c.counts.Injected++
	c.counts.Copies++
	return true
}

func (w *wrapped) CopyHtoD(dst device.Ptr, src []byte, s device.Stream) error {
	if err := w.copyCall(func(c *Counts) *uint64 { return &c.CopyHtoD }, HtoD, uint64(len(src)), s); err != nil {
		return err
	}
	return w.d.CopyHtoD(dst, src, s)
}

func (w *wrapped) CopyDtoH(dst []byte, src device.Ptr, s device.Stream) error {
	if err := w.copyCall(func(c *Counts) *uint64 { return &c.CopyDtoH }, DtoH, uint64(len(dst)), s); err != nil {
		return err
	}
	return w.d.CopyDtoH(dst, src, s)
}

func (w *wrapped) CopyDtoD(dst, src device.Ptr, n uint64, s device.Stream) error {
	if err := w.copyCall(func(c *Counts) *uint64 { return &c.CopyDtoD }, DtoD, n, s); err != nil {
		return err
	}
	return w.d.CopyDtoD(dst, src, n, s)
}

func (w *wrapped) Memset8(dst device.Ptr, v byte, n uint64, s device.Stream) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.Memset8 }, nil)
	return w.d.Memset8(dst, v, n, s)
}

func (w *wrapped) Memset32(dst device.Ptr, v uint32, count uint64, s device.Stream) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.Memset32 }, nil)
	return w.d.Memset32(dst, v, count, s)
}

func (w *wrapped) Reserve(size uint64) (device.Ptr, error) {
	w.cfg.call(func(c *Counts) *uint64 { return &c.Reserve }, nil)
	return w.d.Reserve(size)
}

func (w *wrapped) Unreserve(p device.Ptr, size uint64) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.Unreserve }, nil)
	return w.d.Unreserve(p, size)
}

func (w *wrapped) CreatePhysical(size uint64) (device.PhysMem, error) {
	if _, fire := w.cfg.call(func(c *Counts) *uint64 { return &c.CreatePhysical }, func(r *Rules) *Trigger { return &r.CreatePhysical }); fire {
		return 0, injected(fmt.Sprintf("create %d-byte physical chunk", size), device.ErrOutOfMemory)
	}
	return w.d.CreatePhysical(size)
}

func (w *wrapped) ReleasePhysical(h device.PhysMem) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.ReleasePhysical }, nil)
	return w.d.ReleasePhysical(h)
}

func (w *wrapped) Map(va device.Ptr, size uint64, h device.PhysMem) error {
	if _, fire := w.cfg.call(func(c *Counts) *uint64 { return &c.Map }, func(r *Rules) *Trigger { return &r.Map }); fire {
		return injected(fmt.Sprintf("map %d bytes at %#x", size, uint64(va)), device.ErrOutOfMemory)
	}
	return w.d.Map(va, size, h)
}

func (w *wrapped) Unmap(va device.Ptr, size uint64) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.Unmap }, nil)
	return w.d.Unmap(va, size)
}

func (w *wrapped) LoadModule(ptx []byte) (device.Module, error) {
	w.cfg.call(func(c *Counts) *uint64 { return &c.LoadModule }, nil)
	return w.d.LoadModule(ptx)
}

func (w *wrapped) UnloadModule(m device.Module) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.UnloadModule }, nil)
	return w.d.UnloadModule(m)
}

func (w *wrapped) Function(m device.Module, name string) (device.Function, error) {
	w.cfg.call(func(c *Counts) *uint64 { return &c.Function }, nil)
	return w.d.Function(m, name)
}

func (w *wrapped) Launch(f device.Function, grid, block device.Dim3, sharedBytes uint32, s device.Stream, args ...any) error {
	w.cfg.call(func(c *Counts) *uint64 { return &c.Launch }, nil)
	return w.d.Launch(f, grid, block, sharedBytes, s, args...)
}
