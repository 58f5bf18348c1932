package residency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/safetensors"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/format/weights"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/pool"
)

// onGPU reports whether the suite runs on the GPU (MEMWALL_TEST_DEVICE=cuda).
func onGPU() bool { return os.Getenv("MEMWALL_TEST_DEVICE") == "cuda" }

// testDevice is the GPU under MEMWALL_TEST_DEVICE=cuda, else a simulator
// with backing bytes and a random order of ready streams (seeded), which
// exposes a missing dependency as wrong bytes.
func testDevice(t testing.TB, seed uint64, mod func(*sim.Options)) device.Device {
	t.Helper()
	if onGPU() {
		d, err := cuda.Open(cuda.Options{})
		if err != nil {
			t.Fatalf("MEMWALL_TEST_DEVICE=cuda: %v", err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	o := sim.DefaultOptions()
	o.Shuffle, o.Seed = true, seed
	o.TotalBytes = 1 << 30
	if mod != nil {
		mod(&o)
	}
	d := sim.New(o)
	t.Cleanup(func() { d.Close() })
	return d
}

// randomModel writes a safetensors file of random layers (1..4 tensors
// each, random dtypes and shapes, 64 B..maxBytes per tensor) and stand-alone
// tensors, filled with random bytes, and opens it.
func randomModel(t testing.TB, rng *rand.Rand, layers int, maxBytes uint64) *format.Model {
	t.Helper()
	var specs []format.TensorSpec
	add := func(name string) {
		dt := []string{"BF16", "F16", "F32", "U8"}[rng.IntN(4)]
		elt := map[string]uint64{"BF16": 2, "F16": 2, "F32": 4, "U8": 1}[dt]
		n := max(64/elt, rng.Uint64N(maxBytes/elt+1))
		cols := uint64(1) << rng.IntN(7)
		for n%cols != 0 {
			cols /= 2
		}
		specs = append(specs, format.TensorSpec{Name: name, DType: dt, Shape: []uint64{n / cols, cols}})
	}
	if rng.IntN(2) == 0 {
		add("model.embed_tokens.weight")
	}
	for l := range layers {
		for j := range 1 + rng.IntN(4) {
			add(fmt.Sprintf("model.layers.%d.t%d.weight", l, j))
		}
	}
	if rng.IntN(2) == 0 {
		add("model.norm.weight")
	}
	rng.Shuffle(len(specs), func(i, j int) { specs[i], specs[j] = specs[j], specs[i] })
	var buf bytes.Buffer
	w, err := safetensors.NewWriter(&buf, specs, nil)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, w.DataBytes())
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := weights.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// randomPlan plans m under a random budget between the minimum that
// streams and the budget that keeps everything resident (or exactly
// those ends), with slots ring slots.
func randomPlan(t testing.TB, rng *rand.Rand, m *format.Model, slots int) *plan.WeightPlan {
	t.Helper()
	groups, err := plan.GroupWeights(m.Tensors)
	if err != nil {
		t.Fatal(err)
	}
	o := plan.WeightOptions{Budget: 1 << 50, Slots: slots, LinkGBps: 25, Granule: 512}
	full, err := plan.PlanWeights(groups, o)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := full.MinimumBytes, full.PeakBytes
	switch rng.IntN(4) {
	case 0:
		o.Budget = lo
	case 1:
		o.Budget = hi
	default:
		o.Budget = lo + rng.Uint64N(hi-lo+1)
	}
	if o.Budget < lo {
		o.Budget = lo
	}
	p, err := plan.PlanWeights(groups, o)
	if err != nil {
		t.Fatalf("plan under %d (min %d, all %d): %v", o.Budget, lo, hi, err)
	}
	return p
}

// pools makes a device pool and a pinned host pool on d, closed at cleanup.
func pools(t testing.TB, d device.Device) (dev, host *pool.Pool) {
	t.Helper()
	dev, err := pool.New(d, pool.Options{Name: "residency-test"})
	if err != nil {
		t.Fatal(err)
	}
	host, err = pool.NewHost(d, pool.Options{Name: "residency-test-host", Cache: pool.CacheOff, ChunkBytes: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dev.Close()
		host.Close()
	})
	return dev, host
}

// checkEmpty fails when a pool still has live bytes.
func checkEmpty(t testing.TB, what string, ps ...*pool.Pool) {
	t.Helper()
	for _, p := range ps {
		if st := p.Stats(); st.UsedBytes != 0 || st.LiveBlocks != 0 {
			t.Errorf("%s: pool %s: %d bytes in %d blocks still used", what, st.Name, st.UsedBytes, st.LiveBlocks)
		}
	}
}

// reader is the fake compute: it waits for an acquired group's event on
// its own stream, reads every view back to the host (a device-to-host
// copy), records the group's done event and releases the group. Checks
// compare what was read with the file's bytes once the stream is synced.
type reader struct {
	t      testing.TB
	d      device.Device
	r      *Residency
	m      *format.Model
	cs     device.Stream
	done   []device.Event
	checks []readCheck
	reads  int
}

type readCheck struct {
	group int
	t     format.Tensor
	got   []byte
}

func newReader(t testing.TB, d device.Device, r *Residency, m *format.Model) *reader {
	t.Helper()
	cs, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	rd := &reader{t: t, d: d, r: r, m: m, cs: cs}
	for range r.Plan().Groups {
		e, err := d.NewEvent(false)
		if err != nil {
			t.Fatal(err)
		}
		rd.done = append(rd.done, e)
	}
	t.Cleanup(func() {
		for _, e := range rd.done {
			d.DestroyEvent(e)
		}
		d.DestroyStream(cs)
	})
	return rd
}

// acquire acquires g and queues the reads of its views.
func (rd *reader) acquire(g int) error {
	views, ready, err := rd.r.Acquire(g)
	if err != nil {
		return err
	}
	gp := rd.r.Plan().Groups[g]
	if len(views) != len(gp.Tensors) {
		rd.t.Fatalf("group %d: %d views for %d tensors", g, len(views), len(gp.Tensors))
	}
	if gp.Resident != (ready == 0) {
		rd.t.Fatalf("group %d (resident %v): ready event %d", g, gp.Resident, ready)
	}
	if ready != 0 {
		if err := rd.d.StreamWaitEvent(rd.cs, ready); err != nil {
			return err
		}
	}
	for i, v := range views {
		if v.Tensor.Name != gp.Tensors[i].Name {
			rd.t.Fatalf("group %d view %d: tensor %q, want %q", g, i, v.Tensor.Name, gp.Tensors[i].Name)
		}
		got := make([]byte, v.Tensor.Bytes)
		if err := rd.d.CopyDtoH(got, v.Ptr, rd.cs); err != nil {
			return err
		}
		rd.checks = append(rd.checks, readCheck{group: g, t: v.Tensor, got: got})
	}
	return nil
}

func (rd *reader) release(g int) error {
	if err := rd.d.EventRecord(rd.done[g], rd.cs); err != nil {
		return err
	}
	return rd.r.Release(g, rd.done[g])
}

// verify syncs the reads and compares them with the file.
func (rd *reader) verify() {
	rd.t.Helper()
	if err := rd.d.StreamSynchronize(rd.cs); err != nil {
		rd.t.Fatalf("reads: %v", err)
	}
	for _, c := range rd.checks {
		want := rd.m.Data(c.t)
		if !bytes.Equal(c.got, want) {
			i := 0
			for i < len(want) && c.got[i] == want[i] {
				i++
			}
			rd.t.Fatalf("group %d tensor %q (%d bytes): byte %d differs from the file (read %d views so far)",
				c.group, c.t.Name, len(want), i, rd.reads)
		}
		rd.reads++
	}
	rd.checks = rd.checks[:0]
}

func randomSource(rng *rand.Rand, d device.Device) Source {
	src := []Source{Auto, Register, Pinned, Bounce}[rng.IntN(4)]
	if src == Register && !d.Info().ReadOnlyHostRegister {
		src = Pinned
	}
	return src
}

// TestCyclesRandomPlans walks every group in order again and again, as
// decode steps do, for random models, budgets, slot counts, prefetch
// depths and sources, on a simulator that runs ready streams in a random
// order; every view read back holds the file's bytes, the counts add up,
// and Close gives every byte back.
func TestCyclesRandomPlans(t *testing.T) {
	iters := 60
	if testing.Short() || onGPU() {
		iters = 15
	}
	for it := range iters {
		seed := uint64(it) + 1
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			d := testDevice(t, seed, func(o *sim.Options) { o.ReadOnlyHostRegister = rng.IntN(3) > 0 })
			span := 8
			if onGPU() {
				span = 14 // tensors up to 8 MiB on the GPU
			}
			m := randomModel(t, rng, 1+rng.IntN(8), 1<<uint(10+rng.IntN(span)))
			slots := 2 + rng.IntN(3)
			p := randomPlan(t, rng, m, slots)
			dev, host := pools(t, d)
			o := Options{Source: randomSource(rng, d), BounceBytes: uint64(4096 << rng.IntN(6)), Bounces: 1 + rng.IntN(3)}
			if p.Slots > 1 {
				o.Prefetch = 1 + rng.IntN(p.Slots-1)
			}
			r, err := New(context.Background(), d, dev, host, m, p, o)
			if err != nil {
				t.Fatal(err)
			}
			rd := newReader(t, d, r, m)
			passes := 2 + rng.IntN(4)
			for pass := range passes {
				for g := range p.Groups {
					if err := rd.acquire(g); err != nil {
						t.Fatalf("pass %d: acquire %d: %v", pass, g, err)
					}
					if err := rd.release(g); err != nil {
						t.Fatalf("pass %d: release %d: %v", pass, g, err)
					}
					if rng.IntN(5) == 0 {
						rd.verify()
					}
				}
			}
			rd.verify()
			st := r.Stats()
			ns := len(p.Streamed())
			if st.Groups != len(p.Groups) || st.ResidentGroups != len(p.Groups)-ns || st.PassBytes != p.StreamedBytes {
				t.Errorf("stats %+v for %d groups, %d streamed, %d bytes per pass", st, len(p.Groups), ns, p.StreamedBytes)
			}
			// Every pass copies every streamed group once; copies issued
			// ahead into the next pass add at most Prefetch.
			minCopies := uint64(passes * ns)
			if st.Copies < minCopies || st.Copies > minCopies+uint64(st.Prefetch) || st.Dropped != 0 {
				t.Errorf("%d copies (%d dropped) for %d passes of %d streamed groups, prefetch %d", st.Copies, st.Dropped, passes, ns, st.Prefetch)
			}
			if ns > 0 && (st.Slots != p.Slots || st.Source == "none" || st.StreamedBytes < uint64(passes)*p.StreamedBytes) {
				t.Errorf("stats %+v, plan slots %d, streamed %d per pass", st, p.Slots, p.StreamedBytes)
			}
			if ns == 0 && (st.Copies != 0 || st.Slots != 0 || st.Source != "none") {
				t.Errorf("all resident, stats %+v", st)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			checkEmpty(t, "after Close", dev, host)
		})
	}
}

// TestMissingWaitIsCaught drops the copy stream's wait for a slot's
// release: on the shuffling simulator some seed must read overwritten
// bytes, or the suite above could not see a missing dependency.
func TestMissingWaitIsCaught(t *testing.T) {
	if onGPU() {
		t.Skip("the dropped wait is a simulator experiment")
	}
	caught := 0
	for seed := uint64(1); seed <= 20 && caught == 0; seed++ {
		rng := rand.New(rand.NewPCG(seed, 9))
		d := testDevice(t, seed, nil)
		m := randomModel(t, rng, 6, 4096)
		p := randomPlan(t, rng, m, 2)
		for len(p.Streamed()) < 3 {
			p = randomPlan(t, rng, m, 2)
		}
		dev, host := pools(t, d)
		r, err := New(context.Background(), d, dev, host, m, p, Options{Source: Pinned, noSlotWait: true})
		if err != nil {
			t.Fatal(err)
		}
		rd := newReader(t, d, r, m)
		for range 3 {
			for g := range p.Groups {
				if err := rd.acquire(g); err != nil {
					t.Fatal(err)
				}
				if err := rd.release(g); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := d.StreamSynchronize(rd.cs); err != nil {
			t.Fatal(err)
		}
		for _, c := range rd.checks {
			if !bytes.Equal(c.got, m.Data(c.t)) {
				caught++
				break
			}
		}
		r.Close()
	}
	if caught == 0 {
		t.Fatal("no seed read overwritten bytes without the slot wait: the reader cannot see a missing dependency")
	}
}

// TestRandomHolds acquires and releases random groups in random order,
// holding several at once: views read back hold the file's bytes, views
// of groups held together never overlap, Acquire fails with ErrRingFull
// exactly when every slot holds an acquired group, misuse fails with
// ErrState, and Close gives every byte back.
func TestRandomHolds(t *testing.T) {
	iters := 40
	if testing.Short() || onGPU() {
		iters = 10
	}
	for it := range iters {
		seed := uint64(it) + 100
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 12))
			ops := make([]byte, 300)
			for i := range ops {
				ops[i] = byte(rng.Uint32())
			}
			runHolds(t, seed, ops)
		})
	}
}

