package sim_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
)

// result carries a value and error for get(f()).ok(t).
type result[T any] struct {
	v   T
	err error
}

func get[T any](v T, err error) result[T] { return result[T]{v, err} }

func (r result[T]) ok(t *testing.T) T {
	t.Helper()
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.v
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// wantErr fails unless err wraps target and mentions every fragment.
func wantErr(t *testing.T, what string, err, target error, fragments ...string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: got %v, want an error wrapping %v", what, err, target)
		return
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("%s: error %q does not mention %q", what, err, f)
		}
	}
}

func newDev(t *testing.T, edit func(o *sim.Options)) *sim.Device {
	t.Helper()
	o := sim.DefaultOptions()
	o.Kernels = []sim.Kernel{fillKernel}
	if edit != nil {
		edit(&o)
	}
	d := sim.New(o)
	t.Cleanup(func() { d.Close() })
	return d
}

const (
	gib = uint64(1) << 30
	mib = uint64(1) << 20
)

// xfer is the modelled time to move n bytes at gbps GB/s.
func xfer(n uint64, gbps float64) time.Duration {
	return time.Duration(float64(n)/gbps + 0.5)
}

// racyProgram writes fresh data to a buffer on one stream and reads it back
// on another, with or without the event that orders them, and reports
// whether the read saw the fresh data.
func racyProgram(t *testing.T, d *sim.Device, withEvent bool) bool {
	const n = 1 << 16
	s1, s2 := get(d.NewStream()).ok(t), get(d.NewStream()).ok(t)
	e := get(d.NewEvent(false)).ok(t)
	a := get(d.Alloc(n)).ok(t)
	ok(t, d.Memset8(a, 0, n, s1))
	ok(t, d.Synchronize())
	fresh := bytes.Repeat([]byte{0x5A}, n)
	out := make([]byte, n)
	ok(t, d.CopyHtoD(a, fresh, s1))
	if withEvent {
		ok(t, d.EventRecord(e, s1))
		ok(t, d.StreamWaitEvent(s2, e))
	}
	ok(t, d.CopyDtoH(out, a, s2))
	ok(t, d.Synchronize())
	return bytes.Equal(out, fresh)
}

func TestShuffleExposesMissingWait(t *testing.T) {
	for _, tc := range []struct {
		name      string
		withEvent bool
	}{{"missing wait", false}, {"with event", true}} {
		t.Run(tc.name, func(t *testing.T) {
			right, wrong := 0, 0
			for seed := uint64(1); seed <= 32; seed++ {
				d := newDev(t, func(o *sim.Options) { o.Shuffle, o.Seed = true, seed })
				if racyProgram(t, d, tc.withEvent) {
					right++
				} else {
					wrong++
				}
			}
			t.Logf("32 seeds: %d right, %d wrong", right, wrong)
			if tc.withEvent && wrong > 0 {
				t.Errorf("with the event %d of 32 seeds read stale data", wrong)
			}
			if !tc.withEvent && (wrong == 0 || right == 0) {
				t.Errorf("without the event: %d seeds right, %d wrong; want both outcomes", right, wrong)
			}
		})
	}
}

func TestShuffleIsDeterministic(t *testing.T) {
	outcome := func(seed uint64) string {
		var b strings.Builder
		for range 8 {
			d := newDev(t, func(o *sim.Options) { o.Shuffle, o.Seed = true, seed })
			fmt.Fprint(&b, racyProgram(t, d, false))
			seed += 1000
		}
		return b.String()
	}
	if a, b := outcome(5), outcome(5); a != b {
		t.Errorf("same seeds gave %s then %s", a, b)
	}
}

