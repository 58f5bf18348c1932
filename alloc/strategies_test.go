package alloc_test

import (
	"errors"
	"testing"

	"github.com/memwall/memwall/alloc"
)

// mustAlloc allocates through the harness and fails the test on error.
func mustAlloc(t *testing.T, h *harness, size, align uint64) alloc.Block {
	t.Helper()
	b, err := h.alloc(size, align)
	if err != nil {
		t.Fatalf("Alloc(%d, %d): %v", size, align, err)
	}
	h.verify()
	return b
}

// carve allocates consecutive blocks of the given sizes from an empty
// allocator and returns them.
func carve(t *testing.T, h *harness, sizes ...uint64) []alloc.Block {
	t.Helper()
	var bs []alloc.Block
	for _, s := range sizes {
		bs = append(bs, mustAlloc(t, h, s, 1))
	}
	return bs
}

func TestBestFitChoosesSmallestThenLowest(t *testing.T) {
	h := newHarness(t, alloc.NewBestFit(MiB))
	// Holes (after the frees below): 20K at A, 10K at C, 10K at E, 50K at G.
	bs := carve(t, h, 20*KiB, 8*KiB, 10*KiB, 8*KiB, 10*KiB, 8*KiB, 50*KiB, 8*KiB)
	for _, i := range []int{6, 4, 2, 0} {
		h.freeOffset(bs[i].Offset)
	}
	h.verify()
	tests := []struct {
		name        string
		size, align uint64
		want        uint64
	}{
		{"exact fit, lowest of two equal holes", 10 * KiB, 1, bs[2].Offset},
		{"next equal hole", 10 * KiB, 1, bs[4].Offset},
		{"smaller than every hole", 1 * KiB, 1, bs[0].Offset},
		{"only the large hole fits", 40 * KiB, 1, bs[6].Offset},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustAlloc(t, h, tt.size, tt.align)
			if b.Offset != tt.want {
				t.Fatalf("Alloc(%d) at %d, want %d", tt.size, b.Offset, tt.want)
			}
		})
	}
}

func TestBestFitAlignmentSkipsRangesThatDoNotFit(t *testing.T) {
	h := newHarness(t, alloc.NewBestFit(MiB))
	// A 4 KiB hole at offset 100 (cannot hold 4 KiB aligned to 4 KiB), and
	// a 12 KiB hole further up that can.
	bs := carve(t, h, 100, 4*KiB, 8*KiB, 12*KiB, 1000)
	h.freeOffset(bs[1].Offset)
	h.freeOffset(bs[3].Offset)
	b := mustAlloc(t, h, 4*KiB, 4*KiB)
	lo, hi := bs[3].Offset, bs[3].End()
	if b.Offset < lo || b.End() > hi || b.Offset%(4*KiB) != 0 {
		t.Fatalf("Alloc(4 KiB, 4 KiB) = %+v, want inside the 12 KiB hole [%d, %d)", b, lo, hi)
	}
	// The small hole still serves unaligned requests: lowest address wins.
	if b := mustAlloc(t, h, 4*KiB, 1); b.Offset != bs[1].Offset {
		t.Fatalf("Alloc(4 KiB, 1) = %+v, want offset %d", b, bs[1].Offset)
	}
}

func TestTLSFGoodFitFallsBackToOwnClass(t *testing.T) {
	tests := []struct {
		name           string
		capacity, size uint64
	}{
		{"whole capacity", 1000, 1000},
		{"just below a class bound", 1000, 995},
		{"large odd", 3*GiB + 12345, 3*GiB + 12000},
		{"tiny", 7, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, alloc.NewTLSF(tt.capacity))
			b := mustAlloc(t, h, tt.size, 1)
			if b.Offset != 0 || b.Size != tt.size {
				t.Fatalf("Alloc(%d) = %+v", tt.size, b)
			}
			h.freeAll()
		})
	}
}

func TestTLSFAlignmentPaddingStaysFree(t *testing.T) {
	h := newHarness(t, alloc.NewTLSF(64*KiB))
	mustAlloc(t, h, 100, 1)
	b := mustAlloc(t, h, 1000, 4096)
	if b.Offset != 4096 {
		t.Fatalf("aligned block at %d, want 4096 (first aligned offset)", b.Offset)
	}
	// The padding [100, 4096) is a free range of its own, usable.
	if st := h.a.Stats(); st.FreeRanges != 2 {
		t.Fatalf("free ranges %d, want padding and tail", st.FreeRanges)
	}
	// TLSF takes the first block of the smallest class sure to fit, which
	// here is the padding's class, not the big tail's.
	if p := mustAlloc(t, h, 3000, 1); p.Offset != 100 {
		t.Fatalf("padding not reused: %+v", p)
	}
}

