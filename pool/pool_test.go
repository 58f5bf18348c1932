package pool_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memwall/memwall/alloc"
	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
)

// newSim returns the device the pool tests run on: the simulator, or the
// real GPU when MEMWALL_TEST_DEVICE=cuda (the GPU run of the same suite).
// total bounds the simulator's memory; the GPU has what it has.
func newSim(t testing.TB, backing bool, total uint64) device.Device {
	if os.Getenv("MEMWALL_TEST_DEVICE") == "cuda" {
		d, err := cuda.Open(cuda.Options{})
		if err != nil {
			t.Fatalf("MEMWALL_TEST_DEVICE=cuda: %v", err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	o := sim.DefaultOptions()
	o.Backing = backing
	o.Kernels = kernels.Sim()
	if total > 0 {
		o.TotalBytes = total
	}
	return sim.New(o)
}

// configs are the growth × strategy combinations every behavioural test
// runs over.
func configs() []pool.Options {
	var cs []pool.Options
	for _, g := range []pool.Growth{pool.GrowVirtual, pool.GrowChunks} {
		for _, s := range []string{"bestfit", "tlsf"} {
			cs = append(cs, pool.Options{Name: fmt.Sprintf("%s-%s", g, s), Growth: g, Strategy: s})
		}
	}
	return cs
}

// checkPool verifies the pool's invariants from the outside: live blocks do
// not overlap, accounting matches the blocks the test holds.
func checkPool(t *testing.T, p *pool.Pool, live map[device.Ptr]pool.Block) {
	t.Helper()
	bs := make([]pool.Block, 0, len(live))
	var used uint64
	for _, b := range live {
		bs = append(bs, b)
		used += b.Size
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].Ptr < bs[j].Ptr })
	for i := 1; i < len(bs); i++ {
		if bs[i-1].Ptr+device.Ptr(bs[i-1].Size) > bs[i].Ptr {
			t.Fatalf("live blocks overlap: [%#x,+%d) and [%#x,+%d)", bs[i-1].Ptr, bs[i-1].Size, bs[i].Ptr, bs[i].Size)
		}
	}
	st := p.Stats()
	if st.UsedBytes != used || st.LiveBlocks != len(live) {
		t.Fatalf("stats: used %d in %d blocks, test holds %d in %d", st.UsedBytes, st.LiveBlocks, used, len(live))
	}
	if st.UsedBytes+st.CachedBytes+st.PendingBytes > st.ReservedBytes+st.FreeBytes+st.ReservedBytes {
		t.Fatalf("accounting: used %d + cached %d + pending %d exceeds reserved %d", st.UsedBytes, st.CachedBytes, st.PendingBytes, st.ReservedBytes)
	}
	if st.PeakReservedBytes < st.ReservedBytes || st.PeakUsedBytes < st.UsedBytes {
		t.Fatalf("peaks below current: %+v", st)
	}
	if err := pool.CheckPages(p); err != nil {
		t.Fatal(err)
	}
}

func randSize(r *rand.Rand) uint64 {
	// Log-uniform 256 B .. 8 MiB, the shape of activation and KV traffic.
	exp := 8 + r.IntN(16)
	return uint64(1)<<exp + uint64(r.IntN(1<<exp))
}

// TestRandomWithData fills every live block with its own pattern on the
// device, runs a long random alloc/free sequence, and checks the patterns of
// all live blocks after it: no allocation ever overlapped live data.
func TestRandomWithData(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			d := newSim(t, true, 1<<30)
			p, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			s, _ := d.NewStream()
			r := rand.New(rand.NewPCG(1, 2))
			live := map[device.Ptr]pool.Block{}
			tags := map[device.Ptr]uint32{}
			var ptrs []device.Ptr
			steps := 3000
			if testing.Short() {
				steps = 800
			}
			for i := 0; i < steps; i++ {
				if len(ptrs) > 0 && (r.IntN(2) == 0 || len(ptrs) > 60) {
					k := r.IntN(len(ptrs))
					ptr := ptrs[k]
					ptrs[k] = ptrs[len(ptrs)-1]
					ptrs = ptrs[:len(ptrs)-1]
					if err := p.Free(live[ptr]); err != nil {
						t.Fatal(err)
					}
					delete(live, ptr)
					delete(tags, ptr)
				} else {
					size := randSize(r)
					b, err := p.Alloc(size, pool.AllocOptions{Purpose: pool.Activations})
					if err != nil {
						t.Fatalf("step %d: alloc %d: %v", i, size, err)
					}
					if b.Size < size || b.Ptr%256 != 0 {
						t.Fatalf("block %#x size %d for request %d", b.Ptr, b.Size, size)
					}
					if _, dup := live[b.Ptr]; dup {
						t.Fatalf("address %#x handed out twice", b.Ptr)
					}
					tag := uint32(i)*2654435761 | 1
					if err := d.Memset32(b.Ptr, tag, b.Size/4, s); err != nil {
						t.Fatal(err)
					}
					live[b.Ptr], tags[b.Ptr] = b, tag
					ptrs = append(ptrs, b.Ptr)
				}
				if i%97 == 0 {
					checkPool(t, p, live)
				}
			}
			checkPool(t, p, live)
			for ptr, b := range live {
				buf := make([]byte, b.Size)
				if err := d.CopyDtoH(buf, ptr, s); err != nil {
					t.Fatal(err)
				}
				if err := d.StreamSynchronize(s); err != nil {
					t.Fatal(err)
				}
				want := tags[ptr]
				for i := 0; i+4 <= len(buf); i += 4 {
					got := uint32(buf[i]) | uint32(buf[i+1])<<8 | uint32(buf[i+2])<<16 | uint32(buf[i+3])<<24
					if got != want {
						t.Fatalf("block %#x word %d = %#x, want %#x: another allocation overwrote it", ptr, i/4, got, want)
					}
				}
			}
			for _, b := range live {
				if err := p.Free(b); err != nil {
					t.Fatal(err)
				}
			}
			st := p.Stats()
			if st.UsedBytes != 0 || st.LiveBlocks != 0 {
				t.Fatalf("after freeing everything: %+v", st)
			}
			p.Trim()
			if st := p.Stats(); st.ReservedBytes != 0 {
				t.Fatalf("after Trim of an empty pool %d bytes stay reserved", st.ReservedBytes)
			}
		})
	}
}

