package fault_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/devicetest"
	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/device/sim"
)

var fillKernel = sim.Kernel{
	Name: devicetest.FillKernel,
	Run: func(m *sim.Mem, _, _ device.Dim3, args []any) error {
		dst, _ := args[0].(device.Ptr)
		n, _ := args[1].(uint64)
		seed, _ := args[2].(uint32)
		b, err := m.Bytes(dst, 4*n)
		if err != nil {
			return err
		}
		for i := range n {
			binary.LittleEndian.PutUint32(b[4*i:], devicetest.Pattern(seed, i))
		}
		return nil
	},
}

func newSim(t *testing.T, edit func(*sim.Options)) *sim.Device {
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

// hidden hides sim's Delay method, so the wrapper must sleep.
type hidden struct{ device.Device }

func TestConformance(t *testing.T) {
	load := func(d device.Device) (device.Module, error) { return d.LoadModule(nil) }
	for _, tc := range []struct {
		name  string
		rules fault.Rules
		edit  func(*sim.Options)
		hide  bool
	}{
		{"no faults", fault.Rules{}, nil, false},
		{"slow copies in simulated time, shuffled", fault.Rules{SlowCopies: fault.Always(), CopyDelay: time.Millisecond},
			func(o *sim.Options) { o.Shuffle = true }, false},
		{"every 7th copy sleeps", fault.Rules{SlowCopies: fault.Nth(7), CopyDelay: 100 * time.Microsecond}, nil, true},
		{"free memory hidden", fault.Rules{HideBytes: 4 << 30}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := func(t *testing.T) device.Device {
				var inner device.Device = newSim(t, tc.edit)
				if tc.hide {
					inner = hidden{inner}
				}
				cfg := &fault.Config{}
				cfg.Set(tc.rules)
				return fault.Wrap(inner, cfg)
			}
			devicetest.Run(t, open, devicetest.Options{LoadKernels: load})
		})
	}
}

func isInjectedOOM(err error) bool {
	return errors.Is(err, fault.ErrInjected) && errors.Is(err, device.ErrOutOfMemory)
}

func TestTriggers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		trigger fault.Trigger
		fails   string // which of 6 calls fail
	}{
		{"zero never fires", fault.Trigger{}, "......"},
		{"nth", fault.Nth(3), "..x..."},
		{"from", fault.From(3), "..xxxx"},
		{"always", fault.Always(), "xxxxxx"},
		{"first only", fault.Nth(1), "x....."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newSim(t, nil)
			cfg := &fault.Config{}
			w := fault.Wrap(d, cfg)
			// Calls before Set do not count towards the trigger.
			for range 2 {
				p, err := w.Alloc(512)
				if err != nil {
					t.Fatal(err)
				}
				w.Free(p)
			}
			cfg.Set(fault.Rules{Alloc: tc.trigger})
			got := ""
			for range 6 {
				p, err := w.Alloc(512)
				switch {
				case err == nil:
					got += "."
					w.Free(p)
				case isInjectedOOM(err):
					got += "x"
				default:
					t.Fatalf("Alloc failed with %v, not an injected out-of-memory error", err)
				}
			}
			if got != tc.fails {
				t.Errorf("calls failed as %q, want %q", got, tc.fails)
			}
			if c := cfg.Counts(); c.Alloc != 8 || c.Free != 2+uint64(bytes.Count([]byte(got), []byte("."))) {
				t.Errorf("counts: Alloc %d Free %d", c.Alloc, c.Free)
			}
			if c := cfg.Counts(); c.Injected != uint64(bytes.Count([]byte(got), []byte("x"))) {
				t.Errorf("Injected = %d", c.Injected)
			}
		})
	}
}

