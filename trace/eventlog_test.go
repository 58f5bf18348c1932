package trace_test

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/trace"
)

// newSim returns a simulated device of 1 GiB, closed with the test.
func newSim(t testing.TB) device.Device {
	o := sim.DefaultOptions()
	o.TotalBytes = 1 << 30
	d := sim.New(o)
	t.Cleanup(func() { d.Close() })
	return d
}

// TestEventLogConcurrent records two pools from several goroutines into
// one log: every event arrives whole (the log reads back strictly) and the
// counts add up.
func TestEventLogConcurrent(t *testing.T) {
	var buf bytes.Buffer
	log := trace.NewEventLog(&buf)
	d := newSim(t)
	var pools []*pool.Pool
	for _, name := range []string{"a", "b"} {
		p, err := pool.New(d, pool.Options{Name: name, OnEvent: log.Record})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pools = append(pools, p)
	}
	var wg sync.WaitGroup
	const perG = 500
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			p := pools[g%2]
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := 0; i < perG; i++ {
				b, err := p.Alloc(uint64(1+r.IntN(1<<20)), pool.AllocOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				if err := p.Free(b); err != nil {
					t.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	if err := log.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := log.Events(); n != 4*perG*2 {
		t.Fatalf("%d events, want %d", n, 4*perG*2)
	}
	rd, err := trace.NewReader(bytes.NewReader(buf.Bytes()), "log.jsonl", trace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		_, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 4*perG*3 {
		t.Fatalf("log reads back %d events, want %d (an alloc, a free requested and completed per pair)", n, 4*perG*3)
	}
}

// TestEventLogWriteError: a writer that fails stops the log, and Flush
// says why.
func TestEventLogWriteError(t *testing.T) {
	log := trace.NewEventLog(failWriter{})
	p, err := pool.New(newSim(t), pool.Options{OnEvent: log.Record})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := 0; i < 10000; i++ { // more than the writer's buffer holds
		b, err := p.Alloc(4096, pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := log.Flush(); !errors.Is(err, errWrite) {
		t.Fatalf("Flush after a failed write: %v, want the writer's error", err)
	}
}

var errWrite = errors.New("disk full")

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errWrite }

// TestEventLogAlone records made-up events, the log with no pool under
// it: each reads back field for field (an alloc, or a free as
// free_requested then free_completed), tenants with any characters
// included.
func TestEventLogAlone(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	purposes := []pool.Purpose{pool.Other, pool.Weights, pool.Activations, pool.KV, pool.Staging, pool.Scratch}
	tenants := []string{"", "bert", `quo"te`, "tab\there", "ünï"}
	var evs []pool.Event
	for range 2000 {
		evs = append(evs, pool.Event{Time: time.Unix(0, r.Int64N(1<<62)), Free: r.IntN(2) == 0,
			Ptr: device.Ptr(1 + r.Uint64N(1<<48)), Size: 1 + r.Uint64N(1<<36), Stream: device.Stream(r.Uint64N(8)),
			Purpose: purposes[r.IntN(len(purposes))], Tenant: tenants[r.IntN(len(tenants))]})
	}
	var buf bytes.Buffer
	log := trace.NewEventLog(&buf)
	for _, ev := range evs {
		log.Record(ev)
	}
	if err := log.Flush(); err != nil {
		t.Fatal(err)
	}
	rd, err := trace.NewReader(bytes.NewReader(buf.Bytes()), "log.jsonl", trace.Options{NoValidate: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range evs {
		acts := []trace.Action{trace.Alloc}
		if ev.Free {
			acts = []trace.Action{trace.FreeRequested, trace.FreeCompleted}
		}
		for _, act := range acts {
			got, err := rd.Next()
			if err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
			want := trace.Event{Action: act, Addr: uint64(ev.Ptr), Size: ev.Size, Stream: uint64(ev.Stream),
				Time: ev.Time.UnixNano(), Purpose: ev.Purpose.String(), Tenant: ev.Tenant}
			if got.Action != want.Action || got.Addr != want.Addr || got.Size != want.Size || got.Stream != want.Stream ||
				got.Time != want.Time || got.Purpose != want.Purpose || got.Tenant != want.Tenant {
				t.Fatalf("event %d: read %+v, want %+v", i, got, want)
			}
		}
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Fatalf("after the last event: %v, want EOF", err)
	}
}

// FuzzEventLog round-trips one event of any fields through the log: it
// reads back strictly, with the fields recorded (each byte of
// a tenant's invalid UTF-8 as U+FFFD, the way the log writes strings).
func FuzzEventLog(f *testing.F) {
	f.Add(uint64(4096), uint64(100), uint64(0), int64(1), uint8(0), "", false)
	f.Add(uint64(1<<47), uint64(1<<40), uint64(7), int64(-5), uint8(3), "t\"\\\n\x00", true)
	f.Add(uint64(1), uint64(1), uint64(1), int64(1<<62), uint8(5), "\xff\xfeok", false)
	f.Fuzz(func(t *testing.T, ptr, size, stream uint64, ns int64, purpose uint8, tenant string, free bool) {
		if ptr == 0 || size == 0 || size > trace.MaxSize {
			return // no block has these (the log's format stops at 1 TiB)
		}
		ev := pool.Event{Time: time.Unix(0, ns), Free: free, Ptr: device.Ptr(ptr), Size: size, Stream: device.Stream(stream),
			Purpose: pool.Purpose(purpose % 6), Tenant: tenant}
		var buf bytes.Buffer
		log := trace.NewEventLog(&buf)
		log.Record(ev)
		if err := log.Flush(); err != nil {
			t.Fatal(err)
		}
		rd, err := trace.NewReader(bytes.NewReader(buf.Bytes()), "log.jsonl", trace.Options{NoValidate: true})
		if err != nil {
			t.Fatal(err)
		}
		n := 1
		if free {
			n = 2
		}
		for i := 0; i < n; i++ {
			got, err := rd.Next()
			if err != nil {
				t.Fatalf("%q: %v", buf.String(), err)
			}
			if got.Addr != ptr || got.Size != size || got.Stream != stream || got.Time != ns ||
				got.Purpose != ev.Purpose.String() || got.Tenant != string([]rune(tenant)) {
				t.Fatalf("read %+v from %q, recorded %+v", got, buf.String(), ev)
			}
		}
		if _, err := rd.Next(); err != io.EOF {
			t.Fatalf("%q: after the event: %v", buf.String(), err)
		}
	})
}

// TestWriteSnapshotAlone writes a made-up snapshot, no pool under it, and
// reads it back strictly, event for event: the reserved segments, the block
// held before the history began, the block the history freed without having
// allocated it (live before it began), the history itself and the oom
// event; a block the history allocated is not written twice.
func TestWriteSnapshotAlone(t *testing.T) {
	t0 := time.Unix(100, 0)
	s := &pool.Snapshot{
		Pool: "kv", Time: t0, Requested: 3 << 20, DeviceFree: 1 << 20,
		Reserved: []pool.Range{{Ptr: 1 << 30, Size: 4 << 20}},
		Blocks: []pool.SnapshotBlock{
			{Range: pool.Range{Ptr: 1 << 30, Size: 1 << 20}, Purpose: pool.Weights, Tenant: "llama"},
			{Range: pool.Range{Ptr: 1<<30 + 2<<20, Size: 1 << 20}, Purpose: pool.KV},
		},
		Events: []pool.Event{
			{Time: t0, Free: true, Ptr: 1<<30 + 1<<20, Size: 1 << 20, Purpose: pool.Activations},
			{Time: t0, Ptr: 1<<30 + 2<<20, Size: 1000, Purpose: pool.KV},
		},
	}
	var buf bytes.Buffer
	n, err := trace.WriteSnapshot(&buf, s)
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("WriteSnapshot: %d bytes (buffer holds %d), %v", n, buf.Len(), err)
	}
	rd, err := trace.NewReader(bytes.NewReader(buf.Bytes()), "oom.jsonl", trace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	type ev struct {
		act        trace.Action
		addr, size uint64
		purpose    string
	}
	want := []ev{
		{trace.SegmentAlloc, 1 << 30, 4 << 20, ""},
		{trace.Alloc, 1 << 30, 1 << 20, "weights"},
		{trace.Alloc, 1<<30 + 1<<20, 1 << 20, "activations"},
		{trace.FreeRequested, 1<<30 + 1<<20, 1 << 20, "activations"},
		{trace.FreeCompleted, 1<<30 + 1<<20, 1 << 20, "activations"},
		{trace.Alloc, 1<<30 + 2<<20, 1000, "kv"},
		{trace.OOM, 0, 3 << 20, ""},
	}
	for i, w := range want {
		got, err := rd.Next()
		if err != nil {
			t.Fatalf("event %d: %v (%s)", i, err, buf.String())
		}
		if g := (ev{got.Action, got.Addr, got.Size, got.Purpose}); g != w {
			t.Fatalf("event %d: %+v, want %+v", i, g, w)
		}
		if got.Action == trace.OOM && got.DeviceFree != s.DeviceFree {
			t.Fatalf("oom event: device free %d, want %d", got.DeviceFree, s.DeviceFree)
		}
	}
	if _, err := rd.Next(); err != io.EOF {
		t.Fatalf("after the oom event: %v, want EOF", err)
	}
	if _, err := trace.WriteSnapshot(failWriter{}, s); !errors.Is(err, errWrite) {
		t.Fatalf("WriteSnapshot to a failing writer: %v, want its error", err)
	}
}