// FuzzHolds runs an op sequence (each byte: low bit acquire or release,
// the rest the group) on a model and plan drawn from the seed.
func FuzzHolds(f *testing.F) {
	if onGPU() {
		f.Skip("the fuzz target runs on the simulator")
	}
	f.Add(uint64(1), []byte{0, 2, 4, 1, 3, 5})
	f.Add(uint64(2), []byte{0, 0, 2, 2, 4, 4, 6, 6, 1, 3})
	f.Fuzz(func(t *testing.T, seed uint64, ops []byte) {
		if len(ops) > 2000 {
			ops = ops[:2000]
		}
		runHolds(t, seed, ops)
	})
}

// runHolds builds a random model, plan and residency from seed and runs
// ops, checking every result against a model of the ring's rules.
func runHolds(t *testing.T, seed uint64, ops []byte) {
	rng := rand.New(rand.NewPCG(seed, 11))
	d := testDevice(t, seed, nil)
	m := randomModel(t, rng, 2+rng.IntN(7), 1<<uint(8+rng.IntN(8)))
	p := randomPlan(t, rng, m, 2+rng.IntN(3))
	dev, host := pools(t, d)
	r, err := New(context.Background(), d, dev, host, m, p, Options{Source: randomSource(rng, d), BounceBytes: 8192})
	if err != nil {
		t.Fatal(err)
	}
	rd := newReader(t, d, r, m)
	held := map[int]int{} // group → times held
	heldStreamed := func() int {
		n := 0
		for g := range held {
			if !p.Groups[g].Resident {
				n++
			}
		}
		return n
	}
	for op, b := range ops {
		g := int(b>>1) % len(p.Groups)
		if b&1 == 0 {
			err := rd.acquire(g)
			switch {
			case !p.Groups[g].Resident && held[g] > 0:
				if !errors.Is(err, ErrState) {
					t.Fatalf("op %d: second acquire of streamed group %d: %v", op, g, err)
				}
			case !p.Groups[g].Resident && heldStreamed() == p.Slots:
				if !errors.Is(err, ErrRingFull) {
					t.Fatalf("op %d: acquire %d with all %d slots held: %v", op, g, p.Slots, err)
				}
			case err != nil:
				t.Fatalf("op %d: acquire %d (%d streamed held of %d slots): %v", op, g, heldStreamed(), p.Slots, err)
			default:
				held[g]++
			}
		} else {
			err := rd.release(g)
			if held[g] == 0 {
				if !errors.Is(err, ErrState) {
					t.Fatalf("op %d: release of unheld group %d: %v", op, g, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("op %d: release %d: %v", op, g, err)
			}
			if held[g]--; held[g] == 0 {
				delete(held, g)
			}
		}
		checkDisjoint(t, r, held)
		if op%10 == 9 {
			rd.verify()
		}
	}
	rd.verify()
	if _, _, err := r.Acquire(len(p.Groups)); !errors.Is(err, ErrState) {
		t.Errorf("acquire past the plan: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Acquire(0); !errors.Is(err, ErrClosed) {
		t.Errorf("acquire after Close: %v", err)
	}
	checkEmpty(t, "after Close", dev, host)
}

// checkDisjoint fails when two held groups' views share a device byte.
func checkDisjoint(t *testing.T, r *Residency, held map[int]int) {
	t.Helper()
	type span struct {
		lo, hi device.Ptr
		g      int
	}
	var spans []span
	for g := range held {
		gr := &r.groups[g]
		for _, v := range gr.views {
			spans = append(spans, span{v.Ptr, v.Ptr.Add(v.Tensor.Bytes), g})
		}
	}
	for i, a := range spans {
		for _, b := range spans[i+1:] {
			if a.g != b.g && a.lo < b.hi && b.lo < a.hi {
				t.Fatalf("held groups %d and %d overlap on the device: [%#x, %#x) and [%#x, %#x)", a.g, b.g, a.lo, a.hi, b.lo, b.hi)
			}
		}
	}
}

// copyFail fails the nth host-to-device copy.
type copyFail struct {
	device.Device
	n, calls int
}

var errCopy = errors.New("injected copy failure")

func (c *copyFail) CopyHtoD(dst device.Ptr, src []byte, s device.Stream) error {
	c.calls++
	if c.calls == c.n {
		return errCopy
	}
	return c.Device.CopyHtoD(dst, src, s)
}

// TestFaults injects a failed allocation (device pool growth, pinned host
// memory), a failed event record or a failed copy at a random point of New
// or of the cycles: the error comes back, later calls fail, and after
// Close both pools hold nothing.
func TestFaults(t *testing.T) {
	if onGPU() {
		t.Skip("fault injection runs on the simulator")
	}
	for it := range 60 {
		seed := uint64(it) + 500
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 13))
			base := testDevice(t, seed, nil)
			var cfg fault.Config
			var d device.Device = fault.Wrap(base, &cfg)
			cf := &copyFail{Device: d, n: 1 + rng.IntN(40)}
			kind := rng.IntN(4)
			if kind == 3 {
				d = cf
			}
			m := randomModel(t, rng, 2+rng.IntN(6), 1<<uint(8+rng.IntN(6)))
			p := randomPlan(t, rng, m, 2)
			dev, host := pools(t, d)
			n := uint64(1 + rng.IntN(30))
			switch kind {
			case 0:
				k := 1 + n%3
				cfg.Set(fault.Rules{CreatePhysical: fault.Nth(k), Map: fault.Nth(k), Alloc: fault.Nth(k)})
			case 1:
				cfg.Set(fault.Rules{HostAlloc: fault.Nth(1)})
			case 2:
				cfg.Set(fault.Rules{EventRecord: fault.Nth(n)})
			}
			r, err := New(context.Background(), d, dev, host, m, p, Options{Source: []Source{Pinned, Bounce}[rng.IntN(2)], BounceBytes: 4096})
			if err != nil {
				checkEmpty(t, fmt.Sprintf("after New failed (%v)", err), dev, host)
				return
			}
			rd := newReader(t, base, r, m)
			var runErr error
		cycles:
			for range 4 {
				for g := range p.Groups {
					if runErr = rd.acquire(g); runErr != nil {
						break cycles
					}
					if runErr = rd.release(g); runErr != nil {
						break cycles
					}
				}
			}
			if runErr != nil {
				if !errors.Is(runErr, fault.ErrInjected) && !errors.Is(runErr, errCopy) {
					t.Fatalf("run error %v is not the injected one", runErr)
				}
				if _, _, err := r.Acquire(0); err == nil && !p.Groups[0].Resident {
					t.Errorf("acquire after a failed copy succeeded")
				}
			}
			base.StreamSynchronize(rd.cs)
			cerr := r.Close()
			if runErr == nil && cerr != nil {
				t.Fatalf("close: %v", cerr)
			}
			checkEmpty(t, fmt.Sprintf("after the run (error %v) and Close", runErr), dev, host)
		})
	}
}

