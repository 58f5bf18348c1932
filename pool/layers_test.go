package pool_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/trace"
	"github.com/memwall/memwall/trace/replay"
)

// fakeResource is the layer under the layers tested alone: it hands out
// blocks rounded up to round bytes, from the lowest free address of a
// range of cap bytes (so that freed addresses come back at once), refuses
// with an out-of-memory error past cap or when told to, and counts calls.
type fakeResource struct {
	mu            sync.Mutex
	round, cap    uint64
	live          map[device.Ptr]uint64
	free          []device.Ptr // freed addresses, reused first
	top           device.Ptr
	used          uint64
	allocs, frees int
	failNext      bool
}

func newFake(round, cap uint64) *fakeResource {
	return &fakeResource{round: round, cap: cap, live: map[device.Ptr]uint64{}, top: 1 << 20}
}

func (f *fakeResource) Alloc(size uint64, o pool.AllocOptions) (pool.Block, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allocs++
	if size == 0 {
		return pool.Block{}, errors.New("fake: size 0")
	}
	n := (size + f.round - 1) / f.round * f.round
	if f.failNext || f.used+n > f.cap {
		f.failNext = false
		return pool.Block{}, &pool.OOMError{Pool: "fake", Requested: size, Cause: pool.CauseDevice}
	}
	// Slots of 64 MiB: a freed address is reused by the next request.
	var ptr device.Ptr
	if k := len(f.free); k > 0 {
		ptr, f.free = f.free[k-1], f.free[:k-1]
	} else {
		ptr = f.top
		f.top += 64 << 20
	}
	f.live[ptr] = n
	f.used += n
	return pool.Block{Ptr: ptr, Size: n}, nil
}

func (f *fakeResource) Free(b pool.Block) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frees++
	n, ok := f.live[b.Ptr]
	if !ok {
		return fmt.Errorf("fake: %#x is not live: %w", uint64(b.Ptr), pool.ErrInvalidHandle)
	}
	delete(f.live, b.Ptr)
	f.free = append(f.free, b.Ptr)
	f.used -= n
	return nil
}

func (f *fakeResource) FreeAsync(b pool.Block, s device.Stream) error { return f.Free(b) }

func (f *fakeResource) calls() (allocs, frees int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.allocs, f.frees
}