func TestBuddy(t *testing.T) {
	t.Run("capacity rounding and decomposition", func(t *testing.T) {
		h := newHarness(t, alloc.NewBuddy(3*GiB+300))
		if c := h.a.Capacity(); c != 3*GiB+256 {
			t.Fatalf("Capacity() = %d, want 3 GiB + 256", c)
		}
		if st := h.a.Stats(); st.FreeRanges != 3 || st.LargestFree != 2*GiB {
			t.Fatalf("empty 3 GiB + 256: %+v, want blocks of 2 GiB, 1 GiB, 256 B", st)
		}
		for _, size := range []uint64{2 * GiB, GiB, 1} {
			mustAlloc(t, h, size, 1)
		}
		if _, err := h.alloc(1, 1); !errors.Is(err, alloc.ErrOutOfMemory) {
			t.Fatalf("full buddy: %v", err)
		}
		h.freeAll()
	})
	t.Run("block sizes and alignment", func(t *testing.T) {
		h := newHarness(t, alloc.NewBuddy(64*MiB))
		tests := []struct{ size, align, want uint64 }{
			{1, 1, 256},
			{256, 1, 256},
			{257, 1, 512},
			{3000, 1, 4096},
			{1, 4096, 4096},
			{5 * MiB, 1, 8 * MiB},
			{100, 2 * MiB, 2 * MiB},
		}
		for _, tt := range tests {
			b := mustAlloc(t, h, tt.size, tt.align)
			if b.Size != tt.want || b.Offset%b.Size != 0 {
				t.Errorf("Alloc(%d, %d) = %+v, want a %d-byte block aligned to its size", tt.size, tt.align, b, tt.want)
			}
		}
		h.freeAll()
	})
	t.Run("split and merge", func(t *testing.T) {
		h := newHarness(t, alloc.NewBuddy(MiB))
		b := mustAlloc(t, h, 1, 1)
		// Splitting 1 MiB down to 256 B leaves one free block per order.
		if st := h.a.Stats(); st.FreeRanges != 12 || st.LargestFree != 512*KiB {
			t.Fatalf("after one 256 B block: %+v", st)
		}
		h.freeOffset(b.Offset)
		if err := alloc.CheckEmpty(h.a); err != nil {
			t.Fatal(err)
		}
		if st := h.a.Stats(); st.FreeRanges != 1 {
			t.Fatalf("buddies did not merge back: %+v", st)
		}
	})
	t.Run("grow merges with free buddies", func(t *testing.T) {
		h := newHarness(t, alloc.NewBuddy(MiB))
		h.grow(2 * MiB)
		if st := h.a.Stats(); st.FreeRanges != 1 || st.LargestFree != 2*MiB {
			t.Fatalf("after Grow: %+v", st)
		}
		b := mustAlloc(t, h, MiB, 1)
		h.grow(3 * MiB)
		h.grow(4 * MiB) // [3, 4) MiB merges with [2, 3) MiB; [0, 2) MiB holds a live block
		if st := h.a.Stats(); st.LargestFree != 2*MiB || st.FreeRanges != 2 {
			t.Fatalf("after growing around a live block: %+v", st)
		}
		h.freeOffset(b.Offset)
		if err := alloc.CheckEmpty(h.a); err != nil {
			t.Fatal(err)
		}
		if st := h.a.Stats(); st.FreeRanges != 1 {
			t.Fatalf("4 MiB buddy did not merge into one block: %+v", st)
		}
	})
}