// budgetDevice reports a context's memory on top of a simulator.
type budgetDevice struct {
	device.Device
	ctx uint64
	ok  bool
}

func (b budgetDevice) ContextBytes() (uint64, string, bool) { return b.ctx, "test", b.ok }

// loadedDevice also says what the device had free just after its context.
type loadedDevice struct {
	budgetDevice
	after uint64
}

func (l loadedDevice) FreeAfterContext() (uint64, bool) { return l.after, true }

func TestPlanBudget(t *testing.T) {
	o := sim.DefaultOptions()
	o.TotalBytes = 8 << 30
	sd := sim.New(o)
	defer sd.Close()
	free, total, _ := sd.MemInfo()
	// A device with 7 GiB free: the default leaves the margin free.
	busy7 := sim.New(o)
	defer busy7.Close()
	if _, err := busy7.Alloc(1 << 30); err != nil {
		t.Fatal(err)
	}
	free7, _, _ := busy7.MemInfo()
	for _, tc := range []struct {
		name      string
		d         device.Device
		vram      uint64
		wantErr   string
		pool, ctx uint64
		warn      bool
	}{
		{name: "sim", d: sd, vram: 4 << 30, pool: 4 << 30},
		{name: "context", d: budgetDevice{sd, 500 << 20, true}, vram: 4 << 30, pool: 4<<30 - 500<<20 - LazyReserve, ctx: 500 << 20},
		{name: "context unknown", d: budgetDevice{sd, 500 << 20, false}, vram: 4 << 30, pool: 4 << 30},
		{name: "above total", d: sd, vram: 100 << 30, wantErr: "exceeds the device's total memory"},
		{name: "below context", d: budgetDevice{sd, 500 << 20, true}, vram: 400 << 20, wantErr: "leaves nothing after the device context"},
		{name: "default", d: budgetDevice{sd, 500 << 20, true}, pool: total - 500<<20 - LazyReserve, ctx: 500 << 20},
		{name: "default, room", d: loadedDevice{budgetDevice{busy7, 500 << 20, true}, 0}, pool: free7 - Margin, ctx: 500 << 20},
		{name: "above free", d: budgetDevice{sd, 1 << 30, true}, vram: 8 << 30, pool: 7<<30 - LazyReserve, ctx: 1 << 30},
		{name: "loaded since", d: loadedDevice{budgetDevice{sd, 500 << 20, true}, free + 20<<20}, vram: 4 << 30, pool: 4<<30 - 520<<20 - LazyReserve, ctx: 500 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := PlanBudget(tc.d, tc.vram)
			if tc.wantErr != "" {
				if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.wantErr)) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.PoolBytes != tc.pool || b.ContextBytes != tc.ctx || b.PoolBytes+b.ContextBytes+b.LoadedBytes+b.ReserveBytes != b.VRAMBytes {
				t.Errorf("budget %+v, want pool %d, context %d", b, tc.pool, tc.ctx)
			}
			if b.Default != (tc.vram == 0) || b.ContextSource == "" {
				t.Errorf("budget %+v", b)
			}
		})
	}
	// Above free memory: a warning, not an error.
	b, err := PlanBudget(budgetDevice{sd, 0, true}, free)
	if err != nil || b.Warning != "" {
		t.Errorf("budget of the free memory: %+v, %v", b, err)
	}
	busy, _ := sd.Alloc(1 << 30)
	defer sd.Free(busy)
	b, err = PlanBudget(sd, free)
	if err != nil || b.Warning == "" {
		t.Errorf("budget above the free memory: %+v, %v", b, err)
	}
}