// TestTenantLayerAlone drives tenants over a fake resource (never a pool):
// two siblings and a tenant over one of them, random sizes and roundings,
// frees through the right tenant and double frees. After every operation
// each tenant's use is the sum of the Sizes of the live blocks charged to
// it and within its quota; a request its quota cannot hold is refused
// without asking the layer below; a refusal of the layer below names the
// tenant asked; a refused free changes nothing. (Blocks of a resource
// other than a pool carry no record of their tenant: ownership is
// TestTenantOwnership's, over a pool.)
func TestTenantLayerAlone(t *testing.T) {
	for _, round := range []uint64{1, 256, 1 << 16} {
		t.Run(fmt.Sprint("round", round), func(t *testing.T) {
			r := rand.New(rand.NewPCG(round, 3))
			fake := newFake(round, 1<<30)
			a := pool.NewTenant(fake, "a", 64<<20)
			b := pool.NewTenant(fake, "b", 0)
			c := pool.NewTenant(a, "c", 24<<20) // charged to a as well
			tenants := []*pool.Tenant{a, b, c}
			type held struct {
				blk   pool.Block
				owner *pool.Tenant
			}
			var live []held
			use := map[*pool.Tenant]uint64{}
			quota := map[*pool.Tenant]uint64{a: 64 << 20, c: 24 << 20}
			chain := func(tn *pool.Tenant) []*pool.Tenant {
				if tn == c {
					return []*pool.Tenant{c, a}
				}
				return []*pool.Tenant{tn}
			}
			// over reports whether n more bytes pass a quota on tn's way down.
			over := func(tn *pool.Tenant, n uint64) bool {
				for _, x := range chain(tn) {
					if quota[x] > 0 && use[x]+n > quota[x] {
						return true
					}
				}
				return false
			}
			for op := 0; op < 20000; op++ {
				k := r.IntN(10)
				switch {
				case len(live) > 0 && k < 4:
					i := r.IntN(len(live))
					h := live[i]
					if err := h.owner.Free(h.blk); err != nil {
						t.Fatalf("op %d: %v", op, err)
					}
					if err := h.owner.Free(h.blk); !errors.Is(err, pool.ErrInvalidHandle) {
						t.Fatalf("op %d: double free: %v", op, err)
					}
					for _, x := range chain(h.owner) {
						use[x] -= h.blk.Size
					}
					live = append(live[:i], live[i+1:]...)
				default:
					tn := tenants[r.IntN(3)]
					size := 1 + r.Uint64N(uint64(8)<<(r.IntN(4)*6))
					rounded := (size + round - 1) / round * round
					fa, _ := fake.calls()
					fake.failNext = r.IntN(50) == 0
					blk, err := tn.Alloc(size, pool.AllocOptions{})
					fake.failNext = false
					asked := func() bool { na, _ := fake.calls(); return na != fa }()
					if over(tn, size) && asked {
						t.Fatalf("op %d: a request of %d bytes over %s's quota was sent below", op, size, tn.Name())
					}
					if err != nil {
						var oom *pool.OOMError
						if !errors.As(err, &oom) || !errors.Is(err, pool.ErrOutOfMemory) {
							t.Fatalf("op %d: %v", op, err)
						}
						if oom.Cause == pool.CauseQuota {
							if !over(tn, rounded) {
								t.Fatalf("op %d: %s refused %d bytes (%d rounded) within its quotas: %v", op, tn.Name(), size, rounded, err)
							}
						} else if oom.Tenant != tn.Name() {
							t.Fatalf("op %d: refusal below names tenant %q, want %q: %v", op, oom.Tenant, tn.Name(), err)
						}
						break
					}
					if over(tn, blk.Size) {
						t.Fatalf("op %d: %s handed out %d bytes past a quota", op, tn.Name(), blk.Size)
					}
					for _, x := range chain(tn) {
						use[x] += blk.Size
					}
					live = append(live, held{blk, tn})
				}
				for _, tn := range tenants {
					if tn.Used() != use[tn] {
						t.Fatalf("op %d: tenant %s uses %d, its live blocks hold %d", op, tn.Name(), tn.Used(), use[tn])
					}
					if st := tn.Stats(); st.Quota > 0 && (st.UsedBytes > st.Quota || st.PeakBytes > st.Quota) {
						t.Fatalf("op %d: tenant %s over its quota: %+v", op, tn.Name(), st)
					}
				}
				if len(fake.live) != len(live) {
					t.Fatalf("op %d: %d blocks live below, %d held", op, len(fake.live), len(live))
				}
			}
		})
	}
}