func TestHandleMisuse(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			d := newSim(t, false, 1<<30)
			p, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			q, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer q.Close()
			ta, _ := p.Tenant("a", 0)
			tb, _ := p.Tenant("b", 0)
			for _, size := range []uint64{1000, 4 << 20} { // cached and uncached paths
				b, err := p.Alloc(size, pool.AllocOptions{})
				if err != nil {
					t.Fatal(err)
				}
				before := p.Stats()
				if err := q.Free(b); !errors.Is(err, pool.ErrInvalidHandle) {
					t.Fatalf("free in another pool: %v", err)
				}
				if err := ta.Free(b); !errors.Is(err, pool.ErrInvalidHandle) {
					t.Fatalf("tenant freeing the pool's block: %v", err)
				}
				if err := p.Free(pool.Block{Ptr: b.Ptr, Size: b.Size}); !errors.Is(err, pool.ErrInvalidHandle) {
					t.Fatalf("forged handle: %v", err)
				}
				if after := p.Stats(); after.UsedBytes != before.UsedBytes || after.LiveBlocks != before.LiveBlocks {
					t.Fatalf("a refused free changed the pool: %+v → %+v", before, after)
				}
				if err := p.Free(b); err != nil {
					t.Fatal(err)
				}
				if err := p.Free(b); !errors.Is(err, pool.ErrInvalidHandle) {
					t.Fatalf("double free: %v", err)
				}
				// A stale copy must not free the block's next owner.
				b2, err := p.Alloc(size, pool.AllocOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if err := p.Free(b); !errors.Is(err, pool.ErrInvalidHandle) {
					t.Fatalf("stale handle: %v", err)
				}
				if err := p.Free(b2); err != nil {
					t.Fatal(err)
				}
				x, err := ta.Alloc(size, pool.AllocOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if err := tb.Free(x); !errors.Is(err, pool.ErrInvalidHandle) {
					t.Fatalf("tenant b freeing tenant a's block: %v", err)
				}
				if err := p.Free(x); !errors.Is(err, pool.ErrInvalidHandle) {
					t.Fatalf("pool freeing a tenant's block without the tenant: %v", err)
				}
				if err := ta.Free(x); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := p.Alloc(0, pool.AllocOptions{}); !errors.Is(err, alloc.ErrInvalidArgument) {
				t.Fatalf("alloc 0: %v", err)
			}
			if _, err := p.Alloc(100, pool.AllocOptions{Align: 3}); !errors.Is(err, alloc.ErrInvalidArgument) {
				t.Fatalf("align 3: %v", err)
			}
		})
	}
}