// TestContextBytesGPU: on the GPU the context's own memory is measured
// (MEMWALL_TEST_DEVICE=cuda), plausibly (tens of MiB to a few GiB), and a
// budget takes it off.
func TestContextBytesGPU(t *testing.T) {
	if !onGPU() {
		t.Skip("set MEMWALL_TEST_DEVICE=cuda on a GPU machine to measure the CUDA context")
	}
	d := testDevice(t, 1, nil)
	n, how := ContextBytes(d)
	t.Logf("context: %d bytes (%.1f MiB), %s", n, float64(n)/(1<<20), how)
	if n < 16<<20 || n > 4<<30 {
		t.Errorf("context %d bytes (%s): want 16 MiB..4 GiB", n, how)
	}
	b, err := PlanBudget(d, 8<<30)
	if err != nil {
		t.Fatal(err)
	}
	if b.PoolBytes != 8<<30-n-b.LoadedBytes-LazyReserve || b.ContextBytes != n || b.LoadedBytes > 256<<20 {
		t.Errorf("budget %+v", b)
	}
	fp, ok := Footprint(d)
	if !ok || fp < n || fp > n+b.LoadedBytes+64<<20 {
		t.Errorf("footprint %d (%v) with a context of %d and %d loaded", fp, ok, n, b.LoadedBytes)
	}
	blk, err := d.Alloc(256 << 20)
	if err != nil {
		t.Fatal(err)
	}
	fp2, _ := Footprint(d)
	d.Free(blk)
	if fp2 < fp+256<<20 || fp2 > fp+256<<20+8<<20 {
		t.Errorf("footprint %d after a 256 MiB allocation, %d before", fp2, fp)
	}
	t.Logf("8 GiB budget: %+v", b)
}