// TestSimTimeOrderExposesEarlyReuse: without shuffling, work runs in
// simulated-time order, so a stream that reuses memory another stream is
// still (in simulated time) reading from gets there first.
func TestSimTimeOrderExposesEarlyReuse(t *testing.T) {
	for _, withEvent := range []bool{false, true} {
		t.Run(fmt.Sprintf("event=%v", withEvent), func(t *testing.T) {
			d := newDev(t, nil)
			s1, s2 := get(d.NewStream()).ok(t), get(d.NewStream()).ok(t)
			e := get(d.NewEvent(false)).ok(t)
			const n = 1 << 20
			a := get(d.Alloc(n)).ok(t)
			old := bytes.Repeat([]byte{1}, n)
			ok(t, d.CopyHtoD(a, old, s1))
			ok(t, d.Synchronize())
			// s1: slow pageable work first, then read a. s2: overwrite a.
			ok(t, d.Delay(s1, time.Millisecond))
			got := make([]byte, n)
			ok(t, d.CopyDtoH(got, a, s1))
			ok(t, d.EventRecord(e, s1))
			if withEvent {
				ok(t, d.StreamWaitEvent(s2, e))
			}
			ok(t, d.Memset8(a, 2, n, s2))
			ok(t, d.Synchronize())
			if intact := bytes.Equal(got, old); intact != withEvent {
				t.Errorf("read saw the old data: %v, want %v", intact, withEvent)
			}
		})
	}
}

