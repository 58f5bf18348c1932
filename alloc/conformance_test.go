package alloc_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/memwall/memwall/alloc"
)

const (
	KiB = 1 << 10
	MiB = 1 << 20
	GiB = 1 << 30
)

// forEach runs f as a parallel subtest for every strategy.
func forEach(t *testing.T, f func(t *testing.T, name string)) {
	for _, name := range alloc.Strategies() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, name)
		})
	}
}

func mustNew(t testing.TB, name string, capacity uint64) alloc.Allocator {
	t.Helper()
	a, err := alloc.New(name, capacity)
	if err != nil {
		t.Fatal(err)
	}
	if a.Name() != name {
		t.Fatalf("New(%q).Name() = %q", name, a.Name())
	}
	if err := alloc.CheckEmpty(a); err != nil {
		t.Fatalf("new allocator: %v", err)
	}
	return a
}

func TestNew(t *testing.T) {
	tests := []struct {
		name     string
		strategy string
		capacity uint64
		wantErr  error
	}{
		{"unknown strategy", "firstfit", MiB, alloc.ErrInvalidArgument},
		{"empty name", "", MiB, alloc.ErrInvalidArgument},
		{"capacity above limit", "tlsf", alloc.MaxCapacity + 1, alloc.ErrInvalidArgument},
		{"capacity at limit", "bestfit", alloc.MaxCapacity, nil},
		{"zero capacity", "tlsf", 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := alloc.New(tt.strategy, tt.capacity)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("New(%q, %d) = %v, want %v", tt.strategy, tt.capacity, err, tt.wantErr)
			}
			if err == nil {
				if err := alloc.CheckEmpty(a); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	forEach(t, func(t *testing.T, name string) {
		for _, c := range []uint64{0, 1, 255, 4 * MiB, 3*GiB + 12345, alloc.MaxCapacity} {
			a := mustNew(t, name, c)
			if a.Capacity() > c {
				t.Errorf("New(%q, %d).Capacity() = %d, more than asked", name, c, a.Capacity())
			}
		}
	})
}

func TestAlignment(t *testing.T) {
	forEach(t, func(t *testing.T, name string) {
		h := newHarness(t, mustNew(t, name, 512*MiB))
		maxAlloc := h.a.Stats().MaxAlloc
		for align := uint64(0); align <= MiB; align = max(1, align*2) {
			for _, size := range []uint64{1, 200, 256, 1000, 4096, 65537} {
				b, err := h.alloc(size, align)
				switch {
				case err == nil:
				case errors.Is(err, alloc.ErrTooLarge) && align > maxAlloc:
					continue
				default:
					t.Fatalf("Alloc(%d, %d): %v", size, align, err)
				}
				if align > 1 && b.Offset%align != 0 {
					t.Fatalf("Alloc(%d, %d) = %+v", size, align, b)
				}
				h.verify()
			}
		}
		h.walkStopsEarly(3)
		h.freeAll()
	})
}

func TestInvalidArguments(t *testing.T) {
	tests := []struct {
		name        string
		size, align uint64
		want        error
	}{
		{"size 0", 0, 1, alloc.ErrInvalidArgument},
		{"size 0 align 0", 0, 0, alloc.ErrInvalidArgument},
		{"align 3", 64, 3, alloc.ErrInvalidArgument},
		{"align 6", 64, 6, alloc.ErrInvalidArgument},
		{"align 1000", 64, 1000, alloc.ErrInvalidArgument},
		{"align 2^40+1", 64, 1<<40 + 1, alloc.ErrInvalidArgument},
		{"align all ones", 64, ^uint64(0), alloc.ErrInvalidArgument},
		{"size above MaxCapacity", alloc.MaxCapacity + 1, 1, alloc.ErrTooLarge},
		{"size all ones", ^uint64(0), 256, alloc.ErrTooLarge},
	}
	forEach(t, func(t *testing.T, name string) {
		h := newHarness(t, mustNew(t, name, 64*MiB))
		if _, err := h.alloc(4096, 256); err != nil {
			t.Fatal(err)
		}
		for _, tt := range tests {
			h.run(t, tt.name, func() {
				before := h.walk()
				_, err := h.alloc(tt.size, tt.align) // checks Stats are unchanged but Failures
				if !errors.Is(err, tt.want) {
					h.fatalf("Alloc(%d, %d) = %v, want %v", tt.size, tt.align, err, tt.want)
				}
				if after := h.walk(); !slices.Equal(after, before) {
					h.fatalf("failed Alloc changed the segments")
				}
				h.verify()
			})
		}
	})
}

func TestExhaustion(t *testing.T) {
	forEach(t, func(t *testing.T, name string) {
		const capacity = 64 * MiB
		h := newHarness(t, mustNew(t, name, capacity))
		for _, size := range []uint64{capacity + 1, 2 * capacity} {
			_, err := h.alloc(size, 1)
			var oom *alloc.OOMError
			if !errors.As(err, &oom) && !errors.Is(err, alloc.ErrTooLarge) {
				t.Fatalf("Alloc(%d) beyond capacity = %v", size, err)
			}
		}
		// Fill with 100 KiB blocks until the allocator refuses.
		var err error
		for n := 0; err == nil; n++ {
			if n > capacity/(100*KiB) {
				t.Fatalf("%d blocks of 100 KiB fit in %d bytes", n, uint64(capacity))
			}
			_, err = h.alloc(100*KiB, 256)
		}
		var oom *alloc.OOMError
		if !errors.As(err, &oom) || !errors.Is(err, alloc.ErrOutOfMemory) {
			t.Fatalf("exhausted: %v, want *OOMError wrapping ErrOutOfMemory", err)
		}
		if !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "out of memory") {
			t.Errorf("OOM message %q lacks the strategy or the cause", err)
		}
		h.verify()
		// LargestFree is exactly what an alignment-1 Alloc can still get.
		for i := 0; i < 64; i++ {
			st := h.a.Stats()
			if st.LargestFree == 0 {
				break
			}
			if _, err := h.alloc(st.LargestFree, 1); err != nil {
				t.Fatalf("Alloc(LargestFree=%d, 1): %v", st.LargestFree, err)
			}
			h.verify()
			st = h.a.Stats()
			if _, err := h.alloc(st.LargestFree+1, 1); err == nil {
				t.Fatalf("Alloc(LargestFree+1=%d, 1) succeeded", st.LargestFree+1)
			}
		}
		h.freeAll()
		// Now the whole capacity is available again.
		if st := h.a.Stats(); st.Free != h.a.Capacity() {
			t.Fatalf("after freeing everything: %+v", st)
		}
	})
}

func TestFragmentationReport(t *testing.T) {
	forEach(t, func(t *testing.T, name string) {
		if name == "slab" || name == "linear" {
			t.Skip("free space of slab and linear is not one pool of ranges")
		}
		h := newHarness(t, mustNew(t, name, 16*MiB))
		for {
			if _, err := h.alloc(MiB, 1); err != nil {
				break
			}
		}
		for i := len(h.live) - 1; i >= 0; i -= 2 {
			h.free(i)
		}
		h.verify()
		_, err := h.alloc(2*MiB, 1)
		var oom *alloc.OOMError
		if !errors.As(err, &oom) {
			t.Fatalf("2 MiB into 1 MiB holes: %v", err)
		}
		if oom.Free < oom.Requested || !strings.Contains(err.Error(), "fragmentation") {
			t.Fatalf("OOM with %d bytes free should blame fragmentation: %v", oom.Free, err)
		}
		if f := h.a.Stats().FragmentationFactor(); f > 0.5 {
			t.Errorf("FragmentationFactor %v with 1 MiB holes in %d free bytes", f, oom.Free)
		}
	})
}

func TestInvalidFree(t *testing.T) {
	forEach(t, func(t *testing.T, name string) {
		h := newHarness(t, mustNew(t, name, 64*MiB))
		var blocks []alloc.Block
		for _, size := range []uint64{4096, 1000, 65536, 300} {
			b, err := h.alloc(size, 256)
			if err != nil {
				t.Fatal(err)
			}
			blocks = append(blocks, b)
		}
		h.verify()
		capacity := h.a.Capacity()
		bad := map[string]uint64{
			"capacity":       capacity,
			"past capacity":  capacity + 4096,
			"MaxCapacity":    alloc.MaxCapacity,
			"all ones":       ^uint64(0),
			"interior +1":    blocks[0].Offset + 1,
			"interior +half": blocks[2].Offset + blocks[2].Size/2,
			"end of block":   blocks[3].End(),
		}
		for what, off := range bad {
			if h.isLiveStart(off) {
				continue // e.g. the end of a block that the next one starts at
			}
			h.run(t, what, func() { h.badFree(off); h.verify() })
		}
		h.freeOffset(blocks[1].Offset)
		h.verify()
		h.run(t, "double free", func() { h.badFree(blocks[1].Offset); h.verify() })
		h.freeAll()
		h.run(t, "free after all freed", func() { h.badFree(blocks[0].Offset) })
		h.run(t, "free in empty allocator", func() { h.badFree(0) })
	})
}

func TestReset(t *testing.T) {
	forEach(t, func(t *testing.T, name string) {
		h := newHarness(t, mustNew(t, name, 64*MiB))
		rng := rand.New(rand.NewPCG(1, 2))
		for round := 0; round < 3; round++ {
			for i := 0; i < 50; i++ {
				h.alloc(gpuSize(rng, 4*MiB), 256)
			}
			h.verify()
			h.reset()
			st := h.a.Stats()
			if _, err := h.alloc(st.LargestFree, 1); err != nil {
				t.Fatalf("after Reset, Alloc(LargestFree=%d): %v", st.LargestFree, err)
			}
			h.verify()
		}
	})
}

func TestGrow(t *testing.T) {
	forEach(t, func(t *testing.T, name string) {
		const capacity = 32 * MiB
		h := newHarness(t, mustNew(t, name, capacity))
		if err := h.a.Grow(capacity / 2); !errors.Is(err, alloc.ErrInvalidArgument) && !errors.Is(err, alloc.ErrNotGrowable) {
			t.Fatalf("shrinking Grow: %v", err)
		}
		if err := h.a.Grow(alloc.MaxCapacity + 1); !errors.Is(err, alloc.ErrInvalidArgument) && !errors.Is(err, alloc.ErrNotGrowable) {
			t.Fatalf("Grow past MaxCapacity: %v", err)
		}
		before := h.a.Stats()
		if err := h.a.Grow(h.a.Capacity()); err != nil && !errors.Is(err, alloc.ErrNotGrowable) {
			t.Fatalf("Grow to the same capacity: %v", err)
		}
		if after := h.a.Stats(); after != before {
			t.Fatalf("Grow to the same capacity changed %+v to %+v", before, after)
		}
		block := min(uint64(MiB), h.a.Stats().MaxAlloc)
		for {
			if _, err := h.alloc(block, 256); err != nil {
				break
			}
		}
		h.verify()
		if !h.grow(3 * capacity) {
			t.Skip("not growable")
		}
		h.verify()
		if got := h.a.Capacity(); got != 3*capacity {
			t.Fatalf("Capacity after Grow(%d) = %d", 3*capacity, got)
		}
		// The new space is usable, in big pieces where the strategy allows.
		for n := 0; n < 64; n++ {
			if _, err := h.alloc(block, 256); err != nil {
				t.Fatalf("after growing by %d bytes, block %d of %d bytes: %v", 2*capacity, n, block, err)
			}
		}
		h.verify()
		h.freeAll()
		// Growing an empty allocator from nothing.
		z := newHarness(t, mustNew(t, name, 0))
		if _, err := z.alloc(1, 1); err == nil {
			t.Fatal("Alloc from a zero capacity succeeded")
		}
		z.grow(8 * MiB)
		z.verify()
		if err := alloc.CheckEmpty(z.a); err != nil {
			t.Fatal(err)
		}
		if _, err := z.alloc(4096, 4096); err != nil {
			t.Fatalf("after growing from 0: %v", err)
		}
		z.freeAll()
	})
}

func TestWalkStopsEarly(t *testing.T) {
	forEach(t, func(t *testing.T, name string) {
		h := newHarness(t, mustNew(t, name, 64*MiB))
		for i := 0; i < 8; i++ {
			h.alloc(uint64(i+1)*40*KiB, 256)
		}
		h.free(2)
		h.free(4)
		n := len(h.walk())
		if n < 5 {
			t.Fatalf("only %d segments", n)
		}
		for k := 1; k <= n+1; k++ {
			h.walkStopsEarly(k)
		}
	})
}

func TestZeroCapacity(t *testing.T) {
	forEach(t, func(t *testing.T, name string) {
		h := newHarness(t, mustNew(t, name, 0))
		for _, size := range []uint64{1, 256, MiB} {
			if _, err := h.alloc(size, 1); err == nil {
				t.Fatalf("Alloc(%d) from nothing succeeded", size)
			}
		}
		if segs := h.walk(); len(segs) != 0 {
			t.Fatalf("zero capacity walks %v", segs)
		}
		h.badFree(0)
		h.reset()
	})
}

func TestOOMErrorText(t *testing.T) {
	tests := []struct {
		name string
		err  alloc.OOMError
		want string
	}{
		{"exhausted", alloc.OOMError{Strategy: "tlsf", Requested: 100, Align: 1, Capacity: 1000, Free: 50, LargestFree: 50}, "capacity exhausted"},
		{"fragmented", alloc.OOMError{Strategy: "bestfit", Requested: 100, Align: 256, Capacity: 1000, Free: 500, LargestFree: 60}, "fragmentation"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); !strings.Contains(got, tt.want) || !strings.Contains(got, tt.err.Strategy) {
				t.Errorf("Error() = %q, want it to mention %q", got, tt.want)
			}
			if !errors.Is(&tt.err, alloc.ErrOutOfMemory) {
				t.Error("OOMError is not ErrOutOfMemory")
			}
		})
	}
}