func TestSlab(t *testing.T) {
	t.Run("limits", func(t *testing.T) {
		h := newHarness(t, alloc.NewSlab(16*MiB))
		if st := h.a.Stats(); st.MaxAlloc != alloc.SlabMaxAlloc {
			t.Fatalf("MaxAlloc %d, want %d", st.MaxAlloc, uint64(alloc.SlabMaxAlloc))
		}
		if _, err := h.alloc(alloc.SlabMaxAlloc+1, 1); !errors.Is(err, alloc.ErrTooLarge) {
			t.Fatalf("above the largest class: %v", err)
		}
		if _, err := h.alloc(1, 2*alloc.SlabMaxAlloc); !errors.Is(err, alloc.ErrTooLarge) {
			t.Fatalf("alignment above the largest class: %v", err)
		}
		mustAlloc(t, h, alloc.SlabMaxAlloc, alloc.SlabMaxAlloc)
	})
	t.Run("capacity in whole pages", func(t *testing.T) {
		a := alloc.NewSlab(3*alloc.SlabPageSize + 12345)
		if a.Capacity() != 3*alloc.SlabPageSize {
			t.Fatalf("Capacity() = %d", a.Capacity())
		}
	})
	t.Run("pages are returned when empty", func(t *testing.T) {
		h := newHarness(t, alloc.NewSlab(8*alloc.SlabPageSize))
		var bs []alloc.Block
		for i := 0; i < 100; i++ {
			bs = append(bs, mustAlloc(t, h, 4000, 1))
		}
		// One class, so one page, used from its lowest block up.
		for i, b := range bs {
			if b.Size != 4096 || b.Offset != uint64(i)*4096 {
				t.Fatalf("block %d = %+v, want 4096 bytes at %d", i, b, i*4096)
			}
		}
		other := mustAlloc(t, h, 300, 1)
		if other.Offset < alloc.SlabPageSize {
			t.Fatalf("a second class shares the first page: %+v", other)
		}
		h.freeAll()
		if st := h.a.Stats(); st.FreeRanges != 1 {
			t.Fatalf("pages not returned: %+v", st)
		}
	})
	t.Run("alignment selects a class that is a multiple", func(t *testing.T) {
		h := newHarness(t, alloc.NewSlab(8*alloc.SlabPageSize))
		tests := []struct{ size, align, want uint64 }{
			{300, 1, 320},
			{300, 64, 320},
			{300, 128, 384},
			{300, 256, 512},
			{5000, 4096, 8192},
		}
		for _, tt := range tests {
			if b := mustAlloc(t, h, tt.size, tt.align); b.Size != tt.want {
				t.Errorf("Alloc(%d, %d) = %+v, want class %d", tt.size, tt.align, b, tt.want)
			}
		}
	})
}

func TestLinear(t *testing.T) {
	t.Run("ring", func(t *testing.T) {
		h := newHarness(t, alloc.NewLinear(1000))
		bs := carve(t, h, 300, 300, 300)
		for i, b := range bs {
			if b.Offset != uint64(i)*300 {
				t.Fatalf("block %d at %d, want bump order", i, b.Offset)
			}
		}
		if st := h.a.Stats(); st.LargestFree != 100 {
			t.Fatalf("LargestFree %d, want the 100 B at the end", st.LargestFree)
		}
		if _, err := h.alloc(200, 1); err == nil {
			t.Fatal("200 B fit with the oldest block at offset 0")
		}
		h.freeOffset(0) // the oldest: [0, 300) is reclaimed
		if st := h.a.Stats(); st.LargestFree != 300 {
			t.Fatalf("LargestFree %d after freeing the oldest", st.LargestFree)
		}
		w := mustAlloc(t, h, 250, 1)
		if w.Offset != 0 {
			t.Fatalf("did not wrap: %+v", w)
		}
		if st := h.a.Stats(); st.LargestFree != 50 {
			t.Fatalf("wrapped: LargestFree %d, want 50 (up to the oldest block)", st.LargestFree)
		}
		h.freeOffset(600) // a hole between live blocks: not reusable yet
		h.verify()
		if st := h.a.Stats(); st.LargestFree != 50 || st.Free != 1000-550 {
			t.Fatalf("after a hole: %+v", st)
		}
		h.freeOffset(300) // the oldest again: reclaims through the hole
		if st := h.a.Stats(); st.LargestFree != 750 || st.FreeRanges != 1 {
			t.Fatalf("after reclaiming past the wrap: %+v", st)
		}
		h.freeAll()
	})
	t.Run("freeing the newest rolls back", func(t *testing.T) {
		h := newHarness(t, alloc.NewLinear(MiB))
		a := mustAlloc(t, h, 1000, 1)
		b := mustAlloc(t, h, 1000, 1)
		h.freeOffset(b.Offset)
		if c := mustAlloc(t, h, 500, 1); c.Offset != a.End() {
			t.Fatalf("after freeing the newest, next block at %d, want %d", c.Offset, a.End())
		}
	})
	t.Run("holes wait for the ends", func(t *testing.T) {
		h := newHarness(t, alloc.NewLinear(MiB))
		bs := carve(t, h, 1000, 1000, 1000)
		h.freeOffset(bs[1].Offset)
		if d := mustAlloc(t, h, 10, 1); d.Offset != bs[2].End() {
			t.Fatalf("block at %d, want after the newest (%d), not in the hole", d.Offset, bs[2].End())
		}
	})
	t.Run("alignment padding", func(t *testing.T) {
		h := newHarness(t, alloc.NewLinear(MiB))
		mustAlloc(t, h, 10, 1)
		if b := mustAlloc(t, h, 10, 4096); b.Offset != 4096 {
			t.Fatalf("aligned block at %d", b.Offset)
		}
		if st := h.a.Stats(); st.FreeRanges != 2 {
			t.Fatalf("padding should be one free range: %+v", st)
		}
	})
}