func TestTimeModel(t *testing.T) {
	o := sim.DefaultOptions()
	lat, launch := o.CopyLatency, o.LaunchLatency
	type env struct {
		d      *sim.Device
		s1, s2 device.Stream
		dev    device.Ptr
		dev2   device.Ptr
		pinned []byte
		page   []byte
	}
	// Host buffers shared by the subtests (never touched: no data moves).
	pinBuf, page := untouched(t, gib), untouched(t, gib)
	setup := func(t *testing.T, edit func(*sim.Options)) *env {
		d := newDev(t, func(o *sim.Options) {
			o.Backing = false
			o.Kernels = append(o.Kernels, fixedKernel, sim.Kernel{Name: "nocost"})
			if edit != nil {
				edit(o)
			}
		})
		return &env{
			d: d, s1: get(d.NewStream()).ok(t), s2: get(d.NewStream()).ok(t),
			dev: get(d.Alloc(gib)).ok(t), dev2: get(d.Alloc(gib)).ok(t),
			pinned: get(d.HostRegister(pinBuf, 0)).ok(t).Bytes,
			page:   page,
		}
	}
	tests := []struct {
		name string
		edit func(*sim.Options)
		run  func(t *testing.T, e *env)
		want time.Duration // Now after Synchronize
	}{
		{"1 GiB pinned H2D", nil, func(t *testing.T, e *env) {
			ok(t, e.d.CopyHtoD(e.dev, e.pinned, e.s1))
		}, lat + xfer(gib, 25)},
		{"1 GiB pageable H2D", nil, func(t *testing.T, e *env) {
			ok(t, e.d.CopyHtoD(e.dev, e.page, e.s1))
		}, lat + xfer(gib, 8)},
		{"1 GiB pinned D2H", nil, func(t *testing.T, e *env) {
			ok(t, e.d.CopyDtoH(e.pinned, e.dev, e.s1))
		}, lat + xfer(gib, 25)},
		{"slice inside a pinned buffer is pinned", nil, func(t *testing.T, e *env) {
			ok(t, e.d.CopyHtoD(e.dev, e.pinned[mib:mib+64*mib], e.s1))
		}, lat + xfer(64*mib, 25)},
		{"1 GiB D2D counts read and write", nil, func(t *testing.T, e *env) {
			ok(t, e.d.CopyDtoD(e.dev2, e.dev, gib, e.s1))
		}, lat + xfer(2*gib, 448)},
		{"1 GiB memset counts the write", nil, func(t *testing.T, e *env) {
			ok(t, e.d.Memset8(e.dev, 0, gib, e.s1))
		}, launch + xfer(gib, 448)},
		{"H2D and a kernel overlap on two streams", nil, func(t *testing.T, e *env) {
			ok(t, e.d.CopyHtoD(e.dev, e.pinned, e.s1))
			launchFixed(t, e.d, 40*time.Millisecond, e.s2)
		}, lat + xfer(gib, 25)},
		{"two H2D on two streams share the engine", nil, func(t *testing.T, e *env) {
			ok(t, e.d.CopyHtoD(e.dev, e.pinned, e.s1))
			ok(t, e.d.CopyHtoD(e.dev2, e.pinned, e.s2))
		}, 2 * (lat + xfer(gib, 25))},
		{"H2D and D2H overlap with two copy engines", nil, func(t *testing.T, e *env) {
			ok(t, e.d.CopyHtoD(e.dev, e.pinned, e.s1))
			ok(t, e.d.CopyDtoH(e.pinned[:gib/2], e.dev2, e.s2))
		}, lat + xfer(gib, 25)},
		{"H2D and D2H serialize with one copy engine", func(o *sim.Options) { o.CopyEngines = 1 }, func(t *testing.T, e *env) {
			ok(t, e.d.CopyHtoD(e.dev, e.pinned, e.s1))
			ok(t, e.d.CopyDtoH(e.pinned[:gib/2], e.dev2, e.s2))
		}, 2*lat + xfer(gib, 25) + xfer(gib/2, 25)},
		{"same stream serializes across engines", nil, func(t *testing.T, e *env) {
			ok(t, e.d.CopyHtoD(e.dev, e.pinned, e.s1))
			launchFixed(t, e.d, 40*time.Millisecond, e.s1)
		}, lat + xfer(gib, 25) + 40*time.Millisecond},
		{"event wait delays the waiting stream", nil, func(t *testing.T, e *env) {
			ev := get(e.d.NewEvent(false)).ok(t)
			ok(t, e.d.CopyHtoD(e.dev, e.pinned, e.s1))
			ok(t, e.d.EventRecord(ev, e.s1))
			ok(t, e.d.StreamWaitEvent(e.s2, ev))
			launchFixed(t, e.d, time.Millisecond, e.s2)
		}, lat + xfer(gib, 25) + time.Millisecond},
		{"waiting on a never-recorded event costs nothing", nil, func(t *testing.T, e *env) {
			ev := get(e.d.NewEvent(false)).ok(t)
			ok(t, e.d.StreamWaitEvent(e.s2, ev))
			launchFixed(t, e.d, time.Millisecond, e.s2)
		}, time.Millisecond},
		{"FLOP-bound kernel", nil, func(t *testing.T, e *env) {
			launchCost(t, e.d, sim.Cost{FLOPs: 20e12 * 0.010, Bytes: 1e6}, e.s1)
		}, launch + 10*time.Millisecond},
		{"memory-bound kernel", nil, func(t *testing.T, e *env) {
			launchCost(t, e.d, sim.Cost{FLOPs: 1e6, Bytes: 448e9 * 0.010}, e.s1)
		}, launch + 10*time.Millisecond},
		{"kernel without cost model", nil, func(t *testing.T, e *env) {
			f := get(e.d.Function(get(e.d.LoadModule(nil)).ok(t), "nocost")).ok(t)
			ok(t, e.d.Launch(f, dim(1), dim(1), 0, e.s1))
		}, launch},
		{"delay stalls the stream without an engine", nil, func(t *testing.T, e *env) {
			ok(t, e.d.Delay(e.s1, 5*time.Millisecond))
			ok(t, e.d.CopyHtoD(e.dev2, e.pinned[:mib], e.s2)) // not held up by s1's delay
			ok(t, e.d.CopyHtoD(e.dev, e.pinned[:mib], e.s1))
		}, 5*time.Millisecond + lat + xfer(mib, 25)},
		{"integrated pinned copy at memory speed", func(o *sim.Options) { o.Integrated = true }, func(t *testing.T, e *env) {
			ok(t, e.d.CopyHtoD(e.dev, e.pinned[:256*mib], e.s1))
		}, lat + xfer(2*256*mib, 448)},
		{"zero-copy D2D from host memory at PCIe speed", nil, func(t *testing.T, e *env) {
			hb := get(e.d.HostAlloc(64 * mib)).ok(t)
			ok(t, e.d.CopyDtoD(e.dev, hb.DevicePtr, 64*mib, e.s1))
		}, lat + xfer(64*mib, 25)},
		{"work after a synchronize starts at the host clock", nil, func(t *testing.T, e *env) {
			ok(t, e.d.CopyHtoD(e.dev, e.pinned[:mib], e.s1))
			ok(t, e.d.StreamSynchronize(e.s1))
			ok(t, e.d.CopyHtoD(e.dev, e.pinned[:mib], e.s2))
		}, 2 * (lat + xfer(mib, 25))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t, tc.edit)
			tc.run(t, e)
			ok(t, e.d.Synchronize())
			if got := e.d.Now(); got != tc.want {
				t.Errorf("Now() = %v, want %v", got, tc.want)
			}
		})
	}
}