func TestFailures(t *testing.T) {
	d := newSim(t, nil)
	cfg := &fault.Config{}
	w := fault.Wrap(d, cfg)
	cfg.Set(fault.Rules{HostAlloc: fault.Nth(1), CreatePhysical: fault.Nth(1), Map: fault.Nth(1),
		EventRecord: fault.Nth(1), StreamWaitEvent: fault.Nth(1)})
	_, err := w.HostAlloc(4096)
	if !isInjectedOOM(err) {
		t.Errorf("HostAlloc = %v, want an injected out-of-memory error", err)
	}
	if _, err := w.HostAlloc(4096); err != nil {
		t.Errorf("second HostAlloc = %v", err)
	}
	_, err = w.CreatePhysical(2 << 20)
	if !isInjectedOOM(err) {
		t.Errorf("CreatePhysical = %v, want an injected out-of-memory error", err)
	}
	h, err := w.CreatePhysical(2 << 20)
	if err != nil {
		t.Fatal(err)
	}
	va, err := w.Reserve(2 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Map(va, 2<<20, h); !isInjectedOOM(err) {
		t.Errorf("Map = %v, want an injected out-of-memory error", err)
	}
	if err := w.Map(va, 2<<20, h); err != nil {
		t.Errorf("second Map = %v", err)
	}
	s, _ := w.NewStream()
	e, _ := w.NewEvent(false)
	if err := w.EventRecord(e, s); !errors.Is(err, fault.ErrInjected) {
		t.Errorf("EventRecord = %v, want an injected error", err)
	}
	if err := w.StreamWaitEvent(s, e); !errors.Is(err, fault.ErrInjected) {
		t.Errorf("StreamWaitEvent = %v, want an injected error", err)
	}
	if err := w.EventRecord(e, s); err != nil {
		t.Errorf("second EventRecord = %v", err)
	}
	if c := cfg.Counts(); c.Injected != 5 || c.HostAlloc != 2 || c.Map != 2 || c.EventRecord != 2 || c.StreamWaitEvent != 1 {
		t.Errorf("counts: %+v", c)
	}
}

// TestDroppedWaitCorruptsData: a dropped StreamWaitEvent on a shuffled
// simulator makes a consumer read stale data for some seeds, which is what
// code that ignores the error would see.
func TestDroppedWaitCorruptsData(t *testing.T) {
	wrong := 0
	for seed := uint64(1); seed <= 16; seed++ {
		d := newSim(t, func(o *sim.Options) { o.Shuffle, o.Seed = true, seed })
		cfg := &fault.Config{}
		cfg.Set(fault.Rules{StreamWaitEvent: fault.Always()})
		w := fault.Wrap(d, cfg)
		s1, _ := w.NewStream()
		s2, _ := w.NewStream()
		e, _ := w.NewEvent(false)
		p, _ := w.Alloc(4096)
		fresh := bytes.Repeat([]byte{9}, 4096)
		out := make([]byte, 4096)
		if err := w.CopyHtoD(p, fresh, s1); err != nil {
			t.Fatal(err)
		}
		if err := w.EventRecord(e, s1); err != nil {
			t.Fatal(err)
		}
		if err := w.StreamWaitEvent(s2, e); !errors.Is(err, fault.ErrInjected) {
			t.Fatalf("StreamWaitEvent = %v, want an injected error", err)
		}
		if err := w.CopyDtoH(out, p, s2); err != nil {
			t.Fatal(err)
		}
		if err := w.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, fresh) {
			wrong++
		}
	}
	if wrong == 0 {
		t.Error("no seed read stale data after the wait was dropped")
	}
}

func TestFreeLimit(t *testing.T) {
	d := newSim(t, nil)
	cfg := &fault.Config{}
	w := fault.Wrap(d, cfg)
	free0, total0, _ := w.MemInfo()
	for _, tc := range []struct {
		limit, hide, want uint64
	}{
		{0, 0, free0},
		{100 << 20, 0, 100 << 20},
		{free0 + 1, 0, free0},
		{0, 1 << 30, free0 - 1<<30},
		{0, free0 + 1, 0},
		{100 << 20, 1 << 30, 100 << 20},
		{100 << 20, free0 - 1<<20, 1 << 20},
	} {
		cfg.Set(fault.Rules{FreeLimit: tc.limit, HideBytes: tc.hide})
		free, total, err := w.MemInfo()
		if err != nil || free != tc.want || total != total0 {
			t.Errorf("limit %d hide %d: MemInfo = %d, %d, %v; want %d, %d", tc.limit, tc.hide, free, total, err, tc.want, total0)
		}
	}
}