// TestTenantOwnership: over a pool, with siblings, a tenant over a tenant
// and a counter between two tenants, a block is freed only through the
// tenant that handed it out: the pool, a sibling, the tenant below it and
// a tenant over it refuse it and change nothing; its own tenant frees it
// once; the cached and uncached paths alike.
func TestTenantOwnership(t *testing.T) {
	p, err := pool.New(newSim(t, false, 1<<30), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a, _ := p.Tenant("a", 0)
	b, _ := p.Tenant("b", 0)
	c := pool.NewTenant(pool.NewCounter(a, "between"), "c", 0) // c over a counter over a
	layers := []pool.Resource{p, a, b, c}
	r := rand.New(rand.NewPCG(4, 4))
	type held struct {
		blk   pool.Block
		owner pool.Resource
	}
	var live []held
	for op := 0; op < 5000; op++ {
		if len(live) > 0 && r.IntN(2) == 0 {
			i := r.IntN(len(live))
			h := live[i]
			before := p.Stats()
			for _, w := range layers {
				if w == h.owner {
					continue
				}
				if err := w.Free(h.blk); !errors.Is(err, pool.ErrInvalidHandle) {
					t.Fatalf("op %d: a block of layer %d freed through layer %d: %v", op, slices.Index(layers, h.owner), slices.Index(layers, w), err)
				}
			}
			if after := p.Stats(); after.LiveBlocks != before.LiveBlocks || after.UsedBytes != before.UsedBytes {
				t.Fatalf("op %d: a refused free changed the pool", op)
			}
			if err := h.owner.Free(h.blk); err != nil {
				t.Fatalf("op %d: %v", op, err)
			}
			live = append(live[:i], live[i+1:]...)
			continue
		}
		w := layers[r.IntN(len(layers))]
		size := []uint64{1000, 4 << 10, 300 << 10, 5 << 20}[r.IntN(4)] + r.Uint64N(64)
		blk, err := w.Alloc(size, pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, held{blk, w})
	}
	for _, h := range live {
		if err := h.owner.Free(h.blk); err != nil {
			t.Fatal(err)
		}
	}
	for _, tn := range []*pool.Tenant{a, b, c} {
		if tn.Used() != 0 {
			t.Fatalf("tenant %s uses %d after every free", tn.Name(), tn.Used())
		}
	}
	if st := p.Stats(); st.LiveBlocks != 0 {
		t.Fatalf("%d blocks live after every free", st.LiveBlocks)
	}
}

// TestTenantLayerConcurrent: goroutines allocating through one tenant with
// a tight quota never take it past its quota together (-race checks the
// counters), and everything freed leaves nothing charged.
func TestTenantLayerConcurrent(t *testing.T) {
	fake := newFake(256, 1<<40)
	tn := pool.NewTenant(fake, "t", 1<<20)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 9))
			var mine []pool.Block
			for i := 0; i < 2000; i++ {
				if len(mine) > 0 && r.IntN(2) == 0 {
					if err := tn.Free(mine[len(mine)-1]); err != nil {
						t.Error(err)
						return
					}
					mine = mine[:len(mine)-1]
					continue
				}
				b, err := tn.Alloc(1+r.Uint64N(200<<10), pool.AllocOptions{})
				if err == nil {
					mine = append(mine, b)
				} else if !errors.Is(err, pool.ErrOutOfMemory) {
					t.Error(err)
					return
				}
				if u := tn.Used(); u > 1<<20 {
					t.Errorf("tenant uses %d of its 1 MiB quota", u)
					return
				}
			}
			for _, b := range mine {
				if err := tn.Free(b); err != nil {
					t.Error(err)
				}
			}
		}(g)
	}
	wg.Wait()
	if st := tn.Stats(); st.UsedBytes != 0 || st.PeakBytes > 1<<20 || st.OOMs == 0 {
		t.Fatalf("after every free: %+v (a tight quota must have refused some)", st)
	}
	if len(fake.live) != 0 {
		t.Fatalf("%d blocks left below", len(fake.live))
	}
}

// TestCounterAlone: the statistics layer over a fake that refuses at
// random counts exactly what passed: allocations, frees the layer below
// accepted (not refused ones), failures, live blocks and bytes and their
// peak, after every operation.
func TestCounterAlone(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	fake := newFake(512, 256<<20)
	c := pool.NewCounter(fake, "c")
	var live []pool.Block
	var allocs, frees, fails, used, peak uint64
	for op := 0; op < 20000; op++ {
		if len(live) > 0 && r.IntN(2) == 0 {
			i := r.IntN(len(live))
			b := live[i]
			if err := c.Free(b); err != nil {
				t.Fatal(err)
			}
			if err := c.Free(b); err == nil {
				t.Fatal("double free accepted")
			}
			frees++
			used -= b.Size
			live = append(live[:i], live[i+1:]...)
		} else {
			pur := pool.Purpose(r.IntN(6))
			fake.failNext = r.IntN(20) == 0
			b, err := c.Alloc(1+r.Uint64N(16<<20), pool.AllocOptions{Purpose: pur})
			fake.failNext = false
			if err != nil {
				fails++
			} else {
				allocs++
				used += b.Size
				peak = max(peak, used)
				live = append(live, b)
			}
		}
		s := c.Stats()
		if s.Allocs != allocs || s.Frees != frees || s.OOMs != fails || c.Failures() != fails ||
			s.UsedBytes != used || s.PeakUsedBytes != peak || s.LiveBlocks != len(live) {
			t.Fatalf("op %d: counter %+v, want allocs %d frees %d fails %d used %d peak %d live %d",
				op, s, allocs, frees, fails, used, peak, len(live))
		}
	}
	if c.AllocLatency().Count() == 0 {
		t.Fatal("no allocation latency sampled")
	}
}