var fixedKernel = sim.Kernel{
	Name: "fixed",
	Cost: func(_, _ device.Dim3, args []any) sim.Cost {
		if len(args) == 1 {
			if d, ok := args[0].(int64); ok {
				return sim.Cost{Fixed: time.Duration(d)}
			}
		}
		if len(args) == 2 {
			f, _ := args[0].(float64)
			b, _ := args[1].(float64)
			return sim.Cost{FLOPs: f, Bytes: b}
		}
		return sim.Cost{}
	},
}

func dim(x uint32) device.Dim3 { return device.Dim3{X: x, Y: 1, Z: 1} }

func fixedFn(t *testing.T, d *sim.Device) device.Function {
	t.Helper()
	return get(d.Function(get(d.LoadModule(nil)).ok(t), "fixed")).ok(t)
}

func launchFixed(t *testing.T, d *sim.Device, dur time.Duration, s device.Stream) {
	t.Helper()
	ok(t, d.Launch(fixedFn(t, d), dim(1), dim(1), 0, s, int64(dur)))
}

func launchCost(t *testing.T, d *sim.Device, c sim.Cost, s device.Stream) {
	t.Helper()
	ok(t, d.Launch(fixedFn(t, d), dim(1), dim(1), 0, s, c.FLOPs, c.Bytes))
}

func TestEventElapsedMatchesModel(t *testing.T) {
	d := newDev(t, func(o *sim.Options) { o.Backing = false })
	s := get(d.NewStream()).ok(t)
	start, end := get(d.NewEvent(true)).ok(t), get(d.NewEvent(true)).ok(t)
	dev := get(d.Alloc(gib)).ok(t)
	src := get(d.HostAlloc(gib)).ok(t).Bytes
	ok(t, d.EventRecord(start, s))
	ok(t, d.CopyHtoD(dev, src, s))
	ok(t, d.EventRecord(end, s))
	_, err := d.EventElapsed(start, end)
	wantErr(t, "EventElapsed before completion", err, device.ErrNotReady)
	ok(t, d.EventSynchronize(end))
	el := get(d.EventElapsed(start, end)).ok(t)
	want := 2*time.Microsecond + xfer(gib, 25)
	if el != want {
		t.Errorf("1 GiB pinned H2D took %v, want %v", el, want)
	}
	// 1 GiB / 25 GB/s = 42.95 ms.
	if el < 42900*time.Microsecond || el > 43000*time.Microsecond {
		t.Errorf("1 GiB pinned H2D took %v, want about 42.95 ms", el)
	}
	never := get(d.NewEvent(true)).ok(t)
	_, err = d.EventElapsed(start, never)
	wantErr(t, "EventElapsed of a never-recorded event", err, device.ErrInvalid, "never recorded")
}

