package alloc_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/memwall/memwall/alloc"
)

// fitter is what TLSF and BestFit offer a caller that looks at a place
// before taking it.
type fitter interface {
	alloc.PlacingAllocator
	Find(size, align uint64) (alloc.Fit, bool)
	AllocFit(f alloc.Fit) (alloc.Block, alloc.Handle, error)
}

// TestFitRandom runs one long random sequence on two allocators of each
// strategy that Find serves, one allocating with AllocHandle and the other
// with Find and AllocFit: every block, every failure and every free range
// must be the same, and both must check after every operation. Every few
// operations a Fit made stale by allocating its place must be refused,
// changing nothing.
func TestFitRandom(t *testing.T) {
	ops := randomOps() / 5
	for _, name := range handleStrategies {
		t.Run(name, func(t *testing.T) {
			want := mustNew(t, name, 160*MiB).(alloc.HandleAllocator)
			got := mustNew(t, name, 160*MiB).(fitter)
			type pair struct {
				b      alloc.Block
				hw, hg alloc.Handle
			}
			var live []pair
			r := rand.New(rand.NewPCG(5, 6))
			for op := 0; op < ops; op++ {
				if len(live) > 0 && (len(live) >= 64 || r.IntN(2) == 0) {
					k := r.IntN(len(live))
					x := live[k]
					live[k] = live[len(live)-1]
					live = live[:len(live)-1]
					if _, err := want.FreeHandle(x.hw, x.b.Offset); err != nil {
						t.Fatalf("op %d: free: %v", op, err)
					}
					if _, err := got.FreeHandle(x.hg, x.b.Offset); err != nil {
						t.Fatalf("op %d: free of a fit's block: %v", op, err)
					}
				} else {
					size, align := gpuSize(r, 40*MiB), gpuAlign(r)
					switch r.IntN(50) {
					case 0:
						size = 0
					case 1:
						align = 3 << r.IntN(20)
					}
					bw, hw, errw := want.AllocHandle(size, align)
					f, ok := got.Find(size, align)
					if ok != (errw == nil) {
						t.Fatalf("op %d: Find(%d, %d) ok %v, AllocHandle: %v", op, size, align, ok, errw)
					}
					if !ok {
						continue
					}
					if f.Offset != bw.Offset {
						t.Fatalf("op %d: Find(%d, %d) at %d, AllocHandle at %d", op, size, align, f.Offset, bw.Offset)
					}
					if r.IntN(8) == 0 {
						staleFit(t, op, got, f, size)
						if f, ok = got.Find(size, align); !ok || f.Offset != bw.Offset {
							t.Fatalf("op %d: Find after a refused stale fit: %v at %d, want %d", op, ok, f.Offset, bw.Offset)
						}
					}
					bg, hg, err := got.AllocFit(f)
					if err != nil || bg != bw {
						t.Fatalf("op %d: AllocFit %+v, %v; AllocHandle %+v", op, bg, err, bw)
					}
					live = append(live, pair{bw, hw, hg})
				}
				for _, a := range []alloc.Allocator{want, got} {
					if err := alloc.Check(a); err != nil {
						t.Fatalf("op %d: %v", op, err)
					}
				}
				if sw, sg := segments(want), segments(got); !slices.Equal(sw, sg) {
					t.Fatalf("op %d: ranges differ:\n%v\n%v", op, sw, sg)
				}
			}
		})
	}
}

// staleFit takes f's place with AllocHandle, checks that AllocFit refuses
// f and changes nothing, and frees the place again.
func staleFit(t *testing.T, op int, a fitter, f alloc.Fit, size uint64) {
	t.Helper()
	b, h, err := a.AllocHandleAt(f.Offset, size)
	if err != nil {
		t.Fatalf("op %d: AllocHandleAt a fit's place: %v", op, err)
	}
	before := segments(a)
	if _, _, err := a.AllocFit(f); !errors.Is(err, alloc.ErrInvalidArgument) {
		t.Fatalf("op %d: AllocFit of a stale fit: %v, want ErrInvalidArgument", op, err)
	}
	if after := segments(a); !slices.Equal(before, after) {
		t.Fatalf("op %d: a refused AllocFit changed the ranges", op)
	}
	if _, err := a.FreeHandle(h, b.Offset); err != nil {
		t.Fatalf("op %d: free: %v", op, err)
	}
}

func segments(a alloc.Allocator) []alloc.Segment {
	var s []alloc.Segment
	a.Walk(func(seg alloc.Segment) bool {
		s = append(s, seg)
		return true
	})
	return s
}
