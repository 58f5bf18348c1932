package pool_test

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/trace"
	"github.com/memwall/memwall/trace/replay"
)

// TestEventLog records random allocations and frees (random sizes and
// purposes, every configuration and cache setting) through Options.OnEvent
// into a trace.EventLog and reads the log back: event for event the requests the test
// made, in order, with the addresses the pool returned; replay loads it
// with the test's own peak of live bytes and blocks left live.
func TestEventLog(t *testing.T) {
	for _, o := range configs() {
		for _, cache := range []pool.CacheMode{pool.CachePerProcessor, pool.CacheShared, pool.CacheOff} {
			o.Cache = cache
			t.Run(o.Name+"/"+cache.String(), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(cache)+7, 11))
				var buf bytes.Buffer
				log := trace.NewEventLog(&buf)
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
