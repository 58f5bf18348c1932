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

// FuzzFit drives two allocators of tlsf and of bestfit, one through
// AllocHandle and AllocHandleAt, the other through Find, FitIn and
// AllocFit, decoded from the input three bytes per operation [op, x, y]:
// allocate (op 0-1; a stale Fit refused first when op is 1), free live
// block x (op 2), place at a chosen offset of free range x (op 3, best
// fit only). Both must hand out the same blocks and keep the same free
// ranges, and alloc.Check runs after every operation.
func FuzzFit(f *testing.F) {
	f.Add([]byte{0, 10, 1, 0, 20, 2, 2, 0, 0, 1, 3, 0, 3, 0, 7, 2, 1, 0})
	f.Add([]byte{0, 40, 3, 0, 9, 1, 3, 1, 200, 2, 0, 0, 1, 28, 255, 3, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, name := range handleStrategies {
			want := mustNew(t, name, 64*MiB).(alloc.HandleAllocator)
			got := mustNew(t, name, 64*MiB).(fitter)
			var live []pair
			ops := data
			for n := 0; len(ops) >= 3 && n < maxFuzzOps; n++ {
				op, x, y := ops[0]%4, ops[1], ops[2]
				ops = ops[3:]
				var p pair
				ok := false
				switch bf, isBF := got.(*alloc.BestFit); {
				case op <= 1 && len(live) < maxFuzzLive:
					p, ok = findBoth(t, n, want, got, fuzzSize(x, y), fuzzAlign(y), op == 1)
				case op == 2 && len(live) > 0:
					live = freeBoth(t, n, want, got, live, int(x))
				case op == 3 && isBF && len(live) < maxFuzzLive:
					p, ok = fitIn(t, n, want, bf, fuzzSize(x, 0), uint64(x), uint64(y)<<20)
				}
				if ok {
					live = append(live, p)
				}
				checkBoth(t, n, want, got)
			}
		}
	})
}

// freeBoth frees live block k (modulo their number) in both allocators.
func freeBoth(t *testing.T, op int, want, got alloc.HandleAllocator, live []pair, k int) []pair {
	t.Helper()
	k %= len(live)
	x := live[k]
	live[k] = live[len(live)-1]
	live = live[:len(live)-1]
	if _, err := want.FreeHandle(x.hw, x.b.Offset); err != nil {
		t.Fatalf("op %d: free: %v", op, err)
	}
	if _, err := got.FreeHandle(x.hg, x.b.Offset); err != nil {
		t.Fatalf("op %d: free of a fit's block: %v", op, err)
	}
	return live
}

// checkBoth checks both allocators and that their ranges are the same.
func checkBoth(t *testing.T, op int, want, got alloc.Allocator) {
	t.Helper()
	for _, a := range []alloc.Allocator{want, got} {
		if err := alloc.Check(a); err != nil {
			t.Fatalf("op %d: %v", op, err)
		}
	}
	if sw, sg := segments(want), segments(got); !slices.Equal(sw, sg) {
		t.Fatalf("op %d: ranges differ:\n%v\n%v", op, sw, sg)
	}
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
			if _, _, err := got.AllocFit(alloc.Fit{}); !errors.Is(err, alloc.ErrInvalidArgument) {
				t.Fatalf("AllocFit of the zero Fit: %v, want ErrInvalidArgument", err)
			}
			var live []pair
			r := rand.New(rand.NewPCG(5, 6))
			for op := 0; op < ops; op++ {
				if len(live) > 0 && (len(live) >= 64 || r.IntN(2) == 0) {
					live = freeBoth(t, op, want, got, live, r.IntN(len(live)))
				} else if x, ok := allocBoth(t, op, r, want, got); ok {
					live = append(live, x)
				}
				checkBoth(t, op, want, got)
			}
		})
	}
}

