package kvcache

import (
	"math/rand/v2"
	"testing"
)

// The hash table against a Go map, with keys crowded into few home slots
// so that probe runs wrap around and deletions shift entries back.
func TestHashTable(t *testing.T) {
	for _, spread := range []uint64{1 << 62, 64, 7} {
		rng := rand.New(rand.NewPCG(spread, 3))
		tb := newHashTable(40)
		ref := map[uint64]int32{}
		for op := range 200_000 {
			k := 1 + rng.Uint64N(spread)*0x10000 + uint64(rng.IntN(3))
			if rng.IntN(2) == 0 && len(ref) < 40 {
				if _, ok := ref[k]; !ok {
					tb.put(k, int32(op))
					ref[k] = int32(op)
				}
			} else {
				tb.del(k)
				delete(ref, k)
			}
			if tb.len() != len(ref) {
				t.Fatalf("op %d: %d entries, want %d", op, tb.len(), len(ref))
			}
			if op%97 == 0 {
				for k, v := range ref {
					if got, ok := tb.get(k); !ok || got != v {
						t.Fatalf("op %d: get(%x) = %d, %v; want %d", op, k, got, ok, v)
					}
				}
				n := 0
				tb.each(func(k uint64, b int32) {
					n++
					if ref[k] != b {
						t.Fatalf("op %d: entry %x → %d, want %d", op, k, b, ref[k])
					}
				})
				if n != len(ref) {
					t.Fatalf("op %d: each saw %d entries, want %d", op, n, len(ref))
				}
			}
		}
	}
}

// The sequence table against a Go map, growing and shrinking, with ids
// chosen to collide on their home slots.
func TestSeqTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	tb := newSeqTable()
	ref := map[SeqID]*seq{}
	for op := range 100_000 {
		id := SeqID(rng.IntN(300)) << 56 // few home slots until the table grows
		if rng.IntN(3) > 0 {
			id = SeqID(rng.IntN(2000))
		}
		if rng.IntN(2) == 0 {
			if _, ok := ref[id]; !ok {
				s := &seq{n: op}
				tb.put(id, s)
				ref[id] = s
			}
		} else {
			tb.del(id)
			delete(ref, id)
		}
		if tb.len() != len(ref) {
			t.Fatalf("op %d: %d entries, want %d", op, tb.len(), len(ref))
		}
		if op%101 == 0 {
			for id, s := range ref {
				if got, ok := tb.get(id); !ok || got != s {
					t.Fatalf("op %d: get(%d) = %v, %v", op, id, got, ok)
				}
			}
			n := 0
			tb.each(func(id SeqID, s *seq) {
				n++
				if ref[id] != s {
					t.Fatalf("op %d: entry %d wrong", op, id)
				}
			})
			if n != len(ref) {
				t.Fatalf("op %d: each saw %d, want %d", op, n, len(ref))
			}
		}
	}
}