func TestTenantQuota(t *testing.T) {
	d := newSim(t, false, 1<<30)
	p, err := pool.New(d, pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tn, err := p.Tenant("model-a", 10<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Tenant("model-a", 1); err == nil {
		t.Fatal("duplicate tenant accepted")
	}
	var held []pool.Block
	for i := 0; i < 4; i++ {
		b, err := tn.Alloc(2<<20, pool.AllocOptions{Purpose: pool.Weights})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, b)
	}
	_, err = tn.Alloc(4<<20, pool.AllocOptions{})
	var oom *pool.OOMError
	if !errors.As(err, &oom) || oom.Cause != pool.CauseQuota || oom.Quota != 10<<20 || oom.TenantUsed != 8<<20 {
		t.Fatalf("over quota: %v", err)
	}
	if !errors.Is(err, pool.ErrOutOfMemory) {
		t.Fatal("quota error does not match ErrOutOfMemory")
	}
	// The pool itself is not limited by the tenant's quota.
	big, err := p.Alloc(64<<20, pool.AllocOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if len(st.Tenants) != 1 || st.Tenants[0].UsedBytes != 8<<20 || st.Tenants[0].OOMs != 1 {
		t.Fatalf("tenant stats %+v", st.Tenants)
	}
	if st.ByPurpose["weights"] != 8<<20 {
		t.Fatalf("by purpose %+v", st.ByPurpose)
	}
	for _, b := range held {
		if err := tn.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	if tn.Used() != 0 {
		t.Fatalf("tenant still uses %d", tn.Used())
	}
	if _, err := tn.Alloc(10<<20, pool.AllocOptions{}); err != nil {
		t.Fatalf("full quota after frees: %v", err)
	}
	_ = p.Free(big)
}

func TestLimit(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			d := newSim(t, false, 1<<30)
			o.Limit = 64 << 20
			p, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var held []pool.Block
			for {
				b, err := p.Alloc(6<<20, pool.AllocOptions{})
				if err != nil {
					var oom *pool.OOMError
					if !errors.As(err, &oom) {
						t.Fatalf("not an OOMError: %v", err)
					}
					if oom.Limit != 64<<20 || oom.Requested != 6<<20 || oom.Reserved > 64<<20 {
						t.Fatalf("numbers: %+v", oom)
					}
					if oom.Cause != pool.CauseLimit && oom.Cause != pool.CauseFragmentation {
						t.Fatalf("cause %q", oom.Cause)
					}
					break
				}
				held = append(held, b)
				if len(held) > 20 {
					t.Fatal("limit not enforced")
				}
			}
			if st := p.Stats(); st.ReservedBytes > 64<<20 || st.OOMs != 1 {
				t.Fatalf("reserved %d over limit, ooms %d", st.ReservedBytes, st.OOMs)
			}
			if len(held) < 8 {
				t.Fatalf("only %d 6 MiB blocks fit in 64 MiB", len(held))
			}
			for _, b := range held {
				_ = p.Free(b)
			}
			if _, err := p.Alloc(48<<20, pool.AllocOptions{}); err != nil {
				t.Fatalf("after freeing, 48 MiB in a 64 MiB pool: %v", err)
			}
		})
	}
}