// TestGeneratedModels: the synthetic tiny model as one safetensors file,
// three shards (a group's tensors may span files) and GGUF (padding between
// tensors becomes extent gaps), at the smallest budget and a middle one,
// from every source: cycles read back the file's bytes.
func TestGeneratedModels(t *testing.T) {
	if onGPU() {
		t.Skip("covered by the random plans on the GPU")
	}
	for _, c := range []struct {
		name   string
		format string
		shards int
	}{{"safetensors", synth.Safetensors, 1}, {"shards", synth.Safetensors, 3}, {"gguf", synth.GGUF, 1}} {
		out := filepath.Join(t.TempDir(), "tiny."+c.format)
		if c.shards > 1 {
			out = filepath.Join(filepath.Dir(out), "model.safetensors.index.json")
		}
		res, err := synth.Generate(context.Background(), synth.Tiny(), out, synth.Options{Format: c.format, Shards: c.shards})
		if err != nil {
			t.Fatal(err)
		}
		m, err := weights.Open(res.Path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		if c.shards > 1 && len(m.Files()) != c.shards {
			t.Fatalf("%d files, want %d", len(m.Files()), c.shards)
		}
		groups, err := plan.GroupWeights(m.Tensors)
		if err != nil {
			t.Fatal(err)
		}
		full, err := plan.PlanWeights(groups, plan.WeightOptions{Budget: 1 << 40, LinkGBps: 25})
		if err != nil {
			t.Fatal(err)
		}
		for _, budget := range []uint64{full.MinimumBytes, (full.MinimumBytes + full.PeakBytes) / 2} {
			p, err := plan.PlanWeights(groups, plan.WeightOptions{Budget: budget, LinkGBps: 25})
			if err != nil {
				t.Fatal(err)
			}
			for _, src := range []Source{Register, Pinned, Bounce} {
				t.Run(fmt.Sprintf("%s/%d/%s", c.name, budget, src), func(t *testing.T) {
					d := testDevice(t, budget, nil)
					dev, host := pools(t, d)
					r, err := New(context.Background(), d, dev, host, m, p, Options{Source: src, BounceBytes: 64 << 10})
					if err != nil {
						t.Fatal(err)
					}
					rd := newReader(t, d, r, m)
					for range 3 {
						for g := range p.Groups {
							if err := rd.acquire(g); err != nil {
								t.Fatal(err)
							}
							if err := rd.release(g); err != nil {
								t.Fatal(err)
							}
						}
						rd.verify()
					}
					if err := r.Close(); err != nil {
						t.Fatal(err)
					}
					checkEmpty(t, "after Close", dev, host)
				})
			}
		}
	}
}

// BenchmarkAcquireRelease is the host's cost of one Acquire and Release
// pair in a decode loop (the copies only submitted; a simulator without
// backing bytes moves none), for all-resident and all-streamed plans.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, streamed := range []bool{false, true} {
		b.Run(fmt.Sprintf("streamed=%v", streamed), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			o := sim.DefaultOptions()
			o.Backing = false
			d := sim.New(o)
			defer d.Close()
			m := randomModel(b, rng, 8, 1<<16)
			groups, err := plan.GroupWeights(m.Tensors)
			if err != nil {
				b.Fatal(err)
			}
			wo := plan.WeightOptions{Budget: 1 << 40, LinkGBps: 25, Granule: 512}
			p, err := plan.PlanWeights(groups, wo)
			if err != nil {
				b.Fatal(err)
			}
			if streamed {
				wo.Budget = p.MinimumBytes
				if p, err = plan.PlanWeights(groups, wo); err != nil {
					b.Fatal(err)
				}
			}
			dev, host := pools(b, d)
			r, err := New(context.Background(), d, dev, host, m, p, Options{Source: Pinned})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			cs, _ := d.NewStream()
			done, _ := d.NewEvent(false)
			b.ResetTimer()
			for i := range b.N {
				g := i % len(p.Groups)
				_, ready, err := r.Acquire(g)
				if err != nil {
					b.Fatal(err)
				}
				if ready != 0 {
					d.StreamWaitEvent(cs, ready)
				}
				d.EventRecord(done, cs)
				if err := r.Release(g, done); err != nil {
					b.Fatal(err)
				}
				if g == len(p.Groups)-1 {
					d.StreamSynchronize(cs)
				}
			}
			b.StopTimer()
			d.StreamSynchronize(cs)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/pair")
		})
	}
}