func TestReRecordDoesNotAffectEarlierWait(t *testing.T) {
	d := newDev(t, func(o *sim.Options) { o.Backing = false; o.Kernels = []sim.Kernel{fixedKernel} })
	s1, s2 := get(d.NewStream()).ok(t), get(d.NewStream()).ok(t)
	e := get(d.NewEvent(false)).ok(t)
	t0, t1 := get(d.NewEvent(true)).ok(t), get(d.NewEvent(true)).ok(t)
	dev := get(d.Alloc(mib)).ok(t)
	src := make([]byte, mib)
	ok(t, d.EventRecord(t0, s2))
	launchFixed(t, d, time.Millisecond, s1)
	ok(t, d.EventRecord(e, s1))
	ok(t, d.StreamWaitEvent(s2, e))
	launchFixed(t, d, 100*time.Millisecond, s1)
	ok(t, d.EventRecord(e, s1)) // a later record must not affect s2's earlier wait
	ok(t, d.CopyHtoD(dev, src, s2))
	ok(t, d.EventRecord(t1, s2))
	ok(t, d.EventSynchronize(t1))
	if el, want := get(d.EventElapsed(t0, t1)).ok(t), time.Millisecond+2*time.Microsecond+xfer(mib, 8); el != want {
		t.Errorf("copy on s2 ended at %v, want %v (after the first record only)", el, want)
	}
	// Waiting again picks up the new record.
	ok(t, d.StreamWaitEvent(s2, e))
	q := get(d.NewEvent(true)).ok(t)
	ok(t, d.EventRecord(q, s2))
	ok(t, d.EventSynchronize(q))
	if got := get(d.EventElapsed(t0, q)).ok(t); got != 101*time.Millisecond {
		t.Errorf("after waiting on the re-recorded event s2 is at %v, want 101ms", got)
	}
}

func TestLazyExecution(t *testing.T) {
	d := newDev(t, nil)
	s := get(d.NewStream()).ok(t)
	p := get(d.Alloc(4096)).ok(t)
	src := bytes.Repeat([]byte{1}, 4096)
	out := make([]byte, 4096)
	ok(t, d.CopyHtoD(p, src, s))
	ok(t, d.CopyDtoH(out, p, s))
	if out[0] != 0 {
		t.Fatal("CopyDtoH wrote the host buffer before anything forced it")
	}
	// The host buffer is read when the copy runs: changing it before then
	// changes what arrives (the contract forbids this; the simulator shows
	// why).
	src[0] = 9
	ok(t, d.StreamSynchronize(s))
	if out[0] != 9 || out[1] != 1 {
		t.Errorf("after synchronize out starts %v, want [9 1 ...]", out[:2])
	}
	if st := d.Stats(); st.Pending != 0 || st.Copies != 2 {
		t.Errorf("stats after synchronize: %+v", st)
	}
}

func TestQueryMakesProgress(t *testing.T) {
	d := newDev(t, nil)
	s := get(d.NewStream()).ok(t)
	e := get(d.NewEvent(false)).ok(t)
	p := get(d.Alloc(4096)).ok(t)
	for range 3 {
		ok(t, d.Memset8(p, 1, 4096, s))
	}
	ok(t, d.EventRecord(e, s))
	ok(t, d.Memset8(p, 2, 4096, s))
	calls := 0
	for !get(d.EventQuery(e)).ok(t) {
		calls++
		if calls > 10 {
			t.Fatal("EventQuery never reported completion")
		}
	}
	if calls != 3 {
		t.Errorf("EventQuery reported false %d times, want 3 (one per queued operation)", calls)
	}
	if st := d.Stats(); st.Pending != 1 {
		t.Errorf("%d operations pending after the event completed, want 1", st.Pending)
	}
	if get(d.StreamQuery(s)).ok(t) {
		t.Error("StreamQuery with an operation pending reported true")
	}
	if !get(d.StreamQuery(s)).ok(t) {
		t.Error("StreamQuery still false after the last operation ran")
	}
}

