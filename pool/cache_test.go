package pool_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/memwall/memwall/alloc"
	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
)

// TestParkedLargeBlock: a freed large block is parked on its processor and
// serves the next request of its size with no device call; it counts as
// cached, and Trim gives it back.
func TestParkedLargeBlock(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			d := newSim(t, false, 4<<30)
			p, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			// Pin the test to one processor's cache as far as Go allows:
			// the goroutine may still move, so retry a few times.
			ok := false
			for try := 0; try < 20 && !ok; try++ {
				a, err := p.Alloc(4<<20, pool.AllocOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if err := p.Free(a); err != nil {
					t.Fatal(err)
				}
				if st := p.Stats(); st.UsedBytes != 0 {
					t.Fatalf("after free: used %d", st.UsedBytes)
				} else if st.CachedBytes < 4<<20 {
					continue // freed on another processor than the one that allocated it
				}
				calls := p.Stats().DeviceCalls()
				b, err := p.Alloc(4<<20-100, pool.AllocOptions{Purpose: pool.Activations})
				if err != nil {
					t.Fatal(err)
				}
				ok = b.Ptr == a.Ptr && b.Size == a.Size
				st := p.Stats()
				if st.DeviceCalls() != calls && ok {
					t.Fatalf("reusing a parked block made %d device calls", st.DeviceCalls()-calls)
				}
				if st.UsedBytes != b.Size || st.ByPurpose["activations"] != b.Size || st.RequestedBytes != 4<<20-100 {
					t.Fatalf("accounting after reuse: %+v", st)
				}
				if err := p.Free(b); err != nil {
					t.Fatal(err)
				}
			}
			if !ok {
				t.Fatal("a parked 4 MiB block never served a request of its size")
			}
			// A smaller request does not take the parked block.
			c, err := p.Alloc(4<<20-4096, pool.AllocOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if c.Size > 4<<20-4096+256 {
				t.Fatalf("a request for 4 MiB - 4 KiB got a %d-byte block", c.Size)
			}
			_ = p.Free(c)
			p.Trim()
			if st := p.Stats(); st.CachedBytes != 0 || st.ReservedBytes != 0 {
				t.Fatalf("after Trim: cached %d reserved %d", st.CachedBytes, st.ReservedBytes)
			}
		})
	}
}

// TestCachesGiveBackUnderLimit: blocks cached and parked on every processor
// are reclaimed when a request needs the memory.
func TestCachesGiveBackUnderLimit(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			d := newSim(t, false, 4<<30)
			o.Limit = 1 << 30
			p, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var wg sync.WaitGroup
			// At most 16 goroutines, each holding at most 2 × 12 MiB and
			// 62 × 4 KiB at once: well within the limit together.
			for g := 0; g < min(4*runtime.GOMAXPROCS(0), 16); g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var bs []pool.Block
					for i := 0; i < 64; i++ {
						size := uint64(4 << 10)
						if i%32 == 0 {
							size = 12 << 20
						}
						b, err := p.Alloc(size, pool.AllocOptions{})
						if err != nil {
							t.Error(err)
							return
						}
						bs = append(bs, b)
					}
					for _, b := range bs {
						if err := p.Free(b); err != nil {
							t.Error(err)
						}
					}
				}()
			}
			wg.Wait()
			if st := p.Stats(); st.CachedBytes == 0 || st.UsedBytes != 0 {
				t.Fatalf("nothing cached after the goroutines: %+v", st)
			}
			big, err := p.Alloc(1<<30-64<<20, pool.AllocOptions{})
			if err != nil {
				t.Fatalf("cached blocks were not given back: %v", err)
			}
			_ = p.Free(big)
		})
	}
}