// TestLogLayerAlone: goroutines allocate and free through the event-log
// layer over a fake that hands a freed address to the next request at
// once; the log reads back as a valid trace: every free is of a live
// address, no allocation is of one, and the counts add up.
func TestLogLayerAlone(t *testing.T) {
	var buf bytes.Buffer
	log := trace.NewEventLog(&buf)
	fake := newFake(256, 1<<40)
	r := log.Wrap(fake)
	var wg sync.WaitGroup
	const perG = 2000
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var mine []pool.Block
			for i := 0; i < perG; i++ {
				b, err := r.Alloc(1+rng.Uint64N(1<<20), pool.AllocOptions{Purpose: pool.KV})
				if err != nil {
					t.Error(err)
					return
				}
				mine = append(mine, b)
				if len(mine) > 3 || rng.IntN(2) == 0 {
					k := rng.IntN(len(mine))
					free := r.Free
					if rng.IntN(3) == 0 {
						free = func(b pool.Block) error { return r.FreeAsync(b, 7) }
					}
					if err := free(mine[k]); err != nil {
						t.Error(err)
						return
					}
					mine = append(mine[:k], mine[k+1:]...)
				}
			}
			for _, b := range mine {
				if err := r.Free(b); err != nil {
					t.Error(err)
				}
			}
		}(g)
	}
	wg.Wait()
	// A refused free is not logged.
	if err := r.Free(pool.Block{Ptr: 12345, Size: 1}); err == nil {
		t.Fatal("free of an address never handed out accepted")
	}
	if err := log.Flush(); err != nil {
		t.Fatal(err)
	}
	rd, err := trace.NewReader(bytes.NewReader(buf.Bytes()), "log.jsonl", trace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	liveAt := map[uint64]bool{}
	allocs, frees := 0, 0
	for {
		ev, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Action {
		case trace.Alloc:
			if liveAt[ev.Addr] {
				t.Fatalf("event %d: alloc at %#x, which is live in the log", allocs+frees, ev.Addr)
			}
			if ev.Purpose != "kv" {
				t.Fatalf("alloc logged with purpose %q", ev.Purpose)
			}
			liveAt[ev.Addr] = true
			allocs++
		case trace.FreeCompleted:
			if !liveAt[ev.Addr] {
				t.Fatalf("event %d: free of %#x, which is not live in the log", allocs+frees, ev.Addr)
			}
			delete(liveAt, ev.Addr)
			frees++
		}
	}
	if allocs != 6*perG || frees != 6*perG || len(liveAt) != 0 {
		t.Fatalf("log: %d allocs, %d frees, %d live; want %d, %d, 0", allocs, frees, len(liveAt), 6*perG, 6*perG)
	}
}

