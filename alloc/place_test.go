package alloc_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/memwall/memwall/alloc"
)

// TestAllocHandleAt: a block placed at a chosen offset lies exactly there
// and splits its free range around it; a placement that overlaps a live
// block, lies past the capacity or has size 0 fails and changes nothing
// but the failure count; random placements among random blocks keep every
// invariant (alloc.Check), WalkFree agrees with Walk, and everything frees
// back to an empty allocator.
func TestAllocHandleAt(t *testing.T) {
	for _, name := range handleStrategies {
		t.Run(name, func(t *testing.T) {
			a := mustNew(t, name, 64*MiB).(alloc.PlacingAllocator)
			b, h, err := a.AllocHandleAt(10*MiB, 3*MiB)
			if err != nil || b.Offset != 10*MiB || b.Size != 3*MiB {
				t.Fatalf("AllocHandleAt(10 MiB, 3 MiB) = %+v, %v", b, err)
			}
			var segs []alloc.Segment
			a.Walk(func(s alloc.Segment) bool { segs = append(segs, s); return true })
			want := []alloc.Segment{{0, 10 * MiB, true}, {10 * MiB, 3 * MiB, false}, {13 * MiB, 51 * MiB, true}}
			if len(segs) != len(want) {
				t.Fatalf("segments %+v, want %+v", segs, want)
			}
			for i := range want {
				if segs[i] != want[i] {
					t.Fatalf("segments %+v, want %+v", segs, want)
				}
			}
			for _, bad := range [][2]uint64{{12 * MiB, 1}, {9 * MiB, 2 * MiB}, {9 * MiB, 5 * MiB}, {64 * MiB, 1}, {63 * MiB, 2 * MiB}, {1 << 63, 1}, {MiB, 1 << 61}} {
				before := a.Stats()
				if _, _, err := a.AllocHandleAt(bad[0], bad[1]); !errors.Is(err, alloc.ErrOutOfMemory) {
					t.Errorf("AllocHandleAt(%d, %d): %v, want ErrOutOfMemory", bad[0], bad[1], err)
				}
				after := a.Stats()
				if after.Failures != before.Failures+1 {
					t.Errorf("failures %d -> %d", before.Failures, after.Failures)
				}
				after.Failures = before.Failures
				if after != before {
					t.Errorf("refused placement changed %+v -> %+v", before, after)
				}
			}
			if _, _, err := a.AllocHandleAt(0, 0); !errors.Is(err, alloc.ErrInvalidArgument) {
				t.Errorf("size 0: %v, want ErrInvalidArgument", err)
			}
			if _, err := a.FreeHandle(h, b.Offset); err != nil {
				t.Fatal(err)
			}
			if err := alloc.CheckEmpty(a); err != nil {
				t.Fatal(err)
			}

			r := rand.New(rand.NewPCG(7, uint64(len(name))))
			var live []handleBlock
			for op := 0; op < 20000; op++ {
				before := a.Stats()
				switch k := r.IntN(10); {
				case k < 3 && len(live) < 200:
					if bb, hh, err := a.AllocHandle(1+r.Uint64N(MiB), 1<<r.IntN(12)); err == nil {
						live = append(live, handleBlock{b: bb, h: hh, handle: true})
					}
				case k < 6 && len(live) < 200:
					if hb, ok := allocAt(t, a, byte(r.UintN(256)), byte(r.UintN(256)), before); ok {
						live = append(live, hb)
					}
				case len(live) > 0:
					i := r.IntN(len(live))
					if _, err := a.FreeHandle(live[i].h, live[i].b.Offset); err != nil {
						t.Fatalf("op %d: %v", op, err)
					}
					live = append(live[:i], live[i+1:]...)
				}
				if err := alloc.Check(a); err != nil {
					t.Fatalf("op %d: %v", op, err)
				}
				if op%50 == 0 {
					checkWalkFree(t, a, 1+r.Uint64N(2*MiB))
				}
			}
			freeAllHandleBlocks(t, a, live)
		})
	}
}

// checkWalkFree: WalkFree(min) visits exactly the free ranges of at least
// min bytes that Walk reports, each once, and stops when fn says so.
func checkWalkFree(t *testing.T, a alloc.PlacingAllocator, min uint64) {
	t.Helper()
	want := map[alloc.Segment]bool{}
	a.Walk(func(s alloc.Segment) bool {
		if s.Free && s.Size >= min {
			want[s] = true
		}
		return true
	})
	got := map[alloc.Segment]bool{}
	a.WalkFree(min, func(s alloc.Segment) bool {
		if got[s] || !want[s] {
			t.Fatalf("%s WalkFree(%d) visited %+v (again, or not a free range of that size)", a.Name(), min, s)
		}
		got[s] = true
		return true
	})
	if len(got) != len(want) {
		t.Fatalf("%s WalkFree(%d) visited %d ranges, Walk shows %d", a.Name(), min, len(got), len(want))
	}
	if len(want) > 1 {
		n := 0
		a.WalkFree(min, func(alloc.Segment) bool { n++; return false })
		if n != 1 {
			t.Fatalf("%s WalkFree went on after fn returned false (%d calls)", a.Name(), n)
		}
	}
}