func TestMaxPending(t *testing.T) {
	d := newDev(t, func(o *sim.Options) { o.MaxPending = 4 })
	s := get(d.NewStream()).ok(t)
	p := get(d.Alloc(4096)).ok(t)
	for i := range 20 {
		ok(t, d.Memset8(p, byte(i), 4096, s))
		if st := d.Stats(); st.Pending > 4 {
			t.Fatalf("%d operations pending, limit 4", st.Pending)
		}
	}
	if st := d.Stats(); st.Memsets != 16 {
		t.Errorf("%d memsets ran before any synchronize, want 16", st.Memsets)
	}
}

func TestStats(t *testing.T) {
	d := newDev(t, nil)
	s := get(d.NewStream()).ok(t)
	p := get(d.Alloc(1000)).ok(t)
	hb := get(d.HostAlloc(4096)).ok(t)
	ok(t, d.CopyHtoD(p, hb.Bytes[:1000], s))
	ok(t, d.CopyDtoH(hb.Bytes[:1000], p, s))
	ok(t, d.Memset8(p, 0, 1000, s))
	ok(t, d.StreamSynchronize(s))
	ok(t, d.Free(p))
	st := d.Stats()
	want := sim.Stats{
		Now:       st.Now,
		HtoDBusy:  2*time.Microsecond + xfer(1000, 25),
		DtoHBusy:  2*time.Microsecond + xfer(1000, 25),
		HtoDBytes: 1000, DtoHBytes: 1000, MemsetBytes: 1000,
		ComputeBusy: 4*time.Microsecond + xfer(1000, 448),
		Copies:      2, Memsets: 1,
		AllocCalls: 2, FreeCalls: 1, DriverTime: 90 * time.Microsecond,
		PinnedHostBytes: 4096,
	}
	if st != want {
		t.Errorf("Stats:\n got %+v\nwant %+v", st, want)
	}
	if st.Now != st.HtoDBusy+st.DtoHBusy+st.ComputeBusy {
		t.Errorf("Now %v: one stream should be the sum of its work", st.Now)
	}
}

func TestDefaultInfo(t *testing.T) {
	in := sim.New(sim.DefaultOptions()).Info()
	want := device.Info{
		Backend: "sim", Name: "memwall-sim (8 GiB discrete, PCIe 4.0 x16)", TotalBytes: 8 << 30,
		ComputeMajor: 8, ComputeMinor: 6, Multiprocessors: 46, CanMapHostMemory: true,
		ReadOnlyHostRegister: true, CopyEngines: 2, VirtualMemory: true, Granularity: 2 << 20,
		PCIeGen: 4, PCIeWidth: 16, MemoryBusBit: 256,
	}
	got := in
	got.UUID, got.DriverVersion, got.PCIBusID, got.Disabled = "", "", "", nil
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Info:\n got %+v\nwant %+v", got, want)
	}
}

func TestZeroOptions(t *testing.T) {
	d := sim.New(sim.Options{})
	defer d.Close()
	in, o := d.Info(), d.Options()
	def := sim.DefaultOptions()
	if in.TotalBytes != def.TotalBytes || o.PinnedHtoDGBps != def.PinnedHtoDGBps || o.Granularity != def.Granularity || o.MaxPending != def.MaxPending {
		t.Errorf("zero numeric options not filled: %+v", o)
	}
	if in.VirtualMemory || in.CanMapHostMemory || o.Backing || o.CopyLatency != 0 {
		t.Errorf("zero booleans or latencies changed: %+v", o)
	}
	if _, err := d.Reserve(2 << 20); !errors.Is(err, device.ErrUnsupported) {
		t.Errorf("Reserve on a device without virtual memory = %v", err)
	}
	odd := sim.DefaultOptions()
	odd.Granularity = 3 << 20
	odd.CopyLatency = -1
	if o := sim.New(odd).Options(); o.Granularity != 2<<20 || o.CopyLatency != def.CopyLatency {
		t.Errorf("bad Granularity / negative latency not replaced: %v, %v", o.Granularity, o.CopyLatency)
	}
}
