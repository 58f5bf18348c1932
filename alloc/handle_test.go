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

// TestFreeByHandle runs one random sequence on two allocators of each
// strategy, one freeing with FreeHandle and the other with FreeByHandle,
// valid and invalid frees alike (a wrong offset, a freed or out-of-range
// handle, a block allocated without one): the same errors, the same
// accounting after every operation, the same blocks and free ranges after
// every 16th.
func TestFreeByHandle(t *testing.T) {
	type byHandle interface {
		alloc.HandleAllocator
		FreeByHandle(h alloc.Handle, offset uint64) error
	}
	ops := randomOps() / 5
	for _, name := range handleStrategies {
		t.Run(name, func(t *testing.T) {
			a := mustNew(t, name, 160*MiB).(alloc.HandleAllocator)
			b := mustNew(t, name, 160*MiB).(byHandle)
			var blocks []handleBlock
			r := rand.New(rand.NewPCG(5, 6))
			for op := 0; op < ops; op++ {
				if len(blocks) > 0 && (len(blocks) >= 64 || r.IntN(2) == 0) {
					k := r.IntN(len(blocks))
					x := blocks[k]
					h, off := x.h, x.b.Offset
					switch r.IntN(6) {
					case 0:
						off++
					case 1:
						h = alloc.Handle(r.IntN(1<<20) - 1<<19)
					}
					_, errA := a.FreeHandle(h, off)
					errB := b.FreeByHandle(h, off)
					if (errA == nil) != (errB == nil) || errA != nil && !errors.Is(errB, alloc.ErrInvalidFree) {
						t.Fatalf("op %d: FreeHandle(%d, %d): %v; FreeByHandle: %v", op, h, off, errA, errB)
					}
					if errA == nil || !x.handle {
						if !x.handle {
							if err := a.Free(x.b.Offset); err != nil {
								t.Fatalf("op %d: free %d: %v", op, x.b.Offset, err)
							}
							if err := b.Free(x.b.Offset); err != nil {
								t.Fatalf("op %d: free %d: %v", op, x.b.Offset, err)
							}
						}
						blocks[k] = blocks[len(blocks)-1]
						blocks = blocks[:len(blocks)-1]
					}
				} else {
					size, align := gpuSize(r, 40*MiB), gpuAlign(r)
					x := handleBlock{handle: r.IntN(3) != 0}
					var bb alloc.Block
					var hb alloc.Handle
					var errA, errB error
					if x.handle {
						x.b, x.h, errA = a.AllocHandle(size, align)
						bb, hb, errB = b.AllocHandle(size, align)
					} else {
						x.b, errA = a.Alloc(size, align)
						bb, errB = b.Alloc(size, align)
					}
					if (errA == nil) != (errB == nil) || bb != x.b || hb != x.h {
						t.Fatalf("op %d: alloc %d: %+v %d %v, and %+v %d %v", op, size, x.b, x.h, errA, bb, hb, errB)
					}
					if errA == nil {
						blocks = append(blocks, x)
					}
				}
				if sa, sb := a.Stats(), b.Stats(); sa != sb {
					t.Fatalf("op %d: stats after FreeHandle %+v, after FreeByHandle %+v", op, sa, sb)
				}
				if op%16 != 0 {
					continue
				}
				checkBoth(t, op, a, b)
			}
		})
	}
}
