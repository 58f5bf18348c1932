package pool_test

import (
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/pool"
)

// hotHold is a hold time whose hot threshold (50,000 placements a second
// over one pass interval) is a single placement: pools in these tests are
// hot from their first allocation.
const hotHold = 20 * time.Microsecond

// callerPool is a pool on a metadata-only simulator with 2 MiB pages,
// no caches, and the reclaimer's passes run by the test.
func callerPool(t *testing.T, d device.Device, o pool.Options) *pool.Pool {
	t.Helper()
	o.Cache = pool.CacheOff
	o.Reclaimer = pool.ReclaimByCaller
	if o.HoldTime == 0 {
		o.HoldTime = hotHold
	}
	if o.ReserveBytes == 0 {
		o.ReserveBytes = 1 << 30
	}
	p, err := pool.New(d, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestReclaimHoldsThenGivesBack: a hot pool that needs pages above its
// target maps new memory instead of moving free pages (no unmap on the
// allocating path); the free pages beyond the target go back at the
// second pass after their last use, not the first; an allocation placed on
// them before then takes them back with no device call (a cancelled
// give-back), and they stay until two passes after its free.
func TestReclaimHoldsThenGivesBack(t *testing.T) {
	for _, cancel := range []bool{false, true} {
		sd := newShadow(simVirtual(t))
		p := callerPool(t, sd, pool.Options{})
		var live []pool.Block
		// Every live block keeps a word in each of its pages: a page
		// given back (or moved) under a live block reads back wrong.
		mark := func(b pool.Block) {
			live = append(live, b)
			for off := uint64(0); off < b.Size; off += 2 * mib {
				if err := sd.store(b.Ptr+device.Ptr(off), uint64(b.Ptr)+off); err != nil {
					t.Fatal(err)
				}
			}
		}
		check := func() {
			t.Helper()
			for _, b := range live {
				for off := uint64(0); off < b.Size; off += 2 * mib {
					if got, err := sd.load(b.Ptr + device.Ptr(off)); err != nil || got != uint64(b.Ptr)+off {
						t.Fatalf("live block %#x: word at +%d MiB is %#x (%v): its page went away", uint64(b.Ptr), off>>20, got, err)
					}
				}
			}
		}
		a := mustAlloc(t, p, 20*mib)  // [0, 20)
		mark(mustAlloc(t, p, 20*mib)) // [20, 40)
		mustFree(t, p, a)
		mark(mustAlloc(t, p, 30*mib)) // fits not in a's hole: [40, 70), above the target
		st := p.Stats()
		if st.Unmaps != 0 {
			t.Fatalf("a hot pool unmapped %d times on the allocating path", st.Unmaps)
		}
		target := uint64(pool.DefaultTargetRatio * float64(st.PeakUsedBytes))
		if st.ReservedBytes <= target {
			t.Fatalf("reserved %d MiB, within the target %d MiB: the test's premise is wrong", st.ReservedBytes>>20, target>>20)
		}
		if n := p.Reclaim(); n != 0 {
			t.Fatalf("the first pass gave back %d bytes: nothing was free at the pass before", n)
		}
		if cancel {
			calls := p.Stats().DeviceCalls()
			d := mustAlloc(t, p, 10*mib) // in a's hole, still mapped
			if c := p.Stats().DeviceCalls() - calls; c != 0 {
				t.Fatalf("an allocation on queued pages made %d device calls", c)
			}
			mark(d)
			// The rest of a's pages, idle since the first pass, may go;
			// the ones d lies on stay.
			if n := p.Reclaim(); n > 10*mib {
				t.Fatalf("a pass gave back %d bytes of a 20 MiB hole where a 10 MiB block lies", n)
			}
			check()
			live = live[:len(live)-1]
			mustFree(t, p, d)
			if n := p.Reclaim(); n != 0 {
				t.Fatalf("a pass gave back %d bytes freed since the previous pass", n)
			}
		}
		n := p.Reclaim()
		st = p.Stats()
		target = uint64(pool.DefaultTargetRatio * float64(st.PeakUsedBytes))
		if !cancel && n == 0 || st.ReservedBytes > target {
			t.Fatalf("cancel %v: the pass gave back %d bytes, %d MiB reserved, target %d MiB", cancel, n, st.ReservedBytes>>20, target>>20)
		}
		if n := p.Reclaim(); n != 0 {
			t.Fatalf("a pass within the target gave back %d bytes", n)
		}
		check()
		checkBooks(t, p)
	}
}

// TestReclaimColdIsEager: a pool placing blocks slower than the hot rate
// behaves as with no hold time — the same device calls and memory on the
// same sequence — and its passes give nothing back.
func TestReclaimColdIsEager(t *testing.T) {
	run := func(hold time.Duration) (pool.Stats, uint64) {
		p := callerPool(t, simVirtual(t), pool.Options{HoldTime: hold})
		r := rand.New(rand.NewPCG(3, 4))
		var live []pool.Block
		var back uint64
		for i := 0; i < 3000; i++ {
			if len(live) > 0 && (r.IntN(2) == 0 || len(live) > 24) {
				k := r.IntN(len(live))
				mustFree(t, p, live[k])
				live = append(live[:k], live[k+1:]...)
			} else {
				live = append(live, mustAlloc(t, p, 1+r.Uint64N(24*mib)))
			}
			if i%10 == 9 { // ten placements at most between passes: cold
				back += p.Reclaim()
			}
		}
		checkBooks(t, p)
		return p.Stats(), back
	}
	eager, _ := run(-1)
	held, back := run(time.Second) // hot above 50,000 placements between passes
	if eager.DeviceCalls() != held.DeviceCalls() || eager.PeakReservedBytes != held.PeakReservedBytes || back != 0 {
		t.Errorf("cold pool: %d calls, peak %d MiB, %d bytes given back by passes; eager: %d calls, peak %d MiB",
			held.DeviceCalls(), held.PeakReservedBytes>>20, back, eager.DeviceCalls(), eager.PeakReservedBytes>>20)
	}
	if eager.Unmaps == 0 {
		t.Error("the eager pool moved no page: the sequence does not test the target")
	}
}

// TestReclaimHotRandom: on random sizes, a hot pool never unmaps on the
// allocating path between passes, where the eager pool moves pages; the
// passes bring it back within its target once the load stops.
func TestReclaimHotRandom(t *testing.T) {
	run := func(hold time.Duration) *pool.Pool {
		p := callerPool(t, simVirtual(t), pool.Options{HoldTime: hold})
		r := rand.New(rand.NewPCG(5, 6))
		lo, hi := math.Log(512), math.Log(64<<20)
		live := make([]pool.Block, 32)
		for i := range live {
			live[i] = mustAlloc(t, p, uint64(math.Exp(lo+r.Float64()*(hi-lo))))
		}
		for i := 0; i < 20000; i++ {
			k := r.IntN(len(live))
			mustFree(t, p, live[k])
			live[k] = mustAlloc(t, p, uint64(math.Exp(lo+r.Float64()*(hi-lo))))
		}
		for _, b := range live {
			mustFree(t, p, b)
		}
		return p
	}
	eager := run(-1).Stats()
	p := run(hotHold)
	if st := p.Stats(); st.Unmaps != 0 || eager.Unmaps == 0 {
		t.Fatalf("hot pool: %d unmaps with no pass run; eager pool: %d", st.Unmaps, eager.Unmaps)
	}
	p.Reclaim()
	p.Reclaim() // everything has now been free for a whole pass
	st := p.Stats()
	if target := uint64(pool.DefaultTargetRatio * float64(st.PeakUsedBytes)); st.ReservedBytes > target {
		t.Fatalf("after two passes with nothing live: %d MiB reserved, target %d MiB", st.ReservedBytes>>20, target>>20)
	}
	checkBooks(t, p)
}

// TestReclaimLimitPressure: pages queued for the reclaimer go back at once
// when the limit is reached, so an allocation that fits under the limit
// once they are gone succeeds, with no pass run, and the pool never holds
// more than its limit.
func TestReclaimLimitPressure(t *testing.T) {
	const limit = 64 * mib
	p := callerPool(t, simVirtual(t), pool.Options{Limit: limit})
	a := mustAlloc(t, p, 30*mib)
	mustAlloc(t, p, 10*mib)
	mustFree(t, p, a)                              // 30 MiB of free pages, queued: the pool is hot
	b, err := p.Alloc(40*mib, pool.AllocOptions{}) // 40 + 40 MiB > the limit: a's pages must go
	if err != nil {
		t.Fatalf("40 MiB under a 64 MiB limit with 10 MiB live and 30 MiB queued: %v", err)
	}
	st := p.Stats()
	if st.PeakReservedBytes > limit || st.DeviceFrees == 0 {
		t.Fatalf("peak reserved %d MiB under a %d MiB limit, %d handles released", st.PeakReservedBytes>>20, limit>>20, st.DeviceFrees)
	}
	mustFree(t, p, b)
	// Beyond what the limit allows even with nothing queued: an
	// out-of-memory error that explains itself.
	if _, err := p.Alloc(60*mib, pool.AllocOptions{}); err == nil {
		t.Fatal("60 MiB beside 10 MiB live under a 64 MiB limit succeeded")
	}
	checkBooks(t, p)
}

// lowMemory reports its device's free memory as a sixtieth of the total
// while low is set.
type lowMemory struct {
	device.Device
	low atomic.Bool
}

func (d *lowMemory) MemInfo() (free, total uint64, err error) {
	free, total, err = d.Device.MemInfo()
	if d.low.Load() {
		free = total / 60
	}
	return free, total, err
}

// TestReclaimDeviceLow: when the device reports little free memory, a pass
// gives back every free page beyond the target, held or not.
func TestReclaimDeviceLow(t *testing.T) {
	d := &lowMemory{Device: simVirtual(t)}
	p := callerPool(t, d, pool.Options{})
	a := mustAlloc(t, p, 20*mib)
	mustAlloc(t, p, 20*mib)
	mustFree(t, p, a)
	mustAlloc(t, p, 30*mib) // above the target: new memory, a's pages queued
	d.low.Store(true)
	if n := p.Reclaim(); n == 0 {
		t.Fatal("with the device low on memory, the first pass gave nothing back")
	}
	st := p.Stats()
	if target := uint64(pool.DefaultTargetRatio * float64(st.PeakUsedBytes)); st.ReservedBytes > target {
		t.Fatalf("%d MiB reserved, target %d MiB", st.ReservedBytes>>20, target>>20)
	}
	checkBooks(t, p)
}

// TestReclaimCloseJoins: Close stops and joins the background reclaimer
// (no goroutine is left behind) while goroutines allocate and passes run,
// and every byte goes back to the device; a pool that is never hot starts
// no goroutine at all.
func TestReclaimCloseJoins(t *testing.T) {
	d := newSim(t, false, 8<<30)
	free0, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	for round := 0; round < 4; round++ {
		p, err := pool.New(d, pool.Options{HoldTime: 200 * time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(round), uint64(g)))
				live := make([]pool.Block, 16)
				for i := 0; i < 1500; i++ {
					k := r.IntN(len(live))
					if live[k].Size > 0 {
						if err := p.Free(live[k]); err != nil {
							t.Error(err)
							return
						}
					}
					b, err := p.Alloc(1+r.Uint64N(16*mib), pool.AllocOptions{})
					if err != nil {
						t.Error(err)
						return
					}
					live[k] = b
				}
				for _, b := range live {
					_ = p.Free(b)
				}
			}()
		}
		wg.Wait()
		time.Sleep(time.Millisecond) // a few passes
		if !pool.ReclaimerStarted(p) {
			t.Fatalf("round %d: 6,000 placements on 4 goroutines did not make the pool hot", round)
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	cold, err := pool.New(d, pool.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ { // slower than the hot rate: 1 ms apart
		b, err := cold.Alloc(uint64(1+i%7)<<20, pool.AllocOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_ = cold.Free(b)
		if i%10 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if pool.ReclaimerStarted(cold) {
		t.Error("a pool placing about a thousand blocks a second started its reclaimer")
	}
	cold.Close()
	free1, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	slop := uint64(0)
	if os.Getenv("MEMWALL_TEST_DEVICE") == "cuda" {
		slop = 64 * mib // other processes and the driver's own allocations
	}
	if free1+slop < free0 {
		t.Errorf("device free memory %d MiB after Close, %d MiB before the pools", free1>>20, free0>>20)
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after closing the pools, %d before: a reclaimer outlived its pool", n, before)
	}
}
