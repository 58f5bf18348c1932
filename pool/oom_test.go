package pool_test

import (
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/trace"
	"github.com/memwall/memwall/trace/replay"
)

// TestOOMSnapshot: an allocation refused under the limit carries a
// snapshot that reads back as a strict, consistent event log (every free
// of a block the log allocated, none twice) whose live bytes at the end
// are the blocks the pool held, ending in the oom event; replay reads it.
func TestOOMSnapshot(t *testing.T) {
	for _, o := range configs() {
		for _, hist := range []int{0, 7, 1000} {
			t.Run(o.Name, func(t *testing.T) {
				o.Limit, o.History = 64<<20, hist
				p, err := pool.New(newSim(t, false, 1<<30), o)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				r := rand.New(rand.NewPCG(uint64(hist), 3))
				var live []pool.Block
				var oom *pool.OOMError
				for i := 0; i < 10000 && oom == nil; i++ {
					if len(live) > 0 && r.IntN(3) == 0 {
						live = freeRandom(t, p, r, live)
						continue
					}
					b, err := p.Alloc(uint64(1+r.IntN(6<<20)), pool.AllocOptions{Purpose: pool.KV})
					if err != nil {
						if !errors.As(err, &oom) {
							t.Fatal(err)
						}
						break
					}
					live = append(live, b)
				}
				if oom == nil || oom.Snapshot == nil {
					t.Fatalf("no out-of-memory error with a snapshot under a 64 MiB limit (%v)", oom)
				}
				if hist > 0 && len(oom.Snapshot.Events) != min(hist, len(oom.Snapshot.Events)) {
					t.Fatalf("history of %d holds %d events", hist, len(oom.Snapshot.Events))
				}
				path := filepath.Join(t.TempDir(), "oom.jsonl")
				if err := writeSnapshot(path, oom.Snapshot); err != nil {
					t.Fatal(err)
				}
				rd, err := trace.Open(path, trace.Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer rd.Close()
				var liveBytes, held, reserved uint64
				sawOOM := false
				for {
					ev, err := rd.Next()
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatalf("%s: %v", path, err)
					}
					switch ev.Action {
					case trace.Alloc:
						liveBytes += ev.Size
					case trace.FreeCompleted:
						liveBytes -= ev.Size
					case trace.SegmentAlloc:
						reserved += ev.Size
					case trace.OOM:
						sawOOM = ev.Size == oom.Requested
					}
				}
				for _, b := range oom.Snapshot.Blocks {
					held += b.Size
				}
				if !sawOOM {
					t.Error("no oom event for the request")
				}
				if reserved != oom.Reserved {
					t.Errorf("snapshot reserves %d bytes, the error says %d", reserved, oom.Reserved)
				}
				if hist == 0 && liveBytes != held {
					t.Errorf("log ends with %d bytes live, the pool held %d", liveBytes, held)
				}
				if _, err := replay.Load(path, replay.LoadOptions{}); err != nil {
					t.Fatalf("replay reads the snapshot: %v", err)
				}
			})
		}
	}
}

// writeSnapshot writes s to a new file at path as trace.WriteSnapshot does.
func writeSnapshot(path string, s *pool.Snapshot) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := trace.WriteSnapshot(f, s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
