package alloc

import (
	"bytes"
	"errors"
	"math/bits"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/memwall/memwall/alloc/internal/sizeclass"
)

const MiB = 1 << 20

func TestOffsetMapAgainstMap(t *testing.T) {
	var m offsetMap
	ref := map[uint64]uint64{}
	r := rand.New(rand.NewPCG(3, 4))
	key := func() uint64 {
		// Clustered keys (multiples of 256 in a small range) collide in
		// probe runs; a few arbitrary ones.
		if r.IntN(10) == 0 {
			return r.Uint64N(MaxCapacity)
		}
		return r.Uint64N(4096) * 256
	}
	for i := 0; i < 200_000; i++ {
		k := key()
		switch r.IntN(3) {
		case 0:
			v := r.Uint64()
			m.put(k, v)
			ref[k] = v
		case 1:
			got, ok := m.take(k)
			want, wok := ref[k]
			delete(ref, k)
			if ok != wok || got != want {
				t.Fatalf("op %d: take(%d) = %d, %v; want %d, %v", i, k, got, ok, want, wok)
			}
		default:
			got, ok := m.get(k)
			want, wok := ref[k]
			if ok != wok || got != want {
				t.Fatalf("op %d: get(%d) = %d, %v; want %d, %v", i, k, got, ok, want, wok)
			}
		}
		if m.len() != len(ref) {
			t.Fatalf("op %d: len %d, want %d", i, m.len(), len(ref))
		}
		if i%50_000 == 0 {
			m.clear()
			clear(ref)
		}
	}
	for k, want := range ref {
		if got, ok := m.get(k); !ok || got != want {
			t.Fatalf("final get(%d) = %d, %v; want %d", k, got, ok, want)
		}
	}
	if _, ok := m.get(emptyKey); ok {
		t.Fatal("the empty-slot marker was found as a key")
	}
}

// TestSizeClassesGenerated checks that sizeclasses.go is what the
// generator writes now: edit the generator, not the table.
func TestSizeClassesGenerated(t *testing.T) {
	classes, err := sizeclass.Compute(sizeclass.Default())
	if err != nil {
		t.Fatal(err)
	}
	want, err := sizeclass.Source(sizeclass.Default(), classes)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("sizeclasses.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("sizeclasses.go is stale: run go generate ./alloc")
	}
	if len(classes) != len(slabClasses) {
		t.Fatalf("%d classes computed, %d compiled", len(classes), len(slabClasses))
	}
}

// TestSizeClassWasteBound proves the bound stated in sizeclasses.go for
// every request size from slabMinClass to slabMaxClass: the class chosen
// wastes at most slabMaxWaste of its block, and a page full of requests of
// that size wastes at most slabMaxWaste of the page (tail included).
func TestSizeClassWasteBound(t *testing.T) {
	prev := uint64(0)
	for ci, c := range slabClasses {
		switch {
		case c.size <= prev:
			t.Fatalf("class %d (%d B) not above class %d", ci, c.size, ci-1)
		case c.objects != SlabPageSize/c.size || c.objects == 0:
			t.Fatalf("class %d: %d objects per page, want %d", ci, c.objects, SlabPageSize/c.size)
		case c.size%slabQuantum != 0:
			t.Fatalf("class %d (%d B) not a multiple of %d", ci, c.size, slabQuantum)
		}
		prev = c.size
	}
	for p := uint64(slabMinClass); p <= slabMaxClass; p *= 2 {
		if ci := classFor(p, 1); slabClasses[ci].size != p {
			t.Errorf("power of two %d is not a class (alignments need it)", p)
		}
	}
	var worstObj, worstPage float64
	for size := uint64(slabMinClass); size <= slabMaxClass; size++ {
		ci := classFor(size, 1)
		if ci < 0 {
			t.Fatalf("no class for %d B", size)
		}
		c := slabClasses[ci]
		if c.size < size || ci > 0 && slabClasses[ci-1].size >= size {
			t.Fatalf("size %d in class %d of %d B: not the smallest that holds it", size, ci, c.size)
		}
		obj := float64(c.size-size) / float64(c.size)
		page := float64(SlabPageSize-c.objects*size) / float64(SlabPageSize)
		if obj > slabMaxWaste || page > slabMaxWaste {
			t.Fatalf("size %d in class %d B: waste %.2f%% of the block, %.2f%% of a page; bound %.1f%%",
				size, c.size, obj*100, page*100, slabMaxWaste*100)
		}
		worstObj, worstPage = max(worstObj, obj), max(worstPage, page)
	}
	t.Logf("%d classes; worst waste over [%d, %d] B: %.2f%% of a block, %.2f%% of a page",
		len(slabClasses), slabMinClass, slabMaxClass, worstObj*100, worstPage*100)
}

