package alloc_test

import (
	"errors"
	"testing"

	"github.com/memwall/memwall/alloc"
)

// FuzzHandles drives tlsf and bestfit through blocks allocated and freed by
// handle and by offset, mixed, with frees through wrong handles, wrong
// offsets and stale handles, and blocks placed at a chosen offset
// (AllocHandleAt) inside a free range and over a live block, decoded from
// the input three bytes per operation: [op, x, y]. Refused frees and
// placements must change nothing (but the failure count), FreeHandle must
// report the free range Walk shows, and alloc.Check runs after every
// operation.
func FuzzHandles(f *testing.F) {
	f.Add([]byte{0, 10, 1, 1, 20, 2, 2, 0, 0, 3, 0, 1, 4, 0, 0})
	f.Add([]byte{1, 28, 255, 1, 5, 9, 0, 12, 3, 5, 1, 0, 2, 1, 0, 6, 0, 0})
	f.Add([]byte{0, 40, 3, 0, 9, 1, 2, 0, 0, 7, 0, 200, 7, 1, 17, 7, 0, 0, 2, 1, 0, 7, 5, 99})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, name := range handleStrategies {
			a := mustNew(t, name, 64*MiB).(alloc.HandleAllocator)
			runHandleOps(t, a, data)
		}
	})
}

type handleBlock struct {
	b      alloc.Block
	h      alloc.Handle
	handle bool
}

func runHandleOps(t *testing.T, a alloc.HandleAllocator, ops []byte) {
	var live, freed []handleBlock
	refused := func(what string, err error, before alloc.Stats) {
		t.Helper()
		if !errors.Is(err, alloc.ErrInvalidFree) {
			t.Fatalf("%s %s: %v, want ErrInvalidFree", a.Name(), what, err)
		}
		if after := a.Stats(); after != before {
			t.Fatalf("%s %s changed the stats: %+v -> %+v", a.Name(), what, before, after)
		}
	}
	for n := 0; len(ops) >= 3 && n < maxFuzzOps; n++ {
		op, x, y := ops[0]%8, ops[1], ops[2]
		ops = ops[3:]
		before := a.Stats()
		switch {
		case op <= 1 && len(live) < maxFuzzLive: // allocate, by handle when op == 0
			hb := handleBlock{handle: op == 0}
			var err error
			if hb.handle {
				hb.b, hb.h, err = a.AllocHandle(fuzzSize(x, y), fuzzAlign(y))
			} else {
				hb.b, err = a.Alloc(fuzzSize(x, y), fuzzAlign(y))
			}
			if err == nil {
				live = append(live, hb)
			}
		case op == 2 && len(live) > 0: // free, the right way
			k := int(x) % len(live)
			hb := live[k]
			live = append(live[:k], live[k+1:]...)
			if !hb.handle {
				if err := a.Free(hb.b.Offset); err != nil {
					t.Fatalf("%s free %d: %v", a.Name(), hb.b.Offset, err)
				}
				break
			}
			seg, err := a.FreeHandle(hb.h, hb.b.Offset)
			if err != nil {
				t.Fatalf("%s FreeHandle %d: %v", a.Name(), hb.b.Offset, err)
			}
			var found alloc.Segment
			a.Walk(func(s alloc.Segment) bool {
				if s.Offset <= hb.b.Offset && hb.b.Offset < s.Offset+s.Size {
					found = s
					return false
				}
				return true
			})
			if found != seg || !seg.Free {
				t.Fatalf("%s FreeHandle reported %+v, Walk shows %+v", a.Name(), seg, found)
			}
			freed = append(freed, hb)
		case op == 3 && len(live) > 0: // free a handle block by offset, an offset block by handle
			hb := live[int(x)%len(live)]
			if hb.handle {
				refused("Free of a handle block", a.Free(hb.b.Offset), before)
			} else {
				_, err := a.FreeHandle(alloc.Handle(y), hb.b.Offset)
				refused("FreeHandle of an offset block", err, before)
			}
		case op == 4 && len(live) > 0: // a handle with the wrong offset, or a wrong handle
			hb := live[int(x)%len(live)]
			if !hb.handle {
				break
			}
			_, err := a.FreeHandle(hb.h, hb.b.Offset+1+uint64(y))
			refused("FreeHandle at a wrong offset", err, before)
			if y&1 == 1 {
				_, err = a.FreeHandle(-1-alloc.Handle(y), hb.b.Offset)
				refused("FreeHandle of a negative handle", err, before)
			}
		case op == 5 && len(freed) > 0: // a stale handle, unless its node and offset came back
			hb := freed[int(x)%len(freed)]
			reused := false
			for _, l := range live {
				reused = reused || (l.handle && l.h == hb.h && l.b.Offset == hb.b.Offset)
			}
			if !reused {
				_, err := a.FreeHandle(hb.h, hb.b.Offset)
				refused("FreeHandle of a freed block", err, before)
			}
		case op == 6:
			a.Walk(func(alloc.Segment) bool { return true })
		case op == 7 && len(live) < maxFuzzLive:
			if hb, ok := allocAt(t, a, x, y, before); ok {
				live = append(live, hb)
			}
		}
		if err := alloc.Check(a); err != nil {
			t.Fatalf("%s after op %d: %v", a.Name(), n, err)
		}
	}
	freeAllHandleBlocks(t, a, live)
}