// TestMoreProcessorsAfterNew: processors added after New have no cache and
// use the central path; accounting stays exact.
func TestMoreProcessorsAfterNew(t *testing.T) {
	prev := runtime.GOMAXPROCS(1)
	d := newSim(t, false, 4<<30)
	p, err := pool.New(d, pool.Options{})
	runtime.GOMAXPROCS(max(prev, 4))
	defer runtime.GOMAXPROCS(prev)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				b, err := p.Alloc(uint64(256+(i*g)%(128<<10)), pool.AllocOptions{})
				if err != nil {
					t.Error(err)
					return
				}
				if err := p.Free(b); err != nil {
					t.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	if st := p.Stats(); st.UsedBytes != 0 || st.LiveBlocks != 0 || st.Allocs != 16000 || st.Frees != 16000 {
		t.Fatalf("accounting: %+v", st)
	}
}

// TestTenantChargesWhatItFrees: a tenant is charged per block what its free
// gives back, whatever rounding the block got.
func TestTenantChargesWhatItFrees(t *testing.T) {
	d := newSim(t, false, 1<<30)
	p, err := pool.New(d, pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tn, err := p.Tenant("a", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		var bs []pool.Block
		for _, size := range []uint64{1, 1000, 3<<20 + 1, 70 << 10, 5 << 20} {
			b, err := tn.Alloc(size+uint64(i), pool.AllocOptions{})
			if err != nil {
				t.Fatal(err)
			}
			bs = append(bs, b)
		}
		for _, b := range bs {
			if err := tn.Free(b); err != nil {
				t.Fatal(err)
			}
		}
		if u := tn.Used(); u != 0 {
			t.Fatalf("round %d: tenant uses %d bytes after freeing everything", i, u)
		}
	}
}

// TestBadPurpose: an unknown purpose is refused with a clear error, not
// counted somewhere.
func TestBadPurpose(t *testing.T) {
	d := newSim(t, false, 1<<30)
	p, err := pool.New(d, pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, err = p.Alloc(4096, pool.AllocOptions{Purpose: pool.Purpose(42)})
	if !errors.Is(err, alloc.ErrInvalidArgument) || !strings.Contains(err.Error(), "purpose(42)") {
		t.Fatalf("purpose 42: %v", err)
	}
	if st := p.Stats(); st.Allocs != 0 || st.UsedBytes != 0 {
		t.Fatalf("a refused allocation was counted: %+v", st)
	}
}

// TestConcurrentMappingWithData: goroutines allocate and free while pages
// are mapped, stolen and unmapped without the pool's lock (the soft target
// moves pages on many allocations here); every block keeps its own
// pattern until it is freed, and the device's count of maps and unmaps
// matches the pool's.
func TestConcurrentMappingWithData(t *testing.T) {
	for _, strategy := range []string{"bestfit", "tlsf"} {
		t.Run(strategy, func(t *testing.T) {
			// On the simulator, small pages make many maps; on a GPU
			// (MEMWALL_TEST_DEVICE=cuda) its own 2 MiB pages, sizes scaled.
			var base device.Device
			scale := 1
			if os.Getenv("MEMWALL_TEST_DEVICE") == "cuda" {
				base = newSim(t, true, 0)
				scale = int(base.Info().Granularity / (64 << 10))
			} else {
				so := sim.DefaultOptions()
				so.Backing = true
				so.TotalBytes = 1 << 30
				so.Granularity = 64 << 10
				base = sim.New(so)
			}
			cfg := &fault.Config{}
			d := fault.Wrap(base, cfg)
			p, err := pool.New(d, pool.Options{Strategy: strategy})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var wg sync.WaitGroup
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					s, err := d.NewStream()
					if err != nil {
						t.Error(err)
						return
					}
					r := rand.New(rand.NewPCG(uint64(g), 3))
					type held struct {
						b   pool.Block
						tag uint32
					}
					var mine []held
					check := func(h held) bool {
						buf := make([]byte, h.b.Size)
						if err := d.CopyDtoH(buf, h.b.Ptr, s); err != nil {
							t.Error(err)
							return false
						}
						if err := d.StreamSynchronize(s); err != nil {
							t.Error(err)
							return false
						}
						var word [4]byte
						binary.LittleEndian.PutUint32(word[:], h.tag)
						want := bytes.Repeat(word[:], len(buf)/4)
						if !bytes.Equal(buf[:len(want)], want) {
							i := 0
							for buf[i] == want[i] {
								i++
							}
							t.Errorf("goroutine %d: block %#x byte %d = %#x, want %#x", g, h.b.Ptr, i, buf[i], want[i])
							return false
						}
						return true
					}
					steps, span := 400, 2<<20
					if raceOn {
						steps, span = 120, 256<<10 // the detector slows the simulator's copies
					}
					for i := 0; i < steps; i++ {
						if len(mine) > 0 && (r.IntN(2) == 0 || len(mine) > 12) {
							k := r.IntN(len(mine))
							if !check(mine[k]) {
								return
							}
							if err := p.Free(mine[k].b); err != nil {
								t.Error(err)
								return
							}
							mine[k] = mine[len(mine)-1]
							mine = mine[:len(mine)-1]
							continue
						}
						size := uint64(scale * (64<<10 + r.IntN(span)))
						b, err := p.Alloc(size, pool.AllocOptions{})
						if err != nil {
							t.Error(err)
							return
						}
						tag := uint32(g)<<24 | uint32(i) | 1
						if err := d.Memset32(b.Ptr, tag, b.Size/4, s); err != nil {
							t.Error(err)
							return
						}
						mine = append(mine, held{b, tag})
					}
					for _, h := range mine {
						check(h)
						if err := p.Free(h.b); err != nil {
							t.Error(err)
						}
					}
				}(g)
			}
			wg.Wait()
			st := p.Stats()
			if st.UsedBytes != 0 || st.LiveBlocks != 0 {
				t.Fatalf("after all frees: %+v", st)
			}
			p.Trim()
			st = p.Stats()
			c := cfg.Counts()
			if st.Maps != c.Map || st.Unmaps != c.Unmap || st.ReservedBytes != 0 {
				t.Fatalf("pool: %d maps, %d unmaps, %d reserved; device saw %d maps, %d unmaps", st.Maps, st.Unmaps, st.ReservedBytes, c.Map, c.Unmap)
			}
			if st.Unmaps < 10 {
				t.Fatalf("only %d unmaps: the test did not exercise stolen pages", st.Unmaps)
			}
		})
	}
}

// TestCacheMaxCeiling: a CacheMax above the largest size class is held to
// it; larger requests take the central path instead of a class that does
// not exist.
func TestCacheMaxCeiling(t *testing.T) {
	d := newSim(t, false, 1<<30)
	p, err := pool.New(d, pool.Options{CacheMax: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got := p.Options().CacheMax; got != 1<<20 {
		t.Fatalf("CacheMax %d, want the largest class, 1 MiB", got)
	}
	for _, size := range []uint64{1 << 20, 1<<20 + 1, 3 << 20} {
		b, err := p.Alloc(size, pool.AllocOptions{})
		if err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		if b.Size < size || b.Size > size+256 {
			t.Fatalf("%d bytes: block of %d", size, b.Size)
		}
		if err := p.Free(b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRefillBatches: refills of a small class take batches that grow
// while the class keeps running dry (a loop allocating one size makes few
// trips to the arena), but a mix of random small sizes, whose frees refill
// the classes, keeps taking single blocks: it must not move blocks it
// does not use between the cache and the arena.
func TestRefillBatches(t *testing.T) {
	d := newSim(t, false, 4<<30)
	p, err := pool.New(d, pool.Options{Cache: pool.CacheShared})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var live []pool.Block
	for i := 0; i < 4; i++ {
		b, err := p.Alloc(4096, pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, b)
	}
	// Refills of 1, 2 (one cached, then used) and 4 blocks.
	if st := p.Stats(); st.CachedBytes != 3*4096 {
		t.Errorf("after 4 allocations of one size, %d bytes cached, want 3 blocks of 4096 from a grown batch", st.CachedBytes)
	}
	for _, b := range live {
		if err := p.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	r := rand.New(rand.NewPCG(5, 6))
	lo, hi := math.Log(512), math.Log(float64(p.Options().CacheMax)) // the cached classes
	size := func() uint64 { return uint64(math.Exp(lo + r.Float64()*(hi-lo))) }
	live = live[:0]
	for i := 0; i < 32; i++ {
		b, err := p.Alloc(size(), pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, b)
	}
	pair := func() {
		k := r.IntN(len(live))
		if err := p.Free(live[k]); err != nil {
			t.Fatal(err)
		}
		var err error
		if live[k], err = p.Alloc(size(), pool.AllocOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 5000; i++ {
		pair()
	}
	before := pool.ArenaAllocs(p)
	const pairs = 20000
	for i := 0; i < pairs; i++ {
		pair()
	}
	if per := float64(pool.ArenaAllocs(p)-before) / pairs; per > 0.1 {
		t.Errorf("random small sizes: %.3f arena allocations per free+alloc pair, want ≤ 0.1", per)
	}
	for _, b := range live {
		if err := p.Free(b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDeferredFrees: a freed large block that is not parked waits in its
// processor's cache (counted as cached) and goes back to its arena on that
// processor's next trip there, before anything is placed, so the next
// request can reuse its range; enough of them go back by themselves; an
// allocation that needs their memory, and Trim, take them back.
func TestDeferredFrees(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			o.Cache = pool.CacheShared // one cache: the test sees what it frees
			o.TargetRatio = pool.NoTarget
			d := newSim(t, false, 4<<30)
			p, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			a, err := p.Alloc(8<<20, pool.AllocOptions{})
			if err != nil {
				t.Fatal(err)
			}
			b, err := p.Alloc(3<<20, pool.AllocOptions{}) // the last size requested: a is not parked
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Free(a); err != nil {
				t.Fatal(err)
			}
			if st := p.Stats(); st.CachedBytes != a.Size || st.UsedBytes != b.Size {
				t.Fatalf("after freeing a: cached %d used %d, want %d and %d", st.CachedBytes, st.UsedBytes, a.Size, b.Size)
			}
			// A different size misses the cache; a's range is free again
			// before it is placed, so best fit puts it there.
			c, err := p.Alloc(6<<20, pool.AllocOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if st := p.Stats(); st.CachedBytes != 0 {
				t.Fatalf("after the next allocation: %d bytes still held back", st.CachedBytes)
			}
			if o.Strategy == "bestfit" && c.Ptr != a.Ptr {
				t.Errorf("6 MiB placed at %#x, want the freed 8 MiB range at %#x", c.Ptr, a.Ptr)
			}
			// Enough held-back frees go back without an allocation.
			var bs []pool.Block
			for i := 0; i < 8; i++ {
				x, err := p.Alloc(uint64(1+i)<<20+4096, pool.AllocOptions{})
				if err != nil {
					t.Fatal(err)
				}
				bs = append(bs, x)
			}
			for _, x := range bs {
				if err := p.Free(x); err != nil {
					t.Fatal(err)
				}
			}
			if st := p.Stats(); st.CachedBytes > 4*(9<<20) {
				t.Errorf("%d bytes held back after 8 frees, want at most a few blocks", st.CachedBytes)
			}
			_ = p.Free(b)
			_ = p.Free(c)
			p.Trim()
			if st := p.Stats(); st.CachedBytes != 0 || st.ReservedBytes != 0 {
				t.Fatalf("after Trim: cached %d reserved %d", st.CachedBytes, st.ReservedBytes)
			}
			if err := pool.CheckPages(p); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestParkedBlockHasNoSlack: a block placed with alignment slack (a chunk
// whose base is less aligned than the request) is not parked for the next
// request of its size at the pool's alignment, nor reused for one on the
// stream it was freed on, which would hand that request the slack too:
// the bytes the pool counts as used stay those of the blocks handed out,
// plus only the slack of over-aligned requests.
func TestParkedBlockHasNoSlack(t *testing.T) {
	for _, cache := range []pool.CacheMode{pool.CachePerProcessor, pool.CacheShared} {
		d := newSim(t, false, 1<<30)
		// A chunk's base only 256-aligned: the chunks are another pool's
		// blocks, placed after one of 1 MiB + 256 bytes.
		parent, err := pool.New(d, pool.Options{Name: "parent", Cache: pool.CacheOff})
		if err != nil {
			t.Fatal(err)
		}
		pad, err := parent.Alloc(1<<20+256, pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := pool.New(d, pool.Options{Growth: pool.GrowChunks, Cache: cache, Upstream: pool.Chunks(parent, pool.AllocOptions{})})
		if err != nil {
			t.Fatal(err)
		}
		const size = 300 << 10
		a, err := p.Alloc(size, pool.AllocOptions{}) // the size last asked for here
		if err != nil {
			t.Fatal(err)
		}
		// Placed right after a, at a chunk offset that is a multiple of
		// 512 on a base 256 past one: the whole slack goes before it, so
		// it holds exactly size bytes after its address.
		over, err := p.Alloc(size, pool.AllocOptions{Align: 512})
		if err != nil {
			t.Fatal(err)
		}
		if uint64(over.Ptr)%512 != 0 {
			t.Fatalf("block %#x not aligned to 512", uint64(over.Ptr))
		}
		if err := p.Free(over); err != nil {
			t.Fatal(err)
		}
		b, err := p.Alloc(size, pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if used, held := p.Stats().UsedBytes, a.Size+b.Size; used != held {
			t.Fatalf("%v: the pool counts %d bytes used, its two blocks hold %d: %d of slack handed to a request that asked for none", cache, used, held, used-held)
		}
		// The same through a stream-ordered free, reused on its stream.
		s, err := d.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		if over, err = p.Alloc(size, pool.AllocOptions{Align: 512}); err != nil {
			t.Fatal(err)
		}
		if err := p.FreeAsync(over, s); err != nil {
			t.Fatal(err)
		}
		c, err := p.Alloc(size, pool.AllocOptions{Stream: s})
		if err != nil {
			t.Fatal(err)
		}
		if used, held := p.Stats().UsedBytes, a.Size+b.Size+c.Size; used != held {
			t.Fatalf("%v: after a stream-ordered reuse the pool counts %d bytes used, its blocks hold %d", cache, used, held)
		}
		for _, x := range []pool.Block{a, b, c} {
			if err := p.Free(x); err != nil {
				t.Fatal(err)
			}
		}
		_ = d.StreamSynchronize(s)
		_ = d.DestroyStream(s)
		p.Close()
		_ = parent.Free(pad)
		parent.Close()
	}
}