// TestFragmentationReported builds a checkerboard in chunk mode and asks for
// a block larger than any hole: the error must say fragmentation, with the
// free total above the request.
func TestFragmentationReported(t *testing.T) {
	d := newSim(t, false, 1<<30)
	p, err := pool.New(d, pool.Options{Growth: pool.GrowChunks, ChunkBytes: 32 << 20, Limit: 32 << 20, Cache: pool.CacheOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var bs []pool.Block
	for i := 0; i < 32; i++ {
		b, err := p.Alloc(1<<20, pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	for i := 0; i < len(bs); i += 2 {
		_ = p.Free(bs[i])
	}
	_, err = p.Alloc(2<<20, pool.AllocOptions{})
	var oom *pool.OOMError
	if !errors.As(err, &oom) || oom.Cause != pool.CauseFragmentation || oom.Free < 2<<20 || oom.LargestFree >= 2<<20 {
		t.Fatalf("want a fragmentation error with free ≥ 2 MiB and largest < 2 MiB, got %v", err)
	}
	if oom.Fragmentation >= 0.5 {
		t.Fatalf("fragmentation factor %.2f for a checkerboard", oom.Fragmentation)
	}
}

func TestVirtualReturnsPages(t *testing.T) {
	d := newSim(t, false, 4<<30)
	free0, _, _ := d.MemInfo()
	p, err := pool.New(d, pool.Options{Growth: pool.GrowVirtual, KeepFreeBytes: 8 << 20, Cache: pool.CacheOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var bs []pool.Block
	for i := 0; i < 64; i++ {
		b, err := p.Alloc(4<<20, pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	st := p.Stats()
	if st.ReservedBytes != 256<<20 {
		t.Fatalf("64 × 4 MiB mapped %d bytes", st.ReservedBytes)
	}
	for _, b := range bs {
		_ = p.Free(b)
	}
	st = p.Stats()
	if st.ReservedBytes > 8<<20 {
		t.Fatalf("after freeing all, %d bytes stay mapped (keep 8 MiB)", st.ReservedBytes)
	}
	if st.Unmaps == 0 || st.Maps != 128 {
		t.Fatalf("maps %d unmaps %d", st.Maps, st.Unmaps)
	}
	free, _, _ := d.MemInfo()
	if free+(64<<20) < free0 {
		t.Fatalf("device free memory %d, was %d before the pool: pages not returned", free, free0)
	}
}

// TestStreamOrderedFree: a block freed on s1 is reused at once on s1, and
// on s2 only after s1's work is done.
func TestStreamOrderedFree(t *testing.T) {
	d := newSim(t, true, 1<<30)
	p, err := pool.New(d, pool.Options{Cache: pool.CacheOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s1, _ := d.NewStream()
	s2, _ := d.NewStream()
	a, err := p.Alloc(1<<20, pool.AllocOptions{Stream: s1})
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, 1<<20)
	if err := d.CopyHtoD(a.Ptr, src, s1); err != nil {
		t.Fatal(err)
	}
	if err := p.FreeAsync(a, s1); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.PendingBytes != a.Size {
		t.Fatalf("pending %d, want %d", st.PendingBytes, a.Size)
	}
	b, err := p.Alloc(1<<20, pool.AllocOptions{Stream: s1})
	if err != nil {
		t.Fatal(err)
	}
	if b.Ptr != a.Ptr {
		t.Fatalf("same-stream reuse: got %#x, want %#x", b.Ptr, a.Ptr)
	}
	if err := p.FreeAsync(b, s1); err != nil {
		t.Fatal(err)
	}
	c, err := p.Alloc(1<<20, pool.AllocOptions{Stream: s2})
	if err != nil {
		t.Fatal(err)
	}
	if c.Ptr == a.Ptr {
		t.Fatal("another stream got a block whose free is still pending on s1")
	}
	if err := p.FreeAsync(a, s1); !errors.Is(err, pool.ErrInvalidHandle) {
		t.Fatalf("FreeAsync of a stale handle: %v", err)
	}
	_ = p.Free(c)
	if err := d.StreamSynchronize(s1); err != nil {
		t.Fatal(err)
	}
	p.Trim()
	if st := p.Stats(); st.PendingBytes != 0 {
		t.Fatalf("pending %d after the stream finished and Trim", st.PendingBytes)
	}
}

func TestConcurrent(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			d := newSim(t, false, 8<<30)
			p, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			// Stats and Trim while the others allocate: both stop the
			// caches to read or empty them.
			stop := make(chan struct{})
			statsDone := make(chan struct{})
			go func() {
				defer close(statsDone)
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if st := p.Stats(); st.UsedBytes > st.ReservedBytes {
						errs <- fmt.Errorf("mid-run stats: used %d > reserved %d", st.UsedBytes, st.ReservedBytes)
						return
					}
					if i%4 == 0 {
						p.Trim()
					}
				}
			}()
			for g := 0; g < 16; g++ {
				wg.Add(1)
				go func(g int) {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 7))
					var mine []pool.Block
					for i := 0; i < 2000; i++ {
						if len(mine) > 0 && r.IntN(2) == 0 {
							k := r.IntN(len(mine))
							if err := p.Free(mine[k]); err != nil {
								errs <- err
								return
							}
							mine[k] = mine[len(mine)-1]
							mine = mine[:len(mine)-1]
							continue
						}
						size := uint64(512 + r.IntN(64<<10))
						if r.IntN(8) == 0 {
							size = randSize(r)
						}
						b, err := p.Alloc(size, pool.AllocOptions{})
						if err != nil {
							errs <- err
							return
						}
						mine = append(mine, b)
					}
					for _, b := range mine {
						if err := p.Free(b); err != nil {
							errs <- err
							return
						}
					}
				}(g)
			}
			wg.Wait()
			close(stop)
			<-statsDone
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			st := p.Stats()
			if st.UsedBytes != 0 || st.LiveBlocks != 0 || st.Allocs != st.Frees {
				t.Fatalf("after all goroutines freed: %+v", st)
			}
		})
	}
}

func TestHostPool(t *testing.T) {
	d := newSim(t, true, 1<<30)
	hp, err := pool.NewHost(d, pool.Options{Name: "staging"})
	if err != nil {
		t.Fatal(err)
	}
	defer hp.Close()
	b, err := hp.Alloc(3<<20, pool.AllocOptions{Purpose: pool.Staging})
	if err != nil {
		t.Fatal(err)
	}
	host := b.Bytes()
	if uint64(len(host)) != b.Size || b.Size < 3<<20 {
		t.Fatalf("host bytes %d, size %d", len(host), b.Size)
	}
	for i := range host {
		host[i] = byte(i * 7)
	}
	// Pinned staging: a copy from it to the device carries the bytes.
	dst, _ := d.Alloc(3 << 20)
	s, _ := d.NewStream()
	if err := d.CopyHtoD(dst, host[:3<<20], s); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, 3<<20)
	_ = d.CopyDtoH(back, dst, s)
	_ = d.StreamSynchronize(s)
	for i := range back {
		if back[i] != byte(i*7) {
			t.Fatalf("byte %d lost through the pinned pool", i)
		}
	}
	if st := hp.Stats(); !strings.HasSuffix(st.Backend, "-pinned-host") || st.ByPurpose["staging"] == 0 {
		t.Fatalf("host pool stats %+v", st)
	}
	_ = hp.Free(b)
	if b.Bytes() != nil {
		t.Fatal("a freed host block still gives its bytes")
	}
}

// TestWarmup reserves memory at New, so the first requests within it make
// no driver call; Trim gives it back.
func TestWarmup(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			d := newSim(t, false, 1<<30)
			o.Warmup = 64 << 20
			o.Cache = pool.CacheOff
			p, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			st := p.Stats()
			if st.ReservedBytes < 64<<20 {
				t.Fatalf("warm-up of 64 MiB reserved %d bytes", st.ReservedBytes)
			}
			calls := st.DeviceCalls()
			var held []pool.Block
			for i := 0; i < 12; i++ {
				b, err := p.Alloc(4<<20, pool.AllocOptions{})
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, b)
			}
			if got := p.Stats().DeviceCalls(); got != calls {
				t.Fatalf("48 MiB inside a 64 MiB warm-up made %d driver calls", got-calls)
			}
			for _, b := range held {
				_ = p.Free(b)
			}
			if n := p.Trim(); n < 64<<20 {
				t.Fatalf("Trim gave back %d bytes of a 64 MiB warm-up", n)
			}
		})
	}
}