func TestSizeClassComputeRejectsBadParams(t *testing.T) {
	tests := []struct {
		name string
		p    sizeclass.Params
	}{
		{"quantum not a power of two", sizeclass.Params{PageSize: 1 << 21, MinSize: 256, MaxSize: 1 << 18, Quantum: 48, MaxWaste: 0.125}},
		{"max not a power of two", sizeclass.Params{PageSize: 1 << 21, MinSize: 256, MaxSize: 300000, Quantum: 32, MaxWaste: 0.125}},
		{"page smaller than max", sizeclass.Params{PageSize: 1 << 17, MinSize: 256, MaxSize: 1 << 18, Quantum: 32, MaxWaste: 0.125}},
		{"bound unreachable", sizeclass.Params{PageSize: 1 << 21, MinSize: 256, MaxSize: 1 << 20, Quantum: 32, MaxWaste: 0.125}},
		{"zero waste", sizeclass.Params{PageSize: 1 << 21, MinSize: 256, MaxSize: 1 << 18, Quantum: 32}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := sizeclass.Compute(tt.p); err == nil {
				t.Fatalf("Compute(%+v) succeeded", tt.p)
			}
		})
	}
}

// TestCheckFindsCorruption breaks each strategy's structures by hand and
// expects Check to notice.
func TestCheckFindsCorruption(t *testing.T) {
	setup := func(a Allocator) []Block {
		var bs []Block
		for _, size := range []uint64{1000, 5000, 300, 70000, 4096} {
			b, err := a.Alloc(size, 256)
			if err != nil {
				t.Fatal(err)
			}
			bs = append(bs, b)
		}
		if err := a.Free(bs[1].Offset); err != nil {
			t.Fatal(err)
		}
		if err := a.Free(bs[3].Offset); err != nil {
			t.Fatal(err)
		}
		if err := Check(a); err != nil {
			t.Fatalf("before corruption: %v", err)
		}
		return bs
	}
	tests := []struct {
		name    string
		make    func() Allocator
		corrupt func(a Allocator, bs []Block)
		want    string
	}{
		{"tlsf used count", func() Allocator { return NewTLSF(MiB) },
			func(a Allocator, _ []Block) { a.(*TLSF).used++ }, "Used"},
		{"tlsf bitmap bit lost", func() Allocator { return NewTLSF(MiB) },
			func(a Allocator, _ []Block) {
				t := a.(*TLSF)
				fl := bits.TrailingZeros64(t.flBitmap)
				t.slBitmap[fl] = 0
				t.flBitmap &^= 1 << fl
			}, "bit clear"},
		{"tlsf free neighbours not merged", func() Allocator { return NewTLSF(MiB) },
			func(a Allocator, bs []Block) {
				t := a.(*TLSF)
				id, _ := t.live.take(bs[2].Offset)
				t.nodes[id].free = true
			}, "coalesced"},
		{"tlsf live block lost from index", func() Allocator { return NewTLSF(MiB) },
			func(a Allocator, bs []Block) { a.(*TLSF).live.take(bs[0].Offset) }, "index"},
		{"bestfit treap order", func() Allocator { return NewBestFit(MiB) },
			func(a Allocator, _ []Block) {
				b := a.(*BestFit)
				fl := log2(b.flBitmap)
				root := *b.root(fl, bits.Len32(b.slBitmap[fl])-1)
				b.nodes[root].size++ // key no longer fits its class or order
			}, ""},
		{"bestfit free range counter", func() Allocator { return NewBestFit(MiB) },
			func(a Allocator, _ []Block) { a.(*BestFit).freeRanges++ }, "FreeRanges"},
		{"buddy unmerged buddies", func() Allocator { return NewBuddy(MiB) },
			func(a Allocator, bs []Block) {
				b := a.(*Buddy)
				// Pretend a live block's buddy-half is free without merging.
				id, _ := b.index.get(bs[2].Offset)
				b.nodes[id].free = true
				b.used -= blockSize(b.nodes[id].order)
				b.liveBlocks--
				b.freeBlocks++
				b.push(int32(id))
			}, ""},
		{"slab bitmap", func() Allocator { return NewSlab(16 * MiB) },
			func(a Allocator, bs []Block) {
				s := a.(*Slab)
				p := int(bs[0].Offset / SlabPageSize)
				s.pages[p].free[0] ^= 1 << 5
			}, "slab"},
		{"linear index", func() Allocator { return NewLinear(MiB) },
			func(a Allocator, bs []Block) { a.(*Linear).index.take(bs[4].Offset) }, "index"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := tt.make()
			bs := setup(a)
			tt.corrupt(a, bs)
			err := Check(a)
			if err == nil {
				t.Fatal("Check passed a corrupted allocator")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Check: %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

// fakeAllocator reports whatever segments and stats it is given, to test
// the generic part of Check.
type fakeAllocator struct {
	capacity uint64
	segs     []Segment
	stats    Stats
}

func (f *fakeAllocator) Name() string                     { return "fake" }
func (f *fakeAllocator) Alloc(_, _ uint64) (Block, error) { return Block{}, ErrOutOfMemory }
func (f *fakeAllocator) Free(uint64) error                { return ErrInvalidFree }
func (f *fakeAllocator) Capacity() uint64                 { return f.capacity }
func (f *fakeAllocator) Grow(uint64) error                { return ErrNotGrowable }
func (f *fakeAllocator) Stats() Stats                     { return f.stats }
func (f *fakeAllocator) Reset()                           {}
func (f *fakeAllocator) Walk(fn func(Segment) bool) {
	for _, s := range f.segs {
		if !fn(s) {
			return
		}
	}
}

func TestCheckGeneric(t *testing.T) {
	good := func() *fakeAllocator {
		return &fakeAllocator{capacity: 1000,
			segs:  []Segment{{0, 100, false}, {100, 300, true}, {400, 600, false}},
			stats: Stats{Capacity: 1000, Used: 700, Free: 300, LargestFree: 300, LiveBlocks: 2, FreeRanges: 1}}
	}
	if err := Check(good()); err != nil {
		t.Fatalf("good fake: %v", err)
	}
	tests := []struct {
		name   string
		change func(f *fakeAllocator)
		want   string
	}{
		{"gap", func(f *fakeAllocator) { f.segs[1].Offset = 101 }, "gap or overlap"},
		{"overlap", func(f *fakeAllocator) { f.segs[1].Offset = 99 }, "gap or overlap"},
		{"empty segment", func(f *fakeAllocator) {
			f.segs = append(f.segs[:1], Segment{100, 0, true}, Segment{100, 300, true}, f.segs[2])
		}, "empty"},
		{"short", func(f *fakeAllocator) { f.segs = f.segs[:2] }, "end at"},
		{"past capacity", func(f *fakeAllocator) { f.segs[2].Size = 601 }, "past capacity"},
		{"used", func(f *fakeAllocator) { f.stats.Used++ }, "Used"},
		{"free", func(f *fakeAllocator) { f.stats.Free-- }, "Free"},
		{"live blocks", func(f *fakeAllocator) { f.stats.LiveBlocks = 3 }, "LiveBlocks"},
		{"free ranges", func(f *fakeAllocator) { f.stats.FreeRanges = 0 }, "FreeRanges"},
		{"largest free too big", func(f *fakeAllocator) { f.stats.LargestFree = 301 }, "LargestFree"},
		{"capacity", func(f *fakeAllocator) { f.stats.Capacity = 999 }, "Capacity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := good()
			tt.change(f)
			err := Check(f)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Check = %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
	// CheckEmpty on a fake with live blocks.
	if err := CheckEmpty(good()); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("CheckEmpty with live blocks = %v, want ErrNotEmpty", err)
	}
}

// BenchmarkOffsetIndex compares the allocators' offset index with a Go map
// on their access pattern: with 1000 live offsets, remove one and insert
// another (one take and one put per op).
func BenchmarkOffsetIndex(b *testing.B) {
	const live = 1000
	r := rand.New(rand.NewPCG(5, 6))
	keys := make([]uint64, 1<<14)
	for i := range keys {
		keys[i] = r.Uint64N(1<<40) &^ 255
	}
	b.Run("offsetMap", func(b *testing.B) {
		var m offsetMap
		for i := 0; i < live; i++ {
			m.put(keys[i], uint64(i))
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			m.take(keys[i&(len(keys)-1)])
			m.put(keys[(i+live)&(len(keys)-1)], uint64(i))
		}
	})
	b.Run("map", func(b *testing.B) {
		m := make(map[uint64]uint64)
		for i := 0; i < live; i++ {
			m[keys[i]] = uint64(i)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			delete(m, keys[i&(len(keys)-1)])
			m[keys[(i+live)&(len(keys)-1)]] = uint64(i)
		}
	})
}
