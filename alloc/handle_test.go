package alloc_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/memwall/memwall/alloc"
)

// handleStrategies are the strategies that implement HandleAllocator.
var handleStrategies = []string{"tlsf", "bestfit"}

func TestHandleStrategies(t *testing.T) {
	for _, name := range alloc.Strategies() {
		a := mustNew(t, name, MiB)
		_, ok := a.(alloc.HandleAllocator)
		want := name == "tlsf" || name == "bestfit"
		if ok != want {
			t.Errorf("%s implements HandleAllocator: %v, want %v", name, ok, want)
		}
	}
}

// TestHandleRandom mixes blocks freed by handle and by offset in a long
// random sequence, checking the allocator after every operation and that
// FreeHandle reports exactly the maximal free range Walk shows around the
// freed block.
func TestHandleRandom(t *testing.T) {
	ops := randomOps() / 5
	for _, name := range handleStrategies {
		t.Run(name, func(t *testing.T) {
			a := mustNew(t, name, 160*MiB).(alloc.HandleAllocator)
			var blocks []handleBlock
			r := rand.New(rand.NewPCG(3, 4))
			for op := 0; op < ops; op++ {
				if len(blocks) > 0 && (len(blocks) >= 64 || r.IntN(2) == 0) {
					k := r.IntN(len(blocks))
					x := blocks[k]
					blocks[k] = blocks[len(blocks)-1]
					blocks = blocks[:len(blocks)-1]
					if !x.handle {
						if _, err := a.FreeHandle(0, x.b.Offset); err == nil && a.Stats().LiveBlocks == len(blocks) {
							t.Fatalf("op %d: FreeHandle freed a block allocated without a handle", op)
						}
						if err := a.Free(x.b.Offset); err != nil {
							t.Fatalf("op %d: free %d: %v", op, x.b.Offset, err)
						}
					} else {
						if err := a.Free(x.b.Offset); !errors.Is(err, alloc.ErrInvalidFree) {
							t.Fatalf("op %d: Free of a handle block: %v, want ErrInvalidFree", op, err)
						}
						if _, err := a.FreeHandle(x.h, x.b.Offset+1); !errors.Is(err, alloc.ErrInvalidFree) {
							t.Fatalf("op %d: FreeHandle at the wrong offset: %v, want ErrInvalidFree", op, err)
						}
						seg, err := a.FreeHandle(x.h, x.b.Offset)
						if err != nil {
							t.Fatalf("op %d: FreeHandle %d: %v", op, x.b.Offset, err)
						}
						if !seg.Free || seg.Offset > x.b.Offset || seg.Offset+seg.Size < x.b.End() {
							t.Fatalf("op %d: FreeHandle of [%d,%d) reported %+v", op, x.b.Offset, x.b.End(), seg)
						}
						found := false
						a.Walk(func(s alloc.Segment) bool {
							if s.Offset <= x.b.Offset && x.b.Offset < s.Offset+s.Size {
								found = s == seg
								return false
							}
							return true
						})
						if !found {
							t.Fatalf("op %d: FreeHandle reported %+v, not the free range Walk shows", op, seg)
						}
						if _, err := a.FreeHandle(x.h, x.b.Offset); !errors.Is(err, alloc.ErrInvalidFree) {
							t.Fatalf("op %d: second FreeHandle: %v, want ErrInvalidFree", op, err)
						}
					}
				} else {
					size, align := gpuSize(r, 40*MiB), gpuAlign(r)
					x := handleBlock{handle: r.IntN(2) == 0}
					var err error
					if x.handle {
						x.b, x.h, err = a.AllocHandle(size, align)
					} else {
						x.b, err = a.Alloc(size, align)
					}
					if err != nil {
						if !errors.Is(err, alloc.ErrOutOfMemory) {
							t.Fatalf("op %d: alloc %d: %v", op, size, err)
						}
					} else {
						blocks = append(blocks, x)
					}
				}
				if err := alloc.Check(a); err != nil {
					t.Fatalf("op %d: %v", op, err)
				}
			}
			freeAllHandleBlocks(t, a, blocks)
		})
	}
}

func TestFreeHandleInvalid(t *testing.T) {
	for _, name := range handleStrategies {
		a := mustNew(t, name, MiB).(alloc.HandleAllocator)
		b, h, err := a.AllocHandle(4096, 256)
		if err != nil {
			t.Fatal(err)
		}
		before := a.Stats()
		for _, bad := range []alloc.Handle{-1, 1 << 20, h + 1} {
			if _, err := a.FreeHandle(bad, b.Offset); !errors.Is(err, alloc.ErrInvalidFree) {
				t.Errorf("%s: FreeHandle(%d): %v, want ErrInvalidFree", name, bad, err)
			}
		}
		if after := a.Stats(); after != before {
			t.Errorf("%s: refused frees changed the stats: %+v -> %+v", name, before, after)
		}
		if err := alloc.Check(a); err != nil {
			t.Fatal(err)
		}
	}
}