// TestAlignment: the device address, not just the arena offset, honours the
// requested alignment.
func TestAlignment(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			d := newSim(t, false, 1<<30)
			// A small allocation first leaves the next device allocations
			// (the pool's chunks) only 512-byte aligned on the simulator.
			odd, err := d.Alloc(512)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Free(odd)
			p, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var held []pool.Block
			for _, align := range []uint64{256, 4096, 65536, 1 << 20, 2 << 20} {
				for _, size := range []uint64{100, 5000, 3 << 20} {
					b, err := p.Alloc(size, pool.AllocOptions{Align: align})
					if err != nil {
						t.Fatalf("size %d align %d: %v", size, align, err)
					}
					if uint64(b.Ptr)%align != 0 {
						t.Fatalf("size %d align %d: address %#x is not aligned", size, align, b.Ptr)
					}
					held = append(held, b)
				}
			}
			for _, b := range held {
				if err := p.Free(b); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestOddSizesLeaveNoPadding: a block's size is rounded up to the pool's
// alignment, so the block placed after one of an odd size starts right
// at its end, with no sliver of padding between them.
func TestOddSizesLeaveNoPadding(t *testing.T) {
	for _, o := range configs() {
		t.Run(o.Name, func(t *testing.T) {
			o.Cache = pool.CacheOff
			p, err := pool.New(newSim(t, false, 1<<30), o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			var prev pool.Block
			for i, size := range []uint64{300_001, 300_007, 1_000_003, 77_777} {
				b, err := p.Alloc(size, pool.AllocOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if b.Size%256 != 0 || b.Size < size || b.Size-size >= 256 {
					t.Errorf("request %d: block of %d bytes, want it rounded up to 256", size, b.Size)
				}
				if i > 0 && i < 3 && b.Ptr != prev.Ptr+device.Ptr(prev.Size) {
					t.Errorf("block %d at %#x, want it right after the previous one at %#x+%d", i, b.Ptr, prev.Ptr, prev.Size)
				}
				prev = b
			}
		})
	}
}

// gatedUnmap is a device whose Unmap, once armed, waits at a gate: a page
// move that stays in flight while the test looks at the pool.
type gatedUnmap struct {
	device.Device
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedUnmap) Unmap(va device.Ptr, size uint64) error {
	if g.armed.Load() {
		select {
		case g.entered <- struct{}{}:
		default:
		}
		<-g.gate
	}
	return g.Device.Unmap(va, size)
}

// open disarms the gate and lets every waiting Unmap through.
func (g *gatedUnmap) open() {
	if g.armed.Swap(false) {
		close(g.gate)
	}
}

// TestNoMoveBehindMove: while one goroutine moves pages to stay at the
// soft target, another that needs a page takes new memory instead of
// queuing behind it in the driver, and both blocks come out whole.
func TestNoMoveBehindMove(t *testing.T) {
	const page = 2 << 20
	g := &gatedUnmap{Device: newSim(t, false, 8<<30), entered: make(chan struct{}, 4), gate: make(chan struct{})}
	if g.Info().Granularity != page {
		t.Skipf("needs %d-byte pages, device has %d", page, g.Info().Granularity)
	}
	p, err := pool.New(g, pool.Options{Cache: pool.CacheOff, PageBytes: page, HoldTime: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Ten one-page blocks, then every other one freed: the pool is at its
	// soft target (1.02 × the peak of ten pages) with four free pages.
	var bs []pool.Block
	for i := 0; i < 10; i++ {
		b, err := p.Alloc(page, pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	for i := 1; i < 8; i += 2 {
		if err := p.Free(bs[i]); err != nil {
			t.Fatal(err)
		}
	}
	maps0 := p.Stats().DeviceCalls()
	g.armed.Store(true)
	defer g.open()
	first := make(chan error, 1)
	go func() { // two pages past the end: it moves two free pages there
		_, err := p.Alloc(2*page, pool.AllocOptions{})
		first <- err
	}()
	select {
	case <-g.entered:
	case err := <-first:
		t.Fatalf("the first allocation moved no page (err %v): the test's premise is wrong", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the first allocation never reached Unmap")
	}
	second := make(chan error, 1)
	go func() {
		_, err := p.Alloc(2*page, pool.AllocOptions{})
		second <- err
	}()
	select {
	case err := <-second:
		if err != nil {
			t.Fatal(err)
		}
	case <-g.entered:
		t.Fatal("the second allocation queued a page move behind the first")
	case <-time.After(10 * time.Second):
		t.Fatal("the second allocation waited for the first one's page move")
	}
	g.open()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if p.Stats().DeviceCalls() <= maps0 {
		t.Fatalf("no device calls counted for the moves and the growth")
	}
	if err := pool.CheckPages(p); err != nil {
		t.Fatal(err)
	}
}