func TestSlowCopies(t *testing.T) {
	const delay = 10 * time.Millisecond
	t.Run("simulated", func(t *testing.T) {
		d := newSim(t, nil)
		cfg := &fault.Config{}
		w := fault.Wrap(d, cfg)
		s, _ := w.NewStream()
		a, b := mustAlloc(t, w, 1<<20), mustAlloc(t, w, 1<<20)
		elapsed := func() time.Duration {
			start, _ := w.NewEvent(true)
			end, _ := w.NewEvent(true)
			w.EventRecord(start, s)
			if err := w.CopyDtoD(b, a, 1<<20, s); err != nil {
				t.Fatal(err)
			}
			w.EventRecord(end, s)
			if err := w.EventSynchronize(end); err != nil {
				t.Fatal(err)
			}
			el, err := w.EventElapsed(start, end)
			if err != nil {
				t.Fatal(err)
			}
			return el
		}
		base := elapsed()
		cfg.Set(fault.Rules{SlowCopies: fault.Nth(2), CopyDelay: delay})
		if el := elapsed(); el != base {
			t.Errorf("first copy after Set took %v, want %v (only the 2nd is slowed)", el, base)
		}
		if el := elapsed(); el != base+delay {
			t.Errorf("slowed copy took %v, want %v + %v", el, base, delay)
		}
		if el := elapsed(); el != base {
			t.Errorf("third copy took %v, want %v", el, base)
		}
		if c := cfg.Counts(); c.Injected != 1 || c.Copies != 4 || c.CopyDtoD != 4 {
			t.Errorf("counts: Injected %d Copies %d CopyDtoD %d", c.Injected, c.Copies, c.CopyDtoD)
		}
	})
	t.Run("real sleep", func(t *testing.T) {
		cfg := &fault.Config{}
		cfg.Set(fault.Rules{SlowCopies: fault.Always(), CopyDelay: delay})
		w := fault.Wrap(hidden{newSim(t, nil)}, cfg)
		s, _ := w.NewStream()
		p := mustAlloc(t, w, 4096)
		start := time.Now()
		if err := w.CopyHtoD(p, make([]byte, 4096), s); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el < delay {
			t.Errorf("slowed copy returned after %v, want at least %v", el, delay)
		}
	})
}

func mustAlloc(t *testing.T, d device.Device, n uint64) device.Ptr {
	t.Helper()
	p, err := d.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCounts(t *testing.T) {
	cfg := &fault.Config{}
	w := fault.Wrap(newSim(t, nil), cfg)
	s, _ := w.NewStream()
	e, _ := w.NewEvent(false)
	p := mustAlloc(t, w, 4096)
	buf := make([]byte, 16)
	w.CopyHtoD(p, buf, s)
	w.CopyDtoH(buf, p, s)
	w.Memset8(p, 0, 16, s)
	w.Memset32(p, 0, 4, s)
	w.EventRecord(e, s)
	w.EventQuery(e)
	w.EventSynchronize(e)
	w.StreamQuery(s)
	w.StreamSynchronize(s)
	w.Synchronize()
	w.Free(p)
	w.Free(p) // fails, still counted
	w.DestroyEvent(e)
	w.DestroyStream(s)
	want := fault.Counts{NewStream: 1, NewEvent: 1, Alloc: 1, CopyHtoD: 1, CopyDtoH: 1, Copies: 2, Memset8: 1,
		Memset32: 1, EventRecord: 1, EventQuery: 1, EventSynchronize: 1, StreamQuery: 1, StreamSynchronize: 1,
		Synchronize: 1, Free: 2, DestroyEvent: 1, DestroyStream: 1}
	if got := cfg.Counts(); got != want {
		t.Errorf("counts:\n got %+v\nwant %+v", got, want)
	}
}

// TestConfigConcurrent changes the rules while goroutines allocate; run it
// with -race.
func TestConfigConcurrent(t *testing.T) {
	cfg := &fault.Config{}
	w := fault.Wrap(newSim(t, nil), cfg)
	const workers, iters = 4, 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	failed := 0
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range iters {
				p, err := w.Alloc(1024)
				if err != nil {
					if !isInjectedOOM(err) {
						t.Error(err)
						return
					}
					mu.Lock()
					failed++
					mu.Unlock()
					continue
				}
				if err := w.Free(p); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 100 {
			cfg.Set(fault.Rules{Alloc: fault.Nth(uint64(i%5 + 1)), FreeLimit: uint64(i) << 20})
			_ = cfg.Rules()
			_, _, _ = w.MemInfo()
		}
	}()
	wg.Wait()
	c := cfg.Counts()
	if c.Alloc != workers*iters {
		t.Errorf("Alloc counted %d calls, made %d", c.Alloc, workers*iters)
	}
	if c.Injected != uint64(failed) || c.Free != uint64(workers*iters-failed) {
		t.Errorf("Injected %d, Free %d; %d allocations failed", c.Injected, c.Free, failed)
	}
	if failed == 0 {
		t.Log("no injected failure hit a worker (timing); counts still consistent")
	}
}