// freeAllHandleBlocks frees every block the way it was allocated and
// checks that the allocator is empty again.
func freeAllHandleBlocks(t *testing.T, a alloc.HandleAllocator, blocks []handleBlock) {
	t.Helper()
	for _, hb := range blocks {
		var err error
		if hb.handle {
			_, err = a.FreeHandle(hb.h, hb.b.Offset)
		} else {
			err = a.Free(hb.b.Offset)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := alloc.CheckEmpty(a); err != nil {
		t.Fatal(err)
	}
}

// allocAt places a block with AllocHandleAt: with x odd, over the start of
// a live block (which must fail and change nothing but the failure count);
// otherwise inside the x-th free range at a point and size drawn from y
// (which must succeed exactly there).
func allocAt(t *testing.T, a alloc.HandleAllocator, x, y byte, before alloc.Stats) (handleBlock, bool) {
	t.Helper()
	p, ok := a.(alloc.PlacingAllocator)
	if !ok {
		t.Fatalf("%s is not a PlacingAllocator", a.Name())
	}
	var free, used []alloc.Segment
	a.Walk(func(s alloc.Segment) bool {
		if s.Free {
			free = append(free, s)
		} else {
			used = append(used, s)
		}
		return true
	})
	if x&1 == 1 && len(used) > 0 {
		s := used[int(x/2)%len(used)]
		_, _, err := p.AllocHandleAt(s.Offset, 1+uint64(y))
		if !errors.Is(err, alloc.ErrOutOfMemory) {
			t.Fatalf("%s AllocHandleAt over the live block at %d: %v, want ErrOutOfMemory", a.Name(), s.Offset, err)
		}
		after := a.Stats()
		after.Failures--
		if after != before {
			t.Fatalf("%s refused AllocHandleAt changed the stats: %+v -> %+v", a.Name(), before, a.Stats())
		}
		return handleBlock{}, false
	}
	if len(free) == 0 {
		return handleBlock{}, false
	}
	s := free[int(x/2)%len(free)]
	off := s.Offset + s.Size*uint64(y%16)/16
	size := max(1, (s.Offset+s.Size-off)*uint64(1+y/16)/16)
	b, h, err := p.AllocHandleAt(off, size)
	if err != nil {
		t.Fatalf("%s AllocHandleAt(%d, %d) inside the free range %+v: %v", a.Name(), off, size, s, err)
	}
	if b.Offset != off || b.Size != size {
		t.Fatalf("%s AllocHandleAt(%d, %d) returned %+v", a.Name(), off, size, b)
	}
	return handleBlock{b: b, h: h, handle: true}, true
}