// allocBoth allocates a block of a random size and alignment (or an
// invalid request) in want with AllocHandle and in got with Find and
// AllocFit, or, on best fit, at a random place with FitIn (see fitIn),
// and checks that both agree.
func allocBoth(t *testing.T, op int, r *rand.Rand, want alloc.HandleAllocator, got fitter) (pair, bool) {
	t.Helper()
	size, align := gpuSize(r, 40*MiB), gpuAlign(r)
	if bf, ok := got.(*alloc.BestFit); ok && r.IntN(4) == 0 {
		return fitIn(t, op, want, bf, size, r.Uint64(), r.Uint64())
	}
	switch r.IntN(50) {
	case 0:
		size = 0
	case 1:
		align = 3 << r.IntN(20)
	}
	return findBoth(t, op, want, got, size, align, r.IntN(8) == 0)
}

// findBoth allocates size bytes at align in want with AllocHandle and in
// got with Find and AllocFit (after refusing a stale Fit, with stale),
// and checks that both agree.
func findBoth(t *testing.T, op int, want alloc.HandleAllocator, got fitter, size, align uint64, stale bool) (pair, bool) {
	t.Helper()
	bw, hw, errw := want.AllocHandle(size, align)
	f, ok := got.Find(size, align)
	if ok != (errw == nil) {
		t.Fatalf("op %d: Find(%d, %d) ok %v, AllocHandle: %v", op, size, align, ok, errw)
	}
	if !ok {
		return pair{}, false
	}
	if f.Offset != bw.Offset {
		t.Fatalf("op %d: Find(%d, %d) at %d, AllocHandle at %d", op, size, align, f.Offset, bw.Offset)
	}
	if stale {
		staleFit(t, op, got, f, size)
		if f, ok = got.Find(size, align); !ok || f.Offset != bw.Offset {
			t.Fatalf("op %d: Find after a refused stale fit: %v at %d, want %d", op, ok, f.Offset, bw.Offset)
		}
	}
	bg, hg, err := got.AllocFit(f)
	if err != nil || bg != bw {
		t.Fatalf("op %d: AllocFit %+v, %v; AllocHandle %+v", op, bg, err, bw)
	}
	return pair{bw, hw, hg}, true
}

// pair is a block of the two allocators, with its handle in each.
type pair struct {
	b      alloc.Block
	hw, hg alloc.Handle
}

// fitIn places a block of size bytes in free range k (modulo their
// number, smallest first) at an offset chosen by at, in want with
// AllocHandleAt and in got with FitIn and AllocFit, and checks they
// agree; FitIn of a range that is not free, or too small, must fail.
func fitIn(t *testing.T, op int, want alloc.HandleAllocator, got *alloc.BestFit, size, k, at uint64) (pair, bool) {
	t.Helper()
	var free []alloc.Segment
	got.WalkFree(1, func(s alloc.Segment) bool {
		free = append(free, s)
		return true
	})
	if len(free) == 0 {
		return pair{}, false
	}
	seg := free[k%uint64(len(free))]
	if _, ok := got.FitIn(alloc.Segment{Offset: seg.Offset, Size: seg.Size + 1, Free: true}, seg.Offset, 1); ok {
		t.Fatalf("op %d: FitIn of a range one byte longer than the free one", op)
	}
	if size > seg.Size {
		if _, ok := got.FitIn(seg, seg.Offset, size); ok {
			t.Fatalf("op %d: FitIn of %d bytes in a free range of %d", op, size, seg.Size)
		}
		return pair{}, false
	}
	off := seg.Offset + at%(seg.Size-size+1)
	f, ok := got.FitIn(seg, off, size)
	if !ok {
		t.Fatalf("op %d: FitIn(%+v, %d, %d) failed", op, seg, off, size)
	}
	bw, hw, err := want.(alloc.PlacingAllocator).AllocHandleAt(off, size)
	if err != nil {
		t.Fatalf("op %d: AllocHandleAt(%d, %d): %v", op, off, size, err)
	}
	bg, hg, err := got.AllocFit(f)
	if err != nil || bg != bw {
		t.Fatalf("op %d: AllocFit of FitIn %+v, %v; AllocHandleAt %+v", op, bg, err, bw)
	}
	return pair{bw, hw, hg}, true
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