// TestStackOverPool: the layers stacked over a pool, the way a server
// would (counts over a log over a tenant over the pool): after every
// operation the counter, the tenant and the pool agree on the bytes
// live, the tenant's blocks stay its own, and the log replays to the
// blocks left live.
func TestStackOverPool(t *testing.T) {
	p, err := pool.New(newSim(t, false, 1<<30), pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tn, err := p.Tenant("model", 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log := trace.NewEventLog(&buf)
	c := pool.NewCounter(log.Wrap(tn), "stack")
	r := rand.New(rand.NewPCG(8, 8))
	var live []pool.Block
	for op := 0; op < 5000; op++ {
		if len(live) > 0 && r.IntN(2) == 0 {
			i := r.IntN(len(live))
			if err := p.Free(live[i]); !errors.Is(err, pool.ErrInvalidHandle) {
				t.Fatalf("op %d: the tenant's block freed through the pool: %v", op, err)
			}
			if err := c.Free(live[i]); err != nil {
				t.Fatalf("op %d: %v", op, err)
			}
			live = append(live[:i], live[i+1:]...)
		} else {
			b, err := c.Alloc(1+r.Uint64N(8<<20), pool.AllocOptions{Purpose: pool.Activations})
			if err != nil {
				if !errors.Is(err, pool.ErrOutOfMemory) {
					t.Fatal(err)
				}
				continue
			}
			live = append(live, b)
		}
		cs, ps := c.Stats(), p.Stats()
		if cs.UsedBytes != tn.Used() || ps.Tenants[0].UsedBytes != tn.Used() || ps.UsedBytes != tn.Used() ||
			cs.LiveBlocks != len(live) || ps.LiveBlocks != len(live) {
			t.Fatalf("op %d: counter %d bytes in %d blocks, tenant %d, pool %d in %d; %d blocks held",
				op, cs.UsedBytes, cs.LiveBlocks, tn.Used(), ps.UsedBytes, ps.LiveBlocks, len(live))
		}
	}
	if err := log.Flush(); err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/stack.jsonl"
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	tr, err := replay.Load(path, replay.LoadOptions{})
	if err != nil {
		t.Fatalf("replay reads the stack's log: %v", err)
	}
	if tr.Unfreed != len(live) || tr.Allocs != int64(c.Stats().Allocs) {
		t.Fatalf("replay: %d allocs, %d unfreed; the stack made %d, left %d live", tr.Allocs, tr.Unfreed, c.Stats().Allocs, len(live))
	}
}

// TestPoolOverPool: a pool whose chunks are another pool's blocks gives
// every chunk back when trimmed and closed, runs out where the parent's
// limit says (naming it), and reports the parent's room as its device's.
func TestPoolOverPool(t *testing.T) {
	d := newSim(t, false, 1<<30)
	parent, err := pool.New(d, pool.Options{Name: "server", Limit: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	child, err := pool.New(d, pool.Options{Name: "model", Upstream: pool.Chunks(parent, pool.AllocOptions{Purpose: pool.Weights})})
	if err != nil {
		t.Fatal(err)
	}
	if g := child.Options().Growth; g != pool.GrowChunks {
		t.Fatalf("a pool over a pool grows by %v", g)
	}
	if lim := child.Options().Limit; lim != 256<<20 {
		t.Fatalf("child's limit %d, want the parent's 256 MiB", lim)
	}
	// The parent's own 100 MiB: the child runs out where the parent does,
	// before its own limit.
	own, err := parent.Alloc(100<<20, pool.AllocOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var bs []pool.Block
	for {
		b, err := child.Alloc(10<<20, pool.AllocOptions{})
		if err != nil {
			var oom *pool.OOMError
			if !errors.As(err, &oom) || oom.Pool != "model" || !errors.Is(err, pool.ErrOutOfMemory) {
				t.Fatalf("child out of memory: %v", err)
			}
			var up *pool.OOMError
			if !errors.As(oom.Err, &up) || up.Pool != "server" {
				t.Fatalf("child's refusal does not carry the parent's: %v", err)
			}
			break
		}
		bs = append(bs, b)
	}
	if n := len(bs); n < 12 || n > 15 {
		t.Fatalf("%d blocks of 10 MiB from a parent with 156 MiB left", n)
	}
	if ps := parent.Stats(); ps.ByPurpose["weights"] == 0 || ps.UsedBytes > 256<<20 {
		t.Fatalf("parent: %+v", ps)
	}
	free, total, err := child.MemInfo()
	if err != nil || total != 256<<20 || free > 256<<20 {
		t.Fatalf("child MemInfo %d / %d, %v", free, total, err)
	}
	for _, b := range bs {
		if err := child.Free(b); err != nil {
			t.Fatal(err)
		}
	}
	child.Trim()
	if err := parent.Free(own); err != nil {
		t.Fatal(err)
	}
	if err := child.Close(); err != nil {
		t.Fatal(err)
	}
	if ps := parent.Stats(); ps.UsedBytes != 0 || ps.LiveBlocks != 0 {
		t.Fatalf("parent after the child closed: used %d in %d blocks", ps.UsedBytes, ps.LiveBlocks)
	}
	if _, err := pool.NewHost(d, pool.Options{Upstream: pool.Chunks(parent, pool.AllocOptions{})}); err == nil {
		t.Fatal("a host pool over a device pool accepted")
	}
}
