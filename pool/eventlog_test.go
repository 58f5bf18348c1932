package pool_test

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/trace"
	"github.com/memwall/memwall/trace/replay"
)

// TestEventLog records random allocations and frees (random sizes and
// purposes, every configuration and cache setting) through
// EventLog and reads the log back: event for event the requests the test
// made, in order, with the addresses the pool returned; replay loads it
// with the test's own peak of live bytes and blocks left live.
func TestEventLog(t *testing.T) {
	for _, o := range configs() {
		for _, cache := range []pool.CacheMode{pool.CachePerProcessor, pool.CacheShared, pool.CacheOff} {
			o.Cache = cache
			t.Run(o.Name+"/"+cache.String(), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(cache)+7, 11))
				var buf bytes.Buffer
				log := pool.NewEventLog(&buf)
				o.OnEvent = log.Record
				p, err := pool.New(newSim(t, false, 1<<30), o)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				type want struct {
					free    bool
					ptr     device.Ptr
					size    uint64
					purpose string
				}
				var wants []want
				type held struct {
					b    pool.Block
					size uint64
					pur  pool.Purpose
				}
				var live []held
				var liveBytes, peak uint64
				purposes := []pool.Purpose{pool.Other, pool.Weights, pool.KV, pool.Activations}
				for i := 0; i < 3000; i++ {
					if len(live) > 0 && r.IntN(5) < 2 {
						k := r.IntN(len(live))
						h := live[k]
						if err := p.Free(h.b); err != nil {
							t.Fatal(err)
						}
						wants = append(wants, want{true, h.b.Ptr, h.size, h.pur.String()})
						liveBytes -= h.size
						live = append(live[:k], live[k+1:]...)
						continue
					}
					size := uint64(1) << r.IntN(24)
					size += uint64(r.IntN(int(size)))
					pur := purposes[r.IntN(len(purposes))]
					b, err := p.Alloc(size, pool.AllocOptions{Purpose: pur})
					if err != nil {
						t.Fatal(err)
					}
					wants = append(wants, want{false, b.Ptr, size, pur.String()})
					live = append(live, held{b, size, pur})
					liveBytes += size
					peak = max(peak, liveBytes)
				}
				if err := log.Flush(); err != nil {
					t.Fatal(err)
				}
				frees := 0
				for _, w := range wants {
					if w.free {
						frees++
					}
				}
				if n := log.Events(); n != len(wants) {
					t.Fatalf("log counted %d events, the test made %d", n, len(wants))
				}
				path := filepath.Join(t.TempDir(), "pool.jsonl")
				if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				rd, err := trace.Open(path, trace.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer rd.Close()
				i := 0
				for {
					ev, err := rd.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatalf("%s: %v", path, err)
					}
					if i >= len(wants) {
						t.Fatalf("log holds more than the %d requests made", len(wants))
					}
					w := wants[i]
					act := trace.Alloc
					if w.free {
						act = trace.FreeRequested
						if ev.Action == trace.FreeCompleted {
							act = trace.FreeCompleted
						}
					}
					if ev.Action != act || ev.Addr != uint64(w.ptr) || ev.Size != w.size || ev.Purpose != w.purpose {
						t.Fatalf("event %d: %+v, want %+v", i, ev, w)
					}
					if !w.free || ev.Action == trace.FreeCompleted {
						i++
					}
				}
				if i != len(wants) {
					t.Fatalf("log holds %d of the %d requests", i, len(wants))
				}
				tr, err := replay.Load(path, replay.LoadOptions{})
				if err != nil {
					t.Fatalf("replay reads the log: %v", err)
				}
				if tr.Allocs != int64(len(wants)-frees) || tr.PeakLive != peak || tr.Unfreed != len(live) {
					t.Fatalf("replay: %d allocs, peak %d, %d unfreed; the test made %d allocs, peak %d, left %d live",
						tr.Allocs, tr.PeakLive, tr.Unfreed, len(wants)-frees, peak, len(live))
				}
			})
		}
	}
}

// TestEventLogConcurrent records two pools from several goroutines into
// one log: every event arrives whole (the log reads back strictly) and the
// counts add up.
func TestEventLogConcurrent(t *testing.T) {
	var buf bytes.Buffer
	log := pool.NewEventLog(&buf)
	d := newSim(t, false, 1<<30)
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
	log := pool.NewEventLog(failWriter{})
	p, err := pool.New(newSim(t, false, 1<<30), pool.Options{OnEvent: log.Record})
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
	log := pool.NewEventLog(&buf)
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
		log := pool.NewEventLog(&buf)
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
